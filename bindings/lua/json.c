/* JSON text to Lua in lua-cjson's conventions (core.decode: core.null, the
 * array marker, strings whole across a \u0000 escape), the JSON helpers
 * (extract_json, assert_shape), and the UTF-8 checks encode.c shares. */
#include "lcore.h"

#include <cjson/cJSON.h>

#include "json_pull.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
size_t utf8_invalid_at(const char *s, size_t n)
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

void push_text0(lua_State *L, const char *s)
{
    push_text(L, s, strlen(s));
}

/* ---- JSON: decoding ------------------------------------------------------ */

typedef struct jtree {
    cJSON *root;
} jtree;

int jtree_gc(lua_State *L)
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

/* ---- the fast path: the core's pull reader, no tree -------------------------
 * Most text decoded here is an answer the core has checked already: read
 * with the core's strict reader (core/src/json_pull.h) straight into Lua
 * values, there is no cJSON tree to allocate node by node and free. It
 * takes strict JSON only (valid UTF-8, escapes paired, no raw controls):
 * anything it refuses goes to cJSON below, which then decodes it or says
 * why not in its own words, so the values and messages are the same as
 * before. Numbers are the same doubles (strtod's, as cJSON's); a repeated
 * key keeps its last value, as rawset in order did. */
static int pull_string(lua_State *L, const lr_jp_str *s)
{
    if (!s->escaped) {
        lua_pushlstring(L, s->raw, s->len);
        return 0;
    }
    char small[256];
    char *out = small;
    if (s->len > sizeof small)
        out = lua_newuserdata(L, s->len);   /* collected if anything raises */
    size_t n = lr_jp_unescape(s, out);
    lua_pushlstring(L, out, n);
    if (out != small)
        lua_remove(L, -2);
    return 0;
}

/* Push the value at j->p (blanks skipped): 0, or -1 (the stack as it was,
 * give or take what the caller drops) where the reader refuses the text. */
static int pull_value(lua_State *L, lr_jp *j, int array_mt)
{
    char c = lr_jp_peek(j);
    lr_jp_str str;
    if (c == '"') {
        if (lr_jp_string(j, &str) != 0)
            return -1;
        return pull_string(L, &str);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        double d;
        if (lr_jp_number(j, &d) != 0)
            return -1;
        push_json_number(L, d);
        return 0;
    }
    if (c == '[' || c == '{') {
        /* The outermost object (a chat.completion: id, object, created,
         * model, choices, usage, system_fingerprint...) sized for 8 keys:
         * from 4 it was resized once for every answer. */
        int top_object = c == '{' && j->depth == 0;
        if (lr_jp_enter(j) != 0)
            return -1;
        /* The table, a key and a value: a scalar pushes one value into
         * the room its container (or push_decoded) made. */
        luaL_checkstack(L, 4, "llmretry: JSON nested too deeply");
        lua_createtable(L, c == '[' ? 4 : 0, c == '{' ? (top_object ? 8 : 4) : 0);
        char close = c == '[' ? ']' : '}';
        lr_jp_ws(j);
        int i = 0;
        if (lr_jp_peek(j) != close) {
            for (;;) {
                if (close == '}') {
                    if (lr_jp_member_key(j, &str) != 0)
                        return -1;
                    pull_string(L, &str);
                    if (pull_value(L, j, array_mt) != 0)
                        return -1;
                    lua_rawset(L, -3);
                } else {
                    if (pull_value(L, j, array_mt) != 0)
                        return -1;
                    lua_rawseti(L, -2, ++i);
                }
                lr_jp_ws(j);
                c = lr_jp_peek(j);
                if (c == close)
                    break;
                if (c != ',')
                    return -1;
                j->p++;
                lr_jp_ws(j);
            }
        }
        lr_jp_leave(j);
        if (close == ']') {
            lua_pushvalue(L, array_mt);
            lua_setmetatable(L, -2);
        }
        return 0;
    }
    int what;
    if (lr_jp_literal(j, &what) != 0)
        return -1;
    if (what == 2)
        push_null(L);
    else
        lua_pushboolean(L, what);
    return 0;
}

static int is_json_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Push the value of JSON text s[0..n), or return 0 with a message in err
 * (pushing nothing). The whole text must be one value. */
int push_decoded(lua_State *L, const char *s, size_t n, char *err, size_t errlen)
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
    lr_push_array_mt(L);
    lr_jp j;
    lr_jp_init(&j, s + b, n - b);
    if (pull_value(L, &j, base + 1) == 0) {
        lr_jp_ws(&j);
        if (j.p == j.end) {
            lua_replace(L, base + 1);
            lua_settop(L, base + 1);
            return 1;
        }
    }
    lua_settop(L, base + 1);                /* refused: cJSON's turn */
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


int l_decode(lua_State *L)
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

int l_extract_json(lua_State *L)
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
int l_assert_shape(lua_State *L)
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
