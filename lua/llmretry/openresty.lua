-- llmretry.openresty: LLM calls from OpenResty / nginx Lua handlers that
-- never block the nginx worker.
--
--   -- nginx.conf, main context:  thread_pool default threads=16 max_queue=1000;
--   location /summary {
--     content_by_lua_block {
--       local llm = require("llmretry.openresty")
--       local res, err = llm.call_llm{ body = body, deadline_ms = 30000 }
--     }
--   }
--
-- How it works. call_llm hands the call to ngx.run_worker_thread: the
-- request's coroutine yields (the worker goes on serving other requests and
-- timers) while a thread of an nginx thread_pool runs llmretry.call_llm in
-- its own Lua state, blocking only that pool thread. Each of those Lua
-- states keeps a default engine (one connection cache) for the calls it
-- runs. Calls run at once up to the pool's `threads` per worker; the others
-- wait in its queue (`max_queue`, beyond which run_worker_thread fails).
--
-- Only plain values cross between the two Lua states (no functions, no
-- metatables), so:
--   * the body is encoded to JSON here, on the request side (a misspelt
--     option or a value that cannot be encoded raises before any I/O);
--   * `logger` (a function) runs here, with each event of the call, in order,
--     once the call has finished;
--   * `validate` is named, not passed: { module = "myapp.checks", func = "f" }
--     is require("myapp.checks").f, run on the pool thread (keep it pure: the
--     ngx API is not available there);
--   * the result is rebuilt here: res.data decoded from res.body (llmretry's
--     JSON conventions: llmretry.null, array markers), err with llmretry's
--     error metatable (tostring(err), llmretry.is_error(err)).
-- Usable where ngx.run_worker_thread is: rewrite_by_lua*, access_by_lua*,
-- content_by_lua* (Debian 12: nginx 1.22 with libnginx-mod-http-lua 0.10.23).

local M = {}

-- The thread pool calls go to, unless opts.thread_pool names another.
M.thread_pool = "default"

local type, pairs, ipairs, tostring, error, pcall = type, pairs, ipairs, tostring, error, pcall
local setmetatable, getmetatable, rawget = setmetatable, getmetatable, rawget
local string = string

local typename = type

local function argerror(level, name, want, got)
  error(string.format("llmretry: %s must be %s (got %s)", name, want, typename(got)), level + 1)
end

local function is_callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and type(rawget(mt, "__call")) == "function"
end

-- ---------------------------------------------------------------------------
-- The pool thread's side (its own Lua state).

local function resolve_validate(spec)
  local ok, mod = pcall(require, spec.module)
  if not ok then
    error(string.format("llmretry: validate.module %q cannot be loaded: %s", spec.module,
      tostring(mod)), 0)
  end
  local fn = type(mod) == "table" and mod[spec.func] or nil
  if not is_callable(fn) then
    error(string.format("llmretry: validate: %s.%s is not a function", spec.module, spec.func), 0)
  end
  return fn
end

-- ngx.run_worker_thread(pool, "llmretry.openresty", "run", opts, want_events)
-- -> a plain table: { ok = true, body =, meta =, events = } or
--    { ok = false, err =, events = }. Misuse raises (the request side re-raises).
function M.run(opts, want_events)
  local llm = require("llmretry")
  local events = nil
  if want_events then
    events = {}
    opts.logger = function(ev) events[#events + 1] = ev end
  end
  if opts.validate ~= nil then opts.validate = resolve_validate(opts.validate) end
  local res, err = llm.call_llm(opts)
  if res then
    return { ok = true, body = res.body, meta = res.meta, events = events }
  end
  local plain = {}
  for k, v in pairs(err) do plain[k] = v end
  return { ok = false, err = plain, events = events }
end

-- ---------------------------------------------------------------------------
-- The request's side.

local LOCAL_OPTIONS = { logger = true, thread_pool = true }

-- call_llm(opts) -> res | nil, err, as llmretry.call_llm; the request's
-- coroutine yields until a pool thread has run the call.
function M.call_llm(opts)
  if type(opts) ~= "table" then argerror(2, "opts", "a table", opts) end
  local core = require("llmretry.core")
  local logger = opts.logger
  if logger ~= nil and logger ~= false and not is_callable(logger) then
    argerror(2, "logger", "a function, false or nil", logger)
  end
  local pool = opts.thread_pool
  if pool == nil then pool = M.thread_pool end
  if type(pool) ~= "string" then argerror(2, "thread_pool", "a string", pool) end
  local v = opts.validate
  if v ~= nil and v ~= false then
    if type(v) ~= "table" or type(v.module) ~= "string" or type(v.func) ~= "string" then
      error("llmretry: validate must be { module = \"name\", func = \"name\" } in OpenResty: "
        .. "the call runs in another Lua state, where a function cannot be passed (got "
        .. typename(v) .. ")", 2)
    end
  end
  if opts.engine ~= nil then
    error("llmretry: engine is not an option of llmretry.openresty (each pool thread's Lua "
      .. "state has its own)", 2)
  end
  local args = {}
  for k, val in pairs(opts) do
    if not LOCAL_OPTIONS[k] then args[k] = val end
  end
  if v == false then args.validate = nil else args.validate = v and { module = v.module,
    func = v.func } end
  local body = opts.body
  if type(body) == "table" then
    local ok, text = pcall(core.encode, body)
    if not ok then error(text, 2) end
    args.body = text
    if args.model == nil and type(body.model) == "string" then args.model = body.model end
  elseif type(body) ~= "string" then
    argerror(2, "body", "a table or a JSON string", body)
  end
  local want_events = logger and true or false

  local ok, out = ngx.run_worker_thread(pool, "llmretry.openresty", "run", args, want_events)
  if not ok then
    error("llmretry: ngx.run_worker_thread failed: " .. tostring(out), 2)
  end

  if want_events and type(out.events) == "table" then
    local reported = false
    for _, ev in ipairs(out.events) do
      local lok, e = pcall(logger, ev)
      if not lok and not reported then
        reported = true
        ngx.log(ngx.ERR, "llmretry: the logger raised on ", tostring(ev.event), " (request_id=",
          tostring(ev.request_id), "): ", tostring(e),
          "; later logger errors of this call are not reported")
      end
    end
  end

  if out.ok then
    local data, derr = core.decode(out.body)
    if data == nil then
      -- The engine only returns a success whose body parsed; keep the text.
      error("llmretry: the response body no longer decodes: " .. tostring(derr), 2)
    end
    return { data = data, body = out.body, meta = out.meta }
  end
  return nil, setmetatable(out.err, core.error_mt)
end

return M
