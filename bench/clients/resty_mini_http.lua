-- The least HTTP/1.1 client over an nginx cosocket: what lua-resty-http does
-- for a gateway that calls a model from OpenResty today (lua-resty-http is
-- not in Debian's archive). The OpenResty benchmark's peer
-- (bench/run_openresty.sh): one POST, its response read whole (Content-Length,
-- chunked, or to the close), the connection back in the worker's keep-alive
-- pool. The retry loop is the gateway's (bench/openresty.conf).
local ngx = ngx
local tonumber, concat = tonumber, table.concat

local M = {}

-- Read the body of a chunked response (no trailers: nginx sends none).
local function read_chunked(sock)
  local parts = {}
  while true do
    local line, err = sock:receive("*l")
    if not line then return nil, err end
    local size = tonumber(line:match("^%x+"), 16)
    if not size then return nil, "bad chunk size" end
    if size == 0 then
      local _, e = sock:receive("*l")
      if e then return nil, e end
      return concat(parts)
    end
    local data, e = sock:receive(size)
    if not data then return nil, e end
    parts[#parts + 1] = data
    local _, e2 = sock:receive("*l")
    if e2 then return nil, e2 end
  end
end

-- post(host, port, path, body, headers, timeout_ms) -> status, body | nil, err.
-- headers: extra header lines, each ending in "\r\n".
function M.post(host, port, path, body, headers, timeout_ms)
  local sock = ngx.socket.tcp()
  sock:settimeout(timeout_ms)
  local ok, err = sock:connect(host, port)
  if not ok then return nil, "connect: " .. err end
  ok, err = sock:send({ "POST ", path, " HTTP/1.1\r\nHost: ", host,
    "\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: ",
    #body, "\r\n", headers, "\r\n", body })
  if not ok then sock:close() return nil, "send: " .. err end
  local line
  line, err = sock:receive("*l")
  if not line then sock:close() return nil, "status line: " .. err end
  local status = tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
  if not status then sock:close() return nil, "bad status line" end
  local length, chunked, close = nil, false, false
  while true do
    local h, e = sock:receive("*l")
    if not h then sock:close() return nil, "headers: " .. e end
    if h == "" then break end
    local name, value = h:match("^([^:]+):%s*(.-)%s*$")
    if name then
      name = name:lower()
      if name == "content-length" then
        length = tonumber(value)
      elseif name == "transfer-encoding" then
        chunked = value:lower():find("chunked", 1, true) ~= nil
      elseif name == "connection" then
        close = value:lower() == "close"
      end
    end
  end
  local data
  if chunked then
    data, err = read_chunked(sock)
  elseif length then
    data, err = sock:receive(length)
  else
    data, err = sock:receive("*a")
    close = true
  end
  if not data then sock:close() return nil, "body: " .. err end
  if close then sock:close() else sock:setkeepalive(60000, 2048) end
  return status, data
end

return M
