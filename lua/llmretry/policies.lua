-- llmretry.policies: named policies (issue 9), plain data loaded from a table
-- or a JSON file and checked when loaded, never at call time.
--
-- A policy is a named set of call options: the 14 keys of KEYS below. Lua
-- reads the JSON form of a policy file (examples/policies.json) through the
-- core's cJSON; a .toml path is refused with a message saying so.
--
-- Errors name the file (when loaded from one), the policy and the key:
--   llmretry: policies.json: policy 'fast': timeout_ms must be an integer (got string)

local core = require("llmretry.core")
local args = require("llmretry.args")
local typename, is_integer = args.typename, args.is_integer

local type, pairs, ipairs, tostring, error, pcall, next = type, pairs, ipairs, tostring, error,
  pcall, next
local setmetatable, getmetatable = setmetatable, getmetatable
local string, table, math, io = string, table, math, io

local M = {}

-- The keys of a policy, in the order :resolved() and the docs list them.
M.KEYS = { "base_url", "model", "timeout_ms", "max_retries", "base_delay_ms", "max_delay_ms",
  "jitter", "deadline_ms", "retry_mode", "retry_statuses", "max_retry_after_ms",
  "retry_invalid_response", "max_response_bytes", "idempotency_key" }

-- The core's built-in defaults (core/src/options.c); core.null = unset.
local null = core.null
M.BUILTIN = {
  base_url = null, model = null, timeout_ms = 60000, max_retries = 3, base_delay_ms = 800,
  max_delay_ms = 30000, jitter = "additive", deadline_ms = null, retry_mode = "safe",
  retry_statuses = null, max_retry_after_ms = 120000, retry_invalid_response = true,
  max_response_bytes = 32 * 1024 * 1024, idempotency_key = null,
}

local function to_int(v)
  if math.tointeger then return math.tointeger(v) or v end
  return v
end

-- Each checker returns the value to keep, or raises a string (the message
-- after "<key> ").
local function int_check(lo, hi, what)
  return function(v)
    if not is_integer(v) then
      error({ "must be an integer (got " .. typename(v) .. ")" })
    end
    if (lo and v < lo) or (hi and v > hi) then
      error({ string.format("must be %s (got %s)", what, tostring(to_int(v))) })
    end
    return to_int(v)
  end
end

local function str_check(v)
  if type(v) ~= "string" then error({ "must be a string (got " .. typename(v) .. ")" }) end
  return v
end

local function enum_check(values)
  local set, list = {}, {}
  for i, s in ipairs(values) do set[s] = true; list[i] = string.format("%q", s) end
  local want = table.concat(list, ", ")
  return function(v)
    if type(v) ~= "string" then
      error({ "must be a string, one of " .. want .. " (got " .. typename(v) .. ")" })
    end
    if not set[v] then
      -- The value is not repeated: a secret pasted here must not reach a log.
      error({ string.format("must be one of %s (got another string)", want) })
    end
    return v
  end
end

local function bool_check(v)
  if type(v) ~= "boolean" then error({ "must be a boolean (got " .. typename(v) .. ")" }) end
  return v
end

local function statuses_check(v)
  if type(v) ~= "table" then
    error({ "must be an array of integers (got " .. typename(v) .. ")" })
  end
  local n = 0
  for k in pairs(v) do
    if type(k) ~= "number" then error({ "must be an array of integers (got a table with key "
      .. string.format("%q", tostring(k)) .. ")" }) end
    n = n + 1
  end
  local out = {}
  for i = 1, n do
    local s = v[i]
    if s == nil then error({ "must be an array of integers (got a table with holes)" }) end
    if not is_integer(s) then
      error({ string.format("[%d] must be an integer (got %s)", i, typename(s)) })
    end
    if s < 100 or s > 599 then
      error({ string.format("[%d] must be an HTTP status 100..599 (got %s)", i,
        tostring(to_int(s))) })
    end
    out[i] = to_int(s)
  end
  return setmetatable(out, core.array_mt)
end

local CHECK = {
  base_url = str_check,
  model = str_check,
  timeout_ms = int_check(1, nil, "> 0"),
  max_retries = int_check(0, 100, "0..100"),
  base_delay_ms = int_check(0, nil, ">= 0"),
  max_delay_ms = int_check(0, nil, ">= 0"),
  jitter = enum_check({ "additive", "full", "none" }),
  deadline_ms = int_check(0, nil, ">= 0"),
  retry_mode = enum_check({ "safe", "unsafe" }),
  retry_statuses = statuses_check,
  max_retry_after_ms = int_check(0, nil, ">= 0"),
  retry_invalid_response = bool_check,
  max_response_bytes = int_check(1, nil, "> 0"),
  idempotency_key = function(v)
    if v ~= "auto" then
      error({ string.format('must be "auto" (a fresh key per call; a fixed key would be shared '
        .. "by every call) (got %s)", type(v) == "string" and "another string"
        or typename(v)) })
    end
    return v
  end,
}
M.IS_KEY = CHECK

local Policies = {}
Policies.__index = Policies
Policies.__name = "llmretry.policies"

-- Check one policy table; returns the checked copy. `where` prefixes errors.
local function check_policy(where, name, p)
  if type(p) ~= "table" or getmetatable(p) == core.array_mt then
    error(string.format("%spolicy '%s' must be a table of settings (got %s)", where, name,
      type(p) == "table" and "an array" or typename(p)), 0)
  end
  local keys = {}
  for k in pairs(p) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local out = {}
  for _, k in ipairs(keys) do
    local chk = type(k) == "string" and CHECK[k] or nil
    if not chk then
      error(string.format("%spolicy '%s': unknown key %s (the keys: %s)", where, name,
        type(k) == "string" and string.format("'%s'", k) or tostring(k),
        table.concat(M.KEYS, ", ")), 0)
    end
    local ok, v = pcall(chk, p[k])
    if not ok then
      if type(v) == "table" then
        local msg = v[1]
        local sep = msg:sub(1, 1) == "[" and "" or " "
        error(string.format("%spolicy '%s': %s%s%s", where, name, k, sep, msg), 0)
      end
      error(v, 0)
    end
    out[k] = v
  end
  return out
end

-- load(source[, origin]): source is a table (name -> settings) or a path to a
-- .json file. Returns a policies object; raises on anything wrong.
function M.load(source)
  if getmetatable(source) == Policies then return source end
  local where, data = "llmretry: ", source
  if type(source) == "string" then
    local file = source
    where = "llmretry: " .. file .. ": "
    if file:lower():match("%.toml$") then
      error(where .. "Lua reads the JSON form of a policy file (e.g. examples/policies.json), "
        .. "not TOML: convert it to JSON or load the .json file", 0)
    end
    local f, ferr = io.open(file, "rb")
    if not f then error(where .. "cannot read the policy file: " .. tostring(ferr), 0) end
    local text = f:read("*a")
    f:close()
    local derr
    data, derr = core.decode(text or "")
    if data == nil then error(where .. "not valid JSON: " .. tostring(derr), 0) end
  elseif type(source) ~= "table" then
    error("llmretry: policies must be a table (name -> settings) or the path of a .json file "
      .. "(got " .. typename(source) .. ")", 0)
  end
  if type(data) ~= "table" or getmetatable(data) == core.array_mt
      or (next(data) ~= nil and data[1] ~= nil) then
    error(where .. "the policies must be an object of name -> settings (got "
      .. (type(data) == "table" and "an array" or typename(data)) .. ")", 0)
  end
  local names = {}
  for name in pairs(data) do
    if type(name) ~= "string" or name == "" then
      error(string.format("%sa policy name must be a non-empty string (got %s)", where,
        type(name) == "string" and '""' or tostring(name)), 0)
    end
    names[#names + 1] = name
  end
  table.sort(names)
  local set = {}
  for _, name in ipairs(names) do set[name] = check_policy(where, name, data[name]) end
  return setmetatable({ _set = set, _names = names,
    _origin = type(source) == "string" and source or nil }, Policies)
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

-- name -> the 14 keys of each policy: its own settings over `defaults` (a
-- table of call options, optional: a client's) over the built-in defaults;
-- llm.null = unset.
function Policies:resolved(defaults)
  local out = {}
  for _, name in ipairs(self._names) do
    local p, r = self._set[name], {}
    for _, k in ipairs(M.KEYS) do
      local v = p[k]
      if v == nil and defaults then v = defaults[k] end
      if v == nil then v = M.BUILTIN[k] end
      r[k] = v
    end
    out[name] = r
  end
  return out
end

return M
