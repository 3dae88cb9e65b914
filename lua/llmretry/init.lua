-- llmretry: the production layer around calls to an OpenAI-compatible chat API.
--
-- The pure-Lua half of the Lua binding (docs/lua.md). The C module
-- `llmretry.core` owns the engine (an I/O thread doing every attempt, wait and
-- retry); this file turns its mailbox into call_llm, a coroutine pool
-- (map_with_concurrency) and call_many.
--
-- How waiting works. Every call is submitted to an engine and read back from
-- its handle's mailbox (events, validation requests, then "done") on this Lua
-- state's thread:
--   * outside a pool, call_llm blocks: it waits on the handle in 50 ms slices;
--   * inside a map_with_concurrency worker, call_llm submits to the pool's
--     engine and yields the worker's coroutine (in Lua, never across C); the
--     pool (llmretry.scheduler, with its blocking driver) waits on the
--     group's fd for all workers at once and resumes a worker when its call
--     has news.
--
-- The module keeps no global mutable state: the default engine and the
-- registry of running pools live in upvalues of this chunk, so each Lua state
-- that loads it has its own.

local core = require("llmretry.core")

local type, pairs, ipairs, tostring, error, pcall = type, pairs, ipairs, tostring, error, pcall
local setmetatable, getmetatable, rawget = setmetatable, getmetatable, rawget
local string, table, io = string, table, io
local co_isyieldable = coroutine.isyieldable
local scheduler = require("llmretry.scheduler")

local M = {}

M.VERSION = core.VERSION
M.null = core.null
M.array_mt = core.array_mt
M.empty_array = core.empty_array
M.encode = core.encode
M.decode = core.decode
M.extract_json = core.extract_json
M.assert_shape = core.assert_shape
M.new_engine = core.new_engine
M.error_mt = core.error_mt
-- The event names in event_mask bit order: bit (i - 1) asks for EVENT_NAMES[i].
M.EVENT_NAMES = core.EVENT_NAMES
M.EVENTS_ALL = core.EVENTS_ALL

-- docs/python.md: the error kinds, as the `kind` field of an error table holds
-- them, by upper-case name (M.errors.HTTP_STATUS == "http_status"): the core's
-- list, so a kind it adds is here too.
M.errors = {}
for _, kind in ipairs(core.ERROR_KINDS) do M.errors[kind:upper()] = kind end

-- Is `v` an error table returned by a call (nil, err)?
function M.is_error(v)
  return type(v) == "table" and getmetatable(v) == core.error_mt
end

-- ---------------------------------------------------------------------------
-- Argument checks: programming errors raise at once, naming the argument.

local args = require("llmretry.args")
local typename, argerror, is_callable, is_integer, check_array =
  args.typename, args.argerror, args.is_callable, args.is_integer, args.check_array

local function is_engine(v)
  local mt = getmetatable(v)
  return type(v) == "userdata" and type(mt) == "table" and rawget(mt, "__name") == "llmretry.engine"
end

-- Options of call_llm (and call_many, map_with_concurrency) that are Lua's,
-- not the engine's: they never reach engine:submit.
local LUA_OPTIONS = { logger = true, validate = true, engine = true }

-- Split call options into what engine:submit takes and the Lua-side context.
-- `defaults` (may be nil) gives the pool's logger.
local function split_options(opts, level, defaults)
  local sub, logger, validate = args.split_call_options(opts, level + 1, LUA_OPTIONS,
    defaults and defaults.logger)
  local engine = opts.engine
  if engine ~= nil and not is_engine(engine) then
    argerror(level + 1, "engine", "an engine (llmretry.new_engine()) or nil", engine)
  end
  return sub, { logger = logger, validate = validate, reported = false }, engine
end

local submit = args.submit

-- The mailbox of one call: events to the logger, validation and chunks on
-- this thread (llmretry.mailbox).
local drain = require("llmretry.mailbox").drain

-- ---------------------------------------------------------------------------
-- Engines: the default one, made on first use, one per Lua state.

local default_engine = nil

-- The default engine's shared store (docs/shared.md): LLMRETRY_SHARED, as
-- in Python; other engines say it: llmretry.new_engine(n, conns, "shm:NAME").
local function new_default_engine()
  local shared = os.getenv("LLMRETRY_SHARED")
  return core.new_engine(nil, nil, shared ~= "" and shared or nil)
end

local function get_default_engine()
  if default_engine == nil then default_engine = new_default_engine() end
  return default_engine
end

-- Submit on the default engine. An engine belongs to the process that made
-- it: in a child forked after first use (OpenResty's workers fork after
-- init_by_lua) the core refuses it, and the child makes its own. The
-- parent's engine is left alone (the core's free is a no-op in a child).
local function submit_default(sub, level)
  local engine = get_default_engine()
  if engine:forked() then
    default_engine = new_default_engine()
    engine = default_engine
  end
  local h = submit(engine, sub, level + 1)   -- not a tail call: the level counts this frame
  return h
end

-- This module's pools: sched.current() is the context of the pool whose
-- worker is running ({ engine, group, logger, policy }), and a worker waits
-- for a handle's news with sched.wait(h).
local sched = scheduler.new("llmretry")

-- ---------------------------------------------------------------------------
-- call_llm

-- One call, waited for on this thread (or, in a pool's worker, by yielding
-- it): its mail delivered here, and on_chunk (stream_llm's) given each chunk.
local function run(opts, level, on_chunk)
  local pool = sched.current()
  local sub, ctx, engine = split_options(opts, level + 1, pool)
  ctx.on_chunk = on_chunk
  local pooled = false
  if pool and (engine == nil or engine == pool.engine) and co_isyieldable() then
    engine, pooled = pool.engine, true
    -- The pool's calls pass its group's pacer on the engine thread (the
    -- admission stage): a 429 naming a wait pauses the pool's new starts,
    -- as it does call_many's.
    sub.group = pool.group
  end
  local h
  if engine then h = submit(engine, sub, level + 1) else h = submit_default(sub, level + 1) end
  if pooled then
    while not drain(h, ctx) do sched.wait(h) end
  else
    while not drain(h, ctx) do h:wait(50) end
  end
  if ctx.chunk_error ~= nil then error(ctx.chunk_error, 0) end
  return h:result()
end

-- What an engine (default: the module's own) knows of each endpoint it has
-- called, a list of tables: url, has_key, requests, retries, the retry
-- budget's window_requests / window_retries / retries_refused, the breaker
-- ("closed", "open", "half_open"), consecutive_failures, breaker_opened,
-- short_circuited, open_ms_left, the rpm / tpm in force and in_flight.
function M.endpoint_stats(engine)
  if engine ~= nil and not is_engine(engine) then
    argerror(2, "engine", "an engine (llmretry.new_engine()) or nil", engine)
  end
  return (engine or get_default_engine()):endpoint_stats()
end

-- call_llm(opts) -> res, or nil, err (defined with stream_llm, below).

-- ---------------------------------------------------------------------------
-- stream_llm

-- stream_llm(opts, on_chunk) -> res, or nil, err: call_llm, streamed.
-- on_chunk(chunk) gets each decoded chunk as it arrives (on this thread;
-- inside a map_with_concurrency worker the worker yields between chunks).
-- res is the assembled chat.completion (res.data, res.meta.usage...). Until
-- the first chunk has reached on_chunk every failure is retried; after it,
-- nothing is (the text would repeat): err.kind == "stream_interrupted",
-- err.reason says how it broke, err.chunks_delivered how many were given.
-- A table body gets stream = true (and asks for usage). An on_chunk that
-- raises cancels the stream; the error is raised once the call has ended.
M.call_llm, M.stream_llm = args.blocking_calls(run)

-- ---------------------------------------------------------------------------
-- map_with_concurrency

local pool_error_mt = {
  __name = "llmretry.pool_error",
  __tostring = function(e)
    return string.format("llmretry: item %d failed: %s", e.index, tostring(e.error))
  end,
}

local MAP_OPTIONS = { return_errors = true, logger = true, engine = true }

local function map_impl(items, limit, worker, opts, pool_policy)
  opts = args.check_map_args(2, items, limit, worker, opts, MAP_OPTIONS)
  if opts.engine ~= nil and not is_engine(opts.engine) then
    argerror(2, "opts.engine", "an engine (llmretry.new_engine()) or nil", opts.engine)
  end
  local return_errors, logger = opts.return_errors, opts.logger

  local n = #items
  if n == 0 then return { n = 0 }, {} end

  local owned = opts.engine == nil
  local engine = opts.engine or core.new_engine()
  -- The pool's pacing is the engine's (docs/design.md): its workers' calls form
  -- one group, at most `limit` at once, paused by a 429's named wait and
  -- narrowed by a burst of them, exactly as call_many's items are.
  local group = engine:group{ limit = limit, adaptive = true }
  local driver = scheduler.blocking(group:channel())
  local pool = sched.pool{ items = items, limit = limit, worker = worker, driver = driver,
    return_errors = return_errors,
    context = { engine = engine, group = group, logger = logger or nil, policy = pool_policy } }

  local ok, perr = pcall(function()
    pool.start()
    driver.run(pool.finished)
  end)
  group:close()
  if owned then engine:close() end
  if not ok then error(perr, 0) end

  local results, errors, first_failure = pool.results, pool.errors, pool.first_failure
  if first_failure then
    error(setmetatable({ index = first_failure, error = errors[first_failure],
      results = results, errors = errors }, pool_error_mt), 2)
  end
  return results, errors
end

-- (Tail calls: the argument errors of map_impl point at our caller.)
function M.map_with_concurrency(items, limit, worker, opts)
  return map_impl(items, limit, worker, opts, nil)
end
M._map_with_concurrency = map_impl

-- ---------------------------------------------------------------------------
-- call_many: every body as one batch on the engine thread (an engine group),
-- no coroutines. The group paces the batch: at most `limit` items run at
-- once, a 429 that names a wait pauses every new start, the window adapts
-- (opts.adaptive, default true), and opts.deadline_ms bounds the WHOLE batch
-- (items not started in time fail with deadline_exceeded; a per-call
-- deadline is opts.call_deadline_ms), as in Python's call_many.
--
-- `host` (nil here) lets another adapter run the batch on its own engine and
-- wait its own way (llmretry.openresty: a worker's engine, an ngx.semaphore):
-- host.engine; host.channel, to which the group's calls report (the group
-- only paces them); host.source(group) -> what run_loop waits on
-- (poll() -> handles, wait(ms) -> false when nothing came), told of each
-- call with source:add(h) and of its end with source:forget(h);
-- host.report(ev, e), a logger's first error.
local function call_many_impl(bodies, opts, new_key, host)
  if type(bodies) ~= "table" then argerror(2, "bodies", "a table (array)", bodies) end
  check_array(2, "bodies", bodies)
  if opts ~= nil and type(opts) ~= "table" then argerror(2, "opts", "a table or nil", opts) end
  opts = opts or {}
  local limit = opts.limit
  if limit == nil then limit = 8 end
  if not is_integer(limit) or limit < 1 then
    if type(limit) == "number" then
      error(string.format("llmretry: limit must be an integer >= 1 (got %s)", tostring(limit)), 2)
    end
    argerror(2, "limit", "an integer >= 1", limit)
  end
  if opts.body ~= nil then
    error("llmretry: opts.body is not an option of call_many (the bodies are its first argument)", 2)
  end
  if opts.group ~= nil then
    error("llmretry: opts.group is not an option of call_many (the batch is its own group)", 2)
  end
  local call_deadline = opts.call_deadline_ms
  if call_deadline ~= nil and (not is_integer(call_deadline) or call_deadline < 0) then
    argerror(2, "call_deadline_ms", "an integer >= 0 (each call's deadline) or nil", call_deadline)
  end
  local batch_deadline, adaptive = opts.deadline_ms, opts.adaptive
  if batch_deadline ~= nil and (not is_integer(batch_deadline) or batch_deadline < 0) then
    argerror(2, "deadline_ms", "an integer >= 0 (the whole batch) or nil", batch_deadline)
  end
  if adaptive ~= nil and type(adaptive) ~= "boolean" then
    argerror(2, "adaptive", "a boolean or nil", adaptive)
  end
  local base = {}
  for k, v in pairs(opts) do
    if k ~= "limit" and k ~= "deadline_ms" and k ~= "adaptive" and k ~= "call_deadline_ms" then
      base[k] = v
    end
  end
  base.deadline_ms = call_deadline
  local sub, ctx, engine = split_options(base, 2)
  -- Every option is checked before the first call goes out (a bad one
  -- would otherwise surface from the first submit, with calls of the
  -- batch possibly in flight).
  local ok_opts, why = pcall(core.check_options, sub)
  if not ok_opts then error(why, 2) end
  local n = #bodies
  local outs = { n = n }
  -- Every body is encoded before the first call goes out: a body that cannot
  -- be sent raises before any I/O.
  local payloads, models = {}, {}
  for i = 1, n do
    local b = bodies[i]
    if type(b) == "table" then
      local ok, text = pcall(core.encode, b)
      if not ok then
        error(string.format("llmretry: bodies[%d] cannot be encoded: %s", i, tostring(text)), 2)
      end
      payloads[i] = text
      if type(b.model) == "string" then models[i] = b.model end
    elseif type(b) == "string" then
      if b == "" then error(string.format("llmretry: bodies[%d] must not be empty", i), 2) end
      payloads[i] = b
    else
      argerror(2, string.format("bodies[%d]", i), "a table or a JSON string", b)
    end
  end
  if n == 0 then return outs end

  if host then engine = host.engine end
  local owned = engine == nil
  engine = engine or core.new_engine()
  local group = engine:group{ limit = limit, deadline_ms = batch_deadline, adaptive = adaptive,
    poll = not host }
  local source = host and host.source(group) or group:channel()
  -- Keep the group's queue ahead of its pacer without holding every call of
  -- a huge batch at once.
  local ahead = 4 * limit + 64
  local watch, active, next_i = {}, 0, 1

  local function start()
    while active < ahead and next_i <= n do
      local i = next_i
      next_i = i + 1
      local s = {}
      for k, v in pairs(sub) do s[k] = v end
      s.body = payloads[i]
      s.group = group
      if s.model == nil then s.model = models[i] end
      -- A policy's idempotency_key = "auto": a fresh key per item.
      if new_key then s.idempotency_key = new_key() end
      -- Each call has its own logger state (one stderr report per call).
      local c = { logger = ctx.logger, validate = ctx.validate, reported = false,
        report = host and host.report or nil }
      if host then s.channel = host.channel end
      -- pcall: an error raised here must not carry this file's position.
      local ok, h = pcall(engine.submit, engine, s)
      if not ok then error(h, 0) end
      if host then source:add(h) end
      payloads[i] = nil
      active = active + 1
      local function take(hh)
        if drain(hh, c) then
          watch[hh] = nil
          if host then source:forget(hh) end
          active = active - 1
          local res, err = hh:result()
          outs[i] = res or err
        end
      end
      watch[h] = take
      take(h)
    end
  end

  local ok, perr = pcall(function()
    start()
    scheduler.run_loop(source, watch, function() return active == 0 and next_i > n end,
      function() start() return false end)
  end)
  outs.stats = group:stats()
  group:close()
  if owned then engine:close() end
  if not ok then
    -- The engine's argument errors (the first submit, before any I/O) point
    -- at our caller.
    if type(perr) == "string" then error(perr, 2) end
    error(perr, 0)
  end
  return outs
end

function M.call_many(bodies, opts)
  return call_many_impl(bodies, opts, nil)
end
M._call_many = call_many_impl

-- ---------------------------------------------------------------------------
-- Named policies (issue 9) and clients: llmretry.client.

require("llmretry.client")(M, split_options, sched)

-- ---------------------------------------------------------------------------
-- log_usage

local USAGE_KEYS = { "label", "attempt", "duration_ms", "prompt_tokens", "completion_tokens",
  "total_tokens", "request_id", "model" }

function M.log_usage(meta, label, logger)
  if type(meta) ~= "table" then argerror(2, "meta", "a table (res.meta)", meta) end
  if type(meta.meta) == "table" then meta = meta.meta end -- a whole result
  if label == nil then label = "request" end
  if type(label) ~= "string" then argerror(2, "label", "a string", label) end
  if logger ~= nil and not is_callable(logger) then
    argerror(2, "logger", "a function or nil", logger)
  end
  local null = core.null
  -- What the call was billed: every attempt that returned usage, summed.
  local usage = meta.usage_total or meta.usage
  if type(usage) ~= "table" then usage = {} end
  local function v(x) if x == nil then return null end return x end
  local rec = {
    label = label,
    attempt = v(meta.attempt),
    duration_ms = v(meta.duration_ms),
    prompt_tokens = v(usage.prompt_tokens),
    completion_tokens = v(usage.completion_tokens),
    total_tokens = v(usage.total_tokens),
    request_id = v(meta.request_id),
    model = v(meta.model),
  }
  if logger == nil then
    -- One JSON line, keys in a fixed order.
    local parts = {}
    for i, k in ipairs(USAGE_KEYS) do
      local ok, text = pcall(core.encode, rec[k])
      if not ok then
        -- "value is not valid UTF-8": say which value.
        error(string.format("llmretry: log_usage cannot write %s: %s", k, tostring(text)), 2)
      end
      parts[i] = core.encode(k) .. ":" .. text
    end
    io.stdout:write("{" .. table.concat(parts, ",") .. "}\n")
    io.stdout:flush()
  else
    logger(rec)
  end
  return rec
end

return M
