/* core.encode: a Lua value as JSON text in lua-cjson's conventions
 * (core.null, the array marker, empty arrays), with errors that name the
 * path of the value that cannot be encoded. */
#include "lcore.h"
#include "json_escape.h"

#include <cjson/cJSON.h>

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- JSON: encoding ------------------------------------------------------ */

/* The output buffer, owned by a userdata so that an error raised halfway
 * (a function in the value, out of memory) leaks nothing. */
typedef struct sbuf {
    char *data;
    size_t len, cap;
} sbuf;

int sbuf_gc(lua_State *L)
{
    sbuf *b = lua_touserdata(L, 1);
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    return 0;
}

/* One step of the path from the root to the value being encoded, kept on
 * the C stack and spelled out only when an error names it. */
typedef struct frame {
    const struct frame *up;  /* NULL: the root */
    int key;                 /* stack index of an object key; 0 = array index */
    long long index;         /* 1-based, as Lua code wrote it */
} frame;

/* A table being encoded, and the one it is in: the chain from the root,
 * on the C stack. A table already on it holds itself (a cycle); a table
 * met twice elsewhere is only shared, and encoded twice. A Lua table of
 * the open ones cost an allocation or three per encode. */
typedef struct open_table {
    const void *table;
    const struct open_table *up;
} open_table;

typedef struct enc {
    lua_State *L;
    sbuf *b;
    const open_table *open;  /* the innermost table being encoded */
    int array_mt;            /* stack index of core.array_mt */
    const char *root;        /* "value", "body", "shape" */
} enc;

/* Room for n more bytes at the end of the buffer: it doubles until they fit. */
static char *reserve(enc *e, size_t n)
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
    return b->data + b->len;
}

static void put(enc *e, const char *s, size_t n)
{
    memcpy(reserve(e, n), s, n);
    e->b->len += n;
}

/* One byte: the punctuation, most of what is written by count. */
static void put_char(enc *e, char c)
{
    sbuf *b = e->b;
    if (b->len == b->cap)
        reserve(e, 1);
    b->data[b->len++] = c;
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

/* s as a JSON string, written straight into the buffer: room for it and
 * its quotes is made once, and again only where an escape needs more (a
 * put per run of plain bytes and per quote was most of an encoding's
 * instructions for a chat request's short strings: issue 36). */
static void put_string(enc *e, const char *s, size_t n)
{
    sbuf *b = e->b;
    if (n > SIZE_MAX - 8)
        lr_fail(e->L, "out of memory while encoding JSON");
    char *o = reserve(e, n + 2);
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80 || !lr_json_needs_escape(c)) {
            *o++ = (char)c;
            continue;
        }
        /* Up to six bytes for this one, then the rest and the quote. */
        b->len = (size_t)(o - b->data);
        o = lr_json_escape(reserve(e, 6 + (n - i - 1) + 1), c);
    }
    *o++ = '"';
    b->len = (size_t)(o - b->data);
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
    put_char(e, '[');
    for (size_t i = 1; i <= n; i++) {
        if (i > 1)
            put_char(e, ',');
        lua_rawgeti(L, idx, (int)i);
        frame child = { f, 0, (long long)i };
        enc_value(e, lua_gettop(L), &child, depth + 1);
        lua_pop(L, 1);
    }
    put_char(e, ']');
}

static void enc_object(enc *e, int idx, const frame *f, int depth)
{
    lua_State *L = e->L;
    int first = 1, strings = 0, numbers = 0;
    put_char(e, '{');
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        int key = lua_gettop(L) - 1;
        if (!first)
            put_char(e, ',');
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
        put_char(e, ':');
        frame child = { f, key, 0 };
        enc_value(e, key + 1, &child, depth + 1);
        lua_pop(L, 1);
    }
    put_char(e, '}');
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
    const void *self = lua_topointer(L, idx);
    for (const open_table *o = e->open; o; o = o->up)
        if (o->table == self)
            enc_fail(e, f, "contains a cycle (a table that holds itself)");
    open_table me = { self, e->open };
    e->open = &me;

    size_t n;
    if (table_is_array(e, idx, &n))
        enc_array(e, idx, f, depth, n);
    else
        enc_object(e, idx, f, depth);
    e->open = me.up;
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

/* One output buffer per Lua state, kept in the registry and reused: a
 * buffer userdata (with a finalizer) per encoding was garbage on every
 * call, and the GC's work on it showed in a gateway's profile (issue 36).
 * Nothing in enc_value runs Lua code, so no other encoding can start while
 * one uses it; an error halfway leaves bytes that the next one drops. */
static char sbuf_key;
#define SBUF_KEEP (64 * 1024)       /* a bigger one is freed after use */

static sbuf *shared_sbuf(lua_State *L)
{
    lua_pushlightuserdata(L, &sbuf_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    sbuf *b = lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (!b) {
        b = lua_newuserdata(L, sizeof *b);
        memset(b, 0, sizeof *b);
        luaL_getmetatable(L, SBUF_MT);
        lua_setmetatable(L, -2);
        lua_pushlightuserdata(L, &sbuf_key);
        lua_insert(L, -2);
        lua_rawset(L, LUA_REGISTRYINDEX);
    }
    b->len = 0;
    return b;
}

/* Push the JSON text of the value at idx; errors name paths from `root`. */
void push_encoded(lua_State *L, int idx, const char *root)
{
    idx = lr_absindex(L, idx);
    int base = lua_gettop(L);
    luaL_checkstack(L, 10, "llmretry: out of stack space");
    lr_push_array_mt(L);
    sbuf *b = shared_sbuf(L);
    enc e = { L, b, NULL, base + 1, root };
    frame top = { NULL, 0, 0 };
    enc_value(&e, idx, &top, 1);
    lua_pushlstring(L, b->data ? b->data : "", b->len);
    b->len = 0;
    if (b->cap > SBUF_KEEP) {
        free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
    lua_replace(L, base + 1);
    lua_settop(L, base + 1);
}

int l_encode(lua_State *L)
{
    if (lua_gettop(L) < 1)
        return lr_fail(L, "encode needs a value (got no value)");
    lua_settop(L, 1);
    push_encoded(L, 1, "value");
    return 1;
}
