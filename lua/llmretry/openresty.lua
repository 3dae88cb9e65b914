-- llmretry.openresty: LLM calls from OpenResty / nginx Lua handlers that
-- never block the nginx worker, and no thread per call.
--
--   init_worker_by_lua_block { require("llmretry.openresty").init_worker() }  -- optional
--   location /summary {
--     content_by_lua_block {
--       local llm = require("llmretry.openresty")
--       local res, err = llm.call_llm{ body = body, deadline_ms = 30000 }
--     }
--   }
--
-- How it works. Each worker has one engine (made by init_worker, else on
-- the first call), shared by every request of the worker: one I/O thread,
-- one connection cache, one set of limits. Its calls report to one socket
-- channel of that engine. A dispatcher, a light thread started with
-- ngx.timer.at, connects a cosocket to that channel (an nginx cosocket can
-- connect to "unix:/path" but cannot watch a descriptor it did not open:
-- the core writes one byte to that connection whenever the channel has
-- news), reads the bytes, polls the channel until it is empty, and posts
-- the ngx.semaphore of each request whose call has news. The request's
-- light thread then reads its call's mailbox itself: loggers, validate
-- and on_chunk run in the request, as events and chunks arrive. Nothing
-- blocks the worker, and no Lua runs off it.
--
-- A call whose client goes away is cancelled (with lua_check_client_abort
-- on: this module registers the request's ngx.on_abort); a worker that
-- exits (reload, quit) lets its calls in flight finish, then stops its
-- dispatcher so that the worker can exit (llmretry.openresty_dispatch).
--
-- The transport "cosocket" (init_worker{ transport = "cosocket" }): the
-- worker's engine has no thread; a request runs it and carries its call's
-- bytes on the worker's cosockets (llmretry.openresty_host, llmretry.cosocket).
-- Streams still run on an engine with a thread, made on the first one.
--
-- Usable where ngx.semaphore can wait: rewrite_by_lua*, access_by_lua*,
-- content_by_lua*, ngx.timer callbacks (Debian 12: nginx 1.22 with
-- libnginx-mod-http-lua 0.10.23 and lua-resty-core).

local core = require("llmretry.core")
local semaphore = require("ngx.semaphore")
local llm = require("llmretry")
local args = require("llmretry.args")
local api = require("llmretry.api")
-- LuaJIT's FFI path (llmretry.ffi): always there under OpenResty's
-- LuaJIT; false when the FFI cannot be had, and then the classic one.
local lffi = require("llmretry.ffi")
local ffi_submit = lffi and lffi.submit

local type, pairs, tostring, error, pcall, next = type, pairs, tostring, error, pcall, next
local setmetatable = setmetatable
local string = string
local ngx = ngx

local argerror, is_integer = args.argerror, args.is_integer

local M = {}

M.encode = core.encode
M.decode = core.decode
M.null = core.null
M.array_mt = core.array_mt
M.empty_array = core.empty_array
M.error_mt = core.error_mt
M.is_error = llm.is_error

-- The worker engine's max_in_flight when init_worker does not say: a
-- gateway holds many long calls at once (the core's own default is 256).
M.DEFAULT_MAX_IN_FLIGHT = 1024
-- The gateway engine's I/O loop (docs/openresty.md): "events" touches only
-- the transfers whose sockets are ready, where a gateway has hundreds of
-- requests waiting on a slow server and few answering at each wake-up.
M.DEFAULT_IO_LOOP = "events"
-- Who moves the bytes of the worker's calls (init_worker's transport):
-- "engine" (its I/O thread, libcurl) or "cosocket" (the worker itself).
M.DEFAULT_TRANSPORT = "engine"

-- A request waits this long (seconds) for its semaphore before it looks at
-- its call itself: a wake-up lost to a bug costs a second, not the call.
-- Without a dispatcher (it failed, or the worker is exiting) requests look
-- every POLL_S instead.
local WAIT_S, POLL_S = 1, 0.02
-- Waits of the transport "engine" that ran out with a dispatcher to post
-- them (M.stats' wait_timeouts): a call slower than WAIT_S has one a
-- second; on calls quicker than that, each is a lost wake-up.
local wait_timeouts = 0
local function log_err(...) ngx.log(ngx.ERR, "llmretry: ", ...) end

-- The first error a call's logger raises goes to the error log (the call goes on).
local function report_logger_error(ev, e)
  log_err("the logger raised on ", tostring(ev.event), " (request_id=", tostring(ev.request_id),
    "): ", tostring(e), "; the call goes on (later logger errors of this call are not reported)")
end

-- ---------------------------------------------------------------------------
-- The worker's engine and its dispatch.
--
-- W = { engine, d, exiting }: one per worker (this chunk's upvalue; each
-- worker has its own Lua VM). d = { channel, path, waiting, state }: the
-- channel the worker's calls report to, and who waits for which:
-- waiting maps a call's key (key_of(h)) to its waiter { sema, ready,
-- handles }, weak (the values; the keys too where they are handles), so
-- that a request killed while it waits leaves nothing behind (its handles
-- are collected, which cancels their calls). state: "starting" (the
-- dispatcher has not connected yet), "running", or "stopped" (none: the
-- requests look for themselves every POLL_S); closed once stop() closed its
-- channel.

local W = nil
local HW = nil      -- the transport "cosocket"'s engine (below), or nil

-- A call's key in d.waiting: under the FFI, a number the channel's poll
-- names it by (no table of handles per poll); else the handle itself.
local key_of = lffi and lffi.key or function(h) return h end
local WAITING_MODE = lffi and "v" or "kv"

-- What requests wait on, who posts them, and call_llm's pool of them.
local waiters = require("llmretry.openresty_waiters")
local take_waiter, give_waiter = waiters.take, waiters.give
waiters.set_max_in_flight(M.DEFAULT_MAX_IN_FLIGHT)

-- The transport "engine"'s dispatcher (llmretry.openresty_dispatch).
local DISPATCH = require("llmretry.openresty_dispatch").new{
  waiting_mode = WAITING_MODE, poll_s = POLL_S, log_err = log_err }
local wake, start_dispatch, on_exit = DISPATCH.wake, DISPATCH.start_dispatch, DISPATCH.on_exit

-- The call of h has ended: nobody waits for it. The last one of an exiting
-- worker has the dispatcher look now rather than at its next second.
local function release(w, d, h)
  d.waiting[key_of(h)] = nil
  if d.kick and w.exiting and next(d.waiting) == nil then d.kick:post(1) end
end

-- The worker's shared store (docs/shared.md): init_worker's `shared`, else
-- LLMRETRY_SHARED (which nginx passes only with `env LLMRETRY_SHARED;`).
-- Every worker naming one store paces one budget per endpoint.
local function shared_store(o)
  if o.shared ~= nil then return o.shared end
  local env = os.getenv("LLMRETRY_SHARED")
  return env ~= "" and env or nil
end

-- init_worker's options, for an engine made later (the transport
-- "cosocket" makes its threaded engine on the first stream).
local CONFIG = {}

-- A forked worker's engine is its parent's: it makes its own. Each engine
-- notes the pid it was made in, and each call compares it with nginx's
-- (an FFI call a trace makes) rather than asking the engine (a C method:
-- out of the trace, on every call).
local worker_pid = ngx.worker.pid

local function new_worker(o)
  local engine = core.new_engine(o.max_in_flight or M.DEFAULT_MAX_IN_FLIGHT,
    o.max_host_connections, shared_store(o), o.io_loop or M.DEFAULT_IO_LOOP)
  local w = { engine = engine, exiting = false, pid = worker_pid() }
  local ok, err = pcall(start_dispatch, w)
  if not ok then
    engine:close()
    error(err, 0)
  end
  ngx.timer.at(86400, on_exit, w)
  W = w
  return w
end

-- The worker's engine and its current dispatch: made on first use, and a
-- new one when the last was closed (the worker exits, or its dispatcher
-- failed) or, a second after a failure, to try a dispatcher again.
local function worker()
  local w = W
  if w == nil or w.pid ~= worker_pid() then
    w = new_worker(CONFIG)
  end
  local d = w.d
  if d.closed or (d.state == "stopped" and not w.exiting and not ngx.worker.exiting()
      and ngx.now() - (d.failed_at or 0) >= 1) then
    start_dispatch(w)
  end
  return w
end

-- ---------------------------------------------------------------------------
-- The transport "cosocket": HW = { engine, channel, waiting }, the worker's
-- thread-less engine; its waiting side is llmretry.openresty_host's (bound
-- below, once watch_abort exists).
local hostio = lffi and require("llmretry.openresty_host")
local HOST = nil

local function new_host_worker(o)
  local engine = core.new_engine(o.max_in_flight or M.DEFAULT_MAX_IN_FLIGHT,
    o.max_host_connections, shared_store(o), "host")
  HW = { engine = engine, channel = engine:new_channel(), pid = worker_pid(),
    waiting = setmetatable({}, { __mode = WAITING_MODE }) }
  return HW
end

local function host_worker()
  local hw = HW
  if hw == nil or hw.pid ~= worker_pid() then hw = new_host_worker(CONFIG) end
  return hw
end

-- init_worker([opts]) in init_worker_by_lua*: make the worker's engine and
-- start its dispatcher now rather than on the first call. opts:
-- max_in_flight (default M.DEFAULT_MAX_IN_FLIGHT), max_host_connections
-- (0: libcurl's default), shared ("shm:NAME" or "redis://...": the budgets
-- of every worker naming it are one; default LLMRETRY_SHARED), io_loop
-- ("events", the default M.DEFAULT_IO_LOOP, or "perform": the engine's I/O
-- loop, docs/openresty.md).
function M.init_worker(opts)
  if opts ~= nil and type(opts) ~= "table" then argerror(2, "opts", "a table or nil", opts) end
  opts = opts or {}
  for k, v in pairs(opts) do
    if k ~= "max_in_flight" and k ~= "max_host_connections" and k ~= "shared"
        and k ~= "io_loop" and k ~= "transport" then
      error(string.format("llmretry: opts.%s is not an option of init_worker "
        .. "(max_in_flight, max_host_connections, shared, io_loop, transport)", tostring(k)), 2)
    end
    if k == "transport" then
      if v ~= "engine" and v ~= "cosocket" then
        argerror(2, "transport", '"engine" or "cosocket"', v)
      end
      if v == "cosocket" and not lffi then
        error("llmretry: transport \"cosocket\" needs LuaJIT's FFI (llmretry.ffi), "
          .. "which this Lua does not have", 2)
      end
    elseif k == "io_loop" then
      if v ~= "events" and v ~= "perform" then
        argerror(2, "io_loop", '"events" or "perform"', v)
      end
    elseif k == "shared" then
      if type(v) ~= "string" then
        argerror(2, "shared", '"shm:NAME" or "redis://..." (a string)', v)
      end
    elseif not is_integer(v) or v < 0 or (k == "max_in_flight" and v < 1) then
      argerror(2, k, k == "max_in_flight" and "an integer >= 1" or "an integer >= 0", v)
    end
  end
  if (W ~= nil and not W.engine:forked()) or (HW ~= nil and not HW.engine:forked()) then
    error("llmretry: init_worker: this worker's engine exists already (call init_worker "
      .. "in init_worker_by_lua*, before any call)", 2)
  end
  CONFIG = opts
  waiters.set_max_in_flight(opts.max_in_flight or M.DEFAULT_MAX_IN_FLIGHT)
  if (opts.transport or M.DEFAULT_TRANSPORT) == "cosocket" then
    new_host_worker(opts)
  else
    new_worker(opts)
  end
end

-- ---------------------------------------------------------------------------
-- Client aborts (llmretry.openresty_abort): the calls of a request whose
-- client went away are cancelled.

local abort = require("llmretry.openresty_abort")
local watch_abort = abort.watch
-- The transport "cosocket": nobody else may run the engine soon.
abort.after_cancel = function() if HW ~= nil then HOST.turn(HW) end end
M.cancel_calls = abort.cancel_calls

-- ---------------------------------------------------------------------------
-- Calls

-- Phases where a light thread cannot wait (ngx.semaphore): raise before
-- anything is sent.
local NO_WAIT = { init = true, init_worker = true, set = true, header_filter = true,
  body_filter = true, log = true, balancer = true, exit_worker = true, ssl_session_store = true }

local function check_phase(level)
  local phase = ngx.get_phase()
  if NO_WAIT[phase] then
    error(string.format("llmretry: a call cannot wait in the %s phase (use rewrite_by_lua*, "
      .. "access_by_lua*, content_by_lua* or a timer)", phase), level + 1)
  end
end

HOST = hostio and hostio.new(key_of, watch_abort)

-- What call_many waits on: a semaphore the dispatcher posts for any of the
-- batch's calls, and the list of those with news.
local function batch_source(w, d)
  local waiter = { sema = semaphore.new(), ready = {}, handles = {} }
  local handles = waiter.handles
  local src = {}
  local live
  function src.add(_, h)
    local key = key_of(h)
    d.waiting[key] = waiter
    handles[key] = h
    live = watch_abort(h)
  end
  function src.forget(_, h)
    handles[key_of(h)] = nil
    release(w, d, h)
    if live then live.calls[h] = nil end
  end
  function src.poll()
    local ready = waiter.ready
    waiter.ready = {}
    return ready
  end
  function src.wait(_, ms)
    local ok = waiter.sema:wait(d.state == "stopped" and POLL_S or ms / 1000)
    if not ok then wake(d) end
    return #waiter.ready > 0
  end
  return src
end

-- The calls as llmretry.api declares them; they wait by yielding the
-- request's light thread on a semaphore that the dispatcher posts.
local A = api.new{
  name = "llmretry.openresty",
  refused = {
    { "engine", "llmretry: engine is not an option of llmretry.openresty (every call runs on "
      .. "the worker's engine: see init_worker)" },
    { "thread_pool", "llmretry: thread_pool is not an option any more: calls run on the "
      .. "worker's engine, with no thread pool (docs/openresty.md)" },
  },
  report = report_logger_error,
  check = check_phase,
  -- On the worker's engine, reporting to its dispatcher's channel; the
  -- token is the call's waiter (its semaphore, and the dispatch it is in).
  -- A plain call (nobody listens to its mail) through the FFI when its
  -- options allow (llmretry.ffi.submit), else the classic engine:submit.
  submit = function(sub, _, _, level, plain)
    if (HW ~= nil or CONFIG.transport == "cosocket") and not hostio.streams(sub) then
      local hw = host_worker()
      sub.channel = hw.channel
      local h = plain and ffi_submit(hw.engine, sub) or api.submit(hw.engine, sub, level + 1)
      local waiter = take_waiter()
      waiter.hw = hw
      waiter.awake = true
      hw.waiting[key_of(h)] = waiter
      waiter.live = watch_abort(h)
      return h, waiter
    end
    local w = worker()
    local d = w.d
    sub.channel = d.channel
    local h = plain and ffi_submit(w.engine, sub) or api.submit(w.engine, sub, level + 1)
    local waiter = take_waiter()
    waiter.w, waiter.d = w, d
    waiter.awake = true
    d.waiting[key_of(h)] = waiter
    waiter.live = watch_abort(h)
    return h, waiter
  end,
  wait = function(h, waiter)
    local hw = waiter.hw
    -- A tail call (llmretry.cosocket.perform says why).
    if hw then return HOST.wait(hw, h, waiter, WAIT_S) end
    local d = waiter.d
    -- Asleep until posted: post wakes it once (llmretry.openresty_waiters).
    waiter.awake = false
    local polling = d.state == "stopped"    -- no dispatcher: a look every POLL_S
    local ok = waiter.sema:wait(polling and POLL_S or WAIT_S)
    waiter.awake = true
    if not ok then                  -- nobody woke us: look for ourselves
      if not polling then wait_timeouts = wait_timeouts + 1 end
      wake(d)
    end
  end,
  release = function(h, waiter)
    if waiter.hw then
      waiter.hw.waiting[key_of(h)] = nil
      waiter.hw = nil
      HOST.end_exchange(waiter)
    else
      release(waiter.w, waiter.d, h)
    end
    waiter.awake = nil
    -- Out of the request's calls: its call may be freed now (free_early).
    waiter.live.calls[h] = nil
    waiter.live = nil
    give_waiter(waiter)
  end,
  free_early = true,
  batch = function()
    if HW ~= nil or CONFIG.transport == "cosocket" then
      local hw = host_worker()
      return hw.engine, hw.channel, HOST.batch_source(hw)
    end
    local w = worker()
    local d = w.d
    return w.engine, d.channel, batch_source(w, d)
  end,
}

-- call_llm(opts) -> res | nil, err, as llmretry.call_llm; the request's
-- light thread yields until the call has ended, its logger (a function)
-- getting each event as it happens and validate (a function) each 2xx
-- body, in the request.
--
-- stream_llm(opts, on_chunk) -> res | nil, err, as llmretry.stream_llm:
-- on_chunk(chunk) runs in the request with each decoded chunk as it
-- arrives, free to ngx.print and ngx.flush (a gateway proxying the stream
-- to its client).
--
-- call_many(bodies, opts) -> outs, as llmretry.call_many, on the worker's
-- engine: every body one call, at most opts.limit at once (default 8),
-- paced as one batch; the request yields until all have ended.
M.call_llm, M.stream_llm = A.call_llm, A.stream_llm
function M.call_many(bodies, opts)
  return A.call_many(bodies, opts)
end

-- ---------------------------------------------------------------------------
-- Introspection (tests, a status location)

-- { engine = bool, dispatcher = "starting" | "running" | "stopped" | nil,
--   waiting = calls waited for now, exiting = bool }
-- transport = "engine" | "cosocket" (and, under "cosocket", the calls its
-- engine has waiting: host_waiting), waiters_kept = call_llm's waiters
-- kept for the next calls, waiters_pending = those of them with a post
-- still pending (0: a kept waiter never wakes its next call for nothing),
-- wait_timeouts = the transport "engine"'s waits that ran out with nobody
-- posting them while a dispatcher could (one a second for a call slower
-- than a second; on quicker calls, each is a wake-up lost: the call was a
-- second late). Without a dispatcher requests look every POLL_S: not
-- counted.
function M.stats()
  local w = W
  local transport = CONFIG.transport or M.DEFAULT_TRANSPORT
  local hn = 0
  if HW ~= nil then
    for _ in pairs(HW.waiting) do hn = hn + 1 end
  end
  local kept, pending = waiters.stats()
  if w == nil then
    return { engine = HW ~= nil, waiting = hn, exiting = false, transport = transport,
      host_waiting = hn, waiters_kept = kept, waiters_pending = pending,
      wait_timeouts = wait_timeouts }
  end
  local n = 0
  for _ in pairs(w.d.waiting) do n = n + 1 end
  return { engine = true, dispatcher = w.d.state, waiting = n + hn, exiting = w.exiting,
    transport = transport, host_waiting = hn, waiters_kept = kept, waiters_pending = pending,
    wait_timeouts = wait_timeouts }
end

-- What the worker's engine knows of each endpoint (llmretry.endpoint_stats):
-- under the transport "cosocket", its thread-less engine's.
function M.endpoint_stats()
  if HW ~= nil then return HW.engine:endpoint_stats() end
  local w = W
  if w == nil then return {} end
  return w.engine:endpoint_stats()
end

return M
