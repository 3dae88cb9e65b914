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
-- Named policies (issue 9) and clients.
--
-- llm.load_policies(source): a table (name -> settings) or the path of a
-- policies .json file, checked now (unknown keys, wrong types, out-of-range
-- values raise, naming the file, the policy and the key).
-- llm.client{ policies = ..., <default call options> }: call_llm, call_many
-- and map_with_concurrency with opts.policy = NAME. For one call: explicit
-- options > the named policy > the client's defaults > built-in defaults.

local policies_mod = require("llmretry.policies")

function M.load_policies(source)
  local ok, p = pcall(policies_mod.load, source)
  if not ok then error(p, 2) end
  return p
end

-- A fresh idempotency key: a UUID v4 from the core (the system's CSPRNG).
local new_idempotency_key = core.uuid4
M._new_idempotency_key = new_idempotency_key

local Client = {}
Client.__index = Client
Client.__name = "llmretry.client"

function M.client(opts)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then argerror(2, "opts", "a table or nil", opts) end
  local pols = opts.policies
  if pols == nil then
    pols = policies_mod.load({})
  else
    local ok, p = pcall(policies_mod.load, pols)
    if not ok then error(p, 2) end
    pols = p
  end
  local defaults = {}
  for k, v in pairs(opts) do
    if k ~= "policies" and k ~= "policy" and k ~= "shared" then defaults[k] = v end
  end
  -- shared (docs/shared.md): the client's calls on an engine of their own
  -- whose endpoints' budgets live in that store. An engine passed in has its
  -- store already.
  if opts.shared ~= nil then
    if type(opts.shared) ~= "string" then
      argerror(2, "opts.shared", '"shm:NAME" or "redis://..." (a string) or nil', opts.shared)
    end
    if opts.engine ~= nil then
      error("llmretry: opts.shared and opts.engine: give one (an engine has its store: "
        .. "llmretry.new_engine(n, conns, shared))", 2)
    end
    local ok, engine = pcall(core.new_engine, nil, nil, opts.shared)
    if not ok then error(engine, 2) end
    defaults.engine = engine
  end
  -- Bad defaults raise now, naming the option, as Python's Client does.
  local sub = split_options(defaults, 2)
  local ok_opts, why = pcall(core.check_options, sub)
  if not ok_opts then error(why, 2) end
  local self = setmetatable({ policies = pols, defaults = defaults }, Client)
  if opts.policy ~= nil then
    if type(opts.policy) ~= "string" or not pols:get(opts.policy) then
      error(pols:unknown(opts.policy), 2)
    end
    self.default_policy = opts.policy
  end
  return self
end

-- The endpoints of the client's engine (M.endpoint_stats).
function Client:endpoint_stats()
  return M.endpoint_stats(self.defaults.engine)
end

-- The settings of the policy `name` (nil: none), or raise naming it.
local function policy_of(self, name, level)
  if name == nil then return nil end
  if type(name) ~= "string" then
    argerror(level + 1, "policy", "a policy name (a string) or nil", name)
  end
  local p = self.policies:get(name)
  if not p then error(self.policies:unknown(name), level + 1) end
  return p
end

-- The options of one call (or of a call_many batch: `many`): explicit >
-- policy > client defaults. Returns the merged options and whether each call
-- needs a fresh idempotency key.
local function resolve(self, opts, level, many, pool_policy)
  if opts == nil then opts = {} end
  if type(opts) ~= "table" then argerror(level + 1, "opts", "a table", opts) end
  local name = opts.policy
  if name == nil then name = pool_policy end
  if name == nil then name = self.default_policy end
  local p = policy_of(self, name, level + 1)
  local out = {}
  for k, v in pairs(self.defaults) do out[k] = v end
  if many and out.deadline_ms ~= nil then
    -- A client's deadline_ms is per call; call_many's is the whole batch's.
    out.call_deadline_ms, out.deadline_ms = out.deadline_ms, nil
  end
  local explicit_url = opts.url ~= nil or opts.base_url ~= nil
  local model, auto
  if p then
    -- The policy over the client's defaults, as the core resolves it.
    local layer = self.policies:layer(name, self.defaults)
    for k, v in pairs(layer) do
      if v == core.null then v = nil end
      if k == "model" then
        model = v
      elseif k == "idempotency_key" then
        auto = v == "auto"       -- a fresh key per call, by the caller
      else
        out[k] = v
      end
    end
    out.url = layer.url
    if many then
      -- A client's or a policy's deadline_ms is per call; call_many's own
      -- is the whole batch's.
      out.call_deadline_ms, out.deadline_ms = out.deadline_ms, nil
    end
    out.policy = name
  end
  for k, v in pairs(opts) do
    if k ~= "policy" then out[k] = v end
  end
  if explicit_url then
    -- The endpoint is one setting: the caller's url or base_url replaces both.
    if opts.url == nil then out.url = nil end
    if opts.base_url == nil then out.base_url = nil end
  end
  return out, auto and opts.idempotency_key == nil, model
end

-- A body with `model` filled in when it is a table without one.
local function with_model(body, model)
  if model == nil or type(body) ~= "table" or body.model ~= nil then return body end
  local b = {}
  for k, v in pairs(body) do b[k] = v end
  local mt = getmetatable(body)
  if mt then setmetatable(b, mt) end
  b.model = model
  return b
end

function Client:call_llm(opts)
  if getmetatable(self) ~= Client then
    error("llmretry: call client:call_llm(opts) with a colon", 2)
  end
  local pool = sched.current()
  local o, auto, model = resolve(self, opts, 2, false, pool and pool.policy or nil)
  if auto then o.idempotency_key = new_idempotency_key() end
  o.body = with_model(o.body, model)
  return M.call_llm(o)
end

function Client:stream_llm(opts, on_chunk)
  if getmetatable(self) ~= Client then
    error("llmretry: call client:stream_llm(opts, on_chunk) with a colon", 2)
  end
  local pool = sched.current()
  local o, auto, model = resolve(self, opts, 2, false, pool and pool.policy or nil)
  if auto then o.idempotency_key = new_idempotency_key() end
  o.body = with_model(o.body, model)
  return M.stream_llm(o, on_chunk)
end

function Client:call_many(bodies, opts)
  if getmetatable(self) ~= Client then
    error("llmretry: call client:call_many(bodies, opts) with a colon", 2)
  end
  local o, auto, model = resolve(self, opts, 2, true)
  if type(bodies) == "table" and model ~= nil then
    local bs = {}
    for i = 1, #bodies do bs[i] = with_model(bodies[i], model) end
    bodies = bs
  end
  return M._call_many(bodies, o, auto and new_idempotency_key or nil)
end

function Client:map_with_concurrency(items, limit, worker, opts)
  if getmetatable(self) ~= Client then
    error("llmretry: call client:map_with_concurrency(...) with a colon", 2)
  end
  local name
  if opts ~= nil and type(opts) == "table" and opts.policy ~= nil then
    policy_of(self, opts.policy, 2)
    name = opts.policy
    local o = {}
    for k, v in pairs(opts) do if k ~= "policy" then o[k] = v end end
    opts = o
  end
  if opts == nil or type(opts) == "table" then
    local o = {}
    for k, v in pairs(opts or {}) do o[k] = v end
    if o.logger == nil then o.logger = self.defaults.logger end
    if o.engine == nil then o.engine = self.defaults.engine end
    opts = o
  end
  return M._map_with_concurrency(items, limit, worker, opts, name)
end

-- name -> the 14 resolved settings of each policy of this client (over its
-- defaults).
function Client:resolved()
  return self.policies:resolved(self.defaults)
end

function Client:names()
  return self.policies:names()
end

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
