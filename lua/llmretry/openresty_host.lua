-- llmretry.openresty_host: llmretry.openresty's transport "cosocket", the
-- waiting side (docs/openresty.md). The worker's engine has no thread
-- (io_loop "host"): hw = { engine, channel, waiting } is that engine, the
-- one channel its calls report to, and who waits for which. No dispatcher:
-- whoever runs the engine (turn: every waiting request, after each
-- exchange, at each wake-up) hands its news out at once, and the requests
-- whose calls wait for a timer (backoff, deadline, budget) sleep at most
-- until the engine's next due time. The bytes go through llmretry.cosocket.
--
-- new(key_of, watch_abort) -> the functions below, bound to
-- llmretry.openresty's own: key_of(h) names a call in `waiting`,
-- watch_abort(h) -> the request's abort record (live.abortable,
-- live.calls). A call's waiter is woken by llmretry.openresty_waiters.post.

local lffi = require("llmretry.ffi")
local cosocket = require("llmretry.cosocket")
local semaphore = require("ngx.semaphore")
local post = require("llmretry.openresty_waiters").post

local type, pairs, tostring, rawget = type, pairs, tostring, rawget
local ngx = ngx
local lffi_run, lffi_exchange, lffi_poll = lffi.run, lffi.exchange, lffi.poll

local M = {}

-- Does this call stream (an engine with a thread's, then)?
function M.streams(sub)
  local body = sub.body
  return sub.stream_chunks == true or (type(body) == "table" and rawget(body, "stream") == true)
end

function M.new(key_of, watch_abort)
  local T = {}

  -- The engine's turn, then every waiter whose call has news posted.
  -- Returns how soon (s) the engine wants to run again at the latest.
  local function turn(hw)
    local _, next_ms = lffi_run(hw.engine)
    lffi_poll(hw.channel, post, hw.waiting)
    if next_ms < 1 then next_ms = 1 end
    return next_ms / 1000
  end
  T.turn = turn

  -- A call's exchange in a light thread of its own (the request's): what
  -- a client abort needs, since only killing that thread ends the exchange
  -- before its answer (a cosocket cannot be closed while another light
  -- thread reads it).
  local function exchange_thread(waiter, hw, h, ...)
    cosocket.perform(h, ...)
    waiter.xthread = nil
    turn(hw)
    -- The request looks at its call now: a failed attempt of a call nobody
    -- listens to brings no news (its retry's timer is the request's to wait).
    -- Posted as news is (llmretry.openresty_waiters.post: a sleeping waiter
    -- only, and once; marked posted for the pool).
    post(hw.waiting, key_of(h))
  end

  -- The attempt of h's call that waits for its host, if any, when the
  -- request's client may go away (its abort handler is set): started in a
  -- light thread of its own (true: it has ended already, look now).
  local function spawn_pending(hw, h, waiter)
    if waiter.xthread ~= nil then return false end
    local token, host, port, tls, key, request, timeout_ms = lffi_exchange(h, waiter.request)
    if not token then return false end
    waiter.xthread = true     -- taken off by the thread: it may end before spawn returns
    local th, err = ngx.thread.spawn(exchange_thread, waiter, hw, h, token, host, port, tls,
      key, request, timeout_ms)
    if not th then
      waiter.xthread = nil
      lffi.failed(h, token, lffi.XFER.CONNECT, false, "ngx.thread.spawn: " .. tostring(err))
      turn(hw)
      return true
    end
    if waiter.xthread == nil then
      return true             -- it has ended already (a refused connect): look now
    end
    waiter.xthread = th
    return false
  end

  -- The exchange thread of a call that ended without it (cancelled) ends.
  function T.end_exchange(waiter)
    local th = waiter.xthread
    waiter.xthread = nil
    if type(th) == "thread" then ngx.thread.kill(th) end
  end

  -- A sleep until the call's news or the engine's next due time `due` (s,
  -- at most max_s), then the engine's turn.
  local function sleep(hw, h, waiter, due, max_s)
    waiter.awake = false
    waiter.sema:wait(due < max_s and due or max_s)
    waiter.awake = true
    turn(hw)
    if waiter.xthread ~= nil and not lffi.has_exchange(h) then T.end_exchange(waiter) end
  end

  -- call_llm's wait when nobody can abort the request: the attempt handed
  -- out (at submit or by the last turn) performed in this light thread,
  -- then the engine's turn; none: the engine's turn (due == nil) and a
  -- look again, then the sleep. By tail calls only, down to the socket
  -- read (llmretry.cosocket.perform says why).
  local function in_request(hw, h, waiter, max_s, due)
    local token, host, port, tls, key, request, timeout_ms = lffi_exchange(h, waiter.request)
    if token then
      return cosocket.perform(h, token, host, port, tls, key, request, timeout_ms, turn, hw)
    end
    if due == nil then return in_request(hw, h, waiter, max_s, turn(hw)) end
    return sleep(hw, h, waiter, due, max_s)
  end

  -- call_llm's wait: its attempt in this light thread (or, when the client
  -- may go away, in one of its own), else a sleep until its news or the
  -- engine's next due time (at most max_s).
  function T.wait(hw, h, waiter, max_s)
    if not waiter.live.abortable then return in_request(hw, h, waiter, max_s, nil) end
    if spawn_pending(hw, h, waiter) then return end
    local due = turn(hw)
    if spawn_pending(hw, h, waiter) then return end
    return sleep(hw, h, waiter, due, max_s)
  end

  -- What call_many waits on: the batch's semaphore and ready list (as
  -- llmretry.openresty's batch_source), and each attempt of its calls
  -- performed in a light thread of the request's own, started as the
  -- engine hands it out (the engine's news names the call).
  function T.batch_source(hw)
    local waiter = { sema = semaphore.new(), ready = {}, handles = {} }
    local handles, performing = waiter.handles, {}
    local src = {}
    local live
    function src.add(_, h)
      local key = key_of(h)
      hw.waiting[key] = waiter
      handles[key] = h
      live = watch_abort(h)
    end
    function src.forget(_, h)
      local key = key_of(h)
      handles[key] = nil
      hw.waiting[key] = nil
      if live then live.calls[h] = nil end
      local th = performing[h]
      performing[h] = nil
      if type(th) == "thread" then
        ngx.thread.kill(th)     -- a cancelled call's exchange: nobody reads it
      end
    end
    local function perform(h, ...)
      cosocket.perform(h, ...)
      performing[h] = nil
      turn(hw)
      -- The loop looks again (a retry's timer may be sooner than its wait).
      local sema = waiter.sema
      if sema:count() <= 0 then sema:post(1) end
    end
    local function start_exchanges()
      for _, h in pairs(handles) do
        if not performing[h] then
          local token, host, port, tls, key, request, timeout_ms = lffi_exchange(h, {})
          if token then
            -- The thread runs up to its first wait before spawn returns: it
            -- may have ended already (a refused connect), and then it has
            -- taken its mark off.
            performing[h] = true
            local th, err = ngx.thread.spawn(perform, h, token, host, port, tls, key, request,
              timeout_ms)
            if not th then
              performing[h] = nil
              lffi.failed(h, token, lffi.XFER.CONNECT, false,
                "ngx.thread.spawn: " .. tostring(err))
            elseif performing[h] then
              performing[h] = th
            end
          end
        end
      end
    end
    function src.poll()
      turn(hw)
      start_exchanges()
      local ready = waiter.ready
      waiter.ready = {}
      return ready
    end
    function src.wait(_, ms)
      local due = turn(hw)
      start_exchanges()
      if #waiter.ready == 0 then
        local s = ms / 1000
        waiter.sema:wait(due < s and due or s)
        turn(hw)
        start_exchanges()
      end
      return #waiter.ready > 0
    end
    return src
  end

  return T
end

return M
