/* A call seen from Lua: its error table, its result as Lua tables (walked
 * by shapes.c), and the handle (next, wait, validated, result, cancel). */
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

/* ---- error tables ---------------------------------------------------------- */

/* A field of an error table as text, or NULL when absent or not text. */
static const char *text_field(lua_State *L, int t, const char *name)
{
    lua_getfield(L, t, name);
    int type = lua_type(L, -1);
    return type == LUA_TSTRING || type == LUA_TNUMBER ? lua_tostring(L, -1) : NULL;
}

/* "llmretry: <kind> (<reason>): <message> [request_id=<id>]", with the
 * absent parts left out: Lua code builds error tables too. */
int err_tostring(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    const char *kind = text_field(L, 1, "kind");
    const char *reason = text_field(L, 1, "reason");
    const char *message = text_field(L, 1, "message");
    const char *rid = text_field(L, 1, "request_id");
    int n = 0;
    lua_pushfstring(L, "llmretry: %s", kind ? kind : "error");
    n++;
    if (reason) {
        lua_pushfstring(L, " (%s)", reason);
        n++;
    }
    if (message) {
        lua_pushfstring(L, ": %s", message);
        n++;
    }
    if (rid) {
        lua_pushfstring(L, " [request_id=%s]", rid);
        n++;
    }
    lua_concat(L, n);
    return 1;
}

/* ---- results ----------------------------------------------------------- */

/* The err table of docs/python.md: the core's error fields (and a broken
 * stream's progress), absent values nil. `kind` and `message` override the
 * result's own (a body that would not decode). */
static void push_err(lua_State *L, const llmretry_result *r, const char *kind,
                     const char *message)
{
    lr_push_shape(L, LLMRETRY_SHAPE_ERROR, r);
    if (r->stream)
        lr_shape_into(L, LLMRETRY_SHAPE_STREAM, r);
    if (kind) {
        lua_pushstring(L, kind);
        lua_setfield(L, -2, "kind");
        lua_pushstring(L, message);
        lua_setfield(L, -2, "message");
    }
    char why[160];
    if (r->kind == LLMRETRY_ERR_STREAM_INTERRUPTED && r->body &&
        push_decoded(L, r->body, r->body_len, why, sizeof why)) {
        /* What arrived before it broke, assembled: err.partial.data (none
         * when it does not decode: push_decoded pushed nothing). */
        lua_createtable(L, 0, 1);
        lua_insert(L, -2);
        lua_setfield(L, -2, "data");
        lua_setfield(L, -2, "partial");
    }
    luaL_getmetatable(L, ERROR_MT);
    lua_setmetatable(L, -2);
}

/* Push res (1 value) or nil, err (2 values). */
int lr_push_result(lua_State *L, const llmretry_result *r)
{
    if (!r->ok) {
        lua_pushnil(L);
        push_err(L, r, NULL, NULL);
        return 2;
    }
    char err[160];
    lua_createtable(L, 0, 3);
    if (r->raw_response) {
        /* raw_response: the answer's bytes are the data (JSON Lines, say). */
        lua_pushlstring(L, r->body ? r->body : "", r->body ? r->body_len : 0);
    } else if (!push_decoded(L, r->body ? r->body : "", r->body ? r->body_len : 0, err, sizeof err)) {
        /* The core only succeeds on JSON it parsed; this is cJSON's
         * nesting limit or the like. */
        lua_pop(L, 1);
        lua_pushnil(L);
        char msg[220];
        snprintf(msg, sizeof msg, "the response body could not be decoded: %s", err);
        push_err(L, r, "invalid_response", msg);
        return 2;
    }
    lua_setfield(L, -2, "data");
    lua_pushlstring(L, r->body, r->body_len);
    lua_setfield(L, -2, "body");
    lr_push_shape(L, LLMRETRY_SHAPE_META, r);
    lua_setfield(L, -2, "meta");
    return 1;
}

/* ---- handles ------------------------------------------------------------- */


static lr_handle *check_handle(lua_State *L)
{
    char buf[64];
    lr_handle *h = lr_check_self(L, HANDLE_MT, "a call handle");
    if (!h->call)               /* its call already freed */
        lr_fail(L, "self must be a call handle (got %s); call methods with ':'",
                got(L, 1, buf, sizeof buf));
    return h;
}

void lr_handle_release(lr_handle *h)
{
    if (h->parked) {
        llmretry_event_free(h->parked);
        h->parked = NULL;
    }
    if (h->call) {
        llmretry_call_free(h->call);
        h->call = NULL;
    }
}

int lr_handle_gc(lua_State *L)
{
    lr_handle *h = lua_touserdata(L, 1);
    lr_handle_release(h);
    if (h->cached_ref > 0) {
        luaL_unref(L, LUA_REGISTRYINDEX, h->cached_ref);
        h->cached_ref = 0;
    }
    return 0;
}

static int push_validate(lua_State *L, lr_handle *h)
{
    const char *body;
    size_t len;
    h->validate_parked = 1;
    if (llmretry_call_pending_body(h->call, &body, &len) != LLMRETRY_OK) {
        /* Answered already (or never asked): nothing to deliver. */
        h->validate_parked = 0;
        lua_pushnil(L);
        return 1;
    }
    lua_pushliteral(L, "validate");
    lua_pushlstring(L, body, len);
    h->validate_parked = 0;
    return 2;
}

int handle_next(lua_State *L)
{
    lr_handle *h = check_handle(L);
    luaL_checkstack(L, 6, "llmretry: out of stack space");
    if (h->validate_parked)
        return push_validate(L, h);
    llmretry_event *ev = h->parked;
    llmretry_mail m = LLMRETRY_MAIL_EVENT;
    if (!ev)
        m = llmretry_call_next(h->call, &ev);
    switch (m) {
    case LLMRETRY_MAIL_EVENT:
        h->parked = ev;
        lua_pushliteral(L, "event");
        lr_push_event(L, ev);
        h->parked = NULL;
        llmretry_event_free(ev);
        return 2;
    case LLMRETRY_MAIL_CHUNK: {
        /* A stream chunk's JSON text (handles made with stream_chunks). */
        size_t len = 0;
        const char *data = llmretry_chunk_data(ev, &len);
        lua_pushliteral(L, "chunk");
        lua_pushlstring(L, data ? data : "", len);
        llmretry_event_free(ev);
        return 2;
    }
    case LLMRETRY_MAIL_VALIDATE:
        return push_validate(L, h);
    case LLMRETRY_MAIL_DONE:
        lua_pushliteral(L, "done");
        return 1;
    case LLMRETRY_MAIL_EMPTY:
        break;
    }
    lua_pushnil(L);
    return 1;
}

/* -1 (forever) for any negative timeout. */
int64_t check_timeout(lua_State *L, int idx)
{
    int64_t t = check_int64(L, idx, "timeout_ms");
    return t < 0 ? -1 : t;
}

int handle_wait(lua_State *L)
{
    lr_handle *h = check_handle(L);
    int64_t t = check_timeout(L, 2);
    if (h->parked || h->validate_parked) {
        lua_pushboolean(L, 1);
        return 1;
    }
    lua_pushboolean(L, llmretry_call_wait(h->call, t) == LLMRETRY_OK);
    return 1;
}

int handle_validated(lua_State *L)
{
    lr_handle *h = check_handle(L);
    char buf[64];
    if (lua_type(L, 2) != LUA_TBOOLEAN)
        return lr_fail(L, "ok must be a boolean (got %s)", got(L, 2, buf, sizeof buf));
    const char *msg = NULL;
    if (!lua_isnoneornil(L, 3)) {
        if (lua_type(L, 3) != LUA_TSTRING)
            return lr_fail(L, "message must be a string or nil (got %s)",
                           got(L, 3, buf, sizeof buf));
        msg = lua_tostring(L, 3);
    }
    const char *body;
    size_t len;
    if (llmretry_call_pending_body(h->call, &body, &len) != LLMRETRY_OK)
        return lr_fail(L, "no validation is pending for this call");
    /* ESTATE now only means the engine is gone: the call has been
     * cancelled and its mailbox says so. */
    (void)llmretry_call_validated(h->call, lua_toboolean(L, 2), msg);
    return 0;
}

/* res or nil, err; built once and kept in the handle's user value. */
int handle_result(lua_State *L)
{
    lr_handle *h = check_handle(L);
    const llmretry_result *r = llmretry_call_result(h->call);
    if (!r)
        return lr_fail(L, "the call is not finished");
    if (h->cached_ref > 0) {
        if (h->cached_err)
            lua_pushnil(L);
        lua_rawgeti(L, LUA_REGISTRYINDEX, h->cached_ref);
        return h->cached_err ? 2 : 1;
    }
    lua_settop(L, 1);
    int n = lr_push_result(L, r);
    lua_pushvalue(L, -1);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    /* luaL_ref's refs are > 0; a nil result (never) would be LUA_REFNIL */
    if (ref > 0) {
        h->cached_ref = ref;
        h->cached_err = n != 1;
    }
    return n;
}

int handle_cancel(lua_State *L)
{
    llmretry_call_cancel(check_handle(L)->call);
    return 0;
}

int handle_request_id(lua_State *L)
{
    lua_pushstring(L, llmretry_call_request_id(check_handle(L)->call));
    return 1;
}

int handle_done(lua_State *L)
{
    lua_pushboolean(L, llmretry_call_result(check_handle(L)->call) != NULL);
    return 1;
}

int handle_tostring(lua_State *L)
{
    lr_handle *h = lr_testudata(L, 1, HANDLE_MT);
    if (h && h->call)
        lua_pushfstring(L, "llmretry.handle: %s", llmretry_call_request_id(h->call));
    else
        lua_pushliteral(L, "llmretry.handle: (none)");
    return 1;
}
