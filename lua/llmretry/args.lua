-- Argument checks shared by llmretry's Lua modules: wrong arguments are
-- programming errors, raised at once with error() naming the argument.
local core = require("llmretry.core")

local M = {}

-- type(v), but "null" for llmretry's (and lua-cjson's) null.
function M.typename(v)
  local t = type(v)
  if t == "userdata" and v == core.null then return "null" end
  return t
end

-- Raise "llmretry: <name> must be <want> (got <type>)" at `level` (1 = the
-- function calling argerror, as error()'s levels count).
function M.argerror(level, name, want, got)
  error(string.format("llmretry: %s must be %s (got %s)", name, want, M.typename(got)), level + 1)
end

function M.is_callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and type(rawget(mt, "__call")) == "function"
end

-- An integral number: a Lua 5.4 integer, or a float with no fraction (on
-- LuaJIT every number is a float), never NaN or infinite.
function M.is_integer(v)
  if type(v) ~= "number" then return false end
  if math.type and math.type(v) == "integer" then return true end
  return v == math.floor(v) and v == v and v ~= math.huge and v ~= -math.huge
end

return M
