-- The per-call path of llmretry.openresty's transport "cosocket", outside
-- nginx: what a request of bench/openresty.conf's /llmretry runs but the
-- sockets, in a plain LuaJIT loop (bench/instr_openresty.sh counts its
-- instructions). Each call: its options split as llmretry.api does, the
-- submit through llmretry.ffi, the engine's turn, the attempt's exchange
-- read and fed the 50 ms endpoint's canned answer (what bench/nginx.conf
-- sends), the channel polled, the mailbox drained, the result built and
-- checked, the call freed. WINDOW calls are in flight at once.
--
--   luajit bench/openresty_path.lua N [WINDOW]     (LUA_PATH/LUA_CPATH: the rock)
local N, WINDOW = tonumber(arg[1]), tonumber(arg[2] or "500")
if not N or not WINDOW or N < 1 or WINDOW < 1 then
  io.stderr:write("usage: luajit bench/openresty_path.lua N [WINDOW]\n")
  os.exit(2)
end
local core = require("llmretry.core")
local args = require("llmretry.args")
local lffi = require("llmretry.ffi")
if not lffi then
  io.stderr:write("openresty_path: llmretry.ffi is not available (run it under LuaJIT)\n")
  os.exit(2)
end

local BODY = '{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4.1-mini",'
  .. '"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},'
  .. '"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,'
  .. '"total_tokens":13}}\n'
local ANSWER = "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Sun, 06 Dec 2026 03:49:10 GMT\r\n"
  .. "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
  .. "Connection: keep-alive\r\n\r\n" .. string.format("%x", #BODY) .. "\r\n" .. BODY
  .. "\r\n0\r\n\r\n"
local HOST_KEYS = { logger = true, validate = true, engine = true }
local DONE = lffi.FEED.DONE

local engine = core.new_engine(4096, 0, nil, "host")
local channel = engine:new_channel()

-- The gateway's call_llm{...}, as bench/openresty.conf writes it.
local function submit()
  local opts = { url = "http://127.0.0.1:18089/slow/v1/chat/completions", api_key = "sk-bench",
    body = { model = "gpt-4.1-mini", messages = { { role = "user", content = "hi" } } },
    timeout_ms = 20000, deadline_ms = 60000, max_retries = 2 }
  local sub = args.split_call_options(opts, 1, HOST_KEYS, nil)
  sub.channel = channel
  local h = lffi.submit(engine, sub)
  args.release_sub(sub)
  if not h then error("the call was not submitted through llmretry.ffi") end
  return h
end

-- Who waits for which call, by the key the channel's poll names it by (as
-- llmretry.openresty's waiting map).
local waiting = {}
local function posted() end
local inflight, request, done, started = {}, {}, 0, 0
while done < N do
  while #inflight < WINDOW and started < N do
    local h = submit()
    inflight[#inflight + 1] = h
    waiting[lffi.key(h)] = h
    started = started + 1
  end
  lffi.run(engine)
  for i = 1, #inflight do
    local h = inflight[i]
    local token = lffi.exchange(h, request)
    if token and lffi.feed(h, token, ANSWER) ~= DONE then error("the answer was not taken") end
  end
  lffi.run(engine)
  lffi.poll(channel, posted, waiting)
  local still = {}
  for i = 1, #inflight do
    local h = inflight[i]
    if lffi.drain(h) then
      local res, err = lffi.result(h)
      if not (res and res.data.choices[1].message.content == "ok"
          and res.meta.usage.total_tokens == 13) then
        error("a call failed: " .. tostring(err))
      end
      waiting[lffi.key(h)] = nil
      lffi.free(h)
      done = done + 1
    else
      still[#still + 1] = h
    end
  end
  inflight = still
end
