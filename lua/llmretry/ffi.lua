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
-- M.calls counts the results built here, M.submitted the calls submitted
-- here (tests: the path is taken).
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
typedef struct llmretry_exchange {
    unsigned token;
    const char *host;
    int port;
    int tls;
    const char *pool_key;
    const char *request;
    size_t request_len;
    size_t vary_at, vary_len;
    int64_t timeout_ms;
} llmretry_exchange;
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
struct lr_ffi_handle;
typedef struct lr_ffi_api {
    int abi;
    int (*drain)(void *handle);
    const void *(*result)(void *handle, const char **body, size_t *len, int *flags);
    void (*free)(void *handle);
    double (*key)(void *handle);
    size_t (*poll)(void *channel, double *keys, size_t max);
    ptrdiff_t (*text_len)(const char *s);
    int (*shape_field)(int shape, const void *obj, size_t i, llmretry_field *out);
    size_t (*shape_field_count)(int shape);
    const char *(*field_name)(int shape, size_t i);
    void *(*prep_new)(void);
    void (*prep_free)(void *prep);
    void (*prep_reset)(void *prep);
    const char *(*option)(size_t i, int *type);
    int (*set_int)(void *prep, const char *name, int64_t v, char *err, size_t errlen);
    int (*set_bool)(void *prep, const char *name, int v, char *err, size_t errlen);
    int (*set_text)(void *prep, const char *name, const char *v, char *err, size_t errlen);
    int (*set_number)(void *prep, const char *name, double v, char *err, size_t errlen);
    void (*set_body)(void *prep, const char *body, size_t len, int stream_usage, int validate,
                     int stream_chunks);
    struct lr_ffi_handle *(*submit)(void *engine, void *prep, void *channel,
                                    const char *table_model, char *err, size_t errlen);
    void (*handle_free)(void *handle);
    void (*cancel)(void *handle);
    const char *(*request_id)(void *handle);
    int (*run)(void *engine, double *next_ms);
    int (*exchange)(void *handle, llmretry_exchange *x);
    int (*feed)(void *handle, unsigned token, const char *data, size_t len);
    void (*failed)(void *handle, unsigned token, int why, int reused, const char *message);
    int (*field_type)(int shape, size_t i);
    int (*shape_values)(int shape, const void *obj, double *nums, const char **strs,
                        double *lens, const void **objs);
} lr_ffi_api;
]]
local ABI = 3
-- Another copy of this module (or of an older one) declared these already
-- in this state: ffi.cdef raises on a redefinition, and then they are ours.
pcall(ffi.cdef, CDEF)
local api_address, ffi_result = core._ffi()
local ok_api, api = pcall(ffi.cast, "const lr_ffi_api *", api_address)
if not ok_api or api.abi ~= ABI or type(ffi_result) ~= "function" then return false end

-- The hot entry points, each read from the table once: read at each call,
-- a field of a struct of function pointers is a new cdata (an allocation)
-- wherever LuaJIT interprets the caller rather than compiles it.
local api_drain, api_result, api_free, api_key, api_poll = api.drain, api.result, api.free,
  api.key, api.poll
local api_prep_reset, api_set_int, api_set_bool, api_set_text, api_set_number, api_set_body =
  api.prep_reset, api.set_int, api.set_bool, api.set_text, api.set_number, api.set_body
local api_submit, api_run, api_exchange, api_feed, api_failed, api_shape_values = api.submit,
  api.run, api.exchange, api.feed, api.failed, api.shape_values
local api_handle_free = api.handle_free

local tonumber, type, pairs, pcall, getmetatable, rawget =
  tonumber, type, pairs, pcall, getmetatable, rawget
local floor, find = math.floor, string.find
local ffi_string, ffi_gc, ffi_cast = ffi.string, ffi.gc, ffi.cast
local decode, encode = core.decode, core.encode
local args = require("llmretry.args")
local new_tab, clear_tab = args.new_tab, args.clear_tab

local M = { CDEF = CDEF, calls = 0, submitted = 0 }

-- llmretry_field_type's values (llmretry/shapes.h).
local F_NULL, F_INT, F_STRING, F_USAGE, F_BOOL = 0, 1, 2, 3, 4
local SHAPE_META, SHAPE_USAGE = 0, 3
local OK = 1           -- flags: a success of JSON text (LR_FFI_OK, not LR_FFI_RAW)

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
local keys = ffi.new("double[64]")

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

-- A shape's objects as tables, by a function generated from the shape
-- once (its field names and types, as the core lists them): every value
-- read by one call (api.shape_values), then one table constructor. The
-- field by field walk above made an FFI call and, interpreted, a boxed
-- 64-bit integer per field: it was the biggest part of a result's cost
-- and of its garbage (issue 36). Same table as shape_table's; nil when a
-- value needs the classic path.
local MAX_FIELDS = 64
local nums = ffi.new("double[?]", MAX_FIELDS)
local strs = ffi.new("const char *[?]", MAX_FIELDS)
local lens = ffi.new("double[?]", MAX_FIELDS)
local objs = ffi.new("const void *[?]", MAX_FIELDS)
local BUILDERS = {}

local function builder_of(shape)
  local names = NAMES[shape] or names_of(shape)
  local n = #names
  if n > MAX_FIELDS then return nil end
  local locals, fields = {}, {}
  for i = 0, n - 1 do
    local ty, name = tonumber(api.field_type(shape, i)), names[i + 1]
    if not name:match("^[%a_][%w_]*$") then return nil end
    local v = "v" .. i
    if ty == F_INT then
      locals[#locals + 1] = ("local %s = nums[%d]; if %s ~= %s then %s = nil end")
        :format(v, i, v, v, v)
    elseif ty == F_BOOL then
      locals[#locals + 1] = ("local %s = nums[%d]; if %s ~= %s then %s = nil else %s = %s ~= 0 end")
        :format(v, i, v, v, v, v, v)
    elseif ty == F_STRING then
      locals[#locals + 1] = ("local %s = strs[%d]; if %s ~= nil then %s = ffi_string(%s, lens[%d]) else %s = nil end")
        :format(v, i, v, v, v, i, v)
    elseif ty == F_USAGE then
      locals[#locals + 1] = ("local %s = objs[%d]; if %s ~= nil then %s = usage(%s); if %s == nil then return nil end else %s = nil end")
        :format(v, i, v, v, v, v, v)
    else
      return nil
    end
    fields[#fields + 1] = ("%s = %s"):format(name, v)
  end
  -- A usage object's values are read after the outer ones: locals first.
  local src = "local nums, strs, lens, objs, ffi_string, usage = ...\n"
    .. "return function()\n" .. table.concat(locals, "\n")
    .. "\nreturn { " .. table.concat(fields, ", ") .. " }\nend"
  local chunk = load(src, "=llmretry.ffi builder")
  return chunk
end

-- obj of `shape` as a table (shape_table's), through the generated builder.
local function shape_fast(shape, obj)
  local b = BUILDERS[shape]
  if b == nil then return shape_table(shape, obj) end
  if api_shape_values(shape, obj, nums, strs, lens, objs) < 0 then return nil end
  return b()
end

do
  -- The usage builder reads its own values: its arrays, not the outer ones
  -- (still being read when a usage field comes).
  local unums = ffi.new("double[?]", MAX_FIELDS)
  local ustrs = ffi.new("const char *[?]", MAX_FIELDS)
  local ulens = ffi.new("double[?]", MAX_FIELDS)
  local uobjs = ffi.new("const void *[?]", MAX_FIELDS)
  local uchunk = builder_of(SHAPE_USAGE)
  local ubuild = uchunk and uchunk(unums, ustrs, ulens, uobjs, ffi_string, nil)
  local function usage(obj)
    if api_shape_values(SHAPE_USAGE, obj, unums, ustrs, ulens, uobjs) < 0 then return nil end
    return ubuild()
  end
  local mchunk = ubuild and builder_of(SHAPE_META)
  if mchunk then BUILDERS[SHAPE_META] = mchunk(nums, strs, lens, objs, ffi_string, usage) end
end

-- h's mail up to its end, for a call nobody listens to (no logger, no
-- validate, no on_chunk): true once it is done.
function M.drain(h)
  return api_drain(h) ~= 0
end

-- h's result as handle:result() gives it: res, or nil, err. Only a
-- success of JSON text is built here; anything else is the classic
-- handle:result()'s.
function M.result(h)
  local r = api_result(h, body_p, len_p, flags_p)
  if r ~= nil and flags_p[0] == OK then
    local body = ffi_string(body_p[0], len_p[0])
    local data = decode(body)
    if data ~= nil then
      local meta = shape_fast(SHAPE_META, r)
      if meta ~= nil then
        M.calls = M.calls + 1
        return { data = data, body = body, meta = meta }
      end
    end
  end
  return h:result()
end

-- Free h's call now; h must not be used again (the classic methods raise
-- on a freed handle). A handle of M.submit keeps its few bytes until the GC
-- takes it: ffi.gc(h, nil) would end the trace here.
function M.free(h)
  api_free(h)
end

-- The key channel polls name h's call by (M.poll).
function M.key(h)
  local key = api_key(h)      -- not a tail call: see submit_prepared
  return key
end

-- ---------------------------------------------------------------------------
-- Submitting a call that nobody listens to: its options set by the core's
-- setters from Lua (a trace runs through them), its handle a C object the
-- GC frees (ffi.gc) unless M.free does first. Anything but plain options
-- (text, integers, booleans, numbers; a table or string body; channel,
-- validate, stream_chunks) goes to engine:submit, as does any option the
-- core refuses here: its errors are the classic ones, word for word.

-- The binding's metatables (its registry names), to check what submit is
-- given: the C side takes a userdata's payload as what it says it is.
local ok_reg, REG = pcall(function() return debug.getregistry() end)
if not ok_reg or type(REG) ~= "table" then return false end
local ENGINE_MT, CHANNEL_MT = REG["llmretry.engine"], REG["llmretry.channel"]
if type(ENGINE_MT) ~= "table" or type(CHANNEL_MT) ~= "table" then return false end
local T_TEXT, T_INT, T_BOOL, T_ENUM, T_NUMBER = 1, 2, 3, 4, 7
local KIND = {}         -- option name -> "text", "int", "bool", "number"
do
  local ty = ffi.new("int[1]")
  local i = 0
  while true do
    local name = api.option(i, ty)
    if name == nil then break end
    local t = ty[0]
    KIND[ffi_string(name)] = (t == T_TEXT or t == T_ENUM) and "text" or t == T_INT and "int"
      or t == T_BOOL and "bool" or t == T_NUMBER and "number" or "classic"
    i = i + 1
  end
end
-- The binding's own keys this path takes (the others, group, are classic).
KIND.body, KIND.channel, KIND.validate, KIND.stream_chunks = "own", "own", "own", "own"

local ERRLEN = 512
local errbuf = ffi.new("char[?]", ERRLEN)
local prep = ffi_gc(api.prep_new(), api.prep_free)
local TWO63 = 2 ^ 63

-- A handle of M.submit: what the hosts ask of any handle.
local handle_methods = {
  cancel = function(h) api.cancel(h) end,
  request_id = function(h)
    local s = api.request_id(h)
    if s == nil then return nil end
    return ffi_string(s)
  end,
  -- The classic result, for what M.result does not build (a failure).
  result = function(h) return ffi_result(tonumber(ffi_cast("uintptr_t", h))) end,
}
-- Once per state: a second copy of this module finds it set, to the same
-- functions of the same core.
pcall(ffi.metatype, "struct lr_ffi_handle", {
  __index = handle_methods,
  __tostring = function(h) return "llmretry.handle: " .. (handle_methods.request_id(h) or "(none)") end,
})

-- Set one option; false when it is not plain or the core refuses it here.
local function set(k, v)
  local kind = KIND[k]
  if kind == "int" then
    if type(v) ~= "number" or v ~= floor(v) or v < -TWO63 or v >= TWO63 then return false end
    return api_set_int(prep, k, v, errbuf, ERRLEN) == 0
  elseif kind == "text" then
    if type(v) ~= "string" or find(v, "\0", 1, true) then return false end
    return api_set_text(prep, k, v, errbuf, ERRLEN) == 0
  elseif kind == "bool" then
    if type(v) ~= "boolean" then return false end
    return api_set_bool(prep, k, v and 1 or 0, errbuf, ERRLEN) == 0
  elseif kind == "number" then
    if type(v) ~= "number" then return false end
    return api_set_number(prep, k, v, errbuf, ERRLEN) == 0
  end
  return kind == "own"
end

-- The options `prep` holds now (what set() put there, not the binding's
-- own keys) and how many, -1 while it holds none a call may reuse: a
-- gateway sends every call with the options of the one before, and
-- setting them again was a reset of the whole struct and an FFI call and
-- a name lookup per option (issue 36). Equal Lua strings are one object,
-- so an equal value is the very string prep points into, kept alive here.
local in_prep, in_prep_n = {}, -1

-- Does prep hold sub's options, and no other?
local function same_options(sub)
  if in_prep_n < 0 then return false end
  local n = 0
  for k, v in pairs(sub) do
    if KIND[k] ~= "own" then
      if in_prep[k] ~= v then return false end
      n = n + 1
    end
  end
  return n == in_prep_n
end

-- The submit of a call whose options prep holds: its body set, the call
-- sent, its handle given a finalizer. A function of its own, with no loop,
-- so that LuaJIT compiles it from its entry: at the end of submit it was
-- reached only through the traces of the loops over the options, which end
-- where those loops' functions return, and it ran in the interpreter, each
-- FFI call converting its arguments one by one (issue 36).
local function submit_prepared(engine, ch, body, model, usage, validate, chunks)
  api_set_body(prep, body, #body, usage, validate and 1 or 0, chunks and 1 or 0)
  local h = api_submit(engine, prep, ch, model, errbuf, ERRLEN)
  if h == nil then return nil end
  M.submitted = M.submitted + 1
  -- Not a tail call: LuaJIT cannot compile a return from a tail call to a
  -- fast function with side effects (ffi.gc, a C function through the FFI):
  -- it abandons the trace ("leaving loop in root trace"), and after a few
  -- tries runs the function in its interpreter for good.
  h = ffi_gc(h, api_handle_free)
  return h
end

-- submit(engine, sub) -> handle, or nil: send it with engine:submit (the
-- classic path raises what this one would not say). sub: engine:submit's
-- options, the values kept alive by the caller until this returns.
function M.submit(engine, sub)
  if getmetatable(engine) ~= ENGINE_MT then return nil end
  local ch = sub.channel
  if ch ~= nil and getmetatable(ch) ~= CHANNEL_MT then return nil end
  if sub.method ~= nil then return nil end
  local validate, chunks = sub.validate, sub.stream_chunks
  if (validate ~= nil and type(validate) ~= "boolean")
      or (chunks ~= nil and type(chunks) ~= "boolean") then
    return nil
  end
  if not same_options(sub) then
    api_prep_reset(prep)
    clear_tab(in_prep)
    in_prep_n = -1
    local n = 0
    for k, v in pairs(sub) do
      if type(k) ~= "string" or not set(k, v) then return nil end
      if KIND[k] ~= "own" then
        in_prep[k] = v
        n = n + 1
      end
    end
    in_prep_n = n
  end
  local body, model, usage = sub.body, nil, 0
  if type(body) == "table" then
    local m = rawget(body, "model")
    if type(m) == "string" then model = m end
    local ok, text = pcall(encode, body)
    if not ok then return nil end
    body, usage = text, 1
  elseif type(body) ~= "string" or body == "" then
    return nil
  end
  return submit_prepared(engine, ch, body, model, usage, validate, chunks)
end

-- ---------------------------------------------------------------------------
-- io_loop "host" (llmretry/host_io.h): an engine with no thread, which
-- llmretry.openresty runs and whose attempts it performs on cosockets
-- (llmretry.cosocket). The engine builds each request's bytes and parses
-- the response's; these only carry them.

-- llmretry_feed's and llmretry_xfer_error's values.
M.FEED = { MORE = 0, DONE = 1, DONE_CLOSE = 2, FAILED = 3, GONE = 4 }
M.XFER = { RESOLVE = 1, CONNECT = 2, TLS = 3, TLS_VERIFY = 4, TIMEOUT = 5, SEND = 6,
  CLOSED = 7 }

local next_ms_p = ffi.new("double[1]")
local exchange_p = ffi.new("llmretry_exchange")

-- run(engine) -> status (0: OK), next_ms: the engine's turn, and how soon
-- (ms) it must run again at the latest.
function M.run(engine)
  local st = api_run(engine, next_ms_p)
  return st, next_ms_p[0]
end

-- exchange(h) -> nil, or token, host, port, tls, pool_key, request,
-- timeout_ms: the attempt of h's call that waits for its host. request is
-- an array of strings to send one after the other: the request id's line
-- apart from the rest (llmretry_exchange.vary_at), since LuaJIT 2.1 hashes
-- a long string by four of its bytes and a thousand requests that differ
-- only in their ids would share one hash chain (each new one compared with
-- every other: memcmp was a tenth of the worker's time).
-- `into` (a table) gets the pieces and is the request returned: the
-- caller's to keep for its next exchange (a table less per call).
function M.exchange(h, into)
  if api_exchange(h, exchange_p) == 0 then return nil end
  local x = exchange_p
  local req, n = x.request, tonumber(x.request_len)
  local at, len = tonumber(x.vary_at), tonumber(x.vary_len)
  local request = into
  if len > 0 then
    request[1], request[2], request[3] = ffi_string(req, at), ffi_string(req + at, len),
      ffi_string(req + at + len, n - at - len)
  else
    request[1], request[2], request[3] = ffi_string(req, n), nil, nil
  end
  return x.token, ffi_string(x.host), x.port, x.tls ~= 0, ffi_string(x.pool_key),
    request, tonumber(x.timeout_ms)
end

-- Has h's call an attempt waiting for its host (or one it is performing)?
function M.has_exchange(h)
  return api_exchange(h, exchange_p) ~= 0
end

-- feed(h, token, data) -> one of M.FEED: data, the response's next bytes.
function M.feed(h, token, data)
  local f = api_feed(h, token, data, #data)     -- not a tail call: see submit_prepared
  return f
end

-- failed(h, token, why, reused, message): the exchange ended first.
function M.failed(h, token, why, reused, message)
  api_failed(h, token, why, reused and 1 or 0, message)
end

-- poll(channel, fn, arg): fn(arg, key) for each call with news on the
-- channel (a channel userdata), until it has none. The classic
-- channel:poll() builds a table of handles each time.
local function poll_all(ch, fn, arg)
  while true do
    local n = tonumber(api_poll(ch, keys, 64))
    for i = 0, n - 1 do fn(arg, keys[i]) end
    if n < 64 then return end
  end
end

-- A poll mostly finds none or one (the transport "cosocket" polls after
-- each turn of its engine): those take no loop, which would stop LuaJIT
-- compiling the caller ("inner loop in root trace").
function M.poll(ch, fn, arg)
  local n = tonumber(api_poll(ch, keys, 1))
  if n == 0 then return end
  fn(arg, keys[0])
  n = tonumber(api_poll(ch, keys, 1))
  if n == 0 then return end
  fn(arg, keys[0])
  return poll_all(ch, fn, arg)
end

return M
