-- llmretry.openresty_waiters: what a request of llmretry.openresty waits on
-- (a waiter: its ngx.semaphore and the fields below), who posts it, and the
-- pool that keeps a call_llm's waiter for the next call.
--
-- A waiter is { sema, request, posted } for call_llm (take/give), or a
-- batch's { sema, ready, handles } (made by the batch). Its fields:
--   awake   a call_llm's (either transport): false while the request
--           sleeps and nobody has posted it yet, true otherwise; nil for a
--           batch's waiter (posted whenever one of its calls has news).
--   posted  its semaphore was posted since it left the pool (post sets it).
--   ready   a batch's list of handles with news (post appends to it).
--
-- Why a pool: a semaphore is an FFI object with a finalizer (a weak-table
-- entry for the GC), and the pair was garbage on every call (issue 36).
-- Posts that came after the last drain are taken back first: a waiter comes
-- out of the pool with nothing pending, and nobody posts it any more (its
-- handle left the waiting table before). At most as many as the worker's
-- engine runs at once (256 to 4,096, as the core keeps its records:
-- spares.c): a gateway's thousand calls end in bursts, and past 256 most of
-- a burst's waiters were garbage, each with a semaphore to finalize. Only a
-- waiter marked posted has its semaphore looked at: most calls of the
-- transport "cosocket" are never posted, and two looks into memory nobody
-- touched for the call's 50 ms were a visible part of a call's cost on the
-- worker (issue 36).
--
-- One pool per worker (each has its own Lua VM): this module's upvalues.

local semaphore = require("ngx.semaphore")

local M = {}

local spare = {}
local CAP = 256

-- The pool keeps at most as many waiters as the worker's engine of
-- max_in_flight calls needs (llmretry.openresty says, at load and in
-- init_worker).
function M.set_max_in_flight(n)
  CAP = n < 256 and 256 or n > 4096 and 4096 or n
end

-- A waiter with nothing pending: a kept one, else a new one.
function M.take()
  local n = #spare
  if n == 0 then return { sema = semaphore.new(), request = {}, posted = false } end
  local waiter = spare[n]
  spare[n] = nil
  return waiter
end

-- Back to the pool once its call has ended and nobody can post it: its
-- pending posts taken back (a waiter that keeps one is dropped).
function M.give(waiter)
  if waiter.posted then
    -- Every post is taken back: one is pending when a post came while the
    -- request's wait was timing out (its timeout takes it off the
    -- semaphore's queue, not the post), two for a waiter that never says
    -- it sleeps (the second post saw a count of 0).
    local sema = waiter.sema
    while sema:count() > 0 do
      if not sema:wait(0) then break end
    end
    if sema:count() ~= 0 then return end
    waiter.posted = false
  end
  local n = #spare
  if n < CAP then spare[n + 1] = waiter end
end

-- Wake `waiter` to look at its calls, unless it is awake (a call_llm that
-- is not asleep reads its mail before it sleeps: a post would only be
-- taken back, issue 36). One pending post is enough: the waiter reads
-- everything there is.
function M.rouse(waiter)
  if waiter.awake then return end
  local sema = waiter.sema
  if sema:count() <= 0 then
    waiter.posted = true
    sema:post(1)
    -- A sleeping call_llm is posted once: a second post before it runs
    -- (count() is posts less waiters: 0 while the first waits to be
    -- delivered) would only stay pending.
    if waiter.awake == false then waiter.awake = true end
  end
end

-- The call of `key` has news: post its waiter in `waiting` (if any).
function M.post(waiting, key)
  local waiter = waiting[key]
  if waiter then
    local ready = waiter.ready
    if ready then ready[#ready + 1] = waiter.handles[key] end
    M.rouse(waiter)
  end
end

-- kept: waiters in the pool; pending: those of them with a post pending
-- (0: a kept waiter never wakes its next call for nothing).
function M.stats()
  local pending = 0
  for i = 1, #spare do
    if spare[i].sema:count() ~= 0 then pending = pending + 1 end
  end
  return #spare, pending
end

return M
