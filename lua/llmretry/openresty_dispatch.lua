-- llmretry.openresty_dispatch: llmretry.openresty's transport "engine", the
-- waiting side (docs/openresty.md). The worker's engine runs its calls on
-- its I/O thread and reports them on a socket channel; a dispatcher (an
-- ngx.timer with a reader light thread) reads that socket and hands each
-- call's news to its waiting request. Without a dispatcher (it failed, or
-- the worker exits) the requests look for themselves every poll_s.
--
-- new{ waiting_mode, poll_s, log_err } -> { wake, idle, on_exit,
-- start_dispatch }: waiting_mode is d.waiting's __mode, log_err logs; each
-- call's waiter is woken by llmretry.openresty_waiters.post.
-- d = { channel, path, waiting, state, kick } is a dispatch (see
-- llmretry.openresty's W).

local lffi = require("llmretry.ffi")
local semaphore = require("ngx.semaphore")
local waiters = require("llmretry.openresty_waiters")
local post, rouse = waiters.post, waiters.rouse

local tostring, next, pairs, setmetatable, collectgarbage =
  tostring, next, pairs, setmetatable, collectgarbage
local ngx = ngx

-- The dispatcher's read timeout (ms): as long as the cosocket allows, since
-- nginx logs every cosocket timeout; it wakes on news or the channel's end.
local READ_TIMEOUT_MS = 2 ^ 31 - 1

local M = {}

function M.new(o)
  local waiting_mode, POLL_S, log_err = o.waiting_mode, o.poll_s, o.log_err
  local D = {}

  -- Post the waiter of every call with news on d's channel, until it is empty.
  local function wake(d)
    local ch, waiting = d.channel, d.waiting
    if lffi then return lffi.poll(ch, post, waiting) end
    while true do
      local hs = ch:poll()
      local n = #hs
      if n == 0 then return end
      for i = 1, n do post(waiting, hs[i]) end
    end
  end

  -- Nobody waits on d. Entries of requests killed while they waited go with
  -- their handles, at a full collection: one a second at most (an exiting
  -- worker asks on every wake-up).
  local function idle(d)
    if next(d.waiting) == nil then return true end
    local now = ngx.now()
    if now - (d.collected_at or 0) < 1 then return false end
    d.collected_at = now
    collectgarbage()
    return next(d.waiting) == nil
  end

  -- No more dispatch on d: the channel goes once its calls are gone, and its
  -- end of the dispatcher's connection with it. Its requests asleep look at
  -- once, and every POLL_S from then on (the state says so): else each
  -- would first sleep out its wait's second (WAIT_S), counted as a lost
  -- wake-up. A batch's waiter is posted with nothing ready: it looks too.
  local function stop(d)
    d.state = "stopped"
    d.closed = true
    d.channel:close()
    for _, waiter in pairs(d.waiting) do rouse(waiter) end
  end

  -- The dispatcher's reader (a light thread): every byte on the connection
  -- means "news", which wake() hands out. Returns why the connection ended.
  local function read_loop(d, sock)
    while true do
      local data, err = sock:receiveany(4096)
      if not data and err ~= "timeout" then
        d.reader_end = err
        d.kick:post(1)
        return
      end
      wake(d)
    end
  end

  -- The dispatcher: an ngx.timer callback. It connects to the channel, reads
  -- in a light thread of its own (read_loop), and itself waits on d.kick
  -- (posted when the reader ends or the worker starts exiting; else a look
  -- every second, which logs nothing, unlike a cosocket's timeout): an
  -- exiting worker lets its calls in flight finish, then stops the reader,
  -- whose endless read would otherwise hold the worker for ever.
  local function dispatch(premature, d)
    if premature then
      stop(d)         -- the worker exits before the dispatcher ever ran
      return
    end
    local sock = ngx.socket.tcp()
    local ok, err = sock:connect("unix:" .. d.path)
    if ok then ok, err = d.channel:accept(1000) end
    if not ok then
      log_err("the dispatcher could not connect to its engine's channel (", tostring(err),
        "); the calls of this worker look for their news every ", POLL_S * 1000, " ms instead")
      sock:close()
      d.failed_at = ngx.now()
      stop(d)
      return
    end
    sock:settimeouts(1000, 1000, READ_TIMEOUT_MS)
    d.state = "running"
    local reader = ngx.thread.spawn(read_loop, d, sock)
    while true do
      d.kick:wait(1)
      if d.reader_end then
        if d.state == "running" then
          log_err("the dispatcher's connection to its engine's channel ended (",
            tostring(d.reader_end), ")")
          d.failed_at = ngx.now()
        end
        break
      end
      if d.state ~= "running" or (ngx.worker.exiting() and idle(d)) then break end
    end
    if not d.reader_end then ngx.thread.kill(reader) end
    sock:close()
    if d.state ~= "stopped" then stop(d) end
  end

  -- A worker that exits stops an idle dispatcher at once, a busy one once its
  -- calls have ended (the dispatcher looks every second, and on each news).
  -- A semaphore posted from here would wake nobody before the next event
  -- (nginx runs this while closing idle connections, outside its event
  -- loop), so the channel is closed instead: the core closes its end of the
  -- reader's connection, and that is an event. Handles of finished calls
  -- still hold the C channel: collected first.
  local function on_exit(premature, w)
    if not premature then
      ngx.timer.at(86400, on_exit, w)     -- a day has passed: wait another
      return
    end
    w.exiting = true
    local d = w.d
    if d.state ~= "stopped" and next(d.waiting) == nil then
      collectgarbage()
      if next(d.waiting) == nil then stop(d) end
    end
  end

  local function new_dispatch(w, channel, state)
    local d = { channel = channel, state = state, kick = semaphore.new(),
      waiting = setmetatable({}, { __mode = waiting_mode }) }
    w.d = d
    return d
  end

  -- A new channel on w's engine for its calls from now on: a socket channel
  -- and its dispatcher, or, when there can be none (the worker exits, the
  -- last one failed within the second, no timer), a plain channel that the
  -- waiting requests look at themselves (state "stopped"). Either way no
  -- socket path is left behind: a socket channel exists only with a
  -- dispatcher on its way to connect to it.
  local function start_dispatch(w)
    local prev = w.d
    local failed_at = prev and prev.failed_at
    if w.exiting or ngx.worker.exiting() or (failed_at and ngx.now() - failed_at < 1) then
      new_dispatch(w, w.engine:new_channel(), "stopped").failed_at = failed_at
      return
    end
    local ch = w.engine:new_channel{ socket = true }
    local d = new_dispatch(w, ch, "starting")
    d.path = ch:path()
    local ok, err = ngx.timer.at(0, dispatch, d)
    if not ok then
      log_err("cannot start the dispatcher (ngx.timer.at: ", tostring(err), "); the calls of "
        .. "this worker look for their news every ", POLL_S * 1000, " ms instead")
      ch:close()
      new_dispatch(w, w.engine:new_channel(), "stopped").failed_at = ngx.now()
    end
  end

  D.wake, D.idle, D.on_exit, D.start_dispatch = wake, idle, on_exit, start_dispatch
  return D
end

return M
