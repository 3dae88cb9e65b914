-- llmretry.ffi: the per-call path of a call nobody listens to, through
-- LuaJIT's FFI (issue 36). Decided once, at load: under LuaJIT with its
-- ffi module (OpenResty, Neovim, luajit) this module is a table of
-- functions; under any other interpreter, or when the FFI cannot be had,
-- it is false, and every call takes the classic path (handle:next,
-- handle:result).
--
-- Why: a classic C function (lua_CFunction) ends a LuaJIT trace, so the
-- Lua around handle:next and handle:result ran interpreted, and the
-- interpreter makes every FFI call of lua-resty-core (semaphores, ngx.ctx)
-- slow too. The functions here are plain C (bindings/lua/ffi.c), which a
-- trace calls like any other: draining a call that has no logger, no
-- validate and no stream, reading its result and meta (the tables built
-- here, keys interned once), freeing its call, and polling a channel.
-- Policy stays in the core; this converts values, nothing more. Anything
-- out of the ordinary (a failure, a body that does not decode, text that
-- is not UTF-8, a field of a kind not handled here) goes to the classic
-- function, so that results and errors are the same either way.
--
-- M.calls counts the results read here (tests: the path is taken).
local jit = rawget(_G, "jit")
if type(jit) ~= "table" then return false end
local ok_ffi, ffi = pcall(require, "ffi")
if not ok_ffi then return false end
local core = require("llmretry.core")
if type(core._ffi) ~= "function" then return false end

-- The same struct as bindings/lua/lffi.h, between its cdef markers.
local CDEF = [[
typedef enum llmretry_field_type {
    LLMRETRY_FIELD_NULL = 0,
    LLMRETRY_FIELD_INT,
    LLMRETRY_FIELD_STRING,
    LLMRETRY_FIELD_USAGE,
    LLMRETRY_FIELD_BOOL,
    LLMRETRY_FIELD_LIST,
    LLMRETRY_FIELD_JSON
} llmretry_field_type;
typedef struct llmretry_usage llmretry_usage;
typedef struct llmretry_field {
    const char *name;
    llmretry_field_type type;
    int64_t i;
    const char *s;
    const llmretry_usage *usage;
    struct {
        int shape;
        const void *items;
        size_t size, n;
    } list;
} llmretry_field;
typedef struct lr_ffi_api {
    int abi;
    int (*drain)(void *handle);
    const void *(*result)(void *handle, const char **body, size_t *len, int *flags);
    void (*free)(void *handle);
    uintptr_t (*key)(void *handle);
    size_t (*poll)(void *channel, uintptr_t *keys, size_t max);
    ptrdiff_t (*text_len)(const char *s);
    int (*shape_field)(int shape, const void *obj, size_t i, llmretry_field *out);
    size_t (*shape_field_count)(int shape);
    const char *(*field_name)(int shape, size_t i);
} lr_ffi_api;
]]
local ABI = 1
-- Another copy of this module (or of an older one) declared these already
-- in this state: ffi.cdef raises on a redefinition, and then they are ours.
pcall(ffi.cdef, CDEF)
local ok_api, api = pcall(ffi.cast, "const lr_ffi_api *", core._ffi())
if not ok_api or api.abi ~= ABI then return false end

local tonumber, type = tonumber, type
local ffi_string = ffi.string
local decode = core.decode
local ok_new, new_tab = pcall(require, "table.new")
if not ok_new then new_tab = function() return {} end end

local M = { CDEF = CDEF, calls = 0 }

-- llmretry_field_type's values (llmretry/shapes.h).
local F_NULL, F_INT, F_STRING, F_USAGE, F_BOOL = 0, 1, 2, 3, 4
local SHAPE_META, SHAPE_USAGE = 0, 3
local OK, RAW = 1, 2

-- Each shape's field names, in the core's order, interned once.
local function names_of(shape)
  local names = {}
  for i = 0, tonumber(api.shape_field_count(shape)) - 1 do
    names[i + 1] = ffi_string(api.field_name(shape, i))
  end
  return names
end
local NAMES = { [SHAPE_META] = names_of(SHAPE_META), [SHAPE_USAGE] = names_of(SHAPE_USAGE) }

local field = ffi.new("llmretry_field")
local body_p, len_p, flags_p = ffi.new("const char *[1]"), ffi.new("size_t[1]"), ffi.new("int[1]")
local keys = ffi.new("uintptr_t[64]")

-- The object `obj` of `shape` as a table, as the classic binding builds it
-- (shapes.c: a null field absent); nil when a field needs the classic path.
local function shape_table(shape, obj)
  local names = NAMES[shape]
  local n = #names
  local t = new_tab(0, n)
  for i = 0, n - 1 do
    api.shape_field(shape, obj, i, field)
    local ty = field.type
    if ty == F_INT then
      t[names[i + 1]] = tonumber(field.i)
    elseif ty == F_STRING then
      local s = field.s
      local len = api.text_len(s)
      if len < 0 then return nil end
      t[names[i + 1]] = ffi_string(s, len)
    elseif ty == F_BOOL then
      t[names[i + 1]] = field.i ~= 0
    elseif ty == F_USAGE then
      local u = shape_table(SHAPE_USAGE, field.usage)
      if u == nil then return nil end
      t[names[i + 1]] = u
    elseif ty ~= F_NULL then
      return nil
    end
  end
  return t
end

-- h's mail up to its end, for a call nobody listens to (no logger, no
-- validate, no on_chunk): true once it is done.
function M.drain(h)
  return api.drain(h) ~= 0
end

-- h's result as handle:result() gives it: res, or nil, err. Only a
-- success of JSON text is built here; anything else is the classic
-- handle:result()'s.
function M.result(h)
  local r = api.result(h, body_p, len_p, flags_p)
  if r ~= nil and flags_p[0] == OK then
    local body = ffi_string(body_p[0], len_p[0])
    local data = decode(body)
    if data ~= nil then
      local meta = shape_table(SHAPE_META, r)
      if meta ~= nil then
        M.calls = M.calls + 1
        return { data = data, body = body, meta = meta }
      end
    end
  end
  return h:result()
end

-- Free h's call now; h must not be used again (the classic methods raise
-- on it, as on any freed handle).
function M.free(h)
  api.free(h)
end

-- The key channel polls name h's call by (M.poll).
function M.key(h)
  return tonumber(api.key(h))
end

-- poll(channel, fn, arg): fn(arg, key) for each call with news on the
-- channel (a channel userdata), until it has none. The classic
-- channel:poll() builds a table of handles each time.
function M.poll(ch, fn, arg)
  while true do
    local n = tonumber(api.poll(ch, keys, 64))
    for i = 0, n - 1 do fn(arg, tonumber(keys[i])) end
    if n < 64 then return end
  end
end

return M
