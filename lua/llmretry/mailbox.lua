-- Reading one call's mailbox on the host's thread: events to the logger, a
-- 2xx body to the validator, a stream's chunks to on_chunk. One reading for
-- every host (llmretry.api's calls), whose calls wait differently (a
-- handle's wait, a pool's loop, an ngx.semaphore, Neovim's main loop) but
-- read alike.
local core = require("llmretry.core")

local tostring, pcall, string, io = tostring, pcall, string, io
local decode = core.decode
local verdict_of = require("llmretry.verdict").of

local M = {}

-- The first error a call's logger raises, on stderr: the call goes on.
function M.report_to_stderr(ev, e)
  local stderr = io.stderr
  if stderr then
    pcall(stderr.write, stderr, string.format(
      "llmretry: the logger raised on %s (request_id=%s): %s; the call goes on (later "
        .. "logger errors of this call are not reported)\n",
      tostring(ev.event), tostring(ev.request_id), tostring(e)))
  end
end

-- An event to ctx.logger. The first error the logger raises goes to
-- ctx.report(ev, e) (default: stderr) and sets ctx.reported; the call goes
-- on, and later errors of the same call are not reported. The one rule for
-- a raising logger, whatever the host (nvim.lua reports by vim.notify).
function M.log(ctx, ev)
  local logger = ctx.logger
  if logger then
    local ok, e = pcall(logger, ev)
    if not ok and not ctx.reported then
      ctx.reported = true
      local report = ctx.report or M.report_to_stderr
      report(ev, e)
    end
  end
end

-- The verdict on a 2xx body the core asks about: ctx.validate's, or ok.
function M.verdict(ctx, body)
  if ctx.validate then return verdict_of(ctx.validate, body) end
  return true, nil
end

-- A decoded chunk (or, coalesced, a list of them) to ctx.on_chunk. The
-- caller's own bug stops the stream: the caller raises it once it has ended.
local function give(h, ctx, chunk)
  local ok, e = pcall(ctx.on_chunk, chunk)
  if not ok then
    ctx.chunk_error = e
    h:cancel()
  end
end

-- Take every item now in h's mailbox. True once the call is done. ctx:
-- logger, validate, on_chunk (functions or nil), report(ev, e) (the first
-- logger error; default: stderr), coalesce (on_chunk gets a list of the
-- chunks read one after another, not each: Neovim's one call per loop
-- turn), and what this sets: reported, and chunk_error (what on_chunk
-- raised: the stream is cancelled, the caller raises it once the call has
-- ended).
function M.drain(h, ctx)
  local chunks = nil      -- coalesced chunks not yet given
  while true do
    local kind, value = h:next()
    if kind == "chunk" then
      -- A stream's chunk (stream_llm): decoded, to the caller's on_chunk.
      -- The first one read is the commit point: no retry after it.
      local chunk = decode(value)
      if chunk ~= nil and ctx.on_chunk and ctx.chunk_error == nil then
        if ctx.coalesce then
          chunks = chunks or {}
          chunks[#chunks + 1] = chunk
        else
          give(h, ctx, chunk)
        end
      end
    else
      -- What came before this item reaches on_chunk before it.
      if chunks then
        give(h, ctx, chunks)
        chunks = nil
      end
      if kind == nil then
        return false
      elseif kind == "done" then
        return true
      elseif kind == "event" then
        M.log(ctx, value)
      elseif kind == "validate" then
        h:validated(M.verdict(ctx, value))
      end
    end
  end
end

return M
