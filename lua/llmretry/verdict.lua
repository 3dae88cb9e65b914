-- A host's validate(data) applied to a 2xx body: one reading of its answer
-- for every Lua adapter (the blocking module, the pool, Neovim).
local core = require("llmretry.core")

local M = {}

-- true to accept; false, reason to reject (an invalid_response the policy
-- may retry). validate rejects by returning false (with an optional
-- message), nil plus a message, or by raising.
function M.of(validate, body)
  local data, derr = core.decode(body)
  if data == nil then
    return false, "the body is not valid JSON: " .. tostring(derr)
  end
  local ok, verdict, msg = pcall(validate, data)
  if not ok then
    local m = verdict
    if type(m) ~= "string" then m = tostring(m) end
    return false, m ~= "" and m or "validate raised"
  end
  if verdict == false then
    return false, msg ~= nil and tostring(msg) or "validate returned false"
  end
  if verdict == nil and msg ~= nil then
    return false, tostring(msg)
  end
  return true
end

return M
