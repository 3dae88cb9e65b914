-- llmretry.api: the public calls of every Lua host, declared once.
--
-- call_llm, stream_llm, call_many and map_with_concurrency, their argument
-- checks, the split of a call's options into the engine's and the host's,
-- and how a call's mail and result reach the caller live here. What differs
-- between hosts is only how a call waits, and that is a small table of
-- functions each host module gives to new() (as hiredis's adapters/*.h only
-- wire an event loop to async.c):
--
--   init.lua       blocking: a handle's wait, or a pool worker's yield;
--   openresty.lua  a request's light thread on an ngx.semaphore that the
--                  worker's dispatcher posts;
--   nvim.lua       a coroutine resumed from the editor's main loop, plus
--                  callback forms built on the same start().
--
-- The host table:
--   name          the module's name, in messages ("llmretry.nvim")
--   refused       nil, or a list of { option, message }: options this host
--                 refuses (engine where every call runs on the host's own)
--   report(ev, e) a logger's first error in a call (nil: stderr)
--   check(level)  raise when a call cannot wait here (nil: it always can)
--   submit(sub, engine, pool, level, plain) -> h, token: send the call (on
--                 which engine, channel, group is the host's), `pool` the
--                 running worker's pool context or nil, `engine` opts.engine;
--                 plain: nobody listens to its mail (no logger, validate or
--                 on_chunk), so llmretry.ffi may submit it
--   wait(h, token)    return once h may have news (block, or yield)
--   release(h, token) h's call has ended (nil: nothing to undo)
--   free_early    true: a call_llm's call is freed as soon as its result is
--                 read (the host keeps no reference to its handle after
--                 release)
--   batch()       call_many's engine, channel and what it waits on (nil:
--                 an engine of its own polled on this thread; see call_many)
--   map(...), map_options, map_on_done: how map_with_concurrency's pool
--                 runs, and what it takes (see A.map_with_concurrency)

local core = require("llmretry.core")
local args = require("llmretry.args")
local scheduler = require("llmretry.scheduler")
local drain = require("llmretry.mailbox").drain
-- The FFI path under LuaJIT, false elsewhere (decided once, at load).
local lffi = require("llmretry.ffi")

local type, pairs, tostring, error, pcall = type, pairs, tostring, error, pcall
local getmetatable, rawget = getmetatable, rawget
local string = string
local release_sub = args.release_sub
local argerror, is_callable, is_integer, check_array =
  args.argerror, args.is_callable, args.is_integer, args.check_array

local M = {}

local function is_engine(v)
  local mt = getmetatable(v)
  return type(v) == "userdata" and type(mt) == "table" and rawget(mt, "__name") == "llmretry.engine"
end
M.is_engine = is_engine

-- Options that are the host module's, never engine:submit's.
local LUA_OPTIONS = { logger = true, validate = true, engine = true }
-- call_many's own keys, for "did you mean" when one is misspelt (the core's
-- rule, over these beside the options).
local MANY_KEYS = { "limit", "adaptive", "call_deadline_ms" }

-- engine:submit, its argument errors re-raised at the caller of our caller
-- (`level` as error() counts it, from the caller of submit).
function M.submit(engine, sub, level)
  local ok, h = pcall(engine.submit, engine, sub)
  if not ok then
    if type(h) == "string" then error(h, level + 1) end
    error(h, 0)
  end
  return h
end

-- The options of a streamed call: a copy of opts asking the engine for
-- chunks. The core makes a table body say "stream": true and ask for its
-- usage (llmretry_stream_body); a string body is sent as written.
function M.stream_options(opts)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.stream_chunks = true
  return o
end

function M.new(host)
  local A = {}
  local refused, report, check, submit, wait, release, free_early =
    host.refused, host.report, host.check, host.submit, host.wait, host.release,
    host.free_early

  -- This host's pools: sched.current() is the context of the pool whose
  -- worker is running ({ logger, group, ... }: the host's), and a worker
  -- waits for a handle's news with sched.wait(h).
  local sched = scheduler.new(host.name)
  A.sched = sched

  -- Split call options into what engine:submit takes and what the host
  -- module keeps: sub, logger, validate, opts.engine. `defaults` (nil or a
  -- pool's context) gives the logger when opts has none.
  local function split(opts, level, defaults)
    local sub, logger, validate = args.split_call_options(opts, level + 1, LUA_OPTIONS,
      defaults and defaults.logger)
    local engine = opts.engine
    if refused then
      for i = 1, #refused do
        local r = refused[i]
        if opts[r[1]] ~= nil then error(r[2], level + 1) end
      end
    end
    if engine ~= nil and not is_engine(engine) then
      argerror(level + 1, "engine", "an engine (llmretry.new_engine()) or nil", engine)
    end
    return sub, logger, validate, engine
  end

  -- split's, with the call's context for the mailbox (llmretry.mailbox.drain)
  -- in place of logger and validate: sub, ctx, opts.engine.
  function A.split_options(opts, level, defaults)
    local sub, logger, validate, engine = split(opts, level + 1, defaults)
    return sub, { logger = logger, validate = validate, reported = false, report = report }, engine
  end
  local split_options = A.split_options

  -- Check and send one call: h, its mailbox context, the host's token,
  -- plain (nobody listens to its mail: llmretry.ffi drains it). `pool`: the
  -- context of the pool whose worker makes the call, or nil. no_ctx: a
  -- plain call gets no context (nil), which only its drain would read.
  function A.start(opts, level, on_chunk, pool, no_ctx)
    local sub, logger, validate, engine = split(opts, level + 1, pool)
    local plain = lffi and not on_chunk and not logger and not validate
    local ctx = nil
    if not (plain and no_ctx) then
      ctx = { logger = logger, validate = validate, reported = false, report = report,
        on_chunk = on_chunk }
    end
    local h, token = submit(sub, engine, pool, level + 1, plain)
    -- The core has copied what it needs of sub: the next call's to fill.
    release_sub(sub)
    return h, ctx, token, plain
  end
  local start = A.start

  -- One call, waited for the host's way: its mail delivered to the caller's
  -- functions as it comes, on_chunk (stream_llm's) given each chunk. A
  -- call with none of them under LuaJIT: drained and read through the FFI
  -- (llmretry.ffi), and, where the host says so (host.free_early), its
  -- call freed once read rather than when the handle is collected.
  local function run(opts, level, on_chunk)
    if check then check(level + 1) end
    local h, ctx, token, plain = start(opts, level + 1, on_chunk, sched.current(), true)
    if plain then
      local fdrain = lffi.drain
      while not fdrain(h) do wait(h, token) end
      if release then release(h, token) end
      local res, err = lffi.result(h)
      if free_early then lffi.free(h) end
      return res, err
    end
    while not drain(h, ctx) do wait(h, token) end
    if release then release(h, token) end
    if ctx.chunk_error ~= nil then error(ctx.chunk_error, 0) end
    return h:result()
  end

  -- call_llm(opts) -> res, or nil, err. (Not tail calls: the levels count
  -- the caller's frame.)
  function A.call_llm(opts)
    local res, err = run(opts, 2)
    return res, err
  end

  -- stream_llm(opts, on_chunk) -> res, or nil, err: call_llm, streamed.
  -- on_chunk(chunk) gets each decoded chunk as it arrives. Until the first
  -- chunk has reached on_chunk every failure is retried; after it, nothing
  -- is (err.kind == "stream_interrupted"). An on_chunk that raises cancels
  -- the stream; the error is raised once the call has ended.
  function A.stream_llm(opts, on_chunk)
    if not is_callable(on_chunk) then argerror(2, "on_chunk", "a function", on_chunk) end
    if type(opts) ~= "table" then argerror(2, "opts", "a table", opts) end
    local res, err = run(M.stream_options(opts), 2, on_chunk)
    return res, err
  end

  -- call_many(bodies, opts [, new_key]) -> outs: every body as one batch on
  -- the engine thread (an engine group), no coroutines. The group paces the
  -- batch: at most `limit` items run at once, a 429 that names a wait pauses
  -- the new starts of its model, the window adapts (opts.adaptive, default true), and
  -- opts.deadline_ms bounds the WHOLE batch (items not started in time fail
  -- with deadline_exceeded; a per-call deadline is opts.call_deadline_ms).
  -- new_key (a client's idempotency_key = "auto"): a fresh key per item.
  --
  -- Where it runs: host.batch() -> engine, channel, source: the host's
  -- engine, the channel its calls report to (the group only paces them) and
  -- what the loop waits on (poll() -> handles, wait(ms) -> false when
  -- nothing came; told of each call with source:add(h) and of its end with
  -- source:forget(h)). Without host.batch: opts.engine or an engine of its
  -- own, waiting on the group's channel on this thread.
  function A.call_many(bodies, opts, new_key)
    if check then check(2) end
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
    local ok_opts, why = pcall(core.check_options, sub, MANY_KEYS)
    if not ok_opts then error(why, 2) end
    local n = #bodies
    local outs = { n = n }
    -- Every body is encoded before the first call goes out: a body that
    -- cannot be sent raises before any I/O.
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

    local channel, source
    if host.batch then engine, channel, source = host.batch() end
    local owned = engine == nil
    engine = engine or core.new_engine()
    local group = engine:group{ limit = limit, deadline_ms = batch_deadline, adaptive = adaptive,
      poll = source == nil }
    source = source or group:channel()
    local hosted = channel ~= nil
    -- Keep the group's queue ahead of its pacer without holding every call
    -- of a huge batch at once.
    local ahead = 4 * limit + 64
    local watch, active, next_i = {}, 0, 1

    local function take_next()
      while active < ahead and next_i <= n do
        local i = next_i
        next_i = i + 1
        local s = {}
        for k, v in pairs(sub) do s[k] = v end
        s.body = payloads[i]
        s.group = group
        s.channel = channel
        if s.model == nil then s.model = models[i] end
        if new_key then s.idempotency_key = new_key() end
        -- Each call has its own logger state (one report per call).
        local c = { logger = ctx.logger, validate = ctx.validate, reported = false, report = report }
        -- pcall: an error raised here must not carry this file's position.
        local ok, h = pcall(engine.submit, engine, s)
        if not ok then error(h, 0) end
        if hosted then source:add(h) end
        payloads[i] = nil
        active = active + 1
        local function take(hh)
          if drain(hh, c) then
            watch[hh] = nil
            if hosted then source:forget(hh) end
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
      take_next()
      scheduler.run_loop(source, watch, function() return active == 0 and next_i > n end,
        function() take_next() return false end)
    end)
    outs.stats = group:stats()
    group:close()
    if owned then engine:close() end
    if not ok then
      -- The engine's argument errors (the first submit, before any I/O)
      -- point at our caller.
      if type(perr) == "string" then error(perr, 2) end
      error(perr, 0)
    end
    return outs
  end

  -- map_with_concurrency: worker(item, i) for each item in a coroutine of
  -- its own (llmretry.scheduler), at most `limit` at once, the workers'
  -- calls paced as one engine group. Checked here; host.map(items, limit,
  -- worker, opts, on_done, policy) runs the pool the host's way (blocking
  -- until the last item, or on an event loop, on_done at the end) and
  -- returns what the caller gets. host.map_options: the options it takes;
  -- host.map_on_done: whether it takes on_done. `policy`: a client's.
  function A.map_with_concurrency(items, limit, worker, opts, on_done, policy)
    opts = args.check_map_args(2, items, limit, worker, opts, host.map_options)
    if host.map_on_done and not is_callable(on_done) then
      argerror(2, "on_done", "a function", on_done)
    end
    if opts.engine ~= nil and not is_engine(opts.engine) then
      argerror(2, "opts.engine", "an engine (llmretry.new_engine()) or nil", opts.engine)
    end
    return host.map(items, limit, worker, opts, on_done, policy)
  end

  return A
end

return M
