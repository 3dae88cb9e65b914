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

-- The time left before `deadline` (ngx.now() seconds) in ms, at least 1;
-- nil once it has passed. No deadline: the cosocket's longest wait.
local function left_ms(deadline)
  if deadline == nil then return NO_TIMEOUT end
  local left = (deadline - ngx.now()) * 1000
  if left < 1 then return nil end
  return min(left, NO_TIMEOUT)
end

-- perform(h, token, host, port, tls, pool_key, request, timeout_ms): the
-- exchange (llmretry.ffi.exchange's values) of h's call, to its end.
-- Yields the light thread while it waits on the network. (A cosocket
-- cannot be closed while another light thread reads it: to end an
-- exchange early, run it in a light thread of its own and kill that.)
function M.perform(h, token, host, port, tls, pool_key, request, timeout_ms)
  -- ngx.now() is the time of the event loop's turn (at most that stale):
  -- taken fresh once, for the deadline.
  if timeout_ms > 0 then ngx.update_time() end
  local deadline = timeout_ms > 0 and ngx.now() + timeout_ms / 1000 or nil
  local sock = ngx.socket.tcp()
  sock:settimeout(left_ms(deadline) or 1)
  local ok, err = sock:connect(host, port, opts_of(pool_key))
  if not ok then
    failed(h, token, connect_error(err), false, "could not connect to " .. pool_key .. ": " .. err)
    return
  end
  local reused = (sock:getreusedtimes() or 0) > 0
  if tls and not reused then
    local t = left_ms(deadline)
    if t == nil then
      sock:close()
      failed(h, token, XFER.TIMEOUT, false, "timed out before the TLS handshake")
      return
    end
    sock:settimeout(t)
    ok, err = sock:sslhandshake(nil, host, true)
    if not ok then
      sock:close()
      failed(h, token, tls_error(err), false, "TLS handshake: " .. err)
      return
    end
  end
  local t = left_ms(deadline)
  if t == nil then
    sock:close()
    failed(h, token, XFER.TIMEOUT, reused, "timed out before sending")
    return
  end
  sock:settimeout(t)
  ok, err = sock:send(request)
  if not ok then
    sock:close()
    failed(h, token, err == "timeout" and XFER.TIMEOUT or XFER.SEND, reused, "send: " .. err)
    return
  end
  while true do
    t = left_ms(deadline)
    if t == nil then
      sock:close()
      failed(h, token, XFER.TIMEOUT, reused, "timed out")
      return
    end
    sock:settimeout(t)
    local data
    data, err = sock:receiveany(READ_SIZE)
    if not data then
      sock:close()
      failed(h, token, err == "timeout" and XFER.TIMEOUT or XFER.CLOSED, reused, "receive: " .. err)
      return
    end
    local f = feed(h, token, data)
    if f ~= FEED_MORE then
      if f == FEED_DONE then
        sock:setkeepalive(M.IDLE_MS, M.POOL_SIZE)
      else
        sock:close()
      end
      return
    end
  end
end

return M
