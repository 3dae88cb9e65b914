-- The Neovim examples of README.md and docs/ (marked `<!-- doc-test: nvim -->`)
-- run inside a real headless Neovim, against the mock server, as a user would
-- paste them: OPENAI_BASE_URL is the mock's (the examples name no base_url).
-- Run by tools/host-test.sh, which writes the examples as JSON
-- (tests/python/doc_examples.py lua) to $LLMRETRY_DOC_EXAMPLES.
--
-- Each example runs as one chunk with its `then` code appended (to use
-- what it defines); the test then waits until llmretry.nvim has no call
-- pending and fails if the example raised, made no call, or told the user
-- of an error or a warning (vim.notify).

local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/harness.lua")
local nv = require("llmretry.nvim")
local check = T.check

local path = os.getenv("LLMRETRY_DOC_EXAMPLES") or error("LLMRETRY_DOC_EXAMPLES is not set")
local f = assert(io.open(path, "r"))
local examples = vim.fn.json_decode(f:read("*a"))
f:close()

-- What the examples tell the user, by level.
local notes = {}
vim.notify = function(msg, level)
  notes[#notes + 1] = { msg = tostring(msg), level = level or vim.log.levels.INFO }
end

local n = 0
for _, ex in ipairs(examples) do
  if ex.host == "nvim" then
    n = n + 1
    T.test("doc example " .. ex.name, function()
      notes = {}
      local before = T.requests("default")
      local chunk, why = load(ex.code .. "\n" .. ex["then"] .. "\n", "=" .. ex.name)
      check(chunk, "does not compile: %s", tostring(why))
      chunk()
      check(T.wait_until(function() return nv.stats().pending == 0 end, 10000),
        "calls still pending after 10 s: %s", vim.inspect(nv.stats()))
      T.sleep(50)     -- callbacks scheduled by the last call's end
      local made = #T.requests("default") - #before
      check(made > 0, "the example made no call")
      for _, note in ipairs(notes) do
        check(note.level < vim.log.levels.WARN, "it told the user: %s", note.msg)
      end
    end)
  end
end

T.test("found the Neovim examples", function()
  check(n >= 4, "only %d examples marked doc-test: nvim", n)
end)

T.run(120000)
