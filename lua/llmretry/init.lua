-- llmretry: the production layer around calls to an OpenAI-compatible chat API.
--
-- The pure-Lua half of the Lua binding (docs/lua.md). The C module
-- `llmretry.core` owns the engine (an I/O thread doing every attempt, wait and
-- retry); llmretry.api declares call_llm, stream_llm and call_many for every
-- host, and this file is the blocking host: how a call waits here, the
-- default engine, the coroutine pool (map_with_concurrency) and log_usage.
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

local type, ipairs, tostring, error, pcall = type, ipairs, tostring, error, pcall
local setmetatable, getmetatable = setmetatable, getmetatable
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

local args = require("llmretry.args")
local api = require("llmretry.api")
local argerror, is_callable = args.argerror, args.is_callable
local is_engine = api.is_engine

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

-- What an engine (default: the module's own) knows of each endpoint it has
-- called (a URL, a key and a model each), a list of tables: url, model
-- (nil for calls naming none), has_key, requests, retries, the retry
-- budget's window_requests / window_retries / retries_refused, the breaker
-- ("closed", "open", "half_open"), consecutive_failures, breaker_opened,
-- short_circuited, open_ms_left, the rpm / tpm in force and in_flight.
function M.endpoint_stats(engine)
  if engine ~= nil and not is_engine(engine) then
    argerror(2, "engine", "an engine (llmretry.new_engine()) or nil", engine)
  end
  return (engine or get_default_engine()):endpoint_stats()
end

-- ---------------------------------------------------------------------------
-- The blocking host (llmretry.api): a call waits on its handle in 50 ms
-- slices, or, in a map_with_concurrency worker, yields the worker's
-- coroutine until the pool's loop (llmretry.scheduler) sees its news.

local pool_error_mt = {
  __name = "llmretry.pool_error",
  __tostring = function(e)
    return string.format("llmretry: item %d failed: %s", e.index, tostring(e.error))
  end,
}

local A
A = api.new{
  name = "llmretry",
  -- Where a call goes: a pool's engine and group, opts.engine, or the
  -- default engine. The token says whether the call waits by yielding.
  submit = function(sub, engine, pool, level)
    if pool and (engine == nil or engine == pool.engine) and co_isyieldable() then
      -- The pool's calls pass its group's pacer on the engine thread (the
      -- admission stage): a 429 naming a wait pauses the pool's new starts
      -- of its model, as it does call_many's.
      sub.group = pool.group
      return api.submit(pool.engine, sub, level + 1), true
    end
    if engine == nil then
      -- An engine belongs to the process that made it: in a child forked
      -- after first use (OpenResty's workers fork after init_by_lua) the
      -- core refuses it, and the child makes its own. The parent's engine
      -- is left alone (the core's free is a no-op in a child).
      engine = get_default_engine()
      if engine:forked() then
        default_engine = new_default_engine()
        engine = default_engine
      end
    end
    return api.submit(engine, sub, level + 1), false
  end,
  wait = function(h, pooled)
    if pooled then A.sched.wait(h) else h:wait(50) end
  end,

  -- The pool runs here until its last item: on opts.engine or an engine of
  -- its own, waiting on its group's channel. The first raise (unless
  -- return_errors) is raised once the running items have finished.
  map_options = { return_errors = true, logger = true, engine = true },
  map = function(items, limit, worker, opts, _, policy)
    local n = #items
    if n == 0 then return { n = 0 }, {} end
    local owned = opts.engine == nil
    local engine = opts.engine or core.new_engine()
    -- The pool's pacing is the engine's (docs/design.md): its workers' calls
    -- form one group, at most `limit` at once, paused by a 429's named wait
    -- (the calls of the model it refused) and narrowed by a burst of them,
    -- exactly as call_many's items are.
    local group = engine:group{ limit = limit, adaptive = true }
    local driver = scheduler.blocking(group:channel())
    local pool = A.sched.pool{ items = items, limit = limit, worker = worker, driver = driver,
      return_errors = opts.return_errors,
      context = { engine = engine, group = group, logger = opts.logger or nil, policy = policy } }
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
        results = results, errors = errors }, pool_error_mt), 0)
    end
    return results, errors
  end,
}
local sched = A.sched

-- call_llm(opts) -> res, or nil, err.
-- stream_llm(opts, on_chunk) -> res, or nil, err: call_llm, streamed.
-- on_chunk(chunk) gets each decoded chunk as it arrives (on this thread;
-- inside a map_with_concurrency worker the worker yields between chunks).
-- res is the assembled chat.completion (res.data, res.meta.usage...). Until
-- the first chunk has reached on_chunk every failure is retried; after it,
-- nothing is (the text would repeat): err.kind == "stream_interrupted",
-- err.reason says how it broke, err.chunks_delivered how many were given.
-- A table body gets stream = true (and asks for usage). An on_chunk that
-- raises cancels the stream; the error is raised once the call has ended.
M.call_llm, M.stream_llm = A.call_llm, A.stream_llm

-- call_many(bodies, opts) -> outs (llmretry.api): the batch on its own
-- engine unless opts.engine, waited for on this thread.
-- map_with_concurrency(items, limit, worker [, opts]) -> results, errors.
-- (Tail calls: the argument errors of A's functions point at our caller.)
function M.call_many(bodies, opts)
  return A.call_many(bodies, opts)
end
M._call_many = A.call_many

function M.map_with_concurrency(items, limit, worker, opts)
  return A.map_with_concurrency(items, limit, worker, opts, nil, nil)
end
function M._map_with_concurrency(items, limit, worker, opts, policy)
  return A.map_with_concurrency(items, limit, worker, opts, nil, policy)
end

-- ---------------------------------------------------------------------------
-- Named policies (issue 9) and clients: llmretry.client.

require("llmretry.client")(M, A.split_options, sched)

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
