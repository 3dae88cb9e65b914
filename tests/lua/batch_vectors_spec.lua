-- The batch vectors of tests/vectors/batches/ through map_with_concurrency.
--
-- Mirrors tests/c/test_batch_vectors.c (one engine group) and
-- tests/python/test_batch_vectors.py: each item is a worker coroutine making
-- one call_llm, so the vectors show Lua's pool paced by the engine's
-- admission stage as a batch is (tests/vectors/README.md, "Batch vectors").

local H = require("helpers")
local llm = require("llmretry")
local lfs = require("lfs")
local json = H.json
local check = H.check

local OPTION_NAMES = {
  timeout_ms = true, max_retries = true, base_delay_ms = true, max_delay_ms = true,
  jitter = true, deadline_ms = true, max_retry_after_ms = true,
  retry_budget_ratio = true, retry_budget_min = true, breaker_failures = true,
  breaker_cooldown_ms = true,
}
local DIR = H.VECTOR_DIR .. "/batches"

local files = {}
for entry in lfs.dir(DIR) do
  if entry:match("%.json$") then files[#files + 1] = entry end
end
table.sort(files)

describe("batch vectors", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("finds the batch vector files", function()
    check(#files >= 2, "only %d batch vectors in %s", #files, DIR)
  end)

  for _, file in ipairs(files) do
    local stem = file:gsub("%.json$", "")
    it(stem, function()
      local vec = json.decode(H.read_file(DIR .. "/" .. file), 1, json.null)
      check(vec.name == stem, "name %s must equal the file name", tostring(vec.name))
      local shared = vec.options or {}
      for k in pairs(shared) do check(OPTION_NAMES[k], "unknown option %s", k) end
      mock:put_scenario(vec.name, vec.script)
      local engine = llm.new_engine(vec.max_in_flight)
      local url = mock:scenario_url(vec.name)
      local t0 = H.now_ms()
      local results = llm.map_with_concurrency(vec.items, vec.limit, function(item)
        local opts = { body = H.obj({ model = "gpt-test", messages = { H.obj({ role = "user",
          content = "SECRET" }) } }), base_url = url, api_key = H.SECRET_KEY }
        for k, v in pairs(shared) do opts[k] = v end
        for k, v in pairs(item.options or {}) do
          check(OPTION_NAMES[k], "unknown option %s", k)
          opts[k] = v
        end
        local wait = (item.start_after_ms or 0) - (H.now_ms() - t0)
        if wait > 0 then H.sleep_ms(wait) end   -- the vector's timed schedule
        local started = H.now_ms()
        local res, err = llm.call_llm(opts)
        return { res = res, err = err, ms = H.now_ms() - started }
      end, { engine = engine })
      engine:close()
      for i, want in ipairs(vec.expect.items) do
        local got = results[i]
        check(got ~= nil, "item %d: no result", i)
        check((got.res ~= nil) == (want.outcome == "ok"), "item %d: %s", i, tostring(got.err))
        local meta = got.res and got.res.meta or got.err
        if want.error_kind then
          check(got.err and got.err.kind == want.error_kind, "item %d: %s", i, tostring(got.err))
        end
        if want.reason then
          check(got.err and got.err.reason == want.reason, "item %d: %s", i, tostring(got.err))
        end
        if want.attempts then
          check(meta.attempts == want.attempts, "item %d: %s attempts", i, tostring(meta.attempts))
        end
        if want.max_ms then
          check(got.ms <= want.max_ms, "item %d took %.0f ms", i, got.ms)
        end
      end
      local recs = mock:requests(vec.name)
      check(#recs == vec.expect.requests, "%d requests, want %d", #recs, vec.expect.requests)
      local quiet = vec.expect.quiet_after_429_ms
      if quiet then
        local t429
        for _, r in ipairs(recs) do
          if r.step == 0 and not t429 then t429 = r.time end
        end
        check(t429, "no request got the 429")
        local early = 0
        for _, r in ipairs(recs) do
          -- requests after the script's two (step -1); the one sent beside
          -- the 429 may come late on a loaded machine
          if r.step == -1 and r.time > t429 + quiet[1] / 1000
              and r.time < t429 + quiet[2] / 1000 then
            early = early + 1
          end
        end
        check(early == 0, "%d requests during the pause", early)
      end
    end)
  end
end)
