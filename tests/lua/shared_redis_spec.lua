-- Shared budgets through Redis seen from Lua (issue 28 item 4, docs/shared.md):
-- two engines stand for two processes, a real redis-server
-- (tests/python/redis_server.py) links them: one breaker, one rate limit;
-- an unreachable Redis leaves calls working and says so once.

local H = require("helpers")
local llm = require("llmretry")
local json = require("dkjson")
local check = H.check

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- A Python server of tests/python/ (its arguments in `args`) until :stop():
-- it prints its port first; `more` lines after it are kept in .lines.
local function start_server(args, more, why)
  local cmd = string.format("cd %s && echo $$ && exec " .. H.CLEAN_ENV
    .. "timeout -s TERM 600 python3 tests/python/%s", q(H.REPO), args)
  local p = assert(io.popen(cmd, "r"))
  local pid, port = p:read("*l"), p:read("*l")
  if not (pid and tonumber(port)) then
    p:close()
    error(why)
  end
  local lines = {}
  for i = 1, more do lines[i] = p:read("*l") end
  return { pid = tonumber(pid), port = tonumber(port), pipe = p, lines = lines,
    url = string.format("redis://127.0.0.1:%d/0", tonumber(port)),
    stop = function(self)
      if not self.pipe then return end
      os.execute("kill -TERM " .. self.pid .. " 2>/dev/null")
      self.pipe:close()
      self.pipe = nil
    end }
end

-- redis-server on a free port; a missing redis-server fails.
local function start_redis()
  return start_server("redis_server.py", 0,
    "redis-server did not start (tools/ensure-deps.sh installs it)")
end

describe("shared budgets through Redis", function()
  local mock, redis

  setup(function()
    mock = H.start_mock()
    redis = start_redis()
  end)
  teardown(function()
    if redis then redis:stop() end
    if mock then mock:stop() end
  end)

  local function base(scen, extra)
    return H.merge({ body = H.secret_body("redis"), base_url = scen.url,
      api_key = H.SECRET_KEY, timeout_ms = 5000, base_delay_ms = 10, jitter = "none" }, extra)
  end

  it("shares a breaker between engines", function()
    local scen = mock:scen("lua_redis_down")
    scen.script({}, { status = 503 })
    local a, b = llm.new_engine(nil, nil, redis.url), llm.new_engine(nil, nil, redis.url)
    local opts = { max_retries = 0, breaker_failures = 3, breaker_cooldown_ms = 60000 }
    for _ = 1, 3 do
      local _, err = llm.call_llm(base(scen, H.merge(opts, { engine = a })))
      check(err and err.status == 503, "a 503")
    end
    a:close()   -- as a process that exits: what it did reaches Redis
    local res, err = llm.call_llm(base(scen, H.merge(opts, { engine = b })))
    check(res == nil and err.kind == "circuit_open" and err.attempts == 0,
      "fails fast: " .. tostring(err))
    check(#scen.requests() == 3, "nothing sent")
    b:close()
  end)

  it("paces two engines under one limit", function()
    -- The provider's 600 a minute enforced in any second (10), both engines
    -- configured with it: through Redis they send 10 a second together.
    local scen = mock:scen("lua_redis_lim")
    local doc = H.obj({ steps = setmetatable({}, { __jsontype = "array" }),
                        limits = H.obj({ rpm = 10, window_ms = 1000 }) })
    local code = mock:http("PUT", "/_mock/scenarios/" .. scen.name, json.encode(doc))
    check(code == 204, "PUT limits: HTTP %s", tostring(code))
    -- A second for Redis to answer: on a loaded machine a 50 ms stall is an
    -- outage, which each engine rightly meets on its own budget.
    local patient = redis.url .. "?timeout_ms=1000"
    local engines = { llm.new_engine(nil, nil, patient), llm.new_engine(nil, nil, patient) }
    local items = {}
    for i = 1, 14 do items[i] = i end
    local results, errors = llm.map_with_concurrency(items, 8, function(_, i)
      local res, err = llm.call_llm(base(scen, { engine = engines[i % 2 + 1], rpm = 600,
        max_retries = 5 }))
      check(res, "call %d: %s", i, tostring(err))
      return res and res.meta.attempts
    end)
    check(next(errors) == nil and results.n == 14, "errors %s", H.dump(errors))
    local refused, recs = 0, scen.requests()
    for i, r in ipairs(recs) do
      -- No rate_limited: the mock enforced no limit, and nothing was tested.
      check(type(r.rate_limited) == "boolean", "record %d has no rate_limited", i)
      if r.rate_limited then refused = refused + 1 end
    end
    check(#recs >= 14 and refused <= 1, "%d refused of %d requests", refused, #recs)
    engines[1]:close(); engines[2]:close()
  end)

  it("works on the local budget when Redis is out of reach, saying so once", function()
    local scen = mock:scen("lua_redis_gone")
    scen.script({})
    local url = string.format("redis://:LUA-SECRET-PW@127.0.0.1:%d/0", H.closed_port())
    local e = llm.new_engine(nil, nil, url)
    local rec = H.recorder()
    for _ = 1, 3 do
      local res, err = llm.call_llm(base(scen, { engine = e, rpm = 600, logger = rec.fn }))
      check(res and res.meta.attempts == 1, "call: %s", tostring(err))
    end
    local down = rec.of("llm_shared_unavailable")
    check(#down == 1, "events %s", H.dump(rec.names()))
    H.check_event_shape(down[1])
    check(down[1].shared:find("redis://***@127.0.0.1", 1, true), "shared %s", down[1].shared)
    check(not H.dump(rec.events):find("LUA-SECRET-PW", 1, true), "the password leaked")
    e:close()
    local ok, why = pcall(llm.new_engine, nil, nil, "redis://:LUA-SECRET-PW@host:0")
    check(not ok and tostring(why):find("shared", 1, true) and
      not tostring(why):find("LUA-SECRET-PW", 1, true), "bad URL: %s", tostring(why))
  end)

  -- tests/python/fake_redis.py's servers (test_shared_hostile_store.py runs
  -- them all from Python): whatever one sends, the calls go on at once on
  -- the local budget, one event says what went wrong, and close returns.
  for _, case in ipairs({ "silent", "an array of the wrong length",
                          "a reply to a round dripped" }) do
    it("works on the local budget beside a store that is not quite Redis: " .. case, function()
      local fake = start_server("fake_redis.py " .. q(case), 1, "fake_redis.py did not start")
      local says = fake.lines[1]
      local scen = mock:scen("lua_redis_fake")
      scen.script({})
      local e = llm.new_engine(nil, nil, fake.url)
      local rec = H.recorder()
      for _ = 1, 3 do
        local res, err = llm.call_llm(base(scen, { engine = e, rpm = 600, logger = rec.fn }))
        check(res and res.meta.attempts == 1, "call: %s", tostring(err))
      end
      local started = H.now_ms()
      e:close()
      local took = H.now_ms() - started
      fake:stop()
      local down = rec.of("llm_shared_unavailable")
      check(#down == 1, "events %s", H.dump(rec.names()))
      H.check_event_shape(down[1])
      local msg = down[1].error_message
      check(msg:sub(1, #fake.url + 2) == fake.url .. ": " and msg:find(says, 1, true),
        "the event says %q, not %q", msg, says)
      check(#rec.of("llm_shared_recovered") == 0, "recovered: %s", H.dump(rec.names()))
      -- A round under way at the close is waited for, bounded by the
      -- store's timeout (50 ms); a dripped reply held it for as long as it
      -- dripped before (docs/shared.md).
      check(took < 5000, "the close took %d ms", took)
    end)
  end
end)
