-- llmretry.nvim inside a real headless Neovim (run by tools/host-test.sh):
--   LLMRETRY_MOCK=http://127.0.0.1:PORT nvim --headless -u NONE -i NONE \
--     --cmd "lua package.path=...; package.cpath=..." -c "luafile tests/nvim/test_nvim.lua"
-- Figures (timer ticks during a 1 s call...) are printed as "nvim figures: ...".

local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/harness.lua")
local llm = require("llmretry")
local nv = require("llmretry.nvim")
local check, test = T.check, T.test
local REPO = vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":p:h:h:h")

local figures = {}

-- A call with a callback, recording what the callback saw.
local function start_call(opts)
  local st = { done = false }
  st.t0 = T.now_ms()
  st.handle = nv.call_llm(opts, function(res, err)
    st.done, st.res, st.err = true, res, err
    st.t_done = T.now_ms()
    st.fast = vim.in_fast_event()
    -- Anything a plugin does in a callback: only allowed outside fast events.
    st.api_ok = pcall(vim.api.nvim_buf_set_lines, 0, 0, -1, false, { "answer" })
  end)
  st.t_return = T.now_ms()
  return st
end

local function recorder()
  local r = { events = {} }
  r.fn = function(ev)
    r.events[#r.events + 1] = { name = ev.event, attempt = ev.attempt, request_id = ev.request_id,
      reason = ev.reason, fast = vim.in_fast_event(), t = T.now_ms() }
  end
  function r.names()
    local out = {}
    for i, e in ipairs(r.events) do out[i] = e.name .. "#" .. e.attempt end
    return table.concat(out, " ")
  end
  return r
end

test("a 1 s call completes while a 10 ms timer keeps firing (the loop is not blocked)", function()
  T.script("slow", {}, { delay_ms = 1000 })
  local ticker = T.ticker(10)
  local rec = recorder()
  local st = start_call(T.opts("slow", { logger = rec.fn }))
  check(st.t_return - st.t0 < 100, "call_llm took %.0f ms to return", st.t_return - st.t0)
  check(T.wait_until(function() return st.done end, 5000), "no callback within 5 s")
  ticker.stop()
  check(st.res, "the call failed: %s", tostring(st.err))
  check(st.res.data.choices[1].message.content == "ok", "content %s",
    tostring(st.res.data.choices[1].message.content))
  local dur = st.t_done - st.t0
  local ticks, gap = ticker.between(st.t0, st.t_done)
  figures.call_ms, figures.ticks, figures.max_gap_ms = dur, ticks, gap
  check(dur >= 900, "a 1 s call finished in %.0f ms", dur)
  -- 10 ms ticks over ~1 s: about 100; blocking would give none.
  check(ticks >= 40, "only %d timer ticks during a %.0f ms call", ticks, dur)
  check(gap < 250, "the timer stalled for %.0f ms during the call", gap)
  check(st.fast == false, "the callback ran in a fast event")
  check(st.api_ok, "vim.api failed in the callback")
  check(rec.names() == "llm_request_started#0 llm_request_succeeded#0", "events %s", rec.names())
  for _, e in ipairs(rec.events) do check(not e.fast, "the logger ran in a fast event") end
  check(st.handle.done(), "handle.done() is false after the callback")
  check(st.handle.request_id == st.res.meta.request_id, "handle.request_id %s",
    tostring(st.handle.request_id))
end)

test("control: the same measurement sees a blocking call (llmretry.call_llm) stall the loop", function()
  T.script("slow_blocking", {}, { delay_ms = 1000 })
  local ticker = T.ticker(10)
  T.sleep(50)
  local t0 = T.now_ms()
  local res, err = llm.call_llm(T.opts("slow_blocking"))
  local t1 = T.now_ms()
  T.sleep(30)
  ticker.stop()
  check(res, "the blocking call failed: %s", tostring(err))
  local ticks = ticker.between(t0, t1)
  figures.blocking_ticks = ticks
  check(ticks <= 2, "%d ticks during a blocking call: the measurement cannot see blocking", ticks)
end)

test("a retried call delivers its events in order, then its callback, on the main loop", function()
  T.script("retried", { { status = 503 }, { status = 429, retry_after = "0.1" }, {} })
  local rec = recorder()
  local n_at_callback
  local st = start_call(T.opts("retried", { base_delay_ms = 50, logger = rec.fn }))
  local cb_st = st
  check(T.wait_until(function() return cb_st.done end, 5000), "no callback within 5 s")
  n_at_callback = #rec.events
  check(st.res, "the call failed: %s", tostring(st.err))
  check(st.res.meta.attempts == 3, "attempts %s", tostring(st.res.meta.attempts))
  local want = "llm_request_started#0 llm_request_failed#0 llm_retry_scheduled#0 "
    .. "llm_request_started#1 llm_request_failed#1 llm_retry_scheduled#1 "
    .. "llm_request_started#2 llm_request_succeeded#2"
  check(rec.names() == want, "events\n  %s\nexpected\n  %s", rec.names(), want)
  check(n_at_callback == 8, "%d events when the callback ran", n_at_callback)
  for i, e in ipairs(rec.events) do
    check(not e.fast, "event %d delivered in a fast event", i)
    check(e.request_id == st.res.meta.request_id, "event %d request_id %s", i, e.request_id)
    check(e.t <= st.t_done, "event %d after the callback", i)
  end
  check(not st.fast and st.api_ok, "the callback ran in a fast event")
  check(#T.requests("retried") == 3, "the server saw %d requests", #T.requests("retried"))
end)

test("validate runs on the main loop; a rejected answer is retried", function()
  T.script("validate", { { content = "not json" }, { content = '{"a": 1}' } })
  local calls = {}
  local st = start_call(T.opts("validate", { validate = function(data)
    calls[#calls + 1] = { fast = vim.in_fast_event(),
      api_ok = pcall(vim.api.nvim_get_current_buf) }
    return pcall(vim.json.decode, data.choices[1].message.content)
  end }))
  check(T.wait_until(function() return st.done end, 5000), "no callback within 5 s")
  check(st.res, "the call failed: %s", tostring(st.err))
  check(st.res.meta.attempts == 2, "attempts %s", tostring(st.res.meta.attempts))
  check(st.res.data.choices[1].message.content == '{"a": 1}', "content")
  check(#calls == 2, "validate ran %d times", #calls)
  for i, c in ipairs(calls) do
    check(not c.fast and c.api_ok, "validate %d ran in a fast event", i)
  end
end)

test("cancel stops a call in flight at once and frees it", function()
  collectgarbage("collect")
  collectgarbage("collect")
  local live0 = nv.stats().live_handles
  T.script("cancel_flight", {}, { delay_ms = 5000 })
  local rec = recorder()
  local st = start_call(T.opts("cancel_flight", { logger = rec.fn }))
  check(nv.stats().pending == 1 and nv.stats().watching, "stats %s", vim.inspect(nv.stats()))
  check(T.wait_until(function() return #T.requests("cancel_flight") == 1 end, 3000, 20),
    "the request did not reach the server")
  T.sleep(100)   -- a look for an end that must not come: only time can show it
  check(not st.done, "done before cancel")
  local t_cancel = T.now_ms()
  st.handle.cancel()
  check(T.wait_until(function() return st.done end, 2000), "no callback within 2 s of cancel")
  local took = st.t_done - t_cancel
  figures.cancel_ms = took
  check(took < 1000, "the callback came %.0f ms after cancel", took)
  check(st.res == nil and st.err, "a cancelled call succeeded")
  check(st.err.kind == "cancelled" and st.err.reason == "cancelled", "err %s", tostring(st.err))
  check(llm.is_error(st.err), "err is not an llmretry error")
  check(st.handle.done(), "handle.done() false")
  local last = rec.events[#rec.events]
  check(last and last.name == "llm_request_gave_up" and last.reason == "cancelled",
    "last event %s", rec.names())
  -- Freed: nothing pending, the fd no longer watched, the core handle collected.
  local s = nv.stats()
  check(s.pending == 0 and s.watching == false, "stats after cancel %s", vim.inspect(s))
  -- The caller may keep its handle: the call is freed all the same.
  collectgarbage("collect")
  collectgarbage("collect")
  s = nv.stats()
  check(s.live_handles == live0, "%d core handles still alive (%d before)", s.live_handles, live0)
  check(#T.requests("cancel_flight") == 1, "the server saw %d requests",
    #T.requests("cancel_flight"))
end)

test("cancel during a backoff wait: no attempt after it", function()
  T.script("cancel_backoff", { { status = 503 } })
  local rec = recorder()
  local st = start_call(T.opts("cancel_backoff", { base_delay_ms = 1500, logger = rec.fn }))
  check(T.wait_until(function()
    local e = rec.events[#rec.events]
    return e and e.name == "llm_retry_scheduled"
  end, 3000), "no retry scheduled: %s", rec.names())
  local t_cancel = T.now_ms()
  st.handle:cancel()   -- method syntax works too
  check(T.wait_until(function() return st.done end, 2000), "no callback after cancel")
  check(st.t_done - t_cancel < 500, "the callback came %.0f ms after cancel", st.t_done - t_cancel)
  check(st.err and st.err.kind == "cancelled", "err %s", tostring(st.err))
  T.sleep(2000)   -- past the 1.5 s backoff: a retry that must not come needs the time
  check(#T.requests("cancel_backoff") == 1, "the server saw %d requests",
    #T.requests("cancel_backoff"))
end)

test("map_with_concurrency: at most `limit` calls at once, results in order, loop free", function()
  T.script("pool", {}, { delay_ms = 300 })
  local ticker = T.ticker(10)
  local inflight, max_inflight = 0, 0
  local fast_seen = false
  local done, results, errors
  local t0 = T.now_ms()
  local h = nv.map_with_concurrency({ "a", "b", "c", "d", "e", "f" }, 3, function(word, i)
    if vim.in_fast_event() then fast_seen = true end
    inflight = inflight + 1
    max_inflight = math.max(max_inflight, inflight)
    local res, err = nv.call_llm(T.opts("pool", { body = T.body(word) }))
    inflight = inflight - 1
    if vim.in_fast_event() then fast_seen = true end
    vim.api.nvim_get_current_buf()   -- workers run outside fast events
    if not res then error(err) end
    return word .. i .. ":" .. res.data.choices[1].message.content
  end, function(r, e)
    done, results, errors = true, r, e
  end)
  check(type(h.cancel) == "function", "no cancel in the pool's handle")
  check(T.wait_until(function() return done end, 5000), "on_done did not run within 5 s")
  local t1 = T.now_ms()
  ticker.stop()
  local wall = t1 - t0
  figures.pool_ms = wall
  check(errors == nil, "errors %s", vim.inspect(errors))
  check(results.n == 6, "results.n %s", tostring(results.n))
  for i, w in ipairs({ "a", "b", "c", "d", "e", "f" }) do
    check(results[i] == w .. i .. ":ok", "results[%d] = %s", i, tostring(results[i]))
  end
  check(max_inflight == 3, "%d workers waited at once (limit 3)", max_inflight)
  check(not fast_seen, "a worker ran in a fast event")
  -- 6 calls of 300 ms, 3 at a time: two rounds.
  check(wall >= 550 and wall < 1500, "the pool took %.0f ms", wall)
  local ticks = ticker.between(t0, t1)
  check(ticks >= 20, "only %d timer ticks while the pool ran %.0f ms", ticks, wall)
end)

test("map_with_concurrency: a 429's Retry-After pauses new starts (shared vector)", function()
  -- tests/vectors/batches/pool_pause_on_retry_after.json, as C, Python and
  -- Lua run it: the engine group pacing the pool holds new starts for the
  -- server's second (before it, the Neovim pool did not pause at all).
  local here = vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h")
  local path = here .. "/../vectors/batches/pool_pause_on_retry_after.json"
  local vec = vim.fn.json_decode(table.concat(vim.fn.readfile(path), "\n"))
  local name = "nvim_" .. vec.name
  T.script(name, vec.script.steps, vec.script.after)
  local done, results, errors
  nv.map_with_concurrency(vec.items, vec.limit, function(_, i)
    local res, err = nv.call_llm(T.opts(name, vim.tbl_extend("force", vec.options,
      { body = T.body(name .. i) })))
    if not res then error(err) end
    return true
  end, function(r, e) done, results, errors = true, r, e end)
  check(T.wait_until(function() return done end, 10000), "on_done did not run within 10 s")
  check(errors == nil, "errors %s", vim.inspect(errors))
  check(results.n == #vec.items, "results.n %s", tostring(results.n))
  local recs = T.requests(name)
  check(#recs == vec.expect.requests, "%d requests, expected %d", #recs, vec.expect.requests)
  local quiet = vec.expect.quiet_after_429_ms
  local t429
  for _, r in ipairs(recs) do
    if r.step == 0 and not t429 then t429 = r.time end
  end
  check(t429 ~= nil, "no request got the 429")
  local early = 0
  for _, r in ipairs(recs) do
    if r.time > t429 + quiet[1] / 1000 and r.time < t429 + quiet[2] / 1000 then
      early = early + 1
    end
  end
  check(early == 0, "%d requests arrived during the server's wait", early)
end)

test("map_with_concurrency: a raising worker; return_errors runs every item", function()
  T.script("pool_err", {})
  local done, results, errors
  nv.map_with_concurrency({ 1, 2, 3 }, 2, function(x)
    local res = assert(nv.call_llm(T.opts("pool_err")))
    if x == 2 then error("boom " .. x, 0) end
    return x * 10 + #res.data.choices
  end, function(r, e) done, results, errors = true, r, e end, { return_errors = true })
  check(T.wait_until(function() return done end, 5000), "on_done did not run")
  check(results[1] == 11 and results[2] == nil and results[3] == 31, "results %s",
    vim.inspect(results))
  check(errors and errors[2] == "boom 2" and errors[1] == nil, "errors %s", vim.inspect(errors))

  -- Without return_errors, the first raise stops new starts.
  done = false
  local started = {}
  nv.map_with_concurrency({ 1, 2, 3, 4 }, 1, function(x)
    started[#started + 1] = x
    if x == 2 then error("stop", 0) end
    return x
  end, function(r, e) done, results, errors = true, r, e end)
  check(T.wait_until(function() return done end, 5000), "on_done did not run")
  check(#started == 2, "%d items started after a raise with limit 1", #started)
  check(results[1] == 1 and errors[2] == "stop", "results %s errors %s", vim.inspect(results),
    vim.inspect(errors))
end)

test("cancelling a pool cancels its calls; on_done still runs", function()
  T.script("pool_cancel", {}, { delay_ms = 5000 })
  local done, results
  local h = nv.map_with_concurrency({ 1, 2, 3, 4 }, 2, function(x)
    local res, err = nv.call_llm(T.opts("pool_cancel"))
    return res and "ok" or err.kind
  end, function(r) done, results = true, r end)
  check(T.wait_until(function() return #T.requests("pool_cancel") == 2 end, 3000, 20),
    "the first two calls did not reach the server")
  local t_cancel = T.now_ms()
  h.cancel()
  check(T.wait_until(function() return done end, 2000), "on_done did not run after cancel")
  check(T.now_ms() - t_cancel < 1000, "on_done came %.0f ms after cancel", T.now_ms() - t_cancel)
  check(results[1] == "cancelled" and results[2] == "cancelled", "results %s",
    vim.inspect(results))
  check(results[3] == nil and results[4] == nil, "items started after cancel: %s",
    vim.inspect(results))
  check(nv.stats().pending == 0, "calls still pending")
  check(#T.requests("pool_cancel") == 2, "the server saw %d requests", #T.requests("pool_cancel"))
end)

local function stream_text(chunks, into)
  for _, ch in ipairs(chunks) do
    for _, choice in ipairs(ch.choices or {}) do
      if type(choice.delta) == "table" and type(choice.delta.content) == "string" then
        into[#into + 1] = choice.delta.content
      end
    end
  end
end

test("stream_llm: 40 chunks over 1 s arrive in pieces on the main loop; the loop keeps ticking",
  function()
  local words = {}
  for i = 1, 40 do words[i] = "w" .. i .. " " end
  T.script("nv_stream", { { stream = { chunks = words, delay_ms = 25 } } })
  local ticker = T.ticker(10)
  local calls, pieces, fast_seen = 0, {}, false
  local done, res, err
  local t0 = T.now_ms()
  local h = nv.stream_llm(T.opts("nv_stream"), {
    on_chunk = function(chunks)
      calls = calls + 1
      if vim.in_fast_event() then fast_seen = true end
      stream_text(chunks, pieces)
      vim.api.nvim_buf_set_lines(0, 0, -1, false, { table.concat(pieces) })
    end,
    on_done = function(r, e) done, res, err = true, r, e end })
  local returned_ms = T.now_ms() - t0
  check(T.wait_until(function() return done end, 5000), "on_done did not run within 5 s")
  local t1 = T.now_ms()
  ticker.stop()
  check(res, "failed: %s", tostring(err))
  check(table.concat(pieces) == table.concat(words), "text %q", table.concat(pieces))
  check(res.data.choices[1].message.content == table.concat(words), "assembled %s",
    tostring(res.data.choices[1].message.content))
  check(vim.api.nvim_buf_get_lines(0, 0, 1, false)[1] == table.concat(words), "buffer")
  check(calls >= 10, "only %d on_chunk calls for a 1 s stream (pieces expected)", calls)
  check(not fast_seen, "on_chunk ran in a fast event")
  check(returned_ms < 100, "stream_llm took %.0f ms to return", returned_ms)
  local ticks = ticker.between(t0, t1)
  check(ticks >= 50, "only %d timer ticks during the stream", ticks)
  figures.stream_on_chunk_calls, figures.stream_ticks = calls, ticks
  check(type(h.cancel) == "function" and h.done(), "handle")
end)

test("stream_llm: 3,000 chunks sent at once arrive whole, coalesced, the editor responsive",
  function()
  T.script("nv_burst", { { stream = { chunks = 3000 }, content = string.rep("ab", 3000) } })
  local ticker = T.ticker(10)
  local calls, pieces, done, res, err = 0, {}, false, nil, nil
  local t0 = T.now_ms()
  nv.stream_llm(T.opts("nv_burst"), {
    on_chunk = function(chunks) calls = calls + 1; stream_text(chunks, pieces) end,
    on_done = function(r, e) done, res, err = true, r, e end })
  check(T.wait_until(function() return done end, 10000), "on_done did not run within 10 s")
  local t1 = T.now_ms()
  ticker.stop()
  check(res, "failed: %s", tostring(err))
  check(table.concat(pieces) == string.rep("ab", 3000), "the text arrived changed (%d bytes)",
    #table.concat(pieces))
  check(calls < 3000, "%d on_chunk calls: the chunks were not coalesced", calls)
  figures.burst_on_chunk_calls, figures.burst_ms = calls, t1 - t0
  -- Responsive: the 10 ms timer was not starved while 3,000 chunks came in.
  local ticks = ticker.between(t0, t1)
  check(ticks >= math.floor((t1 - t0) / 10 / 3), "%d ticks in %.0f ms", ticks, t1 - t0)
end)

test("stream_llm: cancel mid-stream ends it at once and frees it", function()
  T.script("nv_cancel", { { stream = { chunks = 100, delay_ms = 30 } } })
  local got, done, res, err = 0, false, nil, nil
  local h
  h = nv.stream_llm(T.opts("nv_cancel"), {
    on_chunk = function(chunks)
      got = got + #chunks
      if got >= 3 then h.cancel() end
    end,
    on_done = function(r, e) done, res, err = true, r, e end })
  check(T.wait_until(function() return done end, 3000), "on_done did not run after cancel")
  check(res == nil and err and err.kind == "cancelled", "err %s", tostring(err))
  check(got < 100, "all %d chunks arrived despite the cancel", got)
  check(T.wait_until(function()
    local recs = T.requests("nv_cancel")
    return recs[1] and recs[1].client_gone == true
  end, 2000), "the server never saw the stream closed")
  collectgarbage()
  collectgarbage()
  check(T.wait_until(function() return nv.stats().pending == 0 end, 1000), "still pending")
end)

test("stream_llm inside a map_with_concurrency worker waits like call_llm", function()
  T.script("nv_stream_pool", {}, { stream = { chunks = { "x", "y" }, delay_ms = 50 } })
  local done, results, errors
  nv.map_with_concurrency({ 1, 2, 3 }, 3, function(i)
    local seen = {}
    local res, err = nv.stream_llm(T.opts("nv_stream_pool", { body = T.body("p" .. i) }),
      function(ch) stream_text({ ch }, seen) end)
    if not res then error(err) end
    return table.concat(seen) .. "/" .. res.data.choices[1].message.content
  end, function(r, e) done, results, errors = true, r, e end)
  check(T.wait_until(function() return done end, 5000), "on_done did not run")
  check(errors == nil, "errors %s", vim.inspect(errors))
  for i = 1, 3 do check(results[i] == "xy/xy", "results[%d] = %s", i, tostring(results[i])) end
end)

test("a coroutine can wait for a call; misuse raises at once, before any I/O", function()
  T.script("co_wait", {})
  local got
  coroutine.wrap(function()
    local res, err = nv.call_llm(T.opts("co_wait"))
    got = res and res.data.choices[1].message.content or tostring(err)
  end)()
  check(T.wait_until(function() return got ~= nil end, 5000), "the coroutine was not resumed")
  check(got == "ok", "got %s", tostring(got))

  T.script("misuse", {})
  local function raises(f, pat)
    local ok, e = pcall(f)
    check(not ok, "no error (expected %s)", pat)
    check(tostring(e):find(pat, 1, true), "error %q lacks %q", tostring(e), pat)
  end
  raises(function() nv.call_llm("x", function() end) end, "opts must be a table")
  raises(function() nv.call_llm(T.opts("misuse"), 42) end, "callback must be a function")
  -- Without a callback, outside any coroutine (a scheduled callback runs on the main thread).
  local outside
  vim.schedule(function() outside = { pcall(nv.call_llm, T.opts("misuse")) } end)
  check(T.wait_until(function() return outside ~= nil end, 2000), "the scheduled check did not run")
  check(outside[1] == false and tostring(outside[2]):find("callback must be a function", 1, true),
    "call_llm without a callback outside a coroutine: %s", tostring(outside[2]))
  raises(function() nv.call_llm(T.opts("misuse", { colour = 1 }), function() end) end, "colour")
  raises(function() nv.call_llm(T.opts("misuse", { logger = 1 }), function() end) end,
    "logger must be")
  raises(function() nv.map_with_concurrency({}, 0, function() end, function() end) end,
    "limit must be an integer >= 1")
  raises(function() nv.map_with_concurrency({}, 1, function() end) end, "on_done must be")
  T.sleep(100)   -- a look for requests that must not come: only time can show it
  check(#T.requests("misuse") == 0, "a bad call reached the server")
  check(nv.stats().pending == 0, "a bad call is pending")
end)

-- tests/vectors/lua_misuse/: the cases busted runs on llmretry and nginx on
-- llmretry.openresty, here on llmretry.nvim's coroutine forms (a test runs in
-- a coroutine): the same bad argument, the same message, at the caller.
test("the misuse vectors: the same messages as in the other Lua hosts", function()
  T.script("misuse_vectors", {})
  local f = assert(io.open(REPO .. "/tests/vectors/lua_misuse/cases.json", "rb"))
  local doc = llm.decode(f:read("*a"))
  f:close()
  local vectors = dofile(REPO .. "/tests/lua/misuse_vectors.lua")
  local ran, failures = vectors.run(doc, "nvim", nv, function() return T.opts("misuse_vectors") end,
    function(name, args)
      -- Neovim's map_with_concurrency(items, limit, worker, on_done [, opts]).
      if name == "map_with_concurrency" then
        args[5], args[4], args.n = args[4], function() end, 5
      end
    end)
  check(#failures == 0, "%d of %d cases failed:\n%s", #failures, ran, table.concat(failures, "\n"))
  check(ran >= 20, "only %d cases ran", ran)
  T.sleep(100)
  check(#T.requests("misuse_vectors") == 0, "a misused call reached the server")
  check(nv.stats().pending == 0, "a misused call is pending")
end)

test("a callback that raises is reported by Neovim and the next call still works", function()
  T.script("raiser", {})
  vim.v.errmsg = ""
  local ran = false
  nv.call_llm(T.opts("raiser"), function()
    ran = true
    error("callback failure (expected by the test)")
  end)
  -- Never inside call_llm, even for a call that has already ended.
  check(not ran, "the callback ran inside call_llm")
  check(T.wait_until(function()
    return vim.v.errmsg:find("callback failure (expected by the test)", 1, true)
  end, 10000), "v:errmsg %q", vim.v.errmsg)
  check(nv.stats().pending == 0, "still pending")
  local st = start_call(T.opts("raiser"))
  check(T.wait_until(function() return st.done end, 5000), "the next call did not finish")
  check(st.res, "the next call failed: %s", tostring(st.err))
end)

test("a logger that raises: one notification for the call, which still succeeds", function()
  T.script("badlog", { { status = 503 }, {} })
  local notes, notify = {}, vim.notify
  vim.notify = function(msg, level) notes[#notes + 1] = { msg = msg, level = level } end
  local calls = 0
  local ok_run, err_run = pcall(function()
    local st = start_call(T.opts("badlog", { base_delay_ms = 10, logger = function()
      calls = calls + 1
      error("logger failure (expected by the test)")
    end }))
    check(T.wait_until(function() return st.done end, 5000), "no callback within 5 s")
    T.wait_until(function() return #notes >= 1 end, 10000)   -- the notification is scheduled
    check(st.res, "the call failed: %s", tostring(st.err))
    check(st.res.meta.attempts == 2, "attempts %s", tostring(st.res.meta.attempts))
    check(calls >= 4, "the logger ran %d times (every event goes to it)", calls)
    check(#notes == 1, "%d notifications: %s", #notes, vim.inspect(notes))
    local msg = notes[1] and notes[1].msg or ""
    check(msg:find("logger failure (expected by the test)", 1, true)
      and msg:find(st.res.meta.request_id, 1, true), "notification %q", msg)
  end)
  vim.notify = notify
  if not ok_run then error(err_run, 0) end
end)

test("an idle session watches nothing", function()
  -- The last test's call ends its watch on the loop, soon after.
  T.wait_until(function() return not nv.stats().watching end, 10000)
  local s = nv.stats()
  check(s.pending == 0 and s.watching == false and s.engine, "stats %s", vim.inspect(s))
end)

-- Figures, printed before the summary line.
T.on_finish(function()
  local parts = {}
  for _, k in ipairs({ "call_ms", "ticks", "max_gap_ms", "blocking_ticks", "cancel_ms",
    "pool_ms", "stream_on_chunk_calls", "stream_ticks", "burst_on_chunk_calls", "burst_ms" }) do
    if figures[k] then parts[#parts + 1] = string.format("%s=%.0f", k, figures[k]) end
  end
  T.out("nvim figures: %s", table.concat(parts, ", "))
end)

T.run(120000)
