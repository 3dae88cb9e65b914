-- Neovim quits promptly with a call in flight (run by tools/host-test.sh,
-- which times the process and expects exit code 0 within a few seconds):
-- llmretry.nvim closes its engine on VimLeavePre, cancelling the call.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/harness.lua")
local nv = require("llmretry.nvim")

T.test("start a 30 s call, then quit with it in flight", function()
  T.script("exit_inflight", {}, { delay_ms = 30000 })
  local called = false
  nv.call_llm(T.opts("exit_inflight", { timeout_ms = 60000 }), function() called = true end)
  T.check(T.wait_until(function() return #T.requests("exit_inflight") == 1 end, 3000, 20),
    "the call did not reach the server")
  T.check(not called and nv.stats().pending == 1, "the call is not in flight")
end)

-- T.run quits with qall! once the test is done: the call is still in flight.
T.run(30000)
