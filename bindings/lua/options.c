/* Submit options: a Lua table checked and turned into llmretry_options
 * (every key must be known; values named in errors). */
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

/* ---- submit options ---------------------------------------------------------- */

typedef enum opt_kind {
    O_BODY, O_STR, O_I64, O_INT, O_BOOL, O_JITTER, O_MODE, O_STATUSES, O_HEADERS,
    O_DEADLINE, O_EVENTS, O_GROUP
} opt_kind;

typedef struct opt_spec {
    const char *name;
    opt_kind kind;
    size_t off;                 /* into llmretry_options */
} opt_spec;

#define OFF(f) offsetof(llmretry_options, f)
static const opt_spec OPTS[] = {
    { "body", O_BODY, 0 },
    { "model", O_STR, OFF(model) },
    { "url", O_STR, OFF(url) },
    { "base_url", O_STR, OFF(base_url) },
    { "api_key", O_STR, OFF(api_key) },
    { "timeout_ms", O_I64, OFF(timeout_ms) },
    { "max_retries", O_INT, OFF(max_retries) },
    { "base_delay_ms", O_I64, OFF(base_delay_ms) },
    { "max_delay_ms", O_I64, OFF(max_delay_ms) },
    { "jitter", O_JITTER, OFF(jitter) },
    { "deadline_ms", O_DEADLINE, OFF(deadline_ms) },
    { "retry_mode", O_MODE, OFF(retry_mode) },
    { "retry_statuses", O_STATUSES, 0 },
    { "max_retry_after_ms", O_I64, OFF(max_retry_after_ms) },
    { "retry_invalid_response", O_BOOL, OFF(retry_invalid_response) },
    { "max_response_bytes", O_I64, OFF(max_response_bytes) },
    { "headers", O_HEADERS, 0 },
    { "request_id", O_STR, OFF(request_id) },
    { "idempotency_key", O_STR, OFF(idempotency_key) },
    { "policy", O_STR, OFF(policy) },
    { "ca_file", O_STR, OFF(ca_file) },
    { "event_mask", O_EVENTS, OFF(events) },
    { "validate", O_BOOL, OFF(validate) },
    { "group", O_GROUP, OFF(group) },
};
#define N_OPTS (sizeof OPTS / sizeof OPTS[0])

static const opt_spec *find_opt(const char *name)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strcmp(OPTS[i].name, name) == 0)
            return &OPTS[i];
    return NULL;
}

/* Every key must be a known option: a typo (timeout instead of timeout_ms)
 * would otherwise be silently ignored. */
static void check_opt_names(lua_State *L, int t)
{
    char unknown[300] = "";
    int n_unknown = 0;
    char buf[64];
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING)
            lr_fail(L, "option names must be strings (got %s)", got(L, -1, buf, sizeof buf));
        const char *k = lua_tostring(L, -1);
        if (!find_opt(k)) {
            size_t len = strlen(unknown);
            snprintf(unknown + len, sizeof unknown - len, "%s'%.40s'", n_unknown ? ", " : "", k);
            n_unknown++;
        }
    }
    if (n_unknown)
        lr_fail(L, "unknown option%s %s", n_unknown > 1 ? "s" : "", unknown);
}

static const char *opt_string(lua_State *L, int idx, const char *name)
{
    char buf[64];
    size_t n;
    if (lua_type(L, idx) != LUA_TSTRING)
        lr_fail(L, "%s must be a string (got %s)", name, got(L, idx, buf, sizeof buf));
    const char *s = lua_tolstring(L, idx, &n);
    if (strlen(s) != n)
        lr_fail(L, "%s must not contain NUL bytes", name);
    return s;
}

static void opt_statuses(lua_State *L, int idx, llmretry_options *o)
{
    char buf[64];
    if (lua_type(L, idx) != LUA_TTABLE)
        lr_fail(L, "retry_statuses must be an array of integers (got %s)",
                got(L, idx, buf, sizeof buf));
    size_t n = lr_rawlen(L, idx), count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        count++;
    }
    if (count != n)
        lr_fail(L, "retry_statuses must be an array of integers (it has non-array keys)");
    if (n == 0)
        lr_fail(L, "retry_statuses must not be empty (use max_retries = 0 to never retry)");
    if (n > LLMRETRY_MAX_STATUSES)
        lr_fail(L, "retry_statuses holds at most %d statuses (got %zu)", LLMRETRY_MAX_STATUSES,
                n);
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, idx, (int)i + 1);
        int64_t v;
        if (!to_int64(L, -1, &v) || v < 100 || v > 599)
            lr_fail(L, "retry_statuses[%zu] must be an integer in 100..599 (got %s)", i + 1,
                    got(L, -1, buf, sizeof buf));
        o->retry_statuses[i] = (int)v;
        lua_pop(L, 1);
    }
    o->n_retry_statuses = n;
}

/* RFC 9110 token characters: anything else cannot be a header name. */
static int is_header_name(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == 0 || (!isalnum(c) && !strchr("!#$%&'*+-.^_`|~", c)))
            return 0;
    }
    return 1;
}

/* headers = { Name = value }: "Name: value" lines, kept alive in a table
 * left on the stack, and their pointers in a userdata (also left there). */
static void opt_headers(lua_State *L, int idx, llmretry_options *o)
{
    char buf[64];
    if (lua_type(L, idx) != LUA_TTABLE)
        lr_fail(L, "headers must be a table of name = value (got %s)",
                got(L, idx, buf, sizeof buf));
    lua_newtable(L);
    int lines = lua_gettop(L);
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        size_t nl;
        if (lua_type(L, -2) != LUA_TSTRING)
            lr_fail(L, "headers keys must be header names (got %s)", got(L, -2, buf, sizeof buf));
        const char *name = lua_tolstring(L, -2, &nl);
        if (!is_header_name(name, nl))
            lr_fail(L, "headers key \"%.40s\" is not a valid header name", name);
        int vt = lua_type(L, -1);
        if (vt != LUA_TSTRING && vt != LUA_TNUMBER)
            lr_fail(L, "headers[\"%s\"] must be a string (got %s)", name,
                    got(L, -1, buf, sizeof buf));
        /* tostring on a copy: never convert in place during lua_next. */
        lua_pushvalue(L, -1);
        size_t vl;
        const char *value = lua_tolstring(L, -1, &vl);
        if (strlen(value) != vl)
            lr_fail(L, "headers[\"%s\"] must not contain NUL bytes", name);
        lua_pushfstring(L, "%s: %s", name, value);
        lua_rawseti(L, lines, ++n);
        lua_pop(L, 2);
    }
    const char **ptrs = lua_newuserdata(L, sizeof *ptrs * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, lines, i + 1);
        ptrs[i] = lua_tostring(L, -1);      /* kept alive by `lines` */
        lua_pop(L, 1);
    }
    o->headers = ptrs;
    o->n_headers = (size_t)n;
}

static void opt_one(lua_State *L, int idx, const opt_spec *s, llmretry_options *o)
{
    char buf[64];
    char *field = (char *)o + s->off;
    switch (s->kind) {
    case O_BODY:
        break;                              /* read first, by parse_opts */
    case O_STR:
        *(const char **)field = opt_string(L, idx, s->name);
        break;
    case O_I64:
        *(int64_t *)field = check_int64(L, idx, s->name);
        break;
    case O_INT:
        *(int *)field = check_int(L, idx, s->name, INT_MIN, INT_MAX);
        break;
    case O_BOOL:
        if (lua_type(L, idx) != LUA_TBOOLEAN)
            lr_fail(L, "%s must be a boolean (got %s)", s->name, got(L, idx, buf, sizeof buf));
        *(int *)field = lua_toboolean(L, idx);
        break;
    case O_JITTER:
        if (llmretry_jitter_parse(opt_string(L, idx, s->name), &o->jitter) != LLMRETRY_OK)
            lr_fail(L, "jitter must be \"additive\", \"full\" or \"none\"");
        break;
    case O_MODE:
        if (llmretry_retry_mode_parse(opt_string(L, idx, s->name), &o->retry_mode) != LLMRETRY_OK)
            lr_fail(L, "retry_mode must be \"safe\" or \"unsafe\"");
        break;
    case O_STATUSES:
        opt_statuses(L, idx, o);
        break;
    case O_HEADERS:
        opt_headers(L, idx, o);
        break;
    case O_DEADLINE: {
        /* The core reads -1 as "no deadline": never let -1 mean that here. */
        int64_t d = check_int64(L, idx, s->name);
        if (d < 0)
            lr_fail(L, "deadline_ms must be >= 0 (got %lld)", (long long)d);
        o->deadline_ms = d;
        break;
    }
    case O_EVENTS:
        o->events = (unsigned)check_int(L, idx, "event_mask", 0, (int)LLMRETRY_EVENTS_ALL);
        break;
    case O_GROUP: {
        lr_group *gr = lr_testudata(L, idx, GROUP_MT);
        if (!gr)
            lr_fail(L, "group must be a group from engine:group() (got %s)",
                    got(L, idx, buf, sizeof buf));
        if (!gr->g)
            lr_fail(L, "group is closed");
        o->group = gr->g;
        break;
    }
    }
}

/* Fill `o` from the options table at t. Strings are borrowed from values
 * that stay reachable from the stack (the table, or anchors pushed here)
 * until the call is submitted: the core copies them. Without need_body, a
 * missing body reads as "{}" (for check_options). */
void parse_opts(lua_State *L, int t, llmretry_options *o, int need_body)
{
    char buf[64];
    if (lua_type(L, t) != LUA_TTABLE)
        lr_fail(L, "opts must be a table (got %s)", got(L, t, buf, sizeof buf));
    luaL_checkstack(L, 2 * (int)N_OPTS + 10, "llmretry: out of stack space");
    check_opt_names(L, t);
    llmretry_options_defaults(o);

    lua_getfield(L, t, "body");
    if (lua_isnil(L, -1) && !need_body) {
        lua_pop(L, 1);
        lua_pushliteral(L, "{}");
    }
    if (lua_type(L, -1) == LUA_TTABLE)
        push_encoded(L, -1, "body");
    else if (lua_type(L, -1) != LUA_TSTRING)
        lr_fail(L, "body must be a JSON string or a table (got %s)", got(L, -1, buf, sizeof buf));
    size_t n;
    o->body = lua_tolstring(L, -1, &n);
    o->body_len = n;
    if (n == 0)
        lr_fail(L, "body must not be empty");

    for (size_t i = 0; i < N_OPTS; i++) {
        if (OPTS[i].kind == O_BODY)
            continue;
        lua_getfield(L, t, OPTS[i].name);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            continue;
        }
        opt_one(L, lua_gettop(L), &OPTS[i], o);
    }
}

/* The core counts headers from 0 in its own order: name the header. */
void rename_header_error(const llmretry_options *o, char *err, size_t errlen)
{
    size_t i;
    int used;
    if (sscanf(err, "headers[%zu]%n", &i, &used) != 1 || i >= o->n_headers)
        return;
    const char *line = o->headers[i];
    const char *colon = strchr(line, ':');
    char out[LLMRETRY_ERRBUF];
    snprintf(out, sizeof out, "headers[\"%.*s\"]%s", colon ? (int)(colon - line) : 0, line,
             err + used);
    snprintf(err, errlen, "%s", out);
}
