-- The engine's pollable side from a hand-written event loop (its channel's
-- fd, poll and wait, engine:submit, handle:next/result/cancel), and
-- collecting engines and handles with calls in flight.

local H = require("helpers")
local llm = require("llmretry")
local check = H.check

local function opts(scen, extra)
  return H.merge(H.FAST, { body = H.secret_body(scen.name), base_url = scen.url,
    api_key = H.SECRET_KEY }, extra)
end

-- Drain one handle: events into `events`; true once done.
local function drain(h, events)
  while true do
    local kind, v = h:next()
    if kind == nil then return false end
    if kind == "done" then return true end
    if kind == "event" then events[#events + 1] = v end
    if kind == "validate" then h:validated(true) end
  end
end

-- A loop over many handles, the way an event loop would use the engine.
local function run_all(engine, handles, timeout_ms)
  local pending, events, polls, wakeups = {}, {}, 0, 0
  for _, h in ipairs(handles) do
    pending[h] = true
    events[h] = {}
  end
  local left = #handles
  local deadline = H.now_ms() + (timeout_ms or 10000)
  local news = engine:channel()
  while left > 0 do
    check(H.now_ms() < deadline, "the loop did not finish in time (%d calls left)", left)
    if news:wait(200) then wakeups = wakeups + 1 end
    local hs = news:poll()
    polls = polls + 1
    for _, h in ipairs(hs) do
      check(events[h], "poll returned a handle that is not ours: %s", tostring(h))
      if pending[h] and drain(h, events[h]) then
        pending[h] = nil
        left = left - 1
      end
    end
  end
  return events, polls, wakeups
end

describe("engine", function()
  local mock

  setup(function() mock = H.start_mock() end)
  teardown(function() if mock then mock:stop() end end)

  it("exposes a readable fd and runs calls from a hand-written loop", function()
    local scen = mock:scen("hand_loop")
    scen.script({ { status = 503 } }, { delay_ms = 100 })
    local engine = llm.new_engine()
    local fd = engine:channel():fd()
    check(H.is_int(fd) and fd >= 0, "fd %s", H.dump(fd))
    local handles = {}
    for i = 1, 5 do
      handles[i] = engine:submit(opts(scen, { request_id = "hand-" .. i }))
      check(handles[i]:request_id() == "hand-" .. i, "request_id")
      check(handles[i]:done() == false, "done before the call ran")
    end
    local t0 = H.now_ms()
    local events = run_all(engine, handles)
    check(H.now_ms() - t0 < 3000, "5 calls of ~100 ms took %.0f ms", H.now_ms() - t0)
    local retried = 0
    for i, h in ipairs(handles) do
      check(h:done(), "not done")
      local res, err = h:result()
      check(res, "call %d failed: %s", i, tostring(err))
      check(res.meta.request_id == "hand-" .. i, "request_id %s", res.meta.request_id)
      H.check_event_sequence(events[h], res.meta.attempts, "hand-" .. i)
      retried = retried + (res.meta.attempts - 1)
      -- result() is stable: the same tables each time
      check(h:result() == res, "result() built a new table")
      check(h:next() == "done", "done does not repeat")
    end
    check(retried == 1, "%d retries (one 503 in the script)", retried)
    engine:close()
  end)

  it("result() of a failed call is the same error table each time, kept while the handle lives", function()
    local scen = mock:scen("stable_error")
    scen.script({ { status = 400 } })
    local engine = llm.new_engine()
    local h = engine:submit(opts(scen, { event_mask = 0 }))
    run_all(engine, { h })
    local res, err = h:result()
    check(res == nil and type(err) == "table", "a 400 gave %s, %s", tostring(res), tostring(err))
    collectgarbage()
    collectgarbage()
    local res2, err2 = h:result()
    check(res2 == nil and err2 == err, "result() built a new error table (%s)", tostring(err2))
    -- the cached error goes with its handle
    local weak = setmetatable({ err }, { __mode = "v" })
    err, err2, h = nil, nil, nil
    collectgarbage()
    collectgarbage()
    check(weak[1] == nil, "the error table outlived its handle")
    engine:close()
  end)

  it("polls without blocking and waits with a timeout", function()
    local scen = mock:scen("poll_nonblocking")
    scen.script({ { delay_ms = 600 } })
    local engine = llm.new_engine()
    local news = engine:channel()
    check(news:fd() == engine:channel():fd(), "the engine has one channel")
    local h = engine:submit(opts(scen, { event_mask = 0 }))
    local t0 = H.now_ms()
    local hs = news:poll()
    check(H.now_ms() - t0 < 50, "poll blocked for %.0f ms", H.now_ms() - t0)
    check(#hs == 0, "news before the answer: %d", #hs)
    t0 = H.now_ms()
    local ready = news:wait(150)
    local waited = H.now_ms() - t0
    check(ready == false, "wait said ready with nothing to report")
    check(waited >= 120 and waited < 500, "wait(150) took %.0f ms", waited)
    check(news:wait(3000) == true, "no news within 3 s")
    hs = news:poll()
    check(#hs == 1 and hs[1] == h, "poll returned %s", H.dump(hs))
    check(drain(h, {}), "not done after news")
    local res = h:result()
    check(res and res.meta.status == 200, "result")
    check(#news:poll() == 0, "the same news twice")
    -- Drained: the fd is quiet again (event loops watch it level-triggered).
    check(news:wait(0) == false, "the fd stays readable with nothing to report")
    engine:close()
  end)

  it("raises on result() before the call is done", function()
    local scen = mock:scen("not_done")
    scen.script({ { delay_ms = 300 } })
    local engine = llm.new_engine()
    local h = engine:submit(opts(scen))
    local e = H.raises(h.result, h)
    check(e:find("not finished", 1, true), "message %s", e)
    h:cancel()
    engine:close()
  end)

  it("cancels a call in flight at once", function()
    local scen = mock:scen("cancel_flight")
    scen.script({ { delay_ms = 5000 } })
    local engine = llm.new_engine()
    local h = engine:submit(opts(scen))
    scen.wait_requests(1, 3000)
    local t0 = H.now_ms()
    h:cancel()
    local events = {}
    local news = engine:channel()
    while not drain(h, events) do
      check(news:wait(1000) or h:wait(0), "no news after cancel")
      news:poll()
    end
    check(H.now_ms() - t0 < 1000, "cancel took %.0f ms", H.now_ms() - t0)
    local res, err = h:result()
    check(res == nil, "a cancelled call succeeded")
    H.check_error(err, "cancelled", { reason = "cancelled", attempts = 1 })
    check(events[#events].event == "llm_request_gave_up" and events[#events].reason == "cancelled",
      "last event %s", H.dump(events[#events]))
    engine:close()
  end)

  it("cancels a call waiting out a long Retry-After", function()
    local scen = mock:scen("cancel_backoff")
    scen.script({ { status = 503, retry_after = "30" } })
    local engine = llm.new_engine()
    local h = engine:submit(opts(scen))
    local events = {}
    -- Wait for the retry to be scheduled, then cancel.
    local t_end = H.now_ms() + 5000
    while H.now_ms() < t_end do
      h:wait(100)
      drain(h, events)
      if events[#events] and events[#events].event == "llm_retry_scheduled" then break end
    end
    check(events[#events].event == "llm_retry_scheduled", "no retry scheduled: %s",
      H.dump(events))
    local t0 = H.now_ms()
    h:cancel()
    while not drain(h, events) do h:wait(100) end
    check(H.now_ms() - t0 < 1000, "cancel took %.0f ms", H.now_ms() - t0)
    local _, err = h:result()
    H.check_error(err, "cancelled", { reason = "cancelled", attempts = 1 })
    check(#scen.requests() == 1, "retried after cancel")
    engine:close()
  end)

  it("answers validation requests through the mailbox", function()
    local scen = mock:scen("mailbox_validate")
    scen.script({ { content = "first" }, { content = "second" } })
    local engine = llm.new_engine()
    local h = engine:submit(opts(scen, { validate = true }))
    local bodies = {}
    while true do
      local kind, v = h:next()
      if kind == "done" then break end
      if kind == "validate" then
        check(type(v) == "string", "validate gives the raw body")
        bodies[#bodies + 1] = v
        local content = llm.decode(v).choices[1].message.content
        if content == "first" then h:validated(false, "not the first") else h:validated(true) end
      elseif kind == nil then
        h:wait(100)
      end
    end
    local res = h:result()
    check(res and res.data.choices[1].message.content == "second", "result %s", H.dump(res))
    check(#bodies == 2, "%d validations", #bodies)
    local e = H.raises(h.validated, h, true)
    check(e:find("no validation is pending", 1, true), "message %s", e)
    engine:close()
  end)

  it("closes with calls in flight: they end cancelled, close is idempotent", function()
    local scen = mock:scen("close_flight")
    scen.script({}, { delay_ms = 3000 })
    local engine = llm.new_engine()
    local hs = {}
    for i = 1, 3 do hs[i] = engine:submit(opts(scen)) end
    local news = engine:channel()
    scen.wait_requests(3, 3000)
    local t0 = H.now_ms()
    engine:close()
    check(H.now_ms() - t0 < 1500, "close took %.0f ms", H.now_ms() - t0)
    engine:close()
    for _, h in ipairs(hs) do
      local spins = 0
      while not drain(h, {}) do
        spins = spins + 1
        check(spins < 50, "a call of a closed engine never finishes")
        h:wait(100)
      end
      local _, err = h:result()
      check(err and err.kind == "cancelled", "result after close: %s", H.dump(err))
    end
    check(#news:poll() == 0, "poll on a closed engine's channel")
    check(news:wait(10) == false, "wait on a closed engine's channel")
    check(tostring(news):find("closed", 1, true), "tostring %s", tostring(news))
    local ce = H.raises(news.fd, news)
    check(ce:find("channel is closed", 1, true), "message %s", ce)
    check(tostring(engine):find("closed", 1, true), "tostring %s", tostring(engine))
    local e = H.raises(engine.submit, engine, opts(scen))
    check(e:find("engine is closed", 1, true), "message %s", e)
    e = H.raises(engine.channel, engine)
    check(e:find("engine is closed", 1, true), "message %s", e)
  end)

  it("is collected safely with calls in flight", function()
    local scen = mock:scen("gc_flight")
    scen.script({}, { delay_ms = 3000 })
    local probe = setmetatable({}, { __mode = "v" })
    do
      local engine = llm.new_engine()
      probe.engine = engine
      for _ = 1, 5 do engine:submit(opts(scen)) end -- handles dropped at once
      local keep = {}
      for i = 1, 5 do keep[i] = engine:submit(opts(scen)) end
      probe.handle = keep[1]
      scen.wait_requests(10, 3000)
      engine, keep = nil, nil -- luacheck: ignore
    end
    local t0 = H.now_ms()
    collectgarbage()
    collectgarbage()
    check(probe.engine == nil and probe.handle == nil, "the engine or a handle was not collected")
    check(H.now_ms() - t0 < 1500, "collecting the engine waited for the calls (%.0f ms)",
      H.now_ms() - t0)
    -- Everything still works afterwards.
    local res, err = llm.call_llm(opts(mock:scen("after_gc")))
    check(res, "a call after the collection failed: %s", tostring(err))
  end)

  it("collects handles in flight while the engine lives on", function()
    local scen = mock:scen("gc_handles")
    scen.script({}, { delay_ms = 400 })
    local engine = llm.new_engine()
    for _ = 1, 10 do engine:submit(opts(scen)) end
    collectgarbage()
    collectgarbage()
    local kept = engine:submit(opts(scen))
    -- The collected handles' calls are cancelled and never reported.
    local events = run_all(engine, { kept }, 5000)
    check(kept:done() and kept:result(), "the kept call failed")
    check(#events[kept] >= 2, "events of the kept call")
    H.sleep_ms(100)   -- a look for news that must not come: only time can show it
    check(#engine:channel():poll() == 0, "news of collected handles")
    engine:close()
  end)

  it("outlives its handles and engines in any collection order", function()
    local scen = mock:scen("gc_order")
    scen.script({}, { delay_ms = 200 })
    for round = 1, 3 do
      local engine = llm.new_engine()
      local hs = {}
      for i = 1, 4 do hs[i] = engine:submit(opts(scen)) end
      if round == 1 then engine:close() end
      if round == 2 then hs = nil end -- luacheck: ignore
      engine = nil -- luacheck: ignore
      collectgarbage()
      collectgarbage()
      if hs then
        for _, h in ipairs(hs) do
          -- The engine is gone: the call reads as cancelled (or done).
          local spins = 0
          while not drain(h, {}) do
            spins = spins + 1
            check(spins < 50, "a call of a collected engine never finishes")
            h:wait(100)
          end
          check(h:done(), "not done")
        end
      end
    end
  end)

  if H.IS_54 then
    it("closes with a to-be-closed variable (5.4)", function()
      local scen = mock:scen("tbc")
      scen.script({}, { delay_ms = 2000 })
      local chunk = assert(load([[
        local llm, opts = ...
        local h
        do
          local engine <close> = llm.new_engine()
          h = engine:submit(opts)
        end
        return h
      ]]))
      local t0 = H.now_ms()
      local h = chunk(llm, opts(scen))
      check(H.now_ms() - t0 < 1500, "closing took %.0f ms", H.now_ms() - t0)
      while not drain(h, {}) do h:wait(100) end
      local _, err = h:result()
      check(err and err.kind == "cancelled", "result %s", H.dump(err))
    end)
  end

  local has_ffi = pcall(require, "ffi")
  if has_ffi then
    it("makes a new default engine in a forked child (LuaJIT ffi)", function()
      local ffi = require("ffi")
      pcall(ffi.cdef, "int fork(void); void _exit(int); int waitpid(int, int *, int);")
      local scen = mock:scen("fork")
      -- The parent's default engine exists before the fork.
      local res = llm.call_llm(opts(scen))
      check(res, "parent call failed")
      local out = os.tmpname()
      local pid = ffi.C.fork()
      if pid == 0 then
        local ok, r, err = pcall(llm.call_llm, opts(scen, { request_id = "from-child" }))
        local f = io.open(out, "w")
        f:write(ok and r and ("ok " .. r.meta.status) or ("failed " .. tostring(r or err)))
        f:close()
        ffi.C._exit(0)
      end
      check(pid > 0, "fork failed")
      local status = ffi.new("int[1]")
      ffi.C.waitpid(pid, status, 0)
      local text = H.read_file(out)
      os.remove(out)
      check(text == "ok 200", "child: %s", text)
      res = llm.call_llm(opts(scen))
      check(res, "parent call after the fork failed")
      local seen = false
      for _, r in ipairs(scen.requests()) do
        if r.headers["x-client-request-id"] == "from-child" then seen = true end
      end
      check(seen, "the child's request never reached the server")
    end)
  end

  it("runs call_llm on a caller's engine", function()
    local scen = mock:scen("call_engine")
    local engine = llm.new_engine(2)
    local res, err = llm.call_llm(opts(scen, { engine = engine }))
    check(res, "failed: %s", tostring(err))
    engine:close()
    local ok, e = pcall(llm.call_llm, opts(scen, { engine = engine }))
    check(not ok and tostring(e):find("engine is closed", 1, true), "closed engine: %s",
      tostring(e))
  end)

  it("keeps max_in_flight", function()
    local scen = mock:scen("max_in_flight")
    scen.script({}, { delay_ms = 200 })
    local engine = llm.new_engine(2)
    local hs = {}
    for i = 1, 6 do hs[i] = engine:submit(opts(scen, { event_mask = 0 })) end
    local t0 = H.now_ms()
    run_all(engine, hs, 10000)
    local wall = H.now_ms() - t0
    check(wall >= 550, "6 calls of 200 ms, 2 in flight, took only %.0f ms", wall)
    engine:close()
  end)
end)
