-- llmretry.nvim: LLM calls for Neovim plugins that never block the editor.
--
--   local llm = require("llmretry.nvim")
--   local call = llm.call_llm({ body = body, deadline_ms = 30000 }, function(res, err)
--     -- runs on the main loop (not in a fast event): every vim.api call is allowed
--   end)
--   call.cancel()        -- at any moment; the callback then gets err.kind == "cancelled"
--
-- How it works. One engine per Neovim session (made on the first call, kept
-- in an upvalue of this chunk) does all the network I/O on its own thread.
-- Its fd is watched by one libuv poll handle (vim.uv, or vim.loop before
-- Neovim 0.10): when it is readable, the poll callback drains the mailbox of
-- every call with news. That callback runs in a "fast" context, where most
-- of vim.api is forbidden, so nothing of the caller's runs there: each
-- call's news (log events, a body to validate, the result) is handed to
-- vim.schedule as one batch, and runs in order on the main loop. The fd is
-- watched only while calls are pending, so an idle session holds no active
-- handle; the engine is closed on VimLeavePre, cancelling what is in flight.
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
local setmetatable, getmetatable, rawget = setmetatable, getmetatable, rawget
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

-- ---------------------------------------------------------------------------
-- Argument checks (the same wording as llmretry's).

local args = require("llmretry.args")
local argerror, is_callable = args.argerror, args.is_callable

-- ---------------------------------------------------------------------------
-- The session's engine and the poll handle on its fd.

local engine = nil          -- made on the first call
local news = nil            -- the engine's channel, where its calls report
local watcher = nil         -- uv poll handle on news:fd()
local watching = false
local pending = {}          -- core handle -> call record, until its "done" is taken
local npending = 0
local live = setmetatable({}, { __mode = "k" })   -- core handles not yet collected (stats)

-- This module's pools (llmretry.scheduler): sched.current() is the context
-- of the pool whose worker is running ({ calls, cancelled, logger }). Their
-- driver is the main loop: a worker waiting on a call record is woken by the
-- record's completion (delivered by vim.schedule, below), and one that
-- yields on its own is resumed by vim.schedule.
local sched = scheduler.new("llmretry.nvim")
local driver = {
  wait = function(rec, wake) rec.wake = wake end,
  later = function(fn) vim.schedule(fn) end,
}

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

local function watch()
  if not watching then
    watcher:start("r", on_readable)
    watching = true
  end
end

-- ---------------------------------------------------------------------------
-- Delivering a call's news on the main loop.

local mailbox = require("llmretry.mailbox")

-- The chunks of one batch, decoded, to the stream's on_chunk in one call:
-- what arrived within one loop turn is one call, so thousands of chunks a
-- second never flood the editor with scheduled callbacks.
local function deliver_chunks(rec, texts)
  local chunks = {}
  for _, text in ipairs(texts) do
    local chunk = core.decode(text)
    if chunk ~= nil then chunks[#chunks + 1] = chunk end
  end
  if #chunks == 0 or not rec.on_chunk or rec.chunk_error then return end
  local ok, e = pcall(rec.on_chunk, chunks)
  if not ok then
    -- The plugin's bug: stop the stream; on_done gets the error.
    rec.chunk_error = e
    if rec.h then rec.h:cancel() end
  end
end

-- Runs in a scheduled callback: items in the order the engine produced them.
local function deliver(rec, batch)
  local texts = nil
  for _, item in ipairs(batch) do
    local kind = item[1]
    if kind == "chunk" then
      texts = texts or {}
      texts[#texts + 1] = item[2]
    else
      if texts then
        deliver_chunks(rec, texts)
        texts = nil
      end
      if kind == "event" then
        mailbox.log(rec, item[2])
      elseif kind == "validate" then
        local ok, msg = mailbox.verdict(rec, item[2])
        -- A call cancelled meanwhile no longer waits for the verdict.
        if rec.h then pcall(rec.h.validated, rec.h, ok, msg) end
      elseif kind == "done" then
        -- Our last reference to the core handle: once collected, the call is freed.
        rec.h = nil
        rec.finished = true
        if rec.chunk_error ~= nil then
          rec.complete(nil, rec.chunk_error)
        else
          rec.complete(item[2], item[3])
        end
      end
    end
  end
  if texts then deliver_chunks(rec, texts) end
end

-- In the poll callback (a fast context): take every item now in the
-- mailbox, hand them to the main loop as one batch.
local function take(rec)
  local h = rec.h
  local batch = {}
  while true do
    local kind, value = h:next()
    if kind == nil then break end
    if kind == "done" then
      pending[h] = nil
      npending = npending - 1
      local res, err = h:result()
      batch[#batch + 1] = { "done", res, err }
      break
    end
    batch[#batch + 1] = { kind, value }
  end
  if #batch > 0 then
    vim.schedule(function() deliver(rec, batch) end)
  end
end

local function poll_engine()
  local hs = news:poll()
  for i = 1, #hs do
    local rec = pending[hs[i]]
    if rec then take(rec) end
  end
  -- Nothing pending: stop watching, so that an idle session has no active
  -- handle (Neovim can exit); the next call starts it again.
  if npending == 0 and watching then
    watcher:stop()
    watching = false
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

-- ---------------------------------------------------------------------------
-- Starting a call.

-- Options of ours, not the engine's.
local LUA_OPTIONS = { logger = true, validate = true, on_chunk = true }

-- Submit opts; `complete(res, err)` runs on the main loop once it is done.
-- `level`: the stack level of the user's call, for argument errors.
local function start(opts, complete, level, defaults)
  local sub, logger, validate = args.split_call_options(opts, level + 1, LUA_OPTIONS,
    defaults and defaults.logger)
  if opts.engine ~= nil then
    error("llmretry: engine is not an option of llmretry.nvim (it runs every call on the "
      .. "session's engine)", level + 1)
  end

  local e = get_engine()
  local ok, h = pcall(e.submit, e, sub)
  if not ok then
    if type(h) == "string" then error(h, level + 1) end
    error(h, 0)
  end
  local rec = { h = h, logger = logger, validate = validate, complete = complete,
    finished = false, reported = false, report = report_by_notify, request_id = h:request_id(),
    on_chunk = opts.on_chunk }
  pending[h] = rec
  npending = npending + 1
  live[h] = true
  watch()
  return rec
end

local function cancel_rec(rec)
  if rec.h then rec.h:cancel() end
end

-- On the main loop, the call of a waiting coroutine is done: its pool
-- resumes it (rec.wake), or, in no pool, it is resumed here.
local function resume(rec, co, res, err)
  local wake = rec.wake
  if wake then return wake(res, err) end
  scheduler.resume_detached(co, "llmretry.nvim: a coroutine waiting for a call raised: ",
    res, err)
end

-- ---------------------------------------------------------------------------
-- call_llm

-- call_llm(opts, callback) -> handle: never blocks; callback(res, err) runs
-- once on the main loop. handle.cancel() (or handle:cancel()) stops the call
-- at any moment; handle.request_id; handle.done() is true once the callback
-- has run.
-- call_llm(opts) inside a coroutine: waits (yields) and returns res or nil, err.
function M.call_llm(opts, callback)
  if callback == nil then
    local co, is_main = co_running()
    if co == nil or is_main then
      error("llmretry: callback must be a function (got nil); call without one only from a "
        .. "coroutine (a map_with_concurrency worker)", 2)
    end
    local pool = sched.current()
    if pool and pool.group and opts.group == nil then
      -- The pool's group paces its calls on the engine thread: a 429
      -- naming a wait pauses the pool's new starts, as in llmretry's.
      local o = {}
      for k, v in pairs(opts) do o[k] = v end
      o.group = pool.group
      opts = o
    end
    local rec
    rec = start(opts, function(res, err)
      if pool then pool.calls[rec] = nil end
      resume(rec, co, res, err)
    end, 2, pool)
    if pool then
      pool.calls[rec] = true
      -- A cancelled pool's later calls end at once, as cancelled.
      if pool.cancelled then cancel_rec(rec) end
    end
    return sched.wait(rec)
  end
  if not is_callable(callback) then argerror(2, "callback", "a function", callback) end
  local rec = start(opts, callback, 2)
  local handle = { request_id = rec.request_id }
  function handle.cancel() cancel_rec(rec) end
  function handle.done() return rec.finished end
  return handle
end

-- ---------------------------------------------------------------------------
-- stream_llm

-- The options of a streamed call (args.stream_options), with on_chunk for
-- deliver.
local function stream_opts(opts, on_chunk)
  if type(opts) ~= "table" then argerror(3, "opts", "a table", opts) end
  local o = args.stream_options(opts)
  o.on_chunk = on_chunk
  return o
end

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
  if is_callable(callbacks) then
    local each = callbacks
    return M.call_llm(stream_opts(opts, function(chunks)
      for _, ch in ipairs(chunks) do each(ch) end
    end))
  end
  if type(callbacks) ~= "table" then
    argerror(2, "callbacks", "{ on_chunk = fn, on_done = fn } (or, in a coroutine, a function)",
      callbacks)
  end
  local on_chunk, on_done = callbacks.on_chunk, callbacks.on_done
  if not is_callable(on_chunk) then argerror(2, "callbacks.on_chunk", "a function", on_chunk) end
  if not is_callable(on_done) then argerror(2, "callbacks.on_done", "a function", on_done) end
  return M.call_llm(stream_opts(opts, on_chunk), on_done)
end

-- ---------------------------------------------------------------------------
-- map_with_concurrency

local MAP_OPTIONS = { return_errors = true, logger = true }

function M.map_with_concurrency(items, limit, worker, on_done, opts)
  opts = args.check_map_args(2, items, limit, worker, opts, MAP_OPTIONS)
  if not is_callable(on_done) then argerror(2, "on_done", "a function", on_done) end
  local return_errors, logger = opts.return_errors, opts.logger

  -- One engine group paces the pool (its calls still report to the one
  -- engine fd the session watches: poll = false).
  local group = get_engine():group{ limit = limit, adaptive = true, poll = false }
  local ctx = { calls = {}, cancelled = false, logger = logger or nil, group = group }
  local pool = sched.pool{ items = items, limit = limit, worker = worker, driver = driver,
    return_errors = return_errors, context = ctx,
    on_finish = function(p)
      group:close()
      vim.schedule(function() on_done(p.results, p.nerrors > 0 and p.errors or nil) end)
    end }

  -- Workers start on the main loop, after this returns.
  vim.schedule(pool.start)

  local handle = {}
  -- Stop new starts and cancel the calls in flight; the workers see
  -- cancelled errors, and on_done still runs once they have finished.
  function handle.cancel()
    pool.stop()
    ctx.cancelled = true
    local recs = {}
    for rec in pairs(ctx.calls) do recs[#recs + 1] = rec end
    for _, rec in ipairs(recs) do cancel_rec(rec) end
  end
  function handle.done() return pool.done end
  return handle
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
