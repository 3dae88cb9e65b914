/* A call seen from Lua: its error table, its events and result as Lua
 * tables, and the handle (next, wait, validated, result, cancel). */
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

/* ---- events and results ---------------------------------------------------- */

void lr_set_int(lua_State *L, const char *key, int64_t v)
{
    lr_pushint(L, v);
    lua_setfield(L, -2, key);
}

static void set_str(lua_State *L, const char *key, const char *s)
{
    if (s) {
        push_text0(L, s);
        lua_setfield(L, -2, key);
    }
}

/* The usage table, or nothing pushed (returns 0) when there is none. */
static int push_usage(lua_State *L, const llmretry_usage *u)
{
    if (!u || !u->present)
        return 0;
    lua_createtable(L, 0, 3);
    lr_set_int(L, "prompt_tokens", u->prompt_tokens);
    lr_set_int(L, "completion_tokens", u->completion_tokens);
    lr_set_int(L, "total_tokens", u->total_tokens);
    return 1;
}

/* The event as a table, walking the field list the core defines (so every
 * field of docs/reliability.md is there, null ones as core.null). */
static void push_event(lua_State *L, const llmretry_event *ev)
{
    size_t n = llmretry_event_field_count(ev);
    lua_createtable(L, 0, (int)n);
    for (size_t i = 0; i < n; i++) {
        llmretry_field f;
        if (llmretry_event_field(ev, i, &f) != 0)
            break;
        switch (f.type) {
        case LLMRETRY_FIELD_INT: lr_pushint(L, f.i); break;
        case LLMRETRY_FIELD_BOOL: lua_pushboolean(L, f.i != 0); break;
        case LLMRETRY_FIELD_STRING:
            if (f.s)
                push_text0(L, f.s);
            else
                push_null(L);
            break;
        case LLMRETRY_FIELD_USAGE:
            if (!push_usage(L, f.usage))
                push_null(L);
            break;
        default: push_null(L); break;
        }
        lua_setfield(L, -2, f.name);
    }
}

/* What a streamed call's stream did (nothing for other calls). */
static void push_stream_fields(lua_State *L, const llmretry_result *r)
{
    if (!r->stream)
        return;
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "stream");
    lr_set_int(L, "chunks", r->chunks);
    if (r->ttft_ms >= 0)
        lr_set_int(L, "ttft_ms", r->ttft_ms);
    if (!r->ok) {
        lr_set_int(L, "chunks_delivered", r->chunks_delivered);
        set_str(L, "stream_reason", llmretry_stream_reason_name(r->stream_reason));
    }
}

/* target (0: the call's own), and with fallbacks what each came to. */
static void push_target_fields(lua_State *L, const llmretry_result *r)
{
    lr_set_int(L, "target", r->target);
    if (!r->targets)
        return;
    lua_createtable(L, r->n_targets, 0);
    for (int i = 0; i < r->n_targets; i++) {
        const llmretry_target_report *t = &r->targets[i];
        lua_createtable(L, 0, 5);
        set_str(L, "model", t->model);
        lr_set_int(L, "attempts", t->attempts);
        if (t->status > 0)
            lr_set_int(L, "status", t->status);
        set_str(L, "kind", llmretry_error_kind_name(t->kind));
        set_str(L, "reason", llmretry_reason_name(t->reason));
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "targets");
}

static void push_meta(lua_State *L, const llmretry_result *r)
{
    lua_createtable(L, 0, 10);
    lr_set_int(L, "attempt", r->attempt);
    lr_set_int(L, "attempts", r->attempts);
    lr_set_int(L, "duration_ms", r->duration_ms);
    lr_set_int(L, "total_ms", r->total_ms);
    lr_set_int(L, "status", r->status);
    if (push_usage(L, &r->usage))
        lua_setfield(L, -2, "usage");
    if (push_usage(L, &r->usage_total))
        lua_setfield(L, -2, "usage_total");
    set_str(L, "request_id", r->request_id);
    set_str(L, "model", r->model);
    set_str(L, "response_model", r->response_model);
    set_str(L, "system_fingerprint", r->system_fingerprint);
    lr_set_int(L, "resends", r->resends);
    push_stream_fields(L, r);
    lr_set_int(L, "target", r->target);
}

/* The err table of docs/python.md (absent values are nil). `message` and
 * `kind` override the result's own (for a body that would not decode). */
static void push_err(lua_State *L, const llmretry_result *r, const char *kind,
                     const char *message)
{
    lua_createtable(L, 0, 13);
    set_str(L, "kind", kind ? kind : llmretry_error_kind_name(r->kind));
    set_str(L, "message", message ? message : r->message);
    if (r->status > 0)
        lr_set_int(L, "status", r->status);
    lr_set_int(L, "attempt", r->attempt);
    lr_set_int(L, "attempts", r->attempts);
    set_str(L, "request_id", r->request_id);
    if (r->retry_after_ms >= 0 && !r->ok)
        lr_set_int(L, "retry_after_ms", r->retry_after_ms);
    if (!r->ok) {
        set_str(L, "error_code", r->error_code);
        set_str(L, "body_preview", r->body_preview);
        if (push_usage(L, &r->usage_total))
            lua_setfield(L, -2, "usage_total");
        /* The schema's verdict: a list of {path = ..., message = ...}. */
        char verdict_err[64];
        if (r->validation_errors &&
            push_decoded(L, r->validation_errors, strlen(r->validation_errors), verdict_err,
                         sizeof verdict_err))
            lua_setfield(L, -2, "validation_errors");
        /* A broken stream's reason is how it broke (as in Python). */
        set_str(L, "reason", r->kind == LLMRETRY_ERR_STREAM_INTERRUPTED
                                 ? llmretry_stream_reason_name(r->stream_reason)
                                 : llmretry_reason_name(r->reason));
        char why[160];
        if (r->kind == LLMRETRY_ERR_STREAM_INTERRUPTED && r->body) {
            if (push_decoded(L, r->body, r->body_len, why, sizeof why)) {
                /* What arrived before it broke, assembled: err.partial.data. */
                lua_createtable(L, 0, 1);
                lua_insert(L, -2);
                lua_setfield(L, -2, "data");
                lua_setfield(L, -2, "partial");
            }   /* not decodable: no partial (push_decoded pushed nothing) */
        }
    }
    set_str(L, "model", r->model);
    lr_set_int(L, "duration_ms", r->duration_ms);
    lr_set_int(L, "total_ms", r->total_ms);
    lr_set_int(L, "resends", r->resends);
    push_stream_fields(L, r);
    push_target_fields(L, r);
    luaL_getmetatable(L, ERROR_MT);
    lua_setmetatable(L, -2);
}

/* Push res (1 value) or nil, err (2 values). */
static int push_result(lua_State *L, const llmretry_result *r)
{
    if (!r->ok) {
        lua_pushnil(L);
        push_err(L, r, NULL, NULL);
        return 2;
    }
    char err[160];
    lua_createtable(L, 0, 3);
    if (!push_decoded(L, r->body ? r->body : "", r->body ? r->body_len : 0, err, sizeof err)) {
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
    push_meta(L, r);
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

int lr_handle_gc(lua_State *L)
{
    lr_handle *h = lua_touserdata(L, 1);
    if (h->parked) {
        llmretry_event_free(h->parked);
        h->parked = NULL;
    }
    if (h->call) {
        llmretry_call_free(h->call);
        h->call = NULL;
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
        push_event(L, ev);
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
    lua_settop(L, 1);
    lr_getuservalue(L, 1);
    lua_rawgeti(L, 2, 1);
    if (lua_toboolean(L, -1))
        return 1;
    lua_rawgeti(L, 2, 2);
    if (lua_toboolean(L, -1)) {
        lua_pushnil(L);
        lua_insert(L, -2);
        return 2;
    }
    lua_settop(L, 2);
    int n = push_result(L, r);
    lua_pushvalue(L, -1);
    lua_rawseti(L, 2, n == 1 ? 1 : 2);
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
