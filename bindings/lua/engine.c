/* Engines and groups: submit, their own channels, close; a batch's group. */
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

/* ---- groups: the calls of one batch, paced together on the engine thread ---- */


static lr_group *check_group(lua_State *L)
{
    return lr_check_self(L, GROUP_MT, "a group");
}

/* Calls in the group keep the C group alive; dropping ours is always safe. */
int group_close(lua_State *L)
{
    lr_group *gr = lua_touserdata(L, 1);
    if (gr) {
        llmretry_group_free(gr->g);
        gr->g = NULL;
    }
    return 0;
}

static int group_open(const void *owner)
{
    return ((const lr_group *)owner)->g != NULL;
}

/* group:channel() -> the group's own channel (its calls' news), or nil
 * for a group made with poll = false (its calls report elsewhere). */
int group_channel(lua_State *L)
{
    lr_group *gr = check_group(L);
    if (!gr->g)
        lr_fail(L, "group is closed");
    llmretry_channel *ch = llmretry_group_channel(gr->g);
    if (!ch) {
        lua_pushnil(L);
        return 1;
    }
    lr_push_own_channel(L, 1, ch, group_open);
    return 1;
}

int group_stats(lua_State *L)
{
    lr_group *gr = check_group(L);
    llmretry_group_stats st;
    memset(&st, 0, sizeof st);
    if (gr->g)
        llmretry_group_stats_get(gr->g, &st);
    lr_push_shape(L, LLMRETRY_SHAPE_GROUP, &st);
    return 1;
}

int group_tostring(lua_State *L)
{
    lr_group *gr = lr_testudata(L, 1, GROUP_MT);
    lua_pushfstring(L, "llmretry.group: %p%s", (void *)gr, gr && gr->g ? "" : " (closed)");
    return 1;
}

/* ---- engines --------------------------------------------------------------- */

typedef struct lr_engine {
    llmretry_engine *e;         /* NULL once closed */
} lr_engine;

/* The engine of an engine userdata's payload, NULL once closed (ffi.c). */
llmretry_engine *lr_engine_of(const void *ud)
{
    return ((const lr_engine *)ud)->e;
}

static lr_engine *check_engine(lua_State *L)
{
    return lr_check_self(L, ENGINE_MT, "an engine");
}

llmretry_engine *check_open_engine(lua_State *L)
{
    lr_engine *eng = check_engine(L);
    if (!eng->e)
        lr_fail(L, "engine is closed");
    return eng->e;
}

/* engine:endpoint_stats(): a list of what the engine knows of each
 * endpoint (retry budget, breaker, rate limits); {} once closed. */
int engine_endpoint_stats(lua_State *L)
{
    lr_engine *eng = check_engine(L);
    llmretry_endpoint_stats st[256];
    size_t n = eng->e ? llmretry_engine_endpoint_stats(eng->e, st, 256) : 0;
    if (n > 256)
        n = 256;
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lr_push_shape(L, LLMRETRY_SHAPE_ENDPOINT, &st[i]);
        lua_rawseti(L, -2, (int)i + 1);
    }
    return 1;
}

/* Cancels the calls in flight and joins the I/O thread; handles stay
 * valid (their calls read as cancelled). */
int engine_close(lua_State *L)
{
    lr_engine *eng = check_engine(L);
    llmretry_engine *e = eng->e;
    eng->e = NULL;
    llmretry_engine_free(e);
    return 0;
}

int engine_gc(lua_State *L)
{
    lr_engine *eng = lua_touserdata(L, 1);
    llmretry_engine *e = eng->e;
    eng->e = NULL;
    llmretry_engine_free(e);
    return 0;
}

/* core.check_options(opts[, own_keys]): raise as engine:submit would on
 * these options, submitting nothing (the body may be left out). For options
 * checked before any call is made: a client's defaults, a call_many
 * batch's. own_keys: the caller's own keys (call_many's limit), suggested
 * for an unknown option that meant one. */
int l_check_options(lua_State *L)
{
    llmretry_options o;
    int also = lua_type(L, 2) == LUA_TTABLE ? 2 : 0;
    parse_opts(L, 1, &o, 0, also);
    char err[LLMRETRY_ERRBUF] = "";
    if (llmretry_options_check(&o, err, sizeof err) != LLMRETRY_OK) {
        rename_header_error(&o, err, sizeof err);
        return lr_fail(L, "%s", err);
    }
    return 0;
}

int engine_submit(lua_State *L)
{
    llmretry_engine *e = check_open_engine(L);
    llmretry_options o;
    parse_opts(L, 2, &o, 1, 0);

    /* The handle exists before the call does, so no error raised from here
     * on can leak the call. */
    lr_handle *h = lr_newuserdata(L, sizeof *h);
    memset(h, 0, sizeof *h);
    int hidx = lua_gettop(L);
    luaL_getmetatable(L, HANDLE_MT);
    lua_setmetatable(L, hidx);

    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = llmretry_engine_submit(e, &o, LLMRETRY_SUBMIT_POLL, &h->call, err,
                                                sizeof err);
    if (st != LLMRETRY_OK) {
        h->call = NULL;
        if (st == LLMRETRY_EINVAL)
            rename_header_error(&o, err, sizeof err);
        return lr_fail(L, "%s", err[0] ? err : llmretry_status_name(st));
    }
    /* The poll of the channel the call reports to (the engine's, its
     * group's, opts.channel) finds its handle through this weak table. */
    lua_getfield(L, 2, "group");
    lr_group *gr = o.group ? lua_touserdata(L, -1) : NULL;
    lua_pop(L, 1);
    if (gr && gr->poll) {
        lua_getfield(L, 2, "group");
        lr_getuservalue(L, -1);
    } else if (o.channel) {
        lua_getfield(L, 2, "channel");
        lr_getuservalue(L, -1);
    } else {
        lr_getuservalue(L, 1);
    }
    push_ptr_key(L, h->call);
    lua_pushvalue(L, hidx);
    lua_rawset(L, -3);
    lua_pushvalue(L, hidx);
    return 1;
}

/* engine:forked() -> true in a process forked from the one that made the
 * engine: it cannot be used there (submit raises); make a new one. */
int engine_forked(lua_State *L)
{
    lr_engine *eng = check_engine(L);
    lua_pushboolean(L, eng->e && llmretry_engine_forked(eng->e));
    return 1;
}

static int engine_open(const void *owner)
{
    return ((const lr_engine *)owner)->e != NULL;
}

/* engine:channel() -> the engine's own channel: where the calls submitted
 * without opts.group or opts.channel report their news. */
int engine_channel(lua_State *L)
{
    lr_push_own_channel(L, 1, llmretry_engine_channel(check_open_engine(L)), engine_open);
    return 1;
}

/* The handles with news from `src`, through the weak call->handle table in
 * the uservalue of the userdata at index 1. Leaves the array on top. */
int push_polled(lua_State *L, void *src, poll_fn fetch)
{
    size_t max = SIZE_MAX;
    if (!lua_isnoneornil(L, 2))
        max = (size_t)check_int(L, 2, "max", 1, INT_MAX);
    lua_settop(L, 1);
    lua_newtable(L);
    if (!src)
        return 1;
    lr_getuservalue(L, 1);
    int n = 0;
    llmretry_call *calls[POLL_BATCH];
    while (max > 0) {
        size_t want = max < POLL_BATCH ? max : POLL_BATCH;
        size_t got_n = fetch(src, calls, want);
        for (size_t i = 0; i < got_n; i++) {
            push_ptr_key(L, calls[i]);
            lua_rawget(L, 3);
            /* A handle already collected has nothing to report. */
            if (lua_isuserdata(L, -1))
                lua_rawseti(L, 2, ++n);
            else
                lua_pop(L, 1);
        }
        max -= got_n;
        if (got_n < want)
            break;
    }
    lua_settop(L, 2);
    return 1;
}

/* engine:group{limit=, deadline_ms=, adaptive=} -> group (docs/reliability.md batches) */
int engine_group(lua_State *L)
{
    char buf[64];
    llmretry_engine *e = check_open_engine(L);
    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    if (!lua_isnoneornil(L, 2)) {
        if (lua_type(L, 2) != LUA_TTABLE)
            lr_fail(L, "opts must be a table (got %s)", got(L, 2, buf, sizeof buf));
        lua_pushnil(L);
        while (lua_next(L, 2)) {
            lua_pop(L, 1);
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?";
            if (strcmp(k, "limit") && strcmp(k, "deadline_ms") && strcmp(k, "adaptive") &&
                strcmp(k, "poll"))
                lr_fail(L, "unknown group option '%.40s' (limit, deadline_ms, adaptive, poll)",
                        k);
        }
        lua_getfield(L, 2, "limit");
        if (!lua_isnil(L, -1))
            go.limit = check_int(L, lua_gettop(L), "limit", 1, INT_MAX);
        lua_getfield(L, 2, "deadline_ms");
        if (!lua_isnil(L, -1)) {
            go.deadline_ms = check_int64(L, lua_gettop(L), "deadline_ms");
            if (go.deadline_ms < 0)
                lr_fail(L, "deadline_ms must be >= 0 (got %lld)", (long long)go.deadline_ms);
        }
        lua_getfield(L, 2, "adaptive");
        if (!lua_isnil(L, -1)) {
            if (lua_type(L, -1) != LUA_TBOOLEAN)
                lr_fail(L, "adaptive must be a boolean (got %s)", got(L, -1, buf, sizeof buf));
            go.adaptive = lua_toboolean(L, -1);
        }
        /* poll = false: the group only paces; its calls report to the
         * engine's channel like any other (one fd for a host watching
         * several). */
        lua_getfield(L, 2, "poll");
        if (!lua_isnil(L, -1)) {
            if (lua_type(L, -1) != LUA_TBOOLEAN)
                lr_fail(L, "poll must be a boolean (got %s)", got(L, -1, buf, sizeof buf));
            go.poll = lua_toboolean(L, -1);
        }
    }
    lr_group *gr = lr_newuserdata(L, sizeof *gr);
    gr->g = NULL;
    gr->poll = go.poll;
    int idx = lua_gettop(L);
    luaL_getmetatable(L, GROUP_MT);
    lua_setmetatable(L, idx);
    lua_newtable(L);                    /* call pointer -> handle, weak */
    luaL_getmetatable(L, WEAKV_MT);
    lua_setmetatable(L, -2);
    lr_setuservalue(L, idx);
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = llmretry_group_new(e, &go, &gr->g, err, sizeof err);
    if (st != LLMRETRY_OK) {
        gr->g = NULL;
        return lr_fail(L, "%s", err[0] ? err : llmretry_status_name(st));
    }
    lua_settop(L, idx);
    return 1;
}

int engine_tostring(lua_State *L)
{
    lr_engine *eng = lr_testudata(L, 1, ENGINE_MT);
    lua_pushfstring(L, "llmretry.engine: %p%s", (void *)eng,
                    eng && eng->e ? "" : " (closed)");
    return 1;
}

int l_new_engine(lua_State *L)
{
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    if (!lua_isnoneornil(L, 1))
        eo.max_in_flight = check_int(L, 1, "max_in_flight", 1, INT_MAX);
    if (!lua_isnoneornil(L, 2))
        eo.max_host_connections = check_int(L, 2, "max_host_connections", 0, INT_MAX);
    if (!lua_isnoneornil(L, 3)) {
        if (lua_type(L, 3) != LUA_TSTRING)
            return luaL_argerror(L, 3, "shared: a string such as \"shm:NAME\" or "
                                       "\"redis://host:port\", or nil");
        eo.shared = lua_tostring(L, 3);
    }
    if (!lua_isnoneornil(L, 4)) {
        /* "host": no thread; llmretry.openresty runs it through llmretry.ffi
         * (run, exchange, feed, failed) and moves the bytes on cosockets. */
        static const char *const loops[] = { "perform", "events", "host", NULL };
        static const int values[] = { LLMRETRY_IO_LOOP_PERFORM, LLMRETRY_IO_LOOP_EVENTS,
                                      LLMRETRY_IO_LOOP_HOST };
        eo.io_loop = values[luaL_checkoption(L, 4, NULL, loops)];
#if LUA_VERSION_NUM != 501
        /* Only LuaJIT's FFI drives such an engine (core._ffi): elsewhere its
         * calls would wait for ever. */
        if (eo.io_loop == LLMRETRY_IO_LOOP_HOST)
            return luaL_argerror(L, 4, "io_loop \"host\" is run through LuaJIT's FFI "
                                       "(llmretry.openresty's transport \"cosocket\"), not "
                                       "under this Lua");
#endif
    }

    lr_engine *eng = lr_newuserdata(L, sizeof *eng);
    eng->e = NULL;
    int idx = lua_gettop(L);
    luaL_getmetatable(L, ENGINE_MT);
    lua_setmetatable(L, idx);
    lua_newtable(L);                    /* call pointer -> handle, weak */
    luaL_getmetatable(L, WEAKV_MT);
    lua_setmetatable(L, -2);
    lr_setuservalue(L, idx);

    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = llmretry_engine_new(&eo, &eng->e, err, sizeof err);
    if (st != LLMRETRY_OK) {
        eng->e = NULL;
        return lr_fail(L, "%s", err[0] ? err : llmretry_status_name(st));
    }
    lua_settop(L, idx);
    return 1;
}
