-- llmretry.scheduler on its own: the coroutine pool that llmretry and
-- llmretry.nvim share, driven here by fake drivers (no engine, no I/O), so
-- that the order in which waits end is the test's to choose.

local H = require("helpers")
local scheduler = require("llmretry.scheduler")
local check = H.check

-- A driver that only records: the test wakes waiters with fire(key, ...) and
-- runs what was put off with run_later().
local function fake_driver()
  local d = { waits = {}, laters = {} }
  function d.wait(key, wake) d.waits[#d.waits + 1] = { key = key, wake = wake } end
  function d.later(fn) d.laters[#d.laters + 1] = fn end
  function d.keys()
    local out = {}
    for i, w in ipairs(d.waits) do out[i] = w.key end
    return out
  end
  function d.fire(key, ...)
    for i, w in ipairs(d.waits) do
      if w.key == key then
        table.remove(d.waits, i)
        w.wake(...)
        return
      end
    end
    error("nothing waits on " .. tostring(key), 2)
  end
  function d.run_later()
    local now = d.laters
    d.laters = {}
    for _, fn in ipairs(now) do fn() end
    return #now
  end
  return d
end

local function range(n)
  local t = {}
  for i = 1, n do t[i] = i end
  return t
end

-- A pool of instance S over items with a fake driver; counts on_finish.
local function new_pool(S, items, limit, worker, extra)
  local d = fake_driver()
  local finished = 0
  local spec = { items = items, limit = limit, worker = worker, driver = d,
    on_finish = function() finished = finished + 1 end }
  for k, v in pairs(extra or {}) do spec[k] = v end
  local p = S.pool(spec)
  return p, d, function() return finished end
end

describe("scheduler pool", function()
  it("keeps results in input order whatever order the waits end in", function()
    local S = scheduler.new("t")
    local items = { "a", "b", "c", "d", "e" }
    local p, d, finished = new_pool(S, items, 5, function(item, i)
      return item .. S.wait("k" .. i)
    end)
    p.start()
    check(H.list_eq(d.keys(), { "k1", "k2", "k3", "k4", "k5" }), "waiting on %s",
      H.list_str(d.keys()))
    for i = 5, 2, -1 do
      d.fire("k" .. i, "-" .. i)
      check(not p.done and not p.finished() and finished() == 0, "done with %d left", i - 1)
    end
    d.fire("k1", "-1")
    check(p.done and p.finished() and finished() == 1, "not done after the last wait")
    check(p.results.n == 5, "results.n %s", tostring(p.results.n))
    for i, item in ipairs(items) do
      check(p.results[i] == item .. "-" .. i, "results[%d] = %s", i, H.dump(p.results[i]))
    end
    check(p.nerrors == 0 and next(p.errors) == nil, "errors %s", H.dump(p.errors))
  end)

  it("never runs more than `limit` at once and starts the next item as one ends", function()
    local S = scheduler.new("t")
    local running, max_running, started = 0, 0, {}
    local p, d, finished = new_pool(S, range(10), 3, function(i)
      started[#started + 1] = i
      running = running + 1
      if running > max_running then max_running = running end
      S.wait(i)
      running = running - 1
      return i * i
    end)
    p.start()
    check(H.list_eq(d.keys(), { 1, 2, 3 }), "waiting on %s", H.list_str(d.keys()))
    d.fire(2)
    check(H.list_eq(d.keys(), { 1, 3, 4 }), "after item 2 ended: %s", H.list_str(d.keys()))
    while #d.waits > 0 do
      check(#d.waits <= 3, "%d waiting at once", #d.waits)
      d.fire(d.waits[#d.waits].key)
    end
    check(max_running == 3, "%d ran at once (limit 3)", max_running)
    check(H.list_eq(started, range(10)), "started %s", H.list_str(started))
    check(finished() == 1, "on_finish ran %d times", finished())
    for i = 1, 10 do check(p.results[i] == i * i, "results[%d] = %s", i, H.dump(p.results[i])) end
  end)

  it("gives a worker what its wake passed, over several waits and inside pcall", function()
    local S = scheduler.new("t")
    local got
    local p, d = new_pool(S, { "x" }, 1, function()
      local a = S.wait("first")
      local ok, b, c = pcall(S.wait, "second")
      local n = select("#", S.wait("third"))
      got = { a = a, ok = ok, b = b, c = c, n = n }
      return "end"
    end)
    p.start()
    d.fire("first", "A")
    check(H.list_eq(d.keys(), { "second" }), "waiting on %s", H.list_str(d.keys()))
    d.fire("second", "B", "C")
    check(H.list_eq(d.keys(), { "third" }), "waiting on %s", H.list_str(d.keys()))
    d.fire("third", nil, nil, nil)
    check(p.done and p.results[1] == "end", "results %s", H.dump(p.results))
    check(got.a == "A" and got.ok == true and got.b == "B" and got.c == "C" and got.n == 3,
      "the worker got %s", H.dump(got))
  end)

  it("resumes a worker once per wait, whatever calls its wake again", function()
    local S = scheduler.new("t")
    local resumed = 0
    local p, d = new_pool(S, { 1 }, 1, function()
      S.wait("a")
      resumed = resumed + 1
      S.wait("b")
      resumed = resumed + 1
      return resumed
    end)
    p.start()
    local wake = d.waits[1].wake
    wake()
    wake()
    check(resumed == 1, "a stale wake resumed the worker (%d)", resumed)
    check(H.list_eq(d.keys(), { "a", "b" }), "waits %s", H.list_str(d.keys()))
    d.fire("b")
    check(p.done and p.results[1] == 2, "results %s", H.dump(p.results))
  end)

  it("keeps what a worker raises in place; the first raise stops new starts", function()
    local S = scheduler.new("t")
    local boom = { code = "boom" }
    local started = {}
    local p, d, finished = new_pool(S, range(6), 2, function(i)
      started[#started + 1] = i
      S.wait(i)
      if i == 1 then error(boom) end
      return i
    end)
    p.start()
    d.fire(1)
    check(p.errors[1] == boom and p.first_failure == 1 and p.nerrors == 1,
      "errors %s first_failure %s", H.dump(p.errors), tostring(p.first_failure))
    check(H.list_eq(d.keys(), { 2 }), "started after the raise: %s", H.list_str(d.keys()))
    check(not p.done and finished() == 0, "done while item 2 runs")
    d.fire(2)
    check(p.done and finished() == 1, "not done")
    check(p.results[2] == 2 and p.results[1] == nil, "results %s", H.dump(p.results))
    check(H.list_eq(started, { 1, 2 }), "started %s", H.list_str(started))
  end)

  it("runs every item with return_errors, raises at start or after a wait", function()
    local S = scheduler.new("t")
    local p, d = new_pool(S, range(7), 3, function(i)
      if i == 2 then error("at once " .. i, 0) end
      S.wait(i)
      if i % 3 == 0 then error("after " .. i, 0) end
      return i * 10
    end, { return_errors = true })
    p.start()
    while #d.waits > 0 do d.fire(d.waits[1].key) end
    check(p.done, "not done")
    check(p.first_failure == nil and p.nerrors == 3, "first_failure %s nerrors %d",
      tostring(p.first_failure), p.nerrors)
    for i = 1, 7 do
      local want_err = (i == 2 and "at once 2") or (i % 3 == 0 and "after " .. i) or nil
      check(p.errors[i] == want_err, "errors[%d] = %s", i, H.dump(p.errors[i]))
      check(p.results[i] == (want_err == nil and i * 10 or nil), "results[%d] = %s", i,
        H.dump(p.results[i]))
    end
  end)

  it("does not take a yield of anything else for a wait: the worker goes on later", function()
    local S = scheduler.new("t")
    local other = scheduler.new("other")
    local counts = {}
    local p, d = new_pool(S, { 1 }, 1, function()
      counts[1] = select("#", coroutine.yield("anything"))
      -- Another instance's wait is not this pool's either.
      counts[2] = select("#", other.wait("theirs"))
      return S.wait("mine")
    end)
    p.start()
    check(#d.waits == 0 and #d.laters == 1, "%d waits, %d put off", #d.waits, #d.laters)
    check(d.run_later() == 1 and counts[1] == 0, "resumed with %s values", tostring(counts[1]))
    check(#d.waits == 0 and #d.laters == 1, "another instance's wait: %d waits, %d put off",
      #d.waits, #d.laters)
    d.run_later()
    check(counts[2] == 0, "resumed with %s values", tostring(counts[2]))
    check(H.list_eq(d.keys(), { "mine" }) and not p.done, "waits %s", H.list_str(d.keys()))
    d.fire("mine", "v")
    check(p.done and p.results[1] == "v", "results %s", H.dump(p.results))
  end)

  it("tells a worker its pool's context, and nobody else", function()
    local S, other = scheduler.new("t"), scheduler.new("other")
    local ctx = { name = "ctx" }
    local seen = {}
    local p, d = new_pool(S, { 1 }, 1, function()
      seen.mine, seen.theirs = S.current(), other.current()
      local co = coroutine.create(function() return S.current() end)
      seen.inner = select(2, coroutine.resume(co))
      S.wait("k")
      seen.after = S.current()
    end, { context = ctx })
    check(S.current() == nil, "a context outside any worker")
    p.start()
    d.fire("k")
    check(seen.mine == ctx and seen.after == ctx, "context %s / %s", H.dump(seen.mine),
      H.dump(seen.after))
    check(seen.theirs == nil, "another instance saw the context")
    check(seen.inner == nil, "a coroutine of the worker's saw the context")
    check(S.current() == nil, "a context after the pool")
  end)

  it("finishes at once on empty input, and when stopped before it starts", function()
    local S = scheduler.new("t")
    local p, _, finished = new_pool(S, {}, 2, function() error("never") end)
    check(not p.done, "done before start")
    p.start()
    check(p.done and finished() == 1 and p.results.n == 0, "empty pool not done")
    local ran = false
    local q, _, qfinished = new_pool(S, range(3), 2, function() ran = true end)
    q.stop()
    q.start()
    check(q.done and qfinished() == 1 and not ran, "a stopped pool started items")
  end)

  it("stop: no new starts, the running items finish, then on_finish", function()
    local S = scheduler.new("t")
    local p, d, finished = new_pool(S, range(5), 2, function(i) return S.wait(i) end)
    p.start()
    p.stop()
    d.fire(1, "one")
    check(H.list_eq(d.keys(), { 2 }) and not p.done, "waits %s", H.list_str(d.keys()))
    d.fire(2, "two")
    check(p.done and finished() == 1, "not done after the running items")
    check(p.results[1] == "one" and p.results[2] == "two" and p.results[3] == nil,
      "results %s", H.dump(p.results))
  end)

  it("runs a long line of workers that never wait without nesting deeper", function()
    local S = scheduler.new("t")
    local n = 100000
    local p = new_pool(S, range(n), 1, function(i) return i end)
    p.start()
    check(p.done and p.results[n] == n and p.results[1] == 1, "results[%d] = %s", n,
      H.dump(p.results[n]))
  end)
end)

describe("scheduler blocking driver", function()
  -- A fake engine: handles complete when the test says; poll() reports the
  -- handles with news; wait() says whether any came (false: a 100 ms slice
  -- without news).
  local function fake_source()
    local src = { news = {}, polls = 0, waits = 0, on_poll = nil }
    function src:poll()
      self.polls = self.polls + 1
      if self.on_poll then self.on_poll(self) end
      local out = self.news
      self.news = {}
      return out
    end
    function src:wait()
      self.waits = self.waits + 1
      if self.on_wait then self.on_wait(self) end
      return #self.news > 0
    end
    return src
  end

  -- A worker's call: wait on h until it is done (as call_llm drains a handle).
  local function worker_for(S)
    return function(h)
      local waits = 0
      while not h.done do
        S.wait(h)
        waits = waits + 1
      end
      return h.value .. "/" .. waits
    end
  end

  it("wakes the workers whose handles the source reports, results in order", function()
    local S = scheduler.new("t")
    local hs = {}
    for i = 1, 4 do hs[i] = { value = "v" .. i } end
    local src = fake_source()
    -- Each poll completes one handle, the last first; the first handle is
    -- also reported once before it is done (news that is not the end).
    local order = { 4, 3, 2, 1 }
    local k = 0
    src.on_poll = function(s)
      k = k + 1
      if k == 1 then s.news = { hs[1] } return end
      local i = order[k - 1]
      if i then
        hs[i].done = true
        s.news = { hs[i] }
      end
    end
    local d = scheduler.blocking(src)
    local p = S.pool{ items = hs, limit = 4, worker = worker_for(S), driver = d }
    p.start()
    d.run(p.finished)
    check(p.done, "not done")
    check(H.list_eq(p.results, { "v1/2", "v2/1", "v3/1", "v4/1" }), "results %s",
      H.list_str(p.results))
  end)

  it("looks at every watched handle after a slice without news", function()
    local S = scheduler.new("t")
    local h = { value = "late" }
    local src = fake_source()
    -- The source never reports h; after three empty slices it is done.
    src.on_wait = function(s) if s.waits == 3 then h.done = true end end
    local d = scheduler.blocking(src)
    local p = S.pool{ items = { h }, limit = 1, worker = worker_for(S), driver = d }
    p.start()
    d.run(p.finished)
    check(p.done and p.results[1] == "late/3", "results %s (%d waits)", H.dump(p.results),
      src.waits)
  end)

  it("resumes a worker that yielded on its own before blocking on the source", function()
    local S = scheduler.new("t")
    local src = fake_source()
    src.on_wait = function() error("waited on the source with a worker ready") end
    local d = scheduler.blocking(src)
    local p = S.pool{ items = { 1, 2 }, limit = 2, driver = d, worker = function(i)
      coroutine.yield()
      coroutine.yield("anything")
      return i
    end }
    p.start()
    d.run(p.finished)
    check(p.done and H.list_eq(p.results, { 1, 2 }), "results %s", H.dump(p.results))
  end)

  it("runs a pool nested in a worker of another", function()
    local S = scheduler.new("t")
    local outer_ctx, inner_ctx = { "outer" }, { "inner" }
    local seen = {}
    local p, d = new_pool(S, { 1, 2 }, 2, function(i)
      local hs = {}
      for j = 1, 3 do hs[j] = { value = i .. "." .. j } end
      local src = fake_source()
      local next_done = 0
      src.on_poll = function(s)
        next_done = next_done + 1
        local h = hs[4 - next_done]
        if h then
          h.done = true
          s.news = { h }
        end
      end
      local inner_d = scheduler.blocking(src)
      local inner = S.pool{ items = hs, limit = 3, driver = inner_d, context = inner_ctx,
        worker = function(h)
          seen[#seen + 1] = S.current()
          return worker_for(S)(h)
        end }
      inner.start()
      inner_d.run(inner.finished)
      seen[#seen + 1] = S.current()
      local tail = S.wait("outer" .. i)
      return table.concat(inner.results, " ") .. " " .. tail
    end, { context = outer_ctx })
    p.start()
    check(H.list_eq(d.keys(), { "outer1", "outer2" }), "outer waits %s", H.list_str(d.keys()))
    d.fire("outer2", "b")
    d.fire("outer1", "a")
    check(p.done, "outer pool not done")
    check(p.results[1] == "1.1/1 1.2/1 1.3/1 a" and p.results[2] == "2.1/1 2.2/1 2.3/1 b",
      "results %s", H.dump(p.results))
    local n_inner, n_outer = 0, 0
    for _, c in ipairs(seen) do
      if c == inner_ctx then n_inner = n_inner + 1 elseif c == outer_ctx then n_outer = n_outer + 1 end
    end
    check(n_inner == 6 and n_outer == 2, "contexts seen: %d inner, %d outer of %d", n_inner,
      n_outer, #seen)
  end)
end)

describe("scheduler detached coroutines", function()
  it("hands (WAIT, key) to a coroutine's resumer when no pool drives it", function()
    local S = scheduler.new("t")
    local co = coroutine.create(function() return "got " .. S.wait("k") end)
    local ok, token, key = coroutine.resume(co)
    check(ok and token == S.WAIT and key == "k", "yielded %s %s %s", tostring(ok),
      tostring(token), tostring(key))
    scheduler.resume_detached(co, "t: ", "it")
    check(coroutine.status(co) == "dead", "status %s", coroutine.status(co))
  end)

  it("raises what a detached coroutine raises, with its traceback", function()
    local S = scheduler.new("t")
    local function inner_failure() error("detached failure") end
    local co = coroutine.create(function()
      S.wait("k")
      inner_failure()
    end)
    coroutine.resume(co)
    local ok, e = pcall(scheduler.resume_detached, co, "prefix: ")
    check(not ok, "no raise")
    local s = tostring(e)
    check(s:find("^prefix: ") and s:find("detached failure", 1, true), "error %s", s)
    check(s:find("stack traceback", 1, true) and s:find("inner_failure", 1, true),
      "no traceback of the coroutine in %s", s)
  end)
end)
