-- llmretry.nvim: LLM calls for Neovim plugins that never block the editor.
--
--   local llm = require("llmretry.nvim")
--   local call = llm.call_llm({ body = body, deadline_ms = 30000 }, function(res, err)
--     -- runs on the main loop (not in a fast event): every vim.api call is allowed
--   end)
--   call.cancel()        -- at any moment; the callback then gets err.kind == "cancelled"
--
-- How it works. The calls are llmretry.api's; this file wires Neovim's
-- waiting to them. One engine per Neovim session (made on the first call,
-- kept in an upvalue of this chunk) does all the network I/O on its own
-- thread. Its channel's fd is watched by one libuv poll handle (vim.uv, or
-- vim.loop before Neovim 0.10): when it is readable, the poll callback takes
-- the calls with news from the channel. That callback runs in a "fast"
-- context, where most of vim.api is forbidden, so nothing of the caller's
-- runs there: it schedules each such call's reader (vim.schedule), which
-- reads the call's mailbox on the main loop (llmretry.mailbox, as every
-- host does). The fd is watched only while calls are pending, so an idle
-- session holds no active handle; the engine is closed on VimLeavePre,
-- cancelling what is in flight.
--
-- Callbacks, loggers and validators run in scheduled callbacks; a callback
-- that raises shows as a Neovim error message, as any scheduled callback's
-- would. Each call's callback runs exactly once: with (res) or (nil, err),
-- err being an llmretry error table (tostring(err) reads well).
--
-- map_with_concurrency(items, limit, worker, on_done [, opts]) runs
-- worker(item, i) in coroutines, at most `limit` at a time, on the main
-- loop. Inside a worker, call_llm(opts) without a callback waits for its
-- call by yielding the worker's coroutine (the editor goes on meanwhile) and
-- returns res or nil, err. The worker's return value is the item's result;
-- what it raises is the item's error. on_done(results, errors) runs once
-- every item has finished: results in input order (results.n = #items),
-- errors nil when no worker raised, else a table index -> what it raised.
-- As in llmretry.map_with_concurrency, the first raise stops new starts
-- (the running items finish) unless opts.return_errors is true.
--
-- stream_llm(opts, { on_chunk = fn, on_done = fn }) streams: on_chunk gets
-- a table of the chunks that came within one loop turn (coalesced), on_done
-- the assembled result; inside a worker stream_llm(opts, on_chunk) waits.
--
-- Any coroutine that nothing else resumes may wait the same way:
--   coroutine.wrap(function() local res, err = llm.call_llm(opts) ... end)()

local core = require("llmretry.core")

local type, pairs, ipairs, tostring, error, pcall = type, pairs, ipairs, tostring, error, pcall
local setmetatable = setmetatable
local string = string
local co_running = coroutine.running
local scheduler = require("llmretry.scheduler")

local vim = vim
local uv = vim.uv or vim.loop

local M = {}

M.VERSION = core.VERSION
M.null = core.null
M.array_mt = core.array_mt
M.empty_array = core.empty_array
M.error_mt = core.error_mt

local args = require("llmretry.args")
local api = require("llmretry.api")
local drain = require("llmretry.mailbox").drain
local argerror, is_callable = args.argerror, args.is_callable

-- ---------------------------------------------------------------------------
-- The session's engine and the poll handle on its fd.

local engine = nil          -- made on the first call
local news = nil            -- the engine's channel, where its calls report
local watcher = nil         -- uv poll handle on news:fd()
local watching = false
local pending = {}          -- core handle -> its call record, until the call has ended
local npending = 0
local live = setmetatable({}, { __mode = "k" })   -- core handles not yet collected (stats)

local function notify(msg, level)
  vim.schedule(function()
    vim.notify(msg, level or vim.log.levels.WARN)
  end)
end

-- A logger's first error in a call, as a notification (the editor's
-- stderr is not where a plugin's user looks); mailbox.log's rule otherwise.
local function report_by_notify(ev, e)
  notify(string.format("llmretry: the logger raised on %s (request_id=%s): %s; the call "
    .. "goes on (later logger errors of this call are not reported)",
    tostring(ev.event), tostring(ev.request_id), tostring(e)))
end

local function close_engine()
  if watcher then
    if watching then watcher:stop() end
    if not watcher:is_closing() then watcher:close() end
  end
  watcher, watching = nil, false
  if engine then engine:close() end
  engine, news = nil, nil
  pending, npending = {}, 0
end

local function register_exit()
  local function add()
    vim.api.nvim_create_autocmd("VimLeavePre", {
      group = vim.api.nvim_create_augroup("llmretry_nvim", { clear = true }),
      callback = function() close_engine() end,
      desc = "llmretry: cancel the calls in flight and stop the engine's thread",
    })
  end
  if vim.in_fast_event() then vim.schedule(add) else add() end
end

local on_readable -- defined below

local function get_engine()
  if engine == nil then
    local e = core.new_engine()
    local ch = e:channel()
    local w, err = uv.new_poll(ch:fd())
    if not w then
      e:close()
      error("llmretry: cannot watch the engine's channel: " .. tostring(err), 0)
    end
    engine, news, watcher, watching = e, ch, w, false
    register_exit()
  end
  return engine
end

-- ---------------------------------------------------------------------------
-- News, from the poll callback to the main loop.
--
-- A call's record: h (until its end), wake (what runs on the main loop at
-- its next news, once: a waiting coroutine's resume, or a callback call's
-- next reading), queued, pool. The poll callback runs in a fast context
-- where little of vim.api is allowed: it only takes the calls with news from
-- the channel and schedules their wake; the mailbox is read on the main
-- loop (llmretry.mailbox.drain), where loggers, validators, on_chunk and
-- callbacks may use all of vim.api.

local function run_wake(rec)
  rec.queued = false
  local wake = rec.wake
  if wake then
    rec.wake = nil
    wake()
  end
end

local function poll_engine()
  local hs = news:poll()
  for i = 1, #hs do
    local rec = pending[hs[i]]
    if rec and not rec.queued then
      rec.queued = true
      vim.schedule(rec.run_wake)
    end
  end
end

on_readable = function(err)
  if engine == nil then return end
  if err then
    notify("llmretry: watching the engine's fd failed: " .. tostring(err), vim.log.levels.ERROR)
  end
  local ok, e = pcall(poll_engine)
  if not ok then
    notify("llmretry: " .. tostring(e), vim.log.levels.ERROR)
  end
end

-- The call of rec has ended: forget it, and stop watching when nothing is
-- pending, so that an idle session has no active handle (Neovim can exit);
-- the next call starts it again.
local function release(h, rec)
  if pending[h] == rec then
    pending[h] = nil
    npending = npending - 1
  end
  rec.h, rec.wake = nil, nil
  if rec.pool then rec.pool.calls[h] = nil end
  if npending == 0 and watching then
    watcher:stop()
    watching = false
  end
end

-- The pools' driver is the main loop: a worker waiting on a handle is woken
-- at the handle's news, and one that yields on its own is resumed by
-- vim.schedule.
local driver = {
  wait = function(h, wake)
    local rec = pending[h]
    if rec then rec.wake = wake else vim.schedule(wake) end
  end,
  later = function(fn) vim.schedule(fn) end,
}

-- This module's calls (llmretry.api): on the session's engine; a waiting
-- coroutine yields, resumed from the main loop at its call's news.
local A
A = api.new{
  name = "llmretry.nvim",
  refused = {
    { "engine", "llmretry: engine is not an option of llmretry.nvim (it runs every call on the "
      .. "session's engine)" },
  },
  report = report_by_notify,
  check = function(level)
    local co, is_main = co_running()
    if co == nil or is_main then
      error("llmretry: callback must be a function (got nil); call without one only from a "
        .. "coroutine (a map_with_concurrency worker)", level + 1)
    end
  end,
  submit = function(sub, _, pool, level)
    -- The pool's group paces its calls on the engine thread: a 429 naming
    -- a wait pauses the pool's new starts, as in llmretry's.
    if pool and sub.group == nil then sub.group = pool.group end
    local e = get_engine()
    local h = api.submit(e, sub, level + 1)
    local rec = { h = h, queued = false, pool = pool }
    rec.run_wake = function() run_wake(rec) end
    pending[h] = rec
    npending = npending + 1
    live[h] = true
    if not watching then
      watcher:start("r", on_readable)
      watching = true
    end
    if pool then
      pool.calls[h] = true
      -- A cancelled pool's later calls end at once, as cancelled.
      if pool.cancelled then h:cancel() end
    end
    return h, rec
  end,
  -- A pool's worker is resumed by its pool (driver.wait); any other
  -- coroutine by this module, which raises what it raises.
  wait = function(h, rec)
    if not rec.pool then
      local co = co_running()
      rec.wake = function()
        scheduler.resume_detached(co, "llmretry.nvim: a coroutine waiting for a call raised: ")
      end
    end
    A.sched.wait(h)
  end,
  release = release,

  map_options = { return_errors = true, logger = true },
  map_on_done = true,
  map = function(items, limit, worker, opts, on_done)
    -- One engine group paces the pool (its calls still report to the one
    -- engine fd the session watches: poll = false).
    local group = get_engine():group{ limit = limit, adaptive = true, poll = false }
    local ctx = { calls = {}, cancelled = false, logger = opts.logger or nil, group = group }
    local pool = A.sched.pool{ items = items, limit = limit, worker = worker, driver = driver,
      return_errors = opts.return_errors, context = ctx,
      on_finish = function(p)
        group:close()
        vim.schedule(function() on_done(p.results, p.nerrors > 0 and p.errors or nil) end)
      end }
    -- Workers start on the main loop, after this returns.
    vim.schedule(pool.start)
    local handle = {}
    function handle.cancel()
      pool.stop()
      ctx.cancelled = true
      local hs = {}
      for h in pairs(ctx.calls) do hs[#hs + 1] = h end
      for _, h in ipairs(hs) do h:cancel() end
    end
    function handle.done() return pool.done end
    return handle
  end,
}

-- A call with a callback: started now, its mailbox read on the main loop at
-- each news, complete(res, err) run there once it has ended. Returns the
-- handle the caller gets.
local function start_with_callback(opts, level, on_chunk, complete)
  local h, ctx, rec = A.start(opts, level + 1, on_chunk, nil)
  -- A stream's on_chunk gets the chunks read together, as one list.
  ctx.coalesce = true
  local finished = false
  local function step()
    local hh = rec.h
    if not drain(hh, ctx) then
      rec.wake = step
      return
    end
    release(hh, rec)
    finished = true
    if ctx.chunk_error ~= nil then return complete(nil, ctx.chunk_error) end
    complete(hh:result())
  end
  -- The first reading waits for the main loop too: a call that has already
  -- ended (a fast answer, an early failure) must not run its callback inside
  -- call_llm, where a raising callback would raise at the caller instead of
  -- being reported by Neovim. Mail that comes before it is read then.
  vim.schedule(step)
  local handle = { request_id = h:request_id() }
  function handle.cancel() if rec.h then rec.h:cancel() end end
  function handle.done() return finished end
  return handle
end

-- ---------------------------------------------------------------------------
-- call_llm

-- call_llm(opts, callback) -> handle: never blocks; callback(res, err) runs
-- once on the main loop. handle.cancel() (or handle:cancel()) stops the call
-- at any moment; handle.request_id; handle.done() is true once the callback
-- has run.
-- call_llm(opts) inside a coroutine: waits (yields) and returns res or nil, err.
function M.call_llm(opts, callback)
  -- (Tail calls: the argument errors of A's point at our caller.)
  if callback == nil then return A.call_llm(opts) end
  if not is_callable(callback) then argerror(2, "callback", "a function", callback) end
  return start_with_callback(opts, 2, nil, callback)
end

-- ---------------------------------------------------------------------------
-- stream_llm

-- stream_llm(opts, { on_chunk = fn, on_done = fn }) -> handle, at once.
-- on_chunk(chunks) runs on the main loop with a table (array) of the
-- decoded chunks that arrived since the last call: one call per loop turn,
-- however many chunks came (so a fast stream never freezes the editor).
-- on_done(res, err) runs once: res the assembled result (res.data...), or
-- nil, err; after a chunk was delivered nothing is retried and err.kind is
-- "stream_interrupted" (err.reason says how). handle.cancel() stops it at
-- once (on_done then gets err.kind "cancelled"); VimLeavePre does too.
-- Inside a map_with_concurrency worker (or any coroutine),
-- stream_llm(opts, on_chunk) waits like call_llm and returns res or nil, err,
-- calling on_chunk(chunk) for each chunk.
function M.stream_llm(opts, callbacks)
  if is_callable(callbacks) then return A.stream_llm(opts, callbacks) end
  if type(callbacks) ~= "table" then
    argerror(2, "callbacks", "{ on_chunk = fn, on_done = fn } (or, in a coroutine, a function)",
      callbacks)
  end
  local on_chunk, on_done = callbacks.on_chunk, callbacks.on_done
  if not is_callable(on_chunk) then argerror(2, "callbacks.on_chunk", "a function", on_chunk) end
  if not is_callable(on_done) then argerror(2, "callbacks.on_done", "a function", on_done) end
  if type(opts) ~= "table" then argerror(2, "opts", "a table", opts) end
  return start_with_callback(api.stream_options(opts), 2, on_chunk, on_done)
end

-- ---------------------------------------------------------------------------
-- map_with_concurrency(items, limit, worker, on_done [, opts]) -> handle
-- (llmretry.api): the pool runs on the main loop; on_done(results, errors)
-- runs there once every item has finished. handle.cancel() stops new
-- starts and cancels the calls in flight (the workers see cancelled
-- errors; on_done still runs); handle.done().

function M.map_with_concurrency(items, limit, worker, on_done, opts)
  return A.map_with_concurrency(items, limit, worker, opts, on_done)
end

-- ---------------------------------------------------------------------------
-- Introspection (tests, :lua print(vim.inspect(require("llmretry.nvim").stats())))

function M.stats()
  local n = 0
  for _ in pairs(live) do n = n + 1 end
  return { pending = npending, watching = watching, engine = engine ~= nil, live_handles = n }
end

-- Close the session's engine now (cancelling what is in flight; their
-- callbacks do not run). The next call makes a new one. Done on VimLeavePre.
function M.shutdown()
  close_engine()
end

return M
