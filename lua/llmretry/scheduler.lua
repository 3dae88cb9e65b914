-- llmretry.scheduler: the one coroutine pool behind map_with_concurrency,
-- shared by the blocking module (llmretry) and by Neovim's (llmretry.nvim).
--
-- A pool runs worker(item, i) for each item in a coroutine of its own, at
-- most `limit` at a time, and keeps what each returns (its first value) or
-- raises, by input index. A worker waits for something (a call) with
-- S.wait(key): it yields the instance's wait token and `key`; the pool hands
-- key and a one-shot `wake` to its driver, and wake(...) resumes the worker,
-- S.wait returning those values. Anything else a worker yields is not a
-- wait: the worker is resumed (with no values) on a later turn.
--
-- How to wait is the driver's, a table of two functions:
--   driver.wait(key, wake)  arrange for wake(...) to run, once, when key has news
--   driver.later(fn)        run fn on a later turn of the host's loop
-- The blocking module's driver is M.blocking(source): it waits on a
-- group's channel in a loop (M.run_loop), the group pacing the pool's calls
-- on the engine thread. Neovim's runs on the editor's main loop (a libuv
-- poll on the engine's channel's fd, vim.schedule), see llmretry/nvim.lua.
--
-- Pure Lua, no global state: each adapter makes its own instance (M.new), so
-- that its wait token and its registry of running workers are its own, and
-- one adapter never takes another's workers or waits. Lua 5.1 (LuaJIT) to 5.4.

local error, setmetatable, tostring, pairs = error, setmetatable, tostring, pairs
local co_create, co_resume, co_yield, co_status, co_running =
  coroutine.create, coroutine.resume, coroutine.yield, coroutine.status, coroutine.running
local traceback = debug.traceback

local M = {}

-- Resume a coroutine that no pool drives (any coroutine may wait for a
-- call): what it raises is raised here, prefixed by `what`, with the
-- coroutine's traceback (there is no other place to report it).
function M.resume_detached(co, what, ...)
  local ok, e = co_resume(co, ...)
  if not ok then error(traceback(co, what .. tostring(e)), 0) end
end

-- ---------------------------------------------------------------------------
-- Waiting on a channel (an engine's, a group's) in a blocking loop.

-- Run until `finished()` is true. `watch` maps a handle to the function that
-- takes its news; the source reports each handle with news once per batch.
-- `step` (optional) runs first on every turn and says whether it did work.
-- `source` is a channel (engine:channel(), group:channel()), or anything
-- with its poll() -> handles and wait(ms) -> false when nothing came: what
-- reports the watched calls' news.
function M.run_loop(source, watch, finished, step)
  while not finished() do
    local progressed = step and step() or false
    if finished() then break end
    local hs = source:poll()
    for i = 1, #hs do
      local h = hs[i]
      local fn = watch[h]
      if fn then fn(h) end
    end
    if #hs == 0 and not progressed and not finished() and not source:wait(100) then
      -- Nothing for 100 ms (or the engine was closed under us, which
      -- cancels its calls): look at every watched handle, so that no call
      -- can wait forever on a wakeup that never comes.
      local list = {}
      for h in pairs(watch) do list[#list + 1] = h end
      for i = 1, #list do
        local fn = watch[list[i]]
        if fn then fn(list[i]) end
      end
    end
  end
end

-- The blocking driver over `source`: a worker waiting on handle h is woken
-- (with no values: it reads h's mailbox itself) when the source reports h;
-- driver.run(finished) runs the loop on this thread until finished().
function M.blocking(source)
  local watch, ready = {}, {}
  local d = {}
  function d.wait(h, wake)
    watch[h] = function(hh)
      watch[hh] = nil
      wake()
    end
  end
  function d.later(fn) ready[#ready + 1] = fn end
  -- A turn first runs what was put off to it: a worker that yielded on its
  -- own lets the others have their news first.
  local function turn()
    if #ready == 0 then return false end
    local now = ready
    ready = {}
    for i = 1, #now do now[i]() end
    return true
  end
  function d.run(finished) M.run_loop(source, watch, finished, turn) end
  return d
end

-- ---------------------------------------------------------------------------
-- Instances and their pools.

function M.new(name)
  local S = {}
  -- The value a waiting worker yields, with the key it waits on.
  local WAIT = setmetatable({}, { __tostring = function() return name .. ".WAIT" end })
  S.WAIT = WAIT
  -- Running workers -> their pool (weak: a worker dropped by a pool that
  -- raised is collected).
  local pool_of = setmetatable({}, { __mode = "k" })

  -- In any coroutine: wait until woken; returns what wake(...) passed. A
  -- coroutine no pool of this instance drives returns to its resumer with
  -- (S.WAIT, key), whoever wakes it resuming it.
  function S.wait(key) return co_yield(WAIT, key) end

  -- The context of the pool whose worker is running, else nil.
  function S.current()
    local co = co_running()
    local p = co and pool_of[co]
    return p and p.context or nil
  end

  -- spec: items (an array), limit (>= 1), worker(item, i), driver,
  -- return_errors (a raise stops new starts unless true), context (what
  -- S.current() gives inside the workers), on_finish(pool) (once, when
  -- every started item has finished and none will start).
  -- The pool: start(), stop() (no new starts; the running items finish),
  -- finished(), and as they fill: results (results.n = #items), errors
  -- (index -> what that item raised), nerrors, first_failure (the index of
  -- the first raise that stopped the pool), done.
  function S.pool(spec)
    local items, limit, worker, driver = spec.items, spec.limit, spec.worker, spec.driver
    local return_errors, on_finish = spec.return_errors, spec.on_finish
    local n = #items
    local p = { results = { n = n }, errors = {}, nerrors = 0, first_failure = nil,
      done = false, context = spec.context }
    local index_of = {}        -- worker coroutine -> item index
    local active, next_i, stopped, filling = 0, 1, false, false
    local step, fill

    local function check_done()
      if not p.done and active == 0 and (stopped or next_i > n) then
        p.done = true
        if on_finish then on_finish(p) end
      end
    end

    local function finish(co, ok, value)
      local i = index_of[co]
      index_of[co], pool_of[co] = nil, nil
      active = active - 1
      if ok then
        p.results[i] = value
      else
        p.errors[i] = value
        p.nerrors = p.nerrors + 1
        if not return_errors and not p.first_failure then
          p.first_failure = i
          stopped = true
        end
      end
      fill()
      check_done()
    end

    local function waker(co)
      local used = false
      return function(...)
        if used then return end
        used = true
        step(co, ...)
      end
    end

    -- Resume `co` until it waits, yields something else, or ends.
    step = function(co, ...)
      local ok, a, b = co_resume(co, ...)
      if co_status(co) == "dead" then
        finish(co, ok, a)
      elseif a == WAIT then
        driver.wait(b, waker(co))
      else
        -- The worker yielded on its own: give the others a turn first.
        driver.later(waker(co))
      end
    end

    -- Start items up to the limit. A worker that ends at once calls fill
    -- again from finish: that inner call returns and this loop goes on, so
    -- a long run of such workers never nests deeper.
    fill = function()
      if filling then return end
      filling = true
      while not stopped and active < limit and next_i <= n do
        local i = next_i
        next_i = i + 1
        local item = items[i]
        local co = co_create(function() return (worker(item, i)) end)
        index_of[co], pool_of[co] = i, p
        active = active + 1
        step(co)
      end
      filling = false
    end

    function p.start()
      fill()
      check_done()
    end
    function p.stop() stopped = true end
    function p.finished() return p.done end
    return p
  end

  return S
end

return M
