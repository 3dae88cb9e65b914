-- The engine's admission stage seen from Lua: map_with_concurrency's calls
-- are paced by the engine like call_many's items (a 429 naming a wait
-- pauses the pool's new starts), and a call waiting for a free slot fails
-- at its deadline.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

describe("admission", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("pauses map_with_concurrency's new starts on a 429 with Retry-After", function()
    local scen = mock:scen("pool_pause")
    -- The first request gets the 429; the one sent beside it takes 300 ms
    -- (without a pause, the next item would start when it ends); every
    -- later one succeeds at once.
    scen.script({ { status = 429, retry_after = "1" }, { delay_ms = 300 } })
    local items = {}
    for i = 1, 6 do items[i] = i end
    local results, errors = llm.map_with_concurrency(items, 2, function(_, i)
      local res, err = llm.call_llm({ body = H.secret_body("p" .. i), base_url = scen.url,
        api_key = H.SECRET_KEY, timeout_ms = 5000, base_delay_ms = 10, jitter = "none" })
      check(res, "call %d failed: %s", i, tostring(err))
      return res and res.meta.attempts
    end)
    check(next(errors) == nil, "errors %s", H.dump(errors))
    check(results.n == 6, "results.n %s", tostring(results.n))
    local recs = scen.requests()
    check(#recs == 7, "%d requests for 6 items and one retry", #recs)
    local t429
    for _, r in ipairs(recs) do
      if r.step == 0 then t429 = r.time end
    end
    check(t429, "no request got the 429")
    -- Requests sent after the 429 (other than the one already in flight
    -- beside it) wait for the server's second.
    local early = 0
    for _, r in ipairs(recs) do
      if r.time > t429 + 0.05 and r.time < t429 + 0.9 then early = early + 1 end
    end
    check(early == 0, "%d requests started during the 1 s pause", early)
  end)

  it("fails a call queued for a slot at its deadline", function()
    local slow = mock:scen("slot_slow")
    slow.script({ { delay_ms = 2000 } })
    local engine = llm.new_engine(1)
    local results = llm.map_with_concurrency({ 1, 2 }, 2, function(_, i)
      local t0 = H.now_ms()
      local res, err = llm.call_llm({ body = H.secret_body("q" .. i), base_url = slow.url,
        api_key = H.SECRET_KEY, timeout_ms = 5000, deadline_ms = i == 2 and 200 or nil })
      return { ok = res ~= nil, kind = err and err.kind, ms = H.now_ms() - t0 }
    end, { engine = engine })
    engine:close()
    check(results[1].ok, "the slow call failed: %s", H.dump(results[1]))
    check(results[2].kind == "deadline_exceeded", "queued call: %s", H.dump(results[2]))
    check(results[2].ms < 1000, "queued call with deadline 200 ms ended after %.0f ms",
      results[2].ms)
  end)

  it("caps connections per host with new_engine(max_in_flight, max_host_connections)", function()
    local scen = mock:scen("host_cap")
    scen.script({}, { delay_ms = 300 })
    local function accepted()
      local code, text = mock:http("GET", "/_mock/connections")
      check(code == 200, "connections: HTTP %s", tostring(code))
      return H.json.decode(text).accepted
    end
    local before = accepted()
    local engine = llm.new_engine(64, 2)
    local t0 = H.now_ms()
    local results, errors = llm.map_with_concurrency({ 1, 2, 3, 4, 5, 6 }, 6, function(_, i)
      local res, err = llm.call_llm({ body = H.secret_body("h" .. i), base_url = scen.url,
        api_key = H.SECRET_KEY, timeout_ms = 5000 })
      check(res, "call %d: %s", i, tostring(err))
      return true
    end, { engine = engine })
    local wall = H.now_ms() - t0
    engine:close()
    check(next(errors) == nil and results.n == 6, "errors %s", H.dump(errors))
    local conns = {}
    for _, r in ipairs(scen.requests()) do conns[r.connection] = (conns[r.connection] or 0) + 1 end
    local n = 0
    for _ in pairs(conns) do n = n + 1 end
    check(n <= 2, "the 6 calls came over %d connections for a cap of 2 (%s; %d accepted)", n,
      H.dump(conns), accepted() - before)
    check(wall >= 850, "6 calls of 300 ms over 2 connections took %.0f ms", wall)
    local ok, msg = pcall(llm.new_engine, 64, -1)
    check(not ok and tostring(msg):find("max_host_connections", 1, true), tostring(msg))
  end)

  it("runs calls on either I/O loop: new_engine(n, conns, shared, io_loop)", function()
    local scen = mock:scen("io_loop")
    scen.script({}, { delay_ms = 100 })
    for _, loop in ipairs({ "perform", "events" }) do
      local engine = llm.new_engine(64, nil, nil, loop)
      local results, errors = llm.map_with_concurrency({ 1, 2, 3, 4 }, 4, function(_, i)
        local res, err = llm.call_llm({ body = H.secret_body("l" .. i), base_url = scen.url,
          api_key = H.SECRET_KEY, timeout_ms = 5000 })
        check(res, "%s loop, call %d: %s", loop, i, tostring(err))
        return true
      end, { engine = engine })
      engine:close()
      check(next(errors) == nil and results.n == 4, "%s loop: errors %s", loop, H.dump(errors))
    end
    local ok, msg = pcall(llm.new_engine, 64, nil, nil, "epoll")
    check(not ok and tostring(msg):find("invalid option 'epoll'", 1, true), tostring(msg))
    -- "host" (no thread) is run through LuaJIT's FFI only: elsewhere its
    -- calls would wait for ever, so it is refused there.
    local ok_host, e = pcall(llm.new_engine, 8, nil, nil, "host")
    if rawget(_G, "jit") then
      check(ok_host, "io_loop host under LuaJIT: %s", tostring(e))
      e:close()
    else
      check(not ok_host and tostring(e):find('io_loop "host" is run through LuaJIT', 1, true),
        tostring(e))
    end
  end)
end)
