-- The logger vectors of tests/vectors/loggers/: one rule for a raising logger.
--
-- Every vector runs through each way the blocking module reads a call's
-- mailbox (lua/llmretry/mailbox.lua): call_llm and call_many; a stream
-- through stream_llm. tests/python/test_logger_vectors.py runs the same
-- files through Python's reader (bindings/python/mailbox.c). Reports go to
-- stderr here: the spec stands in for io.stderr while a call runs.

local H = require("helpers")
local llm = require("llmretry")
local lfs = require("lfs")
local json = H.json
local check = H.check

local OPTION_NAMES = { timeout_ms = true, max_retries = true, base_delay_ms = true,
  max_delay_ms = true, jitter = true }
local DIR = H.VECTOR_DIR .. "/loggers"

local files = {}
for entry in lfs.dir(DIR) do
  if entry:match("%.json$") then files[#files + 1] = entry end
end
table.sort(files)

local function call_way(opts)
  return llm.call_llm(opts)
end

local function many_way(opts)
  local body = opts.body
  local rest = {}
  for k, v in pairs(opts) do if k ~= "body" then rest[k] = v end end
  rest.limit = 1
  local out = llm.call_many({ body }, rest)[1]
  if out and out.data then return out, nil end
  return nil, out
end

local function stream_way(opts)
  return llm.stream_llm(opts, function() end)
end

local CALL_WAYS = { { "call", call_way }, { "many", many_way } }
local STREAM_WAYS = { { "stream", stream_way } }

-- Run fn with io.stderr replaced by a recorder; the lines written, then
-- fn's results.
local function with_stderr(fn)
  local lines, real = {}, io.stderr
  io.stderr = { write = function(_, s) lines[#lines + 1] = s; return true end }
  local r = { pcall(fn) }
  io.stderr = real
  if not r[1] then error(r[2], 0) end
  return lines, r[2], r[3]
end

describe("logger vectors", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("finds the logger vector files", function()
    check(#files >= 3, "only %d logger vectors in %s", #files, DIR)
  end)

  for _, file in ipairs(files) do
    local stem = file:gsub("%.json$", "")
    local vec = json.decode(H.read_file(DIR .. "/" .. file), 1, json.null)
    local ways = vec.body.stream and STREAM_WAYS or CALL_WAYS
    for _, way in ipairs(ways) do
      it(stem .. "-" .. way[1], function()
        check(vec.name == stem, "name %s must equal the file name", tostring(vec.name))
        local raise_on = {}
        for _, name in ipairs(vec.raise_on) do raise_on[name] = true end
        local scenario = vec.name .. "_" .. way[1]
        mock:put_scenario(scenario, vec.script)
        local logged = {}
        local opts = { body = json.encode(vec.body), base_url = mock:scenario_url(scenario),
          api_key = H.SECRET_KEY }
        for k, v in pairs(vec.options or {}) do
          check(OPTION_NAMES[k], "unknown option %s", k)
          opts[k] = v
        end
        opts.logger = function(ev)
          if ev.event:find("^llm_batch_") then return end   -- the batch's own summary
          logged[#logged + 1] = ev
          if raise_on[ev.event] then error("logger broke on " .. ev.event, 0) end
        end
        local reports, res, err = with_stderr(function() return way[2](opts) end)
        local exp = vec.expect
        if exp.outcome == "ok" then
          check(res, "the call failed: %s", tostring(err))
          check(res.data.choices[1].message.content == exp.content, "content %s",
            tostring(res.data.choices[1].message.content))
        else
          check(res == nil and err and err.kind == exp.error_kind, "outcome %s / %s",
            tostring(res), tostring(err))
        end
        local names = {}
        for i, ev in ipairs(logged) do names[i] = ev.event end
        check(table.concat(names, ",") == table.concat(exp.logged, ","),
          "logged %s", table.concat(names, ","))
        check(#reports == exp.reports, "%d reports: %s", #reports, table.concat(reports, " | "))
        if #reports > 0 then
          local first
          for _, ev in ipairs(logged) do
            if raise_on[ev.event] then first = ev; break end
          end
          check(first.event == exp.reported_event, "first raise on %s", first.event)
          local text = reports[1]
          check(text:find(exp.reported_event, 1, true) and text:find(first.request_id, 1, true)
            and text:find("logger broke on " .. exp.reported_event, 1, true), "report %s", text)
          check(not text:find(H.SECRET_KEY, 1, true) and not text:find("SECRET-PROMPT", 1, true),
            "a secret in the report: %s", text)
        end
      end)
    end
  end
end)
