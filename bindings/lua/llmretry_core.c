/* llmretry.core: the Lua face of the C core (Lua 5.4 and LuaJIT/5.1).
 *
 * This module converts between Lua and C and nothing more; the public Lua
 * API is lua/llmretry (docs/lua.md), built on this:
 *
 *   core.encode(v) / core.decode(s)        JSON, lua-cjson conventions:
 *   core.null, core.array_mt, core.empty_array
 *   core.extract_json(s), core.assert_shape(v, shape [, path])
 *   core.check_options(opts)              raise as engine:submit would
 *   core.new_engine([max_in_flight[, max_host_connections[, shared[, io_loop]]]]) -> engine
 *     io_loop: "perform" (the default), "events" or "host" (llmretry_engine_options;
 *     "host" is driven through core._ffi(): llmretry.openresty's cosocket transport)
 *     engine:submit(opts) -> handle        every call in poll mode
 *     engine:channel() -> the engine's own channel, where calls report
 *       without opts.group or opts.channel; engine:close()
 *     engine:group{limit=, deadline_ms=, adaptive=, poll=} -> group: a batch
 *       paced on the engine thread; submit with opts.group; its calls report
 *       to group:channel() (not the engine's; nil with poll = false);
 *       group:stats(), group:close()
 *     engine:new_channel([{socket = true}]) -> channel: submit with
 *       opts.channel; its calls report to it alone (channel.c); a socket
 *       channel's host connects to channel:path(), then channel:accept()
 *     channel:fd(), channel:poll([max]), channel:wait(ms): every channel
 *   handle:next() -> "event", t | "validate", body | "done" | nil
 *   handle:wait(ms), handle:validated(ok [, msg]), handle:result(),
 *   handle:cancel(), handle:request_id(), handle:done()
 *   core._ffi(): for lua/llmretry/ffi.lua alone
 *     (LuaJIT's FFI path, ffi.c)
 *   core.error_mt, core.VERSION, core.EVENT_NAMES, core.EVENTS_ALL,
 *   core.ERROR_KINDS, core.REASONS, core.STREAM_REASONS (the core's lists)
 *
 * The host drains each handle's mailbox on its own thread (docs/design.md): no
 * Lua code ever runs on the engine's I/O thread. A handle does not keep its
 * engine alive: collecting or closing an engine cancels its calls, and
 * their handles then read as cancelled.
 *
 * No global mutable state (docs/lua.md): several Lua states on several
 * threads may load the module at once. Everything lives in the loading
 * state's registry (metatables under "llmretry.*" names) or in userdata.
 *
 * Any lua_* call may raise (out of memory, a metamethod), so C resources
 * are always owned by a userdata whose __gc frees them before the first
 * call that could raise: the encoder's buffer, the decoder's cJSON tree, a
 * call (the handle exists before the call is submitted), an event being
 * converted (parked in its handle). */
#include "lcore.h"

#include <cjson/cJSON.h>

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char lrl_empty_array_tag = 0;

/* ---- errors ---------------------------------------------------------------- */

/* Raise "llmretry: <message>" at the caller's position, like luaL_error
 * but with printf's full syntax (lua_pushfstring knows no %lld or %.40s). */
int lr_fail(lua_State *L, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    luaL_where(L, 1);
    lua_pushstring(L, "llmretry: ");
    lua_pushstring(L, msg);
    lua_concat(L, 3);
    return lua_error(L);
}

/* What a bad argument was, for "(got ...)": numbers by value (never
 * strings, which may be secrets such as an api_key), else the type. */
const char *got(lua_State *L, int idx, char *buf, size_t n)
{
    if (lua_type(L, idx) == LUA_TNUMBER) {
#if LR_HAVE_INTEGERS
        if (lua_isinteger(L, idx)) {
            snprintf(buf, n, "%lld", (long long)lua_tointeger(L, idx));
            return buf;
        }
#endif
        snprintf(buf, n, "%.14g", (double)lua_tonumber(L, idx));
        return buf;
    }
    return lua_isnone(L, idx) ? "no value" : luaL_typename(L, idx);
}

void *lr_check_self(lua_State *L, const char *tname, const char *what)
{
    char buf[64];
    void *p = lr_testudata(L, 1, tname);
    if (!p)
        lr_fail(L, "self must be %s (got %s); call methods with ':'", what,
                got(L, 1, buf, sizeof buf));
    return p;
}

/* A number with an integral value that fits int64 (floats like 3.0 count:
 * on 5.1 every number is one). 0 otherwise. */
int to_int64(lua_State *L, int idx, int64_t *out)
{
    if (lua_type(L, idx) != LUA_TNUMBER)
        return 0;
#if LR_HAVE_INTEGERS
    if (lua_isinteger(L, idx)) {
        *out = (int64_t)lua_tointeger(L, idx);
        return 1;
    }
#endif
    double d = (double)lua_tonumber(L, idx);
    if (d != floor(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return 0;
    *out = (int64_t)d;
    return 1;
}

int64_t check_int64(lua_State *L, int idx, const char *name)
{
    int64_t v;
    char buf[64];
    if (!to_int64(L, idx, &v))
        lr_fail(L, "%s must be an integer (got %s)", name, got(L, idx, buf, sizeof buf));
    return v;
}

int check_int(lua_State *L, int idx, const char *name, int lo, int hi)
{
    int64_t v = check_int64(L, idx, name);
    if (v >= lo && v <= hi)
        return (int)v;
    if (lo == INT_MIN && hi == INT_MAX)
        lr_fail(L, "%s is out of range (got %lld)", name, (long long)v);
    else if (hi == INT_MAX)
        lr_fail(L, "%s must be an integer >= %d (got %lld)", name, lo, (long long)v);
    else
        lr_fail(L, "%s must be an integer in %d..%d (got %lld)", name, lo, hi, (long long)v);
    return (int)v;
}

/* A key for a C pointer in a Lua table. Numbers, not light userdata:
 * LuaJIT builds on some 64-bit targets refuse light userdata beyond 47
 * bits, and user-space addresses are exact as doubles. */
void push_ptr_key(lua_State *L, const void *p)
{
#if LR_HAVE_INTEGERS
    lua_pushinteger(L, (lua_Integer)(uintptr_t)p);
#else
    lua_pushnumber(L, (lua_Number)(uintptr_t)p);
#endif
}

void push_null(lua_State *L)
{
    lua_pushlightuserdata(L, NULL);
}

/* ---- the module ------------------------------------------------------------ */

static const luaL_Reg handle_methods[] = {
    { "next", handle_next },
    { "wait", handle_wait },
    { "validated", handle_validated },
    { "result", handle_result },
    { "cancel", handle_cancel },
    { "request_id", handle_request_id },
    { "done", handle_done },
    { NULL, NULL },
};

static const luaL_Reg group_methods[] = {
    { "channel", group_channel },
    { "stats", group_stats },
    { "close", group_close },
    { NULL, NULL },
};

static const luaL_Reg channel_methods[] = {
    { "poll", channel_poll },
    { "fd", channel_fd },
    { "wait", channel_wait },
    { "path", channel_path },
    { "accept", channel_accept },
    { "close", channel_close },
    { NULL, NULL },
};

static const luaL_Reg engine_methods[] = {
    { "submit", engine_submit },
    { "group", engine_group },
    { "channel", engine_channel },
    { "new_channel", engine_new_channel },
    { "forked", engine_forked },
    { "endpoint_stats", engine_endpoint_stats },
    { "close", engine_close },
    { NULL, NULL },
};

static const luaL_Reg module_functions[] = {
    { "encode", l_encode },
    { "decode", l_decode },
    { "extract_json", l_extract_json },
    { "assert_shape", l_assert_shape },
    { "new_engine", l_new_engine },
    { "check_options", l_check_options },
    { "suggest", l_suggest },
    { "parse_policies", l_parse_policies },
    { "uuid4", l_uuid4 },
    { "url_join", l_url_join },
    { "url_shown", l_url_shown },
    { "resolve_policy", l_resolve_policy },
    { "_ffi", l_ffi_api },
    { NULL, NULL },
};

/* luaL_newmetatable that also sets __name on 5.1 (5.3+ does it itself),
 * leaving the metatable on the stack. */
/* core.array_mt is also kept under this light userdata's key of the
 * registry: every encode and decode looks it up, and a lookup by its name
 * interns and hashes the name first (issue 36). */
static char array_mt_key;

void lr_push_array_mt(lua_State *L)
{
    lua_pushlightuserdata(L, &array_mt_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
}

static void new_metatable(lua_State *L, const char *name)
{
    luaL_newmetatable(L, name);
    lua_pushstring(L, name);
    lua_setfield(L, -2, "__name");
}

static void new_class(lua_State *L, const char *name, const luaL_Reg *methods,
                      lua_CFunction gc, lua_CFunction tostring)
{
    new_metatable(L, name);
    lua_newtable(L);
    lr_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
#if LUA_VERSION_NUM >= 504
    if (gc == engine_gc) {
        lua_pushcfunction(L, gc);
        lua_setfield(L, -2, "__close");
    }
#endif
    lua_pushcfunction(L, tostring);
    lua_setfield(L, -2, "__tostring");
}

/* Registry entries are per state and shared by every copy of the module
 * loaded into it, so tables made by one copy are understood by another. */
static void register_types(lua_State *L)
{
    new_class(L, ENGINE_MT, engine_methods, engine_gc, engine_tostring);
    lua_pop(L, 1);
    new_class(L, HANDLE_MT, handle_methods, lr_handle_gc, handle_tostring);
    lua_pop(L, 1);
    new_class(L, GROUP_MT, group_methods, group_close, group_tostring);
    lua_pop(L, 1);
    new_class(L, CHANNEL_MT, channel_methods, channel_close, channel_tostring);
    lua_pop(L, 1);

    new_metatable(L, SBUF_MT);
    lua_pushcfunction(L, sbuf_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    new_metatable(L, JTREE_MT);
    lua_pushcfunction(L, jtree_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    new_metatable(L, WEAKV_MT);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_pop(L, 1);

    new_metatable(L, ERROR_MT);
    lua_pushcfunction(L, err_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
    new_metatable(L, ARRAY_MT);
    lua_pushlightuserdata(L, &array_mt_key);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);
}

static const char *kind_name(int i)
{
    return llmretry_error_kind_name((llmretry_error_kind)i);
}

static const char *reason_name(int i)
{
    return llmretry_reason_name((llmretry_giveup_reason)i);
}

static const char *stream_reason_name(int i)
{
    return llmretry_stream_reason_name((llmretry_stream_reason)i);
}

#if defined(__GNUC__)
__attribute__((visibility("default")))
#endif
int luaopen_llmretry_core(lua_State *L)
{
    register_types(L);
    lua_newtable(L);
    lr_setfuncs(L, module_functions, 0);

    lua_pushliteral(L, LLMRETRY_VERSION);
    lua_setfield(L, -2, "VERSION");
    lua_createtable(L, LLMRETRY_EV_CHUNK, 0);             /* every event, in bit order */
    for (int t = 0; t < LLMRETRY_EV_CHUNK; t++) {
        lua_pushstring(L, llmretry_event_name((llmretry_event_type)t));
        lua_rawseti(L, -2, t + 1);
    }
    lua_setfield(L, -2, "EVENT_NAMES");
    lua_newtable(L);
    for (size_t i = 0; llmretry_policy_key(i); i++) {
        lua_pushstring(L, llmretry_policy_key(i));
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "POLICY_KEYS");
    /* The core's enumerations, counted up to their end: never typed in. */
    lr_push_names(L, kind_name);
    lua_setfield(L, -2, "ERROR_KINDS");
    lr_push_names(L, reason_name);
    lua_setfield(L, -2, "REASONS");
    lr_push_names(L, stream_reason_name);
    lua_setfield(L, -2, "STREAM_REASONS");
    lua_pushinteger(L, LLMRETRY_EVENTS_ALL);
    lua_setfield(L, -2, "EVENTS_ALL");
    push_null(L);
    lua_setfield(L, -2, "null");
    lua_pushlightuserdata(L, EMPTY_ARRAY);
    lua_setfield(L, -2, "empty_array");
    luaL_getmetatable(L, ARRAY_MT);
    lua_setfield(L, -2, "array_mt");
    luaL_getmetatable(L, ERROR_MT);
    lua_setfield(L, -2, "error_mt");
    return 1;
}
