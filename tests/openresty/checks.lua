-- A validator for the OpenResty host test, named in call_llm's
-- `validate = { module = "checks", func = "json_content" }`: it runs on a
-- pool thread, in that thread's Lua state.
local llm = require("llmretry")

local M = {}

-- The answer's content must itself be JSON.
function M.json_content(data)
  local content = data.choices and data.choices[1] and data.choices[1].message
    and data.choices[1].message.content
  if type(content) ~= "string" then return false, "no content" end
  if llm.decode(content) == nil then return false, "the content is not JSON" end
  return true
end

return M
