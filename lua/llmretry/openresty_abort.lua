-- llmretry.openresty_abort: the calls of a request whose client went away
-- are cancelled (llmretry.openresty, with lua_check_client_abort on). One
-- abort handler serves every request (it runs in the request, so ngx.ctx is
-- that request's), not a closure made per request (garbage, and NYI for
-- LuaJIT's compiler: FNEW). State per worker: each worker has its own Lua
-- VM.

local pcall, pairs = pcall, pairs
local ngx = ngx

local M = {}

local ABORT = {}    -- ngx.ctx key: { calls = set of handles, aborted, abortable }

-- Run after a request's calls are cancelled (llmretry.openresty: the
-- transport "cosocket"'s engine, which nobody else may run soon), or nil.
M.after_cancel = nil

local function cancel_all(live)
  live.aborted = true
  for h in pairs(live.calls) do h:cancel() end
  if M.after_cancel then M.after_cancel() end
end

local function cancel_request()
  local live = ngx.ctx[ABORT]
  if live then cancel_all(live) end
end

-- What watch returns for a request no abort can reach: nothing is kept.
local UNWATCHED = { calls = {}, aborted = false, abortable = false }

-- watch(h) -> the request's record { calls, aborted, abortable }, h in its
-- calls until the call ends (the caller takes it out).
function M.watch(h)
  -- nil, "lua_check_client_abort is off", or a timer (no client): no abort
  -- can reach this request, and its calls go on to their end; nothing is
  -- kept (ngx.ctx, the first time a request touches it, was the biggest
  -- part of a call's cost on the worker: issue 36). 1: registered now;
  -- "duplicate call": registered by an earlier call of this request, or by
  -- the handler itself (which may call cancel_calls).
  local ok, set, why = pcall(ngx.on_abort, cancel_request)
  if not ok or (set ~= 1 and why ~= "duplicate call") then return UNWATCHED end
  local ctx = ngx.ctx
  local live = ctx[ABORT]
  if live == nil then
    -- calls: not weak; a call leaves it when it ends (release), and one
    -- of a request killed meanwhile goes with the request's ngx.ctx.
    -- abortable: the client's going may cancel the calls (the transport
    -- "cosocket" then runs each exchange in a thread it can kill).
    live = { calls = {}, aborted = false, abortable = true }
    ctx[ABORT] = live
  end
  if live.aborted then h:cancel() end
  live.calls[h] = true
  return live
end

-- Cancel every call the current request has in flight: for a handler that
-- registers its own ngx.on_abort (this module's then cannot be).
function M.cancel_calls()
  local live = ngx.ctx[ABORT]
  if live then cancel_all(live) end
end

return M
