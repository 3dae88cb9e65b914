/* llmretry.core: the Lua face of the C core (Lua 5.4 and LuaJIT/5.1).
 *
 * This module converts between Lua and C and nothing more; the public Lua
 * API is lua/llmretry (DESIGN §6), built on this:
 *
 *   core.encode(v) / core.decode(s)        JSON, lua-cjson conventions:
 *   core.null, core.array_mt, core.empty_array
 *   core.extract_json(s), core.assert_shape(v, shape [, path])
 *   core.check_options(opts)              raise as engine:submit would
 *   core.new_engine([max_in_flight[, max_host_connections]]) -> engine
 *     engine:submit(opts) -> handle        every call in poll mode
 *     engine:fd(), engine:poll([max]), engine:wait(ms), engine:close()
 *     engine:group{limit=, deadline_ms=, adaptive=} -> group: a batch paced
 *       on the engine thread; submit with opts.group; its calls report to
 *       group:fd(), group:poll([max]), group:wait(ms) (not the engine's);
 *       group:stats(), group:close()
 *   handle:next() -> "event", t | "validate", body | "done" | nil
 *   handle:wait(ms), handle:validated(ok [, msg]), handle:result(),
 *   handle:cancel(), handle:request_id(), handle:done()
 *   core.error_mt, core.VERSION, core.EVENT_NAMES, core.EVENTS_ALL
 *
 * The host drains each handle's mailbox on its own thread (DESIGN §1): no
 * Lua code ever runs on the engine's I/O thread. A handle does not keep its
 * engine alive: collecting or closing an engine cancels its calls, and
 * their handles then read as cancelled.
 *
 * No global mutable state (DESIGN §6): several Lua states on several
 * threads may load the module at once. Everything lives in the loading
 * state's registry (metatables under "llmretry.*" names) or in userdata.
 *
 * Any lua_* call may raise (out of memory, a metamethod), so C resources
 * are always owned by a userdata whose __gc frees them before the first
 * call that could raise: the encoder's buffer, the decoder's cJSON tree, a
 * call (the handle exists before the call is submitted), an event being
 * converted (parked in its handle). */
#include "compat.h"

#include "llmretry.h"

#include <cjson/cJSON.h>

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ENGINE_MT "llmretry.engine"
#define GROUP_MT "llmretry.group"
#define HANDLE_MT "llmretry.handle"
#define ERROR_MT "llmretry.error"
#define ARRAY_MT "llmretry.array_mt"
#define WEAKV_MT "llmretry.weak_values"
#define SBUF_MT "llmretry.encode_buffer"
#define JTREE_MT "llmretry.decode_tree"

/* Deeper Lua values are almost surely cycles or mistakes; a chat body is a
 * few levels deep. */
#define ENCODE_MAX_DEPTH 100
/* engine:poll takes calls from the core in batches of this many. */
#define POLL_BATCH 64

/* Only its address matters: core.empty_array, a sentinel like cjson's. */
static const char empty_array_tag = 0;
#define EMPTY_ARRAY ((void *)&empty_array_tag)

#if defined(__GNUC__)
#define LR_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define LR_PRINTF(f, a)
#endif

/* ---- errors ---------------------------------------------------------------- */

/* Raise "llmretry: <message>" at the caller's position, like luaL_error
 * but with printf's full syntax (lua_pushfstring knows no %lld or %.40s). */
static int lr_fail(lua_State *L, const char *fmt, ...) LR_PRINTF(2, 3);
static int lr_fail(lua_State *L, const char *fmt, ...)
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
static const char *got(lua_State *L, int idx, char *buf, size_t n)
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

/* A number with an integral value that fits int64 (floats like 3.0 count:
 * on 5.1 every number is one). 0 otherwise. */
static int to_int64(lua_State *L, int idx, int64_t *out)
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

static int64_t check_int64(lua_State *L, int idx, const char *name)
{
    int64_t v;
    char buf[64];
    if (!to_int64(L, idx, &v))
        lr_fail(L, "%s must be an integer (got %s)", name, got(L, idx, buf, sizeof buf));
    return v;
}

static int check_int(lua_State *L, int idx, const char *name, int lo, int hi)
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
static void push_ptr_key(lua_State *L, const void *p)
{
#if LR_HAVE_INTEGERS
    lua_pushinteger(L, (lua_Integer)(uintptr_t)p);
#else
    lua_pushnumber(L, (lua_Number)(uintptr_t)p);
#endif
}

static void push_null(lua_State *L)
{
    lua_pushlightuserdata(L, NULL);
}

/* ---- UTF-8 ---------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n), n > 0 (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF); 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

/* The offset of the first byte of s[0..n) that is not valid UTF-8, or n. */
static size_t utf8_invalid_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(u + i, n - i);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

/* Push text that came from a server as a Lua string, each invalid UTF-8
 * sequence replaced by U+FFFD (as Python's binding decodes it): whatever
 * llmretry hands to Lua can be encoded back to JSON. */
static void push_text(lua_State *L, const char *s, size_t n)
{
    size_t bad = utf8_invalid_at(s, n);
    if (bad == n) {
        lua_pushlstring(L, s, n);
        return;
    }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addlstring(&b, s, bad);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = bad; i < n;) {
        size_t k = u[i] < 0x80 ? 1 : utf8_seq(u + i, n - i);
        if (k == 0) {
            luaL_addlstring(&b, "\xEF\xBF\xBD", 3);
            i++;
        } else {
            luaL_addlstring(&b, s + i, k);
            i += k;
        }
    }
    luaL_pushresult(&b);
}

static void push_text0(lua_State *L, const char *s)
{
    push_text(L, s, strlen(s));
}

/* ---- JSON: encoding ------------------------------------------------------ */

/* The output buffer, owned by a userdata so that an error raised halfway
 * (a function in the value, out of memory) leaks nothing. */
typedef struct sbuf {
    char *data;
    size_t len, cap;
} sbuf;

static int sbuf_gc(lua_State *L)
{
    sbuf *b = lua_touserdata(L, 1);
    free(b->data);
    b->data = NULL;
    return 0;
}

/* One step of the path from the root to the value being encoded, kept on
 * the C stack and spelled out only when an error names it. */
typedef struct frame {
    const struct frame *up;  /* NULL: the root */
    int key;                 /* stack index of an object key; 0 = array index */
    long long index;         /* 1-based, as Lua code wrote it */
} frame;

typedef struct enc {
    lua_State *L;
    sbuf *b;
    int seen;                /* stack index: tables being encoded (cycles) */
    int array_mt;            /* stack index of core.array_mt */
    const char *root;        /* "value", "body", "shape" */
} enc;

static void put(enc *e, const char *s, size_t n)
{
    sbuf *b = e->b;
    if (b->cap - b->len < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2)
                lr_fail(e->L, "out of memory while encoding JSON");
            cap *= 2;
        }
        char *p = realloc(b->data, cap);
        if (!p)
            lr_fail(e->L, "out of memory while encoding JSON");
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static void put_lit(enc *e, const char *s)
{
    put(e, s, strlen(s));
}

static int is_identifier(const char *s, size_t n)
{
    if (n == 0 || n > 60 || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_'))
            return 0;
    return 1;
}

/* Doubles in their shortest round-tripping form, integral ones without an
 * exponent; the locale's decimal comma (if a host set one) is undone. */
static void format_double(double d, char *buf, size_t n)
{
    if (d == floor(d) && fabs(d) < 1e17) {
        snprintf(buf, n, "%.0f", d);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, d);
            if (strtod(buf, NULL) == d)
                break;
        }
    }
    for (char *p = buf; *p; p++)
        if (*p == ',')
            *p = '.';
}

/* The number at idx as JSON text; 0 for NaN and the infinities. */
static int format_number(lua_State *L, int idx, char *buf, size_t n)
{
#if LR_HAVE_INTEGERS
    if (lua_isinteger(L, idx)) {
        snprintf(buf, n, "%lld", (long long)lua_tointeger(L, idx));
        return 1;
    }
#endif
    double d = (double)lua_tonumber(L, idx);
    if (isnan(d) || isinf(d))
        return 0;
    format_double(d, buf, n);
    return 1;
}

static void path_append(enc *e, const frame *f, char *buf, size_t n)
{
    size_t len = strlen(buf);
    if (len + 1 >= n)
        return;
    if (!f->up) {
        snprintf(buf + len, n - len, "%s", e->root);
        return;
    }
    path_append(e, f->up, buf, n);
    len = strlen(buf);
    if (f->key == 0) {
        snprintf(buf + len, n - len, "[%lld]", f->index);
    } else if (lua_type(e->L, f->key) == LUA_TSTRING) {
        size_t kl;
        const char *k = lua_tolstring(e->L, f->key, &kl);
        if (is_identifier(k, kl))
            snprintf(buf + len, n - len, ".%s", k);
        else
            snprintf(buf + len, n - len, "[\"%.40s\"]", k);
    } else {
        char num[64];
        if (!format_number(e->L, f->key, num, sizeof num))
            snprintf(num, sizeof num, "?");
        snprintf(buf + len, n - len, "[%s]", num);
    }
}

static int enc_fail(enc *e, const frame *f, const char *what)
{
    char path[300] = "";
    path_append(e, f, path, sizeof path);
    return lr_fail(e->L, "%s %s", path, what);
}

/* Strings must be valid UTF-8 to be JSON (RFC 8259). The error gives
 * the offset, never the text (it may be a prompt). */
static void check_utf8(enc *e, const frame *f, const char *s, size_t n, const char *what)
{
    size_t bad = utf8_invalid_at(s, n);
    if (bad < n) {
        char msg[120];
        snprintf(msg, sizeof msg, "%s (at byte %zu)", what, bad);
        enc_fail(e, f, msg);
    }
}

static void put_string(enc *e, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    put(e, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        put(e, s + run, i - run);
        run = i + 1;
        char esc[7] = { '\\', 0, 0, 0, 0, 0, 0 };
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            put(e, esc, 6);
            continue;
        }
        put(e, esc, 2);
    }
    put(e, s + run, n - run);
    put(e, "\"", 1);
}

static void enc_value(enc *e, int idx, const frame *f, int depth);

/* Arrays are tables marked with array_mt, or whose keys are exactly
 * 1..n (n > 0). *n is the length to write. */
static int table_is_array(enc *e, int idx, size_t *n)
{
    lua_State *L = e->L;
    if (lua_getmetatable(L, idx)) {
        int marked = lua_rawequal(L, -1, e->array_mt);
        lua_pop(L, 1);
        if (marked) {
            *n = lr_rawlen(L, idx);
            return 1;
        }
    }
    size_t count = 0;
    int64_t max = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int64_t k;
#if LR_HAVE_INTEGERS
        int ok = lua_isinteger(L, -1) && to_int64(L, -1, &k) && k >= 1;
#else
        int ok = to_int64(L, -1, &k) && k >= 1;
#endif
        if (!ok) {
            lua_pop(L, 1);
            return 0;
        }
        count++;
        if (k > max)
            max = k;
    }
    *n = count;
    return count > 0 && (int64_t)count == max;
}

static void enc_array(enc *e, int idx, const frame *f, int depth, size_t n)
{
    lua_State *L = e->L;
    put(e, "[", 1);
    for (size_t i = 1; i <= n; i++) {
        if (i > 1)
            put(e, ",", 1);
        lua_rawgeti(L, idx, (int)i);
        frame child = { f, 0, (long long)i };
        enc_value(e, lua_gettop(L), &child, depth + 1);
        lua_pop(L, 1);
    }
    put(e, "]", 1);
}

static void enc_object(enc *e, int idx, const frame *f, int depth)
{
    lua_State *L = e->L;
    int first = 1, strings = 0, numbers = 0;
    put(e, "{", 1);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        int key = lua_gettop(L) - 1;
        if (!first)
            put(e, ",", 1);
        first = 0;
        /* Number keys become names ("50256" in a logit_bias map), so mixed
         * with string keys ({1, 2, x = 3}: an array with a field) they
         * would silently turn an array into an object, or write one name
         * twice ([1] and ["1"]). */
        if (lua_type(L, key) == LUA_TSTRING)
            strings = 1;
        else if (lua_type(L, key) == LUA_TNUMBER)
            numbers = 1;
        if (strings && numbers)
            enc_fail(e, f, "mixes number and string keys (an array with named fields?)");
        if (lua_type(L, key) == LUA_TSTRING) {
            size_t kl;
            const char *k = lua_tolstring(L, key, &kl);
            check_utf8(e, f, k, kl, "has a key that is not valid UTF-8");
            put_string(e, k, kl);
        } else if (lua_type(L, key) == LUA_TNUMBER) {
            /* Never lua_tostring on a key: it would break lua_next. */
            char num[64];
            if (!format_number(L, key, num, sizeof num))
                enc_fail(e, f, "has a key that cannot be encoded (NaN or inf)");
            put_string(e, num, strlen(num));
        } else {
            char what[80];
            snprintf(what, sizeof what, "has a key that cannot be encoded (%s)",
                     luaL_typename(L, key));
            enc_fail(e, f, what);
        }
        put(e, ":", 1);
        frame child = { f, key, 0 };
        enc_value(e, key + 1, &child, depth + 1);
        lua_pop(L, 1);
    }
    put(e, "}", 1);
}

static void enc_table(enc *e, int idx, const frame *f, int depth)
{
    lua_State *L = e->L;
    if (depth > ENCODE_MAX_DEPTH) {
        char what[80];
        snprintf(what, sizeof what, "is nested too deeply (more than %d levels)",
                 ENCODE_MAX_DEPTH);
        enc_fail(e, f, what);
    }
    luaL_checkstack(L, 8, "llmretry: value nested too deeply");
    lua_pushvalue(L, idx);
    lua_rawget(L, e->seen);
    int cycle = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (cycle)
        enc_fail(e, f, "contains a cycle (a table that holds itself)");
    lua_pushvalue(L, idx);
    lua_pushboolean(L, 1);
    lua_rawset(L, e->seen);

    size_t n;
    if (table_is_array(e, idx, &n))
        enc_array(e, idx, f, depth, n);
    else
        enc_object(e, idx, f, depth);

    lua_pushvalue(L, idx);
    lua_pushnil(L);
    lua_rawset(L, e->seen);
}

static void enc_value(enc *e, int idx, const frame *f, int depth)
{
    lua_State *L = e->L;
    char num[64];
    switch (lua_type(L, idx)) {
    case LUA_TNIL:
        put_lit(e, "null");
        break;
    case LUA_TBOOLEAN:
        put_lit(e, lua_toboolean(L, idx) ? "true" : "false");
        break;
    case LUA_TNUMBER:
        if (!format_number(L, idx, num, sizeof num))
            enc_fail(e, f, "cannot be encoded (NaN or inf)");
        put_lit(e, num);
        break;
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        check_utf8(e, f, s, n, "is not valid UTF-8");
        put_string(e, s, n);
        break;
    }
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) == NULL)
            put_lit(e, "null");
        else if (lua_touserdata(L, idx) == EMPTY_ARRAY)
            put_lit(e, "[]");
        else
            enc_fail(e, f, "cannot be encoded (light userdata)");
        break;
    case LUA_TTABLE:
        enc_table(e, idx, f, depth);
        break;
    default: {
        char what[64];
        snprintf(what, sizeof what, "cannot be encoded (%s)", luaL_typename(L, idx));
        enc_fail(e, f, what);
    }
    }
}

/* Push the JSON text of the value at idx; errors name paths from `root`. */
static void push_encoded(lua_State *L, int idx, const char *root)
{
    idx = lr_absindex(L, idx);
    int base = lua_gettop(L);
    luaL_checkstack(L, 10, "llmretry: out of stack space");
    luaL_getmetatable(L, ARRAY_MT);
    lua_newtable(L);
    sbuf *b = lua_newuserdata(L, sizeof *b);
    memset(b, 0, sizeof *b);
    luaL_getmetatable(L, SBUF_MT);
    lua_setmetatable(L, -2);
    enc e = { L, b, base + 2, base + 1, root };
    frame top = { NULL, 0, 0 };
    enc_value(&e, idx, &top, 1);
    lua_pushlstring(L, b->data ? b->data : "", b->len);
    free(b->data);
    b->data = NULL;
    lua_replace(L, base + 1);
    lua_settop(L, base + 1);
}

/* ---- JSON: decoding ------------------------------------------------------ */

typedef struct jtree {
    cJSON *root;
} jtree;

static int jtree_gc(lua_State *L)
{
    jtree *t = lua_touserdata(L, 1);
    cJSON_Delete(t->root);
    t->root = NULL;
    return 0;
}

static void push_json_number(lua_State *L, double d)
{
#if LR_HAVE_INTEGERS
    /* Integral values up to 2^53 are exact in the double cJSON parsed. */
    if (d == floor(d) && fabs(d) <= 9007199254740992.0) {
        lua_pushinteger(L, (lua_Integer)d);
        return;
    }
#endif
    lua_pushnumber(L, (lua_Number)d);
}

/* The JSON text being decoded, for strings cJSON cannot hand over whole:
 * its strings are NUL-terminated, so a "\u0000" escape would cut one. The
 * string tokens of the text come in the order push_json meets the tree's
 * strings (keys before their values, depth first), so each string is
 * decoded again from the next token, with its length. NULL cursor: the
 * text has no "\u0000", cJSON's strings are whole. */
typedef struct jtext {
    const char *p, *end;
} jtext;

static unsigned hex4(const char *s)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Push the next string token of the text, decoded with its length. The
 * text parsed already, so every token and escape in it is well formed. */
static void push_next_string(lua_State *L, jtext *t)
{
    const char *q = memchr(t->p, '"', (size_t)(t->end - t->p));
    const char *s = q ? q + 1 : t->end;
    size_t cap = (size_t)(t->end - s) + 1;
    char *out = lua_newuserdata(L, cap); /* collected if anything raises */
    size_t n = 0;
    while (s < t->end && *s != '"') {
        if (*s != '\\') {
            out[n++] = *s++;
            continue;
        }
        char e = s[1];
        s += 2;
        switch (e) {
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            unsigned cp = hex4(s);
            s += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && s + 6 <= t->end && s[0] == '\\' && s[1] == 'u') {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(s + 2) - 0xDC00);
                s += 6;
            }
            n += put_utf8(out + n, cp);
            break;
        }
        default: out[n++] = e; break; /* " \ / */
        }
    }
    t->p = s < t->end ? s + 1 : t->end;
    push_text(L, out, n);
    lua_remove(L, -2);
}

static int has_nul_escape(const char *s, size_t n)
{
    for (size_t i = 0; i + 6 <= n; i++)
        if (s[i] == '\\' && memcmp(s + i + 1, "u0000", 5) == 0)
            return 1;
    return 0;
}

/* cJSON caps nesting (CJSON_NESTING_LIMIT), which bounds this recursion.
 * Known limit, cJSON's: numbers are doubles (integers beyond 2^53 lose
 * precision). Invalid UTF-8 in a string becomes U+FFFD (push_text). */
static void push_json(lua_State *L, const cJSON *v, int array_mt, jtext *t)
{
    luaL_checkstack(L, 4, "llmretry: JSON nested too deeply");
    if (cJSON_IsFalse(v) || cJSON_IsTrue(v)) {
        lua_pushboolean(L, cJSON_IsTrue(v));
    } else if (cJSON_IsNumber(v)) {
        push_json_number(L, v->valuedouble);
    } else if (cJSON_IsString(v)) {
        if (t)
            push_next_string(L, t);
        else
            push_text0(L, v->valuestring);
    } else if (cJSON_IsArray(v)) {
        lua_createtable(L, cJSON_GetArraySize(v), 0);
        int i = 0;
        for (const cJSON *el = v->child; el; el = el->next) {
            push_json(L, el, array_mt, t);
            lua_rawseti(L, -2, ++i);
        }
        lua_pushvalue(L, array_mt);
        lua_setmetatable(L, -2);
    } else if (cJSON_IsObject(v)) {
        lua_createtable(L, 0, cJSON_GetArraySize(v));
        for (const cJSON *el = v->child; el; el = el->next) {
            if (t)
                push_next_string(L, t);
            else
                push_text0(L, el->string);
            push_json(L, el, array_mt, t);
            lua_rawset(L, -3);
        }
    } else {
        push_null(L);
    }
}

static int is_json_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Push the value of JSON text s[0..n), or return 0 with a message in err
 * (pushing nothing). The whole text must be one value. */
static int push_decoded(lua_State *L, const char *s, size_t n, char *err, size_t errlen)
{
    size_t b = 0;
    while (b < n && is_json_ws(s[b]))
        b++;
    if (b == n) {
        snprintf(err, errlen, "invalid JSON: the text is empty");
        return 0;
    }
    int base = lua_gettop(L);
    luaL_checkstack(L, 6, "llmretry: out of stack space");
    luaL_getmetatable(L, ARRAY_MT);
    jtree *t = lua_newuserdata(L, sizeof *t);
    t->root = NULL;
    luaL_getmetatable(L, JTREE_MT);
    lua_setmetatable(L, -2);
    const char *end = NULL;
    t->root = cJSON_ParseWithLengthOpts(s + b, n - b, &end, 0);
    size_t used = end ? (size_t)(end - s) : b;
    while (t->root && used < n && is_json_ws(s[used]))
        used++;
    if (!t->root || used != n) {
        snprintf(err, errlen, "invalid JSON: %s at byte %zu",
                 t->root ? "unexpected text after the value" : "parse error", used);
        cJSON_Delete(t->root);
        t->root = NULL;
        lua_settop(L, base);
        return 0;
    }
    /* Strings are decoded again from the text only when one may hold a
     * NUL (a stray "\\u0000" preceded by an escaped backslash costs only
     * the slow path). */
    jtext text = { s + b, s + n };
    push_json(L, t->root, base + 1, has_nul_escape(s + b, n - b) ? &text : NULL);
    cJSON_Delete(t->root);
    t->root = NULL;
    lua_replace(L, base + 1);
    lua_settop(L, base + 1);
    return 1;
}

static const char *check_text(lua_State *L, int idx, const char *name, size_t *n)
{
    char buf[64];
    if (lua_type(L, idx) != LUA_TSTRING)
        lr_fail(L, "%s must be a string (got %s)", name, got(L, idx, buf, sizeof buf));
    return lua_tolstring(L, idx, n);
}

static int l_encode(lua_State *L)
{
    if (lua_gettop(L) < 1)
        return lr_fail(L, "encode needs a value (got no value)");
    lua_settop(L, 1);
    push_encoded(L, 1, "value");
    return 1;
}

static int l_decode(lua_State *L)
{
    size_t n;
    const char *s = check_text(L, 1, "text", &n);
    char err[160];
    if (push_decoded(L, s, n, err, sizeof err))
        return 1;
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
}

static int l_extract_json(lua_State *L)
{
    size_t n, start, len;
    const char *s = check_text(L, 1, "text", &n);
    char err[LLMRETRY_ERRBUF];
    if (llmretry_extract_json(s, n, &start, &len, err, sizeof err) == LLMRETRY_OK &&
        push_decoded(L, s + start, len, err, sizeof err))
        return 1;
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
}

/* A mismatch is raised like assert() does: the core's message alone, no
 * position (it is about the data, not about the calling line). */
static int l_assert_shape(lua_State *L)
{
    char buf[64];
    if (lua_gettop(L) < 2)
        return lr_fail(L, "shape must be given (got no value)");
    const char *path = NULL;
    if (!lua_isnoneornil(L, 3)) {
        if (lua_type(L, 3) != LUA_TSTRING)
            return lr_fail(L, "path must be a string (got %s)", got(L, 3, buf, sizeof buf));
        path = lua_tostring(L, 3);
    }
    lua_settop(L, 3);
    push_encoded(L, 1, "value");
    push_encoded(L, 2, "shape");
    size_t vl, sl;
    const char *v = lua_tolstring(L, 4, &vl);
    const char *sh = lua_tolstring(L, 5, &sl);
    char err[LLMRETRY_ERRBUF];
    if (llmretry_assert_shape(v, vl, sh, sl, path, err, sizeof err) != LLMRETRY_OK) {
        lua_pushstring(L, err);
        return lua_error(L);
    }
    lua_settop(L, 1);
    return 1;
}

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
static int err_tostring(lua_State *L)
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

static void set_int(lua_State *L, const char *key, int64_t v)
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
    set_int(L, "prompt_tokens", u->prompt_tokens);
    set_int(L, "completion_tokens", u->completion_tokens);
    set_int(L, "total_tokens", u->total_tokens);
    return 1;
}

/* The event as a table, walking the field list the core defines (so every
 * field of DESIGN §3 is there, null ones as core.null). */
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

static void push_meta(lua_State *L, const llmretry_result *r)
{
    lua_createtable(L, 0, 10);
    set_int(L, "attempt", r->attempt);
    set_int(L, "attempts", r->attempts);
    set_int(L, "duration_ms", r->duration_ms);
    set_int(L, "total_ms", r->total_ms);
    set_int(L, "status", r->status);
    if (push_usage(L, &r->usage))
        lua_setfield(L, -2, "usage");
    set_str(L, "request_id", r->request_id);
    set_str(L, "model", r->model);
    set_str(L, "response_model", r->response_model);
    set_str(L, "system_fingerprint", r->system_fingerprint);
}

/* The err table of DESIGN §4 (absent values are nil). `message` and
 * `kind` override the result's own (for a body that would not decode). */
static void push_err(lua_State *L, const llmretry_result *r, const char *kind,
                     const char *message)
{
    lua_createtable(L, 0, 13);
    set_str(L, "kind", kind ? kind : llmretry_error_kind_name(r->kind));
    set_str(L, "message", message ? message : r->message);
    if (r->status > 0)
        set_int(L, "status", r->status);
    set_int(L, "attempt", r->attempt);
    set_int(L, "attempts", r->attempts);
    set_str(L, "request_id", r->request_id);
    if (r->retry_after_ms >= 0 && !r->ok)
        set_int(L, "retry_after_ms", r->retry_after_ms);
    if (!r->ok) {
        set_str(L, "error_code", r->error_code);
        set_str(L, "body_preview", r->body_preview);
        set_str(L, "reason", llmretry_reason_name(r->reason));
    }
    set_str(L, "model", r->model);
    set_int(L, "duration_ms", r->duration_ms);
    set_int(L, "total_ms", r->total_ms);
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

typedef struct lr_handle {
    llmretry_call *call;        /* NULL only while submit is failing */
    /* An event taken from the mailbox but not yet handed to Lua: if
     * building its table raises, the next call to next() retries it and
     * __gc frees it. Same idea for a validation request. */
    llmretry_event *parked;
    int validate_parked;
} lr_handle;

static lr_handle *check_handle(lua_State *L)
{
    char buf[64];
    lr_handle *h = lr_testudata(L, 1, HANDLE_MT);
    if (!h || !h->call)
        lr_fail(L, "self must be a call handle (got %s); call methods with ':'",
                got(L, 1, buf, sizeof buf));
    return h;
}

static int handle_gc(lua_State *L)
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

static int handle_next(lua_State *L)
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
static int64_t check_timeout(lua_State *L, int idx)
{
    int64_t t = check_int64(L, idx, "timeout_ms");
    return t < 0 ? -1 : t;
}

static int handle_wait(lua_State *L)
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

static int handle_validated(lua_State *L)
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
static int handle_result(lua_State *L)
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

static int handle_cancel(lua_State *L)
{
    llmretry_call_cancel(check_handle(L)->call);
    return 0;
}

static int handle_request_id(lua_State *L)
{
    lua_pushstring(L, llmretry_call_request_id(check_handle(L)->call));
    return 1;
}

static int handle_done(lua_State *L)
{
    lua_pushboolean(L, llmretry_call_result(check_handle(L)->call) != NULL);
    return 1;
}

static int handle_tostring(lua_State *L)
{
    lr_handle *h = lr_testudata(L, 1, HANDLE_MT);
    if (h && h->call)
        lua_pushfstring(L, "llmretry.handle: %s", llmretry_call_request_id(h->call));
    else
        lua_pushliteral(L, "llmretry.handle: (none)");
    return 1;
}

/* ---- groups: the calls of one batch, paced together on the engine thread ---- */

typedef struct lr_group {
    llmretry_group *g;
} lr_group;

static lr_group *check_group(lua_State *L)
{
    char buf[64];
    lr_group *gr = lr_testudata(L, 1, GROUP_MT);
    if (!gr)
        lr_fail(L, "self must be a group (got %s); call methods with ':'",
                got(L, 1, buf, sizeof buf));
    return gr;
}

/* Calls in the group keep the C group alive; dropping ours is always safe. */
static int group_close(lua_State *L)
{
    lr_group *gr = lua_touserdata(L, 1);
    if (gr) {
        llmretry_group_free(gr->g);
        gr->g = NULL;
    }
    return 0;
}

static int group_fd(lua_State *L)
{
    lr_group *gr = check_group(L);
    if (!gr->g)
        lr_fail(L, "group is closed");
    lua_pushinteger(L, llmretry_group_fd(gr->g));
    return 1;
}

static int group_wait(lua_State *L)
{
    lr_group *gr = check_group(L);
    int64_t t = check_timeout(L, 2);
    lua_pushboolean(L, gr->g && llmretry_group_wait(gr->g, t) == LLMRETRY_OK);
    return 1;
}

static int group_stats(lua_State *L)
{
    lr_group *gr = check_group(L);
    llmretry_group_stats st;
    memset(&st, 0, sizeof st);
    if (gr->g)
        llmretry_group_stats_get(gr->g, &st);
    lua_createtable(L, 0, 5);
    set_int(L, "window", st.window);
    set_int(L, "active", st.active);
    set_int(L, "queued", st.queued);
    set_int(L, "pauses", st.pauses);
    set_int(L, "halvings", st.halvings);
    return 1;
}

static int group_tostring(lua_State *L)
{
    lr_group *gr = lr_testudata(L, 1, GROUP_MT);
    lua_pushfstring(L, "llmretry.group: %p%s", (void *)gr, gr && gr->g ? "" : " (closed)");
    return 1;
}

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
static void parse_opts(lua_State *L, int t, llmretry_options *o, int need_body)
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
static void rename_header_error(const llmretry_options *o, char *err, size_t errlen)
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

/* ---- engines --------------------------------------------------------------- */

typedef struct lr_engine {
    llmretry_engine *e;         /* NULL once closed */
} lr_engine;

static lr_engine *check_engine(lua_State *L)
{
    char buf[64];
    lr_engine *eng = lr_testudata(L, 1, ENGINE_MT);
    if (!eng)
        lr_fail(L, "self must be an engine (got %s); call methods with ':'",
                got(L, 1, buf, sizeof buf));
    return eng;
}

static llmretry_engine *check_open_engine(lua_State *L)
{
    lr_engine *eng = check_engine(L);
    if (!eng->e)
        lr_fail(L, "engine is closed");
    return eng->e;
}

/* Cancels the calls in flight and joins the I/O thread; handles stay
 * valid (their calls read as cancelled). */
static int engine_close(lua_State *L)
{
    lr_engine *eng = check_engine(L);
    llmretry_engine *e = eng->e;
    eng->e = NULL;
    llmretry_engine_free(e);
    return 0;
}

static int engine_gc(lua_State *L)
{
    lr_engine *eng = lua_touserdata(L, 1);
    llmretry_engine *e = eng->e;
    eng->e = NULL;
    llmretry_engine_free(e);
    return 0;
}

/* core.check_options(opts): raise as engine:submit would on these options,
 * submitting nothing (the body may be left out). For options checked
 * before any call is made: a client's defaults, a call_many batch's. */
static int l_check_options(lua_State *L)
{
    llmretry_options o;
    parse_opts(L, 1, &o, 0);
    char err[LLMRETRY_ERRBUF] = "";
    if (llmretry_options_check(&o, err, sizeof err) != LLMRETRY_OK) {
        rename_header_error(&o, err, sizeof err);
        return lr_fail(L, "%s", err);
    }
    return 0;
}

static int engine_submit(lua_State *L)
{
    llmretry_engine *e = check_open_engine(L);
    llmretry_options o;
    parse_opts(L, 2, &o, 1);

    /* The handle exists before the call does, so no error raised from here
     * on can leak the call. */
    lr_handle *h = lr_newuserdata(L, sizeof *h);
    memset(h, 0, sizeof *h);
    int hidx = lua_gettop(L);
    luaL_getmetatable(L, HANDLE_MT);
    lua_setmetatable(L, hidx);
    lua_newtable(L);                    /* the cached result */
    lr_setuservalue(L, hidx);

    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = llmretry_engine_submit(e, &o, LLMRETRY_SUBMIT_POLL, &h->call, err,
                                                sizeof err);
    if (st != LLMRETRY_OK) {
        h->call = NULL;
        if (st == LLMRETRY_EINVAL)
            rename_header_error(&o, err, sizeof err);
        return lr_fail(L, "%s", err[0] ? err : llmretry_status_name(st));
    }
    /* engine:poll (group:poll for a group's calls) finds the handle of a
     * call through this weak table. */
    if (o.group) {
        lua_getfield(L, 2, "group");
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
static int engine_forked(lua_State *L)
{
    lr_engine *eng = check_engine(L);
    lua_pushboolean(L, eng->e && llmretry_engine_forked(eng->e));
    return 1;
}

static int engine_fd(lua_State *L)
{
    lua_pushinteger(L, llmretry_engine_fd(check_open_engine(L)));
    return 1;
}

typedef size_t (*poll_fn)(void *src, llmretry_call **calls, size_t max);

static size_t poll_engine(void *src, llmretry_call **calls, size_t max)
{
    return llmretry_engine_poll(src, calls, max);
}

static size_t poll_group(void *src, llmretry_call **calls, size_t max)
{
    return llmretry_group_poll(src, calls, max);
}

/* The handles with news from `src`, through the weak call->handle table in
 * the uservalue of the userdata at index 1. Leaves the array on top. */
static int push_polled(lua_State *L, void *src, poll_fn fetch)
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

static int engine_poll(lua_State *L)
{
    return push_polled(L, check_engine(L)->e, poll_engine);
}

static int group_poll(lua_State *L)
{
    return push_polled(L, check_group(L)->g, poll_group);
}

/* engine:group{limit=, deadline_ms=, adaptive=} -> group (DESIGN §2 batches) */
static int engine_group(lua_State *L)
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
            if (strcmp(k, "limit") && strcmp(k, "deadline_ms") && strcmp(k, "adaptive"))
                lr_fail(L, "unknown group option '%.40s' (limit, deadline_ms, adaptive)", k);
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
    }
    lr_group *gr = lr_newuserdata(L, sizeof *gr);
    gr->g = NULL;
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

static int engine_wait(lua_State *L)
{
    lr_engine *eng = check_engine(L);
    int64_t t = check_timeout(L, 2);
    lua_pushboolean(L, eng->e && llmretry_engine_wait(eng->e, t) == LLMRETRY_OK);
    return 1;
}

static int engine_tostring(lua_State *L)
{
    lr_engine *eng = lr_testudata(L, 1, ENGINE_MT);
    lua_pushfstring(L, "llmretry.engine: %p%s", (void *)eng,
                    eng && eng->e ? "" : " (closed)");
    return 1;
}

static int l_new_engine(lua_State *L)
{
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    if (!lua_isnoneornil(L, 1))
        eo.max_in_flight = check_int(L, 1, "max_in_flight", 1, INT_MAX);
    if (!lua_isnoneornil(L, 2))
        eo.max_host_connections = check_int(L, 2, "max_host_connections", 0, INT_MAX);

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

/* ---- named policies: the core checks them (core/src/policies.c) ---------- */

/* core.parse_policies(json_text[, source]) -> names, settings (name -> the
 * JSON text of the keys it sets), or nil, message: the core's words, so Lua
 * and Python refuse a policy file alike (llmretry/policies.lua raises). */
static int l_parse_policies(lua_State *L)
{
    size_t len;
    const char *text = luaL_checklstring(L, 1, &len);
    const char *source = luaL_optstring(L, 2, NULL);
    char err[1024] = "";           /* a file's path, the policy, the known keys */
    llmretry_policies *p = NULL;
    llmretry_status st = llmretry_policies_parse(text, len, source, &p, err, sizeof err);
    if (st != LLMRETRY_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err[0] ? err : llmretry_status_name(st));
        return 2;
    }
    size_t n = llmretry_policies_count(p);
    lua_createtable(L, (int)n, 0);
    lua_createtable(L, 0, (int)n);
    for (size_t i = 0; i < n; i++) {
        const char *name = llmretry_policies_name(p, i);
        char *json = llmretry_policies_get_json(p, name);
        if (!json) {
            llmretry_policies_free(p);
            return lr_fail(L, "out of memory reading policies");
        }
        lua_pushstring(L, name);
        lua_rawseti(L, -3, (int)i + 1);
        lua_pushstring(L, json);
        lua_setfield(L, -2, name);
        llmretry_free(json);
    }
    llmretry_policies_free(p);
    return 2;
}

/* core.resolve_policy(settings_json|nil, explicit_json|nil, defaults_json|nil)
 * -> the JSON text of every policy key (explicit > policy > defaults >
 * built-in), or nil, message. */
static int l_resolve_policy(lua_State *L)
{
    size_t plen = 0, elen = 0, dlen = 0;
    const char *pol = luaL_optlstring(L, 1, NULL, &plen);
    const char *ex = luaL_optlstring(L, 2, NULL, &elen);
    const char *def = luaL_optlstring(L, 3, NULL, &dlen);
    char err[1024] = "", *out = NULL;
    llmretry_policies *p = NULL;
    llmretry_status st = LLMRETRY_OK;
    if (pol) {
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        luaL_addstring(&b, "{\"p\":");
        luaL_addlstring(&b, pol, plen);
        luaL_addstring(&b, "}");
        luaL_pushresult(&b);
        size_t len;
        const char *doc = lua_tolstring(L, -1, &len);
        st = llmretry_policies_parse(doc, len, NULL, &p, err, sizeof err);
        lua_pop(L, 1);
    }
    if (st == LLMRETRY_OK)
        st = llmretry_policies_resolve(p, pol ? "p" : NULL, ex, elen, def, dlen, &out, err,
                                       sizeof err);
    llmretry_policies_free(p);
    if (st != LLMRETRY_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err[0] ? err : llmretry_status_name(st));
        return 2;
    }
    lua_pushstring(L, out);
    llmretry_free(out);
    return 1;
}

/* core.uuid4() -> a fresh UUID v4 from the system's CSPRNG (the core's). */
static int l_uuid4(lua_State *L)
{
    char id[37];
    if (llmretry_uuid4(id) != LLMRETRY_OK)
        return lr_fail(L, "could not read the system's random source");
    lua_pushstring(L, id);
    return 1;
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
    { "fd", group_fd },
    { "poll", group_poll },
    { "wait", group_wait },
    { "stats", group_stats },
    { "close", group_close },
    { NULL, NULL },
};

static const luaL_Reg engine_methods[] = {
    { "submit", engine_submit },
    { "group", engine_group },
    { "fd", engine_fd },
    { "forked", engine_forked },
    { "poll", engine_poll },
    { "wait", engine_wait },
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
    { "parse_policies", l_parse_policies },
    { "uuid4", l_uuid4 },
    { "resolve_policy", l_resolve_policy },
    { NULL, NULL },
};

/* luaL_newmetatable that also sets __name on 5.1 (5.3+ does it itself),
 * leaving the metatable on the stack. */
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
    new_class(L, HANDLE_MT, handle_methods, handle_gc, handle_tostring);
    lua_pop(L, 1);
    new_class(L, GROUP_MT, group_methods, group_close, group_tostring);
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
    lua_pop(L, 1);
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
    lua_createtable(L, 6, 0);
    for (int t = 0; t < 6; t++) {
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
