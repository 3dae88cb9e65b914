/* Submit options: a Lua table checked and turned into llmretry_options
 * (every key must be known; values named in errors). */
#include "lcore.h"

#include <cjson/cJSON.h>

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- submit options ---------------------------------------------------------- */

/* Keys of this binding that are not options of the core's table (the
 * core's option table names the others, with their types and ranges). */
static const char *const HOST_KEYS[] = { "body", "validate", "group", "channel", "stream_chunks",
                                         NULL };

static int is_host_key(const char *name)
{
    for (const char *const *k = HOST_KEYS; *k; k++)
        if (strcmp(*k, name) == 0)
            return 1;
    return 0;
}

/* How a body is given, for messages about a missing or misplaced one. */
#define BODY_EXAMPLE \
    "opts.body, such as body = { model = \"gpt-4.1-mini\", messages = { { role = \"user\", " \
    "content = \"hi\" } } }"

/* Is name a field of the request body (llmretry_body_fields)? */
static int is_body_field(const char *name)
{
    for (const char *const *f = llmretry_body_fields(); *f; f++)
        if (strcmp(*f, name) == 0)
            return 1;
    return 0;
}

/* names[n..max) filled with the strings of the array at idx, up to its
 * first value that is not one; the new count. The strings stay alive while
 * the array is on the stack. */
static size_t add_strings(lua_State *L, int idx, const char **names, size_t n, size_t max)
{
    for (lua_Integer i = 1; n < max; i++, lua_pop(L, 1)) {
        lua_rawgeti(L, idx, i);
        if (lua_type(L, -1) != LUA_TSTRING) {
            lua_pop(L, 1);
            break;
        }
        names[n++] = lua_tostring(L, -1);
    }
    return n;
}

/* The option an unknown key most likely meant (the core's rule, over the
 * table's names, this binding's keys and, when `also` is not 0, the
 * strings of the array at that index: a function's own keys, such as
 * call_many's limit), or NULL. */
static const char *meant_option(lua_State *L, const char *key, int also)
{
    enum { MAX_NAMES = 300 };
    const char *names[MAX_NAMES];
    size_t n = 0;
    for (size_t i = 0; i < llmretry_option_count() && n < MAX_NAMES; i++)
        names[n++] = llmretry_option_at(i)->name;
    for (const char *const *k = HOST_KEYS; *k && n < MAX_NAMES; k++)
        names[n++] = *k;
    if (also)
        n = add_strings(L, also, names, n, MAX_NAMES);
    return llmretry_option_suggest(key, names, n);
}

/* core.suggest(key, names): the one of the array `names` that the unknown
 * key most likely meant (the core's rule, as for options), or nil: for a
 * function's own options that are not the core's (map_with_concurrency's). */
int l_suggest(lua_State *L)
{
    enum { MAX_NAMES = 64 };
    const char *key = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    const char *names[MAX_NAMES];
    size_t n = add_strings(L, 2, names, 0, MAX_NAMES);
    const char *meant = llmretry_option_suggest(key, names, n);
    if (meant)
        lua_pushstring(L, meant);
    else
        lua_pushnil(L);
    return 1;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Keeps the `max` first names in name order among those seen: `k` joins
 * names[0..n) (n of them so far), or takes the place of the last one when
 * full. Which keys a message names must not depend on a table's order. */
static void keep_first_names(const char **names, int n, int max, const char *k)
{
    if (n < max) {
        names[n] = k;
        return;
    }
    int last = 0;
    for (int i = 1; i < n; i++)
        if (strcmp(names[i], names[last]) > 0)
            last = i;
    if (strcmp(k, names[last]) < 0)
        names[last] = k;
}

/* Which options of the core's table t sets: bit i for llmretry_option_at(i).
 * Up to 256 options; past that every one counts as set (looked up by name). */
typedef struct {
    uint64_t bits[4];
    int all;
} opt_set;

/* Every key must be a known option: a typo (timeout instead of timeout_ms)
 * would otherwise be silently ignored. One pass over t's keys also notes
 * which options are set, so that parse_opts looks up those few, not each
 * of the table's options by name (a string lookup per option per call). */
static void check_opt_names(lua_State *L, int t, opt_set *set, int need_body, int also)
{
    enum { MAX_SAID = 8 };
    const char *unknown[MAX_SAID];     /* keys of t: alive while t is */
    int n_unknown = 0;
    char buf[64];
    const llmretry_option_info *first = llmretry_option_at(0);
    memset(set, 0, sizeof *set);
    set->all = llmretry_option_count() > 256;
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING)
            lr_fail(L, "option names must be strings (got %s)", got(L, -1, buf, sizeof buf));
        const char *k = lua_tostring(L, -1);
        const llmretry_option_info *opt = llmretry_option_find(k);
        if (opt) {
            size_t i = (size_t)(opt - first);   /* the table is one array */
            if (i < 256)
                set->bits[i / 64] |= (uint64_t)1 << (i % 64);
        } else if (!is_host_key(k)) {
            keep_first_names(unknown, n_unknown < MAX_SAID ? n_unknown : MAX_SAID, MAX_SAID, k);
            n_unknown++;
        }
    }
    if (n_unknown == 0)
        return;
    /* In name order: a table's own order differs from one Lua to another. */
    int n_said = n_unknown < MAX_SAID ? n_unknown : MAX_SAID;
    qsort(unknown, (size_t)n_said, sizeof unknown[0], by_name);
    char said[600] = "", body[200] = "";
    int n_body = 0;
    for (int i = 0; i < n_said; i++) {
        size_t len = strlen(said);
        int in_body = is_body_field(unknown[i]);
        const char *meant = in_body ? NULL : meant_option(L, unknown[i], also);
        snprintf(said + len, sizeof said - len, "%s'%.40s'%s%s%s", i ? ", " : "", unknown[i],
                 meant ? " (did you mean " : "", meant ? meant : "", meant ? "?)" : "");
        if (in_body) {
            len = strlen(body);
            snprintf(body + len, sizeof body - len, "%s%s", n_body++ ? ", " : "", unknown[i]);
        }
    }
    if (n_unknown > n_said) {
        size_t len = strlen(said);
        snprintf(said + len, sizeof said - len, " and %d more", n_unknown - n_said);
    }
    if (n_body)
        lr_fail(L, "unknown option%s %s; %s %s in the request body%s", n_unknown > 1 ? "s" : "",
                said, body, n_body > 1 ? "go" : "goes",
                need_body ? ": " BODY_EXAMPLE : " (each body's), not in the options");
    lr_fail(L, "unknown option%s %s", n_unknown > 1 ? "s" : "", said);
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
    char buf[64], err[LLMRETRY_ERRBUF];
    int v[LLMRETRY_MAX_STATUSES + 1];
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
    /* The core says how many may be listed; only so many are read here. */
    size_t read = n < LLMRETRY_MAX_STATUSES ? n : LLMRETRY_MAX_STATUSES + 1;
    for (size_t i = 0; i < read && i < n; i++) {
        lua_rawgeti(L, idx, (int)i + 1);
        int64_t x;
        if (!to_int64(L, -1, &x))
            lr_fail(L, "retry_statuses[%zu] must be an integer (got %s)", i + 1,
                    got(L, -1, buf, sizeof buf));
        v[i] = x > INT_MAX ? INT_MAX : x < INT_MIN ? INT_MIN : (int)x;
        lua_pop(L, 1);
    }
    if (llmretry_options_set_statuses(o, v, n, err, sizeof err) != LLMRETRY_OK) {
        /* The core counts from 0; a Lua array from 1. */
        size_t i;
        int used;
        if (sscanf(err, "retry_statuses[%zu]%n", &i, &used) == 1)
            lr_fail(L, "retry_statuses[%zu]%s", i + 1, err + used);
        lr_fail(L, "%s", err);
    }
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
        char err[LLMRETRY_ERRBUF];
        /* The core's rule; a table has no order to name a header by. */
        if (llmretry_check_header(name, nl, "", 0, (size_t)-1, err, sizeof err) != LLMRETRY_OK)
            lr_fail(L, "%s", err);
        int vt = lua_type(L, -1);
        if (vt != LUA_TSTRING && vt != LUA_TNUMBER)
            lr_fail(L, "headers[\"%s\"] must be a string (got %s)", name,
                    got(L, -1, buf, sizeof buf));
        /* tostring on a copy: never convert in place during lua_next. */
        lua_pushvalue(L, -1);
        size_t vl;
        const char *value = lua_tolstring(L, -1, &vl);
        if (llmretry_check_header(name, nl, value, vl, (size_t)-1, err, sizeof err) != LLMRETRY_OK)
            lr_fail(L, "%s", err);
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

/* One option by the core's table: the conversion follows its type, the
 * range and the message are the core's. */
static void opt_one(lua_State *L, int idx, const llmretry_option_info *opt, llmretry_options *o)
{
    char buf[64], err[LLMRETRY_ERRBUF];
    llmretry_status st = LLMRETRY_OK;
    switch (opt->type) {
    case LLMRETRY_OPTTYPE_TEXT:
    case LLMRETRY_OPTTYPE_ENUM:
        st = llmretry_options_set_text(o, opt->name, opt_string(L, idx, opt->name), err,
                                       sizeof err);
        break;
    case LLMRETRY_OPTTYPE_INT:
        st = llmretry_options_set_int(o, opt->name, check_int64(L, idx, opt->name), err,
                                      sizeof err);
        break;
    case LLMRETRY_OPTTYPE_BOOL:
        if (lua_type(L, idx) != LUA_TBOOLEAN)
            lr_fail(L, "%s must be a boolean (got %s)", opt->name, got(L, idx, buf, sizeof buf));
        st = llmretry_options_set_bool(o, opt->name, lua_toboolean(L, idx), err, sizeof err);
        break;
    case LLMRETRY_OPTTYPE_STATUSES:
        opt_statuses(L, idx, o);
        break;
    case LLMRETRY_OPTTYPE_HEADERS:
        opt_headers(L, idx, o);
        break;
    case LLMRETRY_OPTTYPE_NUMBER:
        if (lua_type(L, idx) != LUA_TNUMBER)
            lr_fail(L, "%s must be a number (got %s)", opt->name, got(L, idx, buf, sizeof buf));
        st = llmretry_options_set_number(o, opt->name, (double)lua_tonumber(L, idx), err,
                                         sizeof err);
        break;
    case LLMRETRY_OPTTYPE_TARGETS:
        /* A list of target tables, encoded as the JSON the core checks;
         * the text stays on the stack until the submit copies it. */
        if (lua_type(L, idx) != LUA_TTABLE)
            lr_fail(L, "%s must be a list of targets (tables) (got %s)", opt->name,
                    got(L, idx, buf, sizeof buf));
        lua_pushnil(L);
        if (!lua_next(L, idx))
            break;                  /* {}: no fallbacks */
        lua_pop(L, 2);
        push_encoded(L, idx, opt->name);
        st = llmretry_options_set_json(o, opt->name, lua_tostring(L, -1), err, sizeof err);
        break;
    case LLMRETRY_OPTTYPE_SCHEMA:
        /* A JSON Schema: a table (encoded here), JSON text, or true/false;
         * the text stays on the stack until the submit copies it. */
        if (lua_type(L, idx) == LUA_TTABLE)
            push_encoded(L, idx, opt->name);
        else if (lua_type(L, idx) == LUA_TBOOLEAN)
            lua_pushstring(L, lua_toboolean(L, idx) ? "true" : "false");
        else if (lua_type(L, idx) == LUA_TSTRING)
            lua_pushvalue(L, idx);
        else
            lr_fail(L, "%s must be a table (a JSON Schema) or JSON text (got %s)", opt->name,
                    got(L, idx, buf, sizeof buf));
        st = llmretry_options_set_json(o, opt->name, lua_tostring(L, -1), err, sizeof err);
        break;
    }
    if (st != LLMRETRY_OK)
        lr_fail(L, "%s", err);
}

/* The keys of this binding's own: validate (a flag here: the function is
 * the Lua side's), stream_chunks (handle:next() gives "chunk" items:
 * llm.stream_llm), group and channel. */
static void host_opts(lua_State *L, int t, llmretry_options *o)
{
    char buf[64];
    static const char *const flags[] = { "validate", "stream_chunks" };
    int *fields[] = { &o->validate, &o->stream_chunks };
    for (int i = 0; i < 2; i++) {
        lua_getfield(L, t, flags[i]);
        if (!lua_isnil(L, -1)) {
            if (lua_type(L, -1) != LUA_TBOOLEAN)
                lr_fail(L, "%s must be a boolean (got %s)", flags[i], got(L, -1, buf, sizeof buf));
            *fields[i] = lua_toboolean(L, -1);
        }
        lua_pop(L, 1);
    }
    lua_getfield(L, t, "group");
    if (!lua_isnil(L, -1)) {
        lr_group *gr = lr_testudata(L, -1, GROUP_MT);
        if (!gr)
            lr_fail(L, "group must be a group from engine:group() (got %s)",
                    got(L, -1, buf, sizeof buf));
        if (!gr->g)
            lr_fail(L, "group is closed");
        o->group = gr->g;
    }
    lua_pop(L, 1);
    lua_getfield(L, t, "channel");
    if (!lua_isnil(L, -1)) {
        lr_chan *c = lr_testudata(L, -1, CHANNEL_MT);
        if (!c)
            lr_fail(L, "channel must be a channel from engine:new_channel() (got %s)",
                    got(L, -1, buf, sizeof buf));
        if (!lr_chan_open(c))
            lr_fail(L, "channel is closed");
        o->channel = c->ch;
    }
    lua_pop(L, 1);
}

/* Fill `o` from the options table at t. Strings are borrowed from values
 * that stay reachable from the stack (the table, or anchors pushed here)
 * until the call is submitted: the core copies them. Without need_body, a
 * missing body reads as "{}" (for check_options). `also`: 0, or the index
 * of an array of the caller's own keys, suggested for an unknown one. */
void parse_opts(lua_State *L, int t, llmretry_options *o, int need_body, int also)
{
    char buf[64];
    if (lua_type(L, t) != LUA_TTABLE)
        lr_fail(L, "opts must be a table (got %s)", got(L, t, buf, sizeof buf));
    luaL_checkstack(L, 2 * (int)llmretry_option_count() + 10, "llmretry: out of stack space");
    opt_set set;
    check_opt_names(L, t, &set, need_body, also);
    llmretry_options_defaults(o);

    /* A GET or DELETE has no body: a missing one stays missing (NULL). */
    lua_getfield(L, t, "method");
    int bodiless = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "POST") != 0;
    lua_pop(L, 1);
    const char *table_model = NULL;
    lua_getfield(L, t, "body");
    if (lua_isnil(L, -1) && !need_body && !bodiless) {
        lua_pop(L, 1);
        lua_pushliteral(L, "{}");
    }
    if (lua_isnil(L, -1) && bodiless) {
        o->body = NULL;             /* the nil stays on the stack, as a body would */
        o->body_len = 0;
    } else if (lua_type(L, -1) == LUA_TTABLE) {
        /* Its "model", anchored on the stack: the core would otherwise
         * parse the text we are about to make only to read it back. */
        lua_pushliteral(L, "model");
        lua_rawget(L, -2);
        if (lua_type(L, -1) == LUA_TSTRING)
            table_model = lua_tostring(L, -1);
        lua_insert(L, -2);
        push_encoded(L, -1, "body");
        /* A table the binding encoded: a stream of it reports its usage. */
        o->stream_usage = 1;
    }
    else if (lua_isnil(L, -1))
        lr_fail(L, "body is missing: the request goes in " BODY_EXAMPLE);
    else if (lua_type(L, -1) != LUA_TSTRING)
        lr_fail(L, "body must be a JSON string or a table (got %s)", got(L, -1, buf, sizeof buf));
    if (!lua_isnil(L, -1)) {
        size_t n;
        o->body = lua_tolstring(L, -1, &n);
        o->body_len = n;
        if (n == 0)
            lr_fail(L, "body must not be empty");
    }

    const llmretry_option_info *opt;
    for (size_t i = 0; (opt = llmretry_option_at(i)); i++) {
        if (!set.all && !(set.bits[i / 64] >> (i % 64) & 1))
            continue;               /* not in t: its default stands */
        lua_getfield(L, t, opt->name);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            continue;
        }
        opt_one(L, lua_gettop(L), opt, o);
    }
    host_opts(L, t, o);
    /* What the core would read from the JSON body (no model option, and no
     * content_type: another type is not read at all). */
    if (table_model && !o->model && !o->content_type && o->method == LLMRETRY_METHOD_POST)
        o->model = table_model;
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
