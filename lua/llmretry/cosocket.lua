-- llmretry.cosocket: one attempt's HTTP/1.1 exchange on an nginx cosocket,
-- for llmretry.openresty's transport "cosocket" (docs/openresty.md).
--
-- The worker's engine then has no thread (io_loop "host",
-- llmretry/host_io.h): it builds each attempt's request (head and body),
-- parses the response as its bytes come, and decides what comes of it,
-- as it does for its own transfers. This only carries the bytes: it
-- connects (a kept-alive connection of the worker's pool when there is
-- one), shakes hands over TLS, sends, hands each piece it reads to the
-- engine, keeps or closes the connection as the engine says, and names
-- what went wrong when something does. Nothing here decides a retry.

local lffi = require("llmretry.ffi")

local ngx = ngx
local find = string.find
local min = math.min

local M = {}

-- Kept-alive connections per pool (an origin: "host:port", "tls:host:port")
-- and how long an idle one is kept (ms): a gateway holds many calls at once.
M.POOL_SIZE = 1024
M.IDLE_MS = 60000

local FEED, XFER = lffi.FEED, lffi.XFER
local feed, failed = lffi.feed, lffi.failed
local FEED_MORE, FEED_DONE = FEED.MORE, FEED.DONE
-- A cosocket's timeouts are 32-bit milliseconds.
local NO_TIMEOUT = 2 ^ 31 - 1
local READ_SIZE = 65536

-- connect's options for each pool key, made once.
local pool_opts = setmetatable({}, { __mode = "k" })
local function opts_of(key)
  local o = pool_opts[key]
  if o == nil then
    o = { pool = key, pool_size = M.POOL_SIZE, backlog = M.POOL_SIZE }
    pool_opts[key] = o
  end
  return o
end

-- What a failed connect was, as the engine names it.
local function connect_error(err)
  if err == "timeout" then return XFER.TIMEOUT end
  if find(err, "resolv", 1, true) then return XFER.RESOLVE end
  return XFER.CONNECT
end

-- What a failed TLS handshake was: a certificate that does not verify is
-- never retried.
local function tls_error(err)
  if err == "timeout" then return XFER.TIMEOUT end
  if find(err, "certificate", 1, true) or find(err, "verify", 1, true) then
    return XFER.TLS_VERIFY
  end
  return XFER.TLS
end

-- The socket's timeout for its next operation: what is left before
-- `deadline` (ngx.now() seconds; nil: none, the cosocket's longest wait),
-- set when the loop's time has moved since `at` (when it was last set):
-- connect from the pool, send and the first read come in one turn, and
-- each settimeout was a call out of the trace. Returns the time it is set
-- at, or nil once the deadline has passed.
local FOREVER = -1
local function arm(sock, deadline, at)
  if deadline == nil then
    if at ~= FOREVER then sock:settimeout(NO_TIMEOUT) end
    return FOREVER
  end
  local now = ngx.now()
  if at == now then return at end
  local left = (deadline - now) * 1000
  if left < 1 then return nil end
  sock:settimeout(min(left, NO_TIMEOUT))
  return now
end

-- The exchange has ended: then(arg), if given, as a tail call.
local function ended(then_, arg)
  if then_ ~= nil then return then_(arg) end
end

-- The exchange failed (`why`, one of XFER; `reused`: on a kept-alive
-- connection): its socket closed (when it has one), the engine told, then
-- ended(then_, arg).
local function fail(sock, h, token, why, reused, message, then_, arg)
  if sock ~= nil then sock:close() end
  failed(h, token, why, reused, message)
  return ended(then_, arg)
end

-- The response's bytes, read and handed to the engine to its end; then
-- ended(then_, arg). perform's second half, reached by a tail call: the
-- request's light thread waits on the socket from this frame alone.
local function read_answer(h, token, sock, deadline, at, reused, then_, arg)
  while true do
    at = arm(sock, deadline, at)
    if not at then
      return fail(sock, h, token, XFER.TIMEOUT, reused, "timed out", then_, arg)
    end
    local data, err = sock:receiveany(READ_SIZE)
    if not data then
      return fail(sock, h, token, err == "timeout" and XFER.TIMEOUT or XFER.CLOSED, reused,
        "receive: " .. err, then_, arg)
    end
    local f = feed(h, token, data)
    if f ~= FEED_MORE then
      if f == FEED_DONE then
        sock:setkeepalive(M.IDLE_MS, M.POOL_SIZE)
      else
        sock:close()
      end
      return ended(then_, arg)
    end
  end
end

-- perform(h, token, host, port, tls, pool_key, request, timeout_ms
-- [, then_, arg]): the exchange (llmretry.ffi.exchange's values) of h's
-- call, to its end; then then_(arg) (the waiter's turn of the engine), its
-- results perform's. Yields the light thread while it waits on the
-- network. It ends in tail calls: reached by tail calls too
-- (llmretry.openresty_host), a request waits on the socket with few frames
-- under read_answer's. ngx_lua keeps its request coroutines and LuaJIT
-- shrinks a stack of over ~90 slots that it finds mostly empty: deeper,
-- each request's stack was shrunk between requests and grown again
-- (issue 36). (A cosocket cannot be closed while another light thread
-- reads it: to end an exchange early, run it in a light thread of its own
-- and kill that.)
function M.perform(h, token, host, port, tls, pool_key, request, timeout_ms, then_, arg)
  -- ngx.now() is the time of the event loop's turn (at most that stale):
  -- taken fresh once, for the deadline.
  if timeout_ms > 0 then ngx.update_time() end
  local deadline = timeout_ms > 0 and ngx.now() + timeout_ms / 1000 or nil
  local sock = ngx.socket.tcp()
  local at = arm(sock, deadline, nil)
  if not at then
    return fail(nil, h, token, XFER.TIMEOUT, false, "timed out before connecting", then_,
      arg)
  end
  local ok, err = sock:connect(host, port, opts_of(pool_key))
  if not ok then
    return fail(nil, h, token, connect_error(err), false,
      "could not connect to " .. pool_key .. ": " .. err, then_, arg)
  end
  local reused = (sock:getreusedtimes() or 0) > 0
  if tls and not reused then
    at = arm(sock, deadline, at)
    if not at then
      return fail(sock, h, token, XFER.TIMEOUT, false, "timed out before the TLS handshake",
        then_, arg)
    end
    ok, err = sock:sslhandshake(nil, host, true)
    if not ok then
      return fail(sock, h, token, tls_error(err), false, "TLS handshake: " .. err, then_, arg)
    end
  end
  at = arm(sock, deadline, at)
  if not at then
    return fail(sock, h, token, XFER.TIMEOUT, reused, "timed out before sending", then_, arg)
  end
  ok, err = sock:send(request)
  if not ok then
    return fail(sock, h, token, err == "timeout" and XFER.TIMEOUT or XFER.SEND, reused,
      "send: " .. err, then_, arg)
  end
  return read_answer(h, token, sock, deadline, at, reused, then_, arg)
end

return M
