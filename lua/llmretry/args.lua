-- Argument checks shared by llmretry's Lua modules: wrong arguments are
-- programming errors, raised at once with error() naming the argument.
local core = require("llmretry.core")

local M = {}

-- table.new(narr, nrec) where the Lua has it (LuaJIT), else {}.
local ok_new, new_tab = pcall(require, "table.new")
if not ok_new then new_tab = function() return {} end end
-- table.clear(t) where the Lua has it (LuaJIT), else a loop.
local ok_clear, clear_tab = pcall(require, "table.clear")
if not ok_clear then
  clear_tab = function(t)
    for k in pairs(t) do t[k] = nil end
  end
end

M.new_tab, M.clear_tab = new_tab, clear_tab

-- A `sub` of split_call_options that its caller handed back (release_sub)
-- once the core had read it: the next split fills it rather than making
-- one (a table and its hash part less per call: issue 36).
local spare_sub = nil

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

local function key_text(k)
  if type(k) == "number" then return tostring(k) end
  if type(k) == "string" then return string.format("%q", k:sub(1, 40)) end
  return "of type " .. M.typename(k)
end

-- Raise unless t is a sequence: keys 1..#t and nothing else, but for the
-- field `n` that table.pack sets. A table with other keys would otherwise
-- pass for a shorter list (or an empty one) without a word.
function M.check_array(level, name, t)
  local len, count = #t, 0
  for k in pairs(t) do
    if k ~= "n" then
      if not (M.is_integer(k) and k >= 1 and k <= len) then
        error(string.format("llmretry: %s must be an array (keys 1..n), not a table with the "
          .. "key %s", name, key_text(k)), level + 1)
      end
      count = count + 1
    end
  end
  if count < len then
    local i = 1
    while t[i] ~= nil do i = i + 1 end
    error(string.format("llmretry: %s must be an array (keys 1..n), not a table with a hole "
      .. "at [%d]", name, i), level + 1)
  end
  return len
end

-- A call's options split into engine:submit's and the host module's own:
-- checks opts, logger (a function or false; `default_logger` when nil) and
-- validate, copies every key not in `host_keys`, flags validate for the
-- engine and asks for no events when nobody logs them. Returns sub, logger,
-- validate (nil when off). `level` is the caller's, as for argerror.
function M.split_call_options(opts, level, host_keys, default_logger)
  if type(opts) ~= "table" then M.argerror(level + 1, "opts", "a table", opts) end
  local logger, validate = opts.logger, opts.validate
  if logger == nil then logger = default_logger end
  if logger ~= nil and logger ~= false and not M.is_callable(logger) then
    M.argerror(level + 1, "logger", "a function, false or nil", logger)
  end
  if validate ~= nil and validate ~= false and not M.is_callable(validate) then
    M.argerror(level + 1, "validate", "a function or nil", validate)
  end
  local sub = spare_sub
  if sub ~= nil then
    spare_sub = nil
  else
    -- Sized once (the engine's keys below included): grown key by key, it
    -- was five allocations per call.
    local n = 2
    for _ in pairs(opts) do n = n + 1 end
    sub = new_tab(0, n)
  end
  for k, v in pairs(opts) do
    if not host_keys[k] then sub[k] = v end
  end
  if validate then sub.validate = true end
  if not logger and sub.event_mask == nil then sub.event_mask = 0 end
  return sub, logger or nil, validate or nil
end

-- release_sub(sub): split_call_options's sub back, for its next call.
-- Only once nothing holds it: engine:submit and llmretry.ffi.submit read it
-- and keep nothing of it (llmretry.api's start hands it back after them).
function M.release_sub(sub)
  clear_tab(sub)
  spare_sub = sub
end

-- map_with_concurrency's arguments, checked alike in every host: items an
-- array, limit an integer >= 1, worker a function, opts nil or a table of
-- the keys in `allowed` (a set): return_errors a boolean, logger a function
-- or false. Returns opts (a table). `level` is the caller's, as for argerror.
function M.check_map_args(level, items, limit, worker, opts, allowed)
  level = level + 1   -- argerror's and error's levels count this frame
  if type(items) ~= "table" then M.argerror(level, "items", "a table (array)", items) end
  M.check_array(level, "items", items)
  if not M.is_integer(limit) or limit < 1 then
    if type(limit) == "number" then
      error(string.format("llmretry: limit must be an integer >= 1 (got %s)", tostring(limit)),
        level)
    end
    M.argerror(level, "limit", "an integer >= 1", limit)
  end
  if not M.is_callable(worker) then M.argerror(level, "worker", "a function", worker) end
  if opts ~= nil and type(opts) ~= "table" then M.argerror(level, "opts", "a table or nil", opts) end
  opts = opts or {}
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for name in pairs(allowed) do names[#names + 1] = name end
      local meant = type(k) == "string" and core.suggest(k, names)
      error(string.format("llmretry: opts.%s is not an option of map_with_concurrency%s",
        tostring(k), meant and (" (did you mean " .. meant .. "?)") or ""), level)
    end
  end
  local return_errors = opts.return_errors
  if return_errors ~= nil and type(return_errors) ~= "boolean" then
    M.argerror(level, "opts.return_errors", "a boolean or nil", return_errors)
  end
  local logger = opts.logger
  if logger ~= nil and logger ~= false and not M.is_callable(logger) then
    M.argerror(level, "opts.logger", "a function, false or nil", logger)
  end
  return opts
end

return M
