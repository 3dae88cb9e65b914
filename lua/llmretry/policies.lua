-- llmretry.policies: named policies (issue 9), plain data loaded from a table
-- or a JSON file and checked when loaded, never at call time.
--
-- A policy is a named set of call options: the 14 keys of KEYS below. Lua
-- reads the JSON form of a policy file (examples/policies.json); a .toml
-- path is refused with a message saying so. The core checks every key
-- (core/src/policies.c): Python's loader calls the same code, so both
-- refuse a bad file with the same words.
--
-- Errors name the file (when loaded from one), the policy and the key:
--   llmretry: policies.json: policy 'fast': timeout_ms must be an integer (got string)

local core = require("llmretry.core")
local args = require("llmretry.args")
local typename = args.typename

local type, pairs, ipairs, tostring, error, pcall = type, pairs, ipairs, tostring, error, pcall
local setmetatable, getmetatable = setmetatable, getmetatable
local string, table, io = string, table, io

local M = {}

-- The keys of a policy, in the order :resolved() and the docs list them:
-- the core's (core/src/policies.c), which also holds their rules and
-- built-in values.
M.KEYS = {}
for i, k in ipairs(core.POLICY_KEYS) do M.KEYS[i] = k end

-- The policy keys a client's defaults may give (only these reach the core).
local IS_KEY = {}
for _, k in ipairs(M.KEYS) do IS_KEY[k] = true end
M.IS_KEY = IS_KEY

local Policies = {}
Policies.__index = Policies
Policies.__name = "llmretry.policies"

-- load(source): source is a table (name -> settings) or a path to a .json
-- file. Returns a policies object; raises on anything wrong. The core
-- (core/src/policies.c) checks every key, with the words Python uses too.
function M.load(source)
  if getmetatable(source) == Policies then return source end
  local text, origin
  if type(source) == "string" then
    origin = source
    if source:lower():match("%.toml$") then
      error("llmretry: " .. source .. ": Lua reads the JSON form of a policy file (e.g. "
        .. "examples/policies.json), not TOML: convert it to JSON or load the .json file", 0)
    end
    local f, ferr = io.open(source, "rb")
    if not f then
      error("llmretry: " .. source .. ": cannot read the policy file: " .. tostring(ferr), 0)
    end
    text = f:read("*a") or ""
    f:close()
  elseif type(source) == "table" then
    local ok, json = pcall(core.encode, source)
    if not ok then
      error("llmretry: policies must be plain data (a table of name -> settings): "
        .. tostring(json):gsub("^llmretry: ", ""), 0)
    end
    text = json
  else
    error("llmretry: policies must be a table (name -> settings) or the path of a .json file "
      .. "(got " .. typename(source) .. ")", 0)
  end
  local names, settings = core.parse_policies(text, origin)
  if not names then error("llmretry: " .. settings, 0) end
  local set = {}
  for _, name in ipairs(names) do set[name] = core.decode(settings[name]) end
  table.sort(names)
  return setmetatable({ _set = set, _json = settings, _names = names, _origin = origin },
    Policies)
end

function M.is_policies(v) return getmetatable(v) == Policies end

-- The names, sorted.
function Policies:names()
  local out = {}
  for i, n in ipairs(self._names) do out[i] = n end
  return out
end

-- The checked settings of one policy (only the keys it sets), or nil.
function Policies:get(name)
  return self._set[name]
end

-- The error for an unknown name, listing the known ones.
function Policies:unknown(name)
  local list = {}
  for i, n in ipairs(self._names) do list[i] = "'" .. n .. "'" end
  return string.format("llmretry: unknown policy %s (known: %s)",
    type(name) == "string" and ("'" .. name .. "'") or typename(name),
    #list > 0 and table.concat(list, ", ") or "none")
end

-- The options policy `name` gives over `defaults` (a client's call
-- options), as the core resolves them: every policy key (llm.null = unset)
-- and `url` when the endpoint's layer set one (the endpoint is one setting:
-- a policy's base_url beats a client's url). Cached per policy: a client's
-- defaults never change.
function Policies:layer(name, defaults)
  local cache = self._layers
  if not cache then cache = setmetatable({}, { __mode = "k" }); self._layers = cache end
  local by_name = cache[defaults]
  if not by_name then by_name = {}; cache[defaults] = by_name end
  if by_name[name] then return by_name[name] end
  local d = {}
  for k, v in pairs(defaults or {}) do
    if IS_KEY[k] or k == "url" then d[k] = v end
  end
  local json, err = core.resolve_policy(self._json[name], nil, core.encode(setmetatable(d, nil)))
  if not json then error("llmretry: " .. err, 3) end
  by_name[name] = core.decode(json)
  return by_name[name]
end

-- name -> the 14 keys of each policy: its own settings over `defaults` (a
-- table of call options, optional: a client's) over the built-in defaults;
-- llm.null = unset. The precedence is the core's.
function Policies:resolved(defaults)
  local djson
  if defaults then
    local d = {}
    for k, v in pairs(defaults) do
      if IS_KEY[k] then d[k] = v end
    end
    djson = core.encode(setmetatable(d, nil))
  end
  local out = {}
  for _, name in ipairs(self._names) do
    local json, err = core.resolve_policy(self._json[name], nil, djson)
    if not json then error("llmretry: " .. err, 2) end
    out[name] = core.decode(json)
  end
  return out
end

return M
