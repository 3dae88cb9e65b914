/*
 * json.c — the JSON helpers shared by the bindings: finding the JSON value
 * in a model's reply (llmretry_extract_json) and checking a response
 * against a shape (llmretry_assert_shape), and whether a body's text opens
 * an object (llmretry_json_text_opens).
 *
 * Both take text with an explicit length (it need not be NUL-terminated)
 * and parse it with cJSON_ParseWithLengthOpts, checking ourselves that
 * nothing but whitespace follows the value. Error messages name paths and
 * type names only, never the values: responses may carry user data.
 */
#include "llmretry.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Deepest shape accepted. Shapes are written by programmers, so this only
 * catches mistakes; it also bounds the recursion of the checker, which
 * descends the data only as far as the shape does. */
#define SHAPE_MAX_DEPTH 64

/* Deepest object/array nesting looked for inside prose (step 3 of
 * extract_json; fenced and bare JSON may nest as deep as cJSON allows).
 * Trying every '{' and '[' costs O(cap * n) on adversarial text such as
 * half a megabyte of "[[[[x]]]]" blocks: about 0.5 s with 128, ten times
 * more with cJSON's own limit of 1000. Model output nests far less. */
#define SCAN_MAX_DEPTH 128

/* Room for a path like "root.items[12].name"; longer ones are cut (the
 * message is cut to errlen anyway). */
#define PATH_MAX_LEN 1024

/* ------------------------------------------------------------------ */
/* Messages                                                           */
/* ------------------------------------------------------------------ */

/* Drop an incomplete UTF-8 sequence at the end of `s`, so that cutting a
 * message short never hands a binding undecodable text. */
static void utf8_drop_partial_tail(char *s)
{
    size_t n = strlen(s), i = n, cont = 0;
    while (i > 0 && cont < 3 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) {
        i--;
        cont++;
    }
    if (i == 0)
        return;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    if (lead >= 0xC0 && cont < need)
        s[i - 1] = '\0';
}

/* Format into err (when given); vsnprintf cuts safely at errlen. */
static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    if (n < 0)
        err[0] = '\0';
    else if ((size_t)n >= errlen)
        utf8_drop_partial_tail(err);
}

/* ------------------------------------------------------------------ */
/* Parsing helpers                                                    */
/* ------------------------------------------------------------------ */

/* JSON's own whitespace (RFC 8259). */
static int is_json_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Whitespace trimmed off model text, like JavaScript's trim() on ASCII. */
static int is_text_ws(unsigned char c)
{
    return is_json_ws(c) || c == '\f' || c == '\v';
}

/* Can a JSON value start with c? cJSON silently skips control bytes and a
 * BOM before a value; we refuse them so that a returned span is exactly
 * JSON that any strict parser takes. */
static int is_value_start(unsigned char c)
{
    return c == '{' || c == '[' || c == '"' || c == '-' || (c >= '0' && c <= '9') ||
           c == 't' || c == 'f' || c == 'n';
}

/* Parse s[0, n) as exactly one JSON value with only JSON whitespace
 * around it. On failure returns NULL and sets *err_at to the byte offset
 * where parsing stopped. */
static cJSON *parse_exact(const char *s, size_t n, size_t *err_at)
{
    size_t b = 0;
    while (b < n && is_json_ws((unsigned char)s[b]))
        b++;
    if (b == n || !is_value_start((unsigned char)s[b])) {
        *err_at = b;
        return NULL;
    }
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s + b, n - b, &end, 0);
    size_t used = end ? (size_t)(end - s) : b;
    if (v == NULL) {
        *err_at = used;
        return NULL;
    }
    /* Not require_null_terminated: that wants a NUL inside the length,
     * and our text need not have one. Check the tail ourselves. */
    while (used < n && is_json_ws((unsigned char)s[used]))
        used++;
    if (used != n) {
        cJSON_Delete(v);
        *err_at = used;
        return NULL;
    }
    return v;
}

static int is_json(const char *s, size_t n, size_t *err_at)
{
    cJSON *v = parse_exact(s, n, err_at);
    cJSON_Delete(v);
    return v != NULL;
}

/* ------------------------------------------------------------------ */
/* llmretry_extract_json                                              */
/* ------------------------------------------------------------------ */

/* Offset of the next "```" at or after `from`, or n when there is none. */
static size_t find_fence(const char *s, size_t n, size_t from)
{
    for (size_t i = from; i + 3 <= n; i++)
        if (s[i] == '`' && s[i + 1] == '`' && s[i + 2] == '`')
            return i;
    return n;
}

/* Shrink [*b, *e) past surrounding whitespace. */
static void trim(const char *s, size_t *b, size_t *e)
{
    while (*b < *e && is_text_ws((unsigned char)s[*b]))
        (*b)++;
    while (*e > *b && is_text_ws((unsigned char)s[*e - 1]))
        (*e)--;
}

/* From the '{' or '[' at `p`, find the end of the bracketed span, skipping
 * brackets inside strings (and escaped quotes inside those). Bracket kinds
 * are not paired up here: cJSON rejects a mismatch afterwards. Returns 1
 * and sets *end (one past the closing bracket) when the span closes. */
static int match_brackets(const char *s, size_t n, size_t p, size_t *end)
{
    size_t depth = 0;
    int in_string = 0;
    for (size_t i = p; i < n; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\')
                i++; /* the escaped byte cannot end the string */
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > SCAN_MAX_DEPTH)
                return 0;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) {
                *end = i + 1;
                return 1;
            }
        }
    }
    return 0;
}

static int ieq(char a, char lower)
{
    return a == lower || a == lower - ('a' - 'A');
}

llmretry_status llmretry_extract_json(const char *text, size_t text_len,
                                      size_t *start, size_t *len,
                                      char *err, size_t errlen)
{
    if (start == NULL || len == NULL) {
        set_err(err, errlen, "start and len must not be NULL");
        return LLMRETRY_EINVAL;
    }
    if (text == NULL && text_len > 0) {
        set_err(err, errlen, "text is NULL but text_len is %zu", text_len);
        return LLMRETRY_EINVAL;
    }
    if (text == NULL)
        text = "";
    size_t b, e, at;

    /* 1. The first ``` fenced block (optionally tagged json, any case)
     * whose content is JSON. Fences pair up in order, like the seed's
     * regular expression; an unterminated one ends the search. */
    int have_bad_fence = 0, unterminated = 0;
    size_t bad_fence_at = 0, bad_fence_len = 0;
    size_t open = find_fence(text, text_len, 0);
    while (open < text_len) {
        size_t body = open + 3;
        if (body + 4 <= text_len && ieq(text[body], 'j') && ieq(text[body + 1], 's') &&
            ieq(text[body + 2], 'o') && ieq(text[body + 3], 'n'))
            body += 4;
        size_t close = find_fence(text, text_len, body);
        if (close == text_len) {
            unterminated = 1;
            break;
        }
        b = body;
        e = close;
        trim(text, &b, &e);
        if (is_json(text + b, e - b, &at)) {
            *start = b;
            *len = e - b;
            return LLMRETRY_OK;
        }
        if (!have_bad_fence) {
            have_bad_fence = 1;
            bad_fence_at = at;
            bad_fence_len = e - b;
        }
        open = find_fence(text, text_len, close + 3);
    }

    /* 2. The whole text, which may be a bare scalar such as 42. A UTF-8
     * BOM in front is not part of the JSON. */
    b = 0;
    e = text_len;
    if (text_len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        b = 3;
    trim(text, &b, &e);
    if (b < e && is_json(text + b, e - b, &at)) {
        *start = b;
        *len = e - b;
        return LLMRETRY_OK;
    }

    /* 3. The first object or array inside prose. A start whose span does
     * not parse may still contain one, so every '{' and '[' is tried. */
    for (size_t p = 0; p < text_len; p++) {
        size_t end;
        if (text[p] != '{' && text[p] != '[')
            continue;
        if (match_brackets(text, text_len, p, &end) && is_json(text + p, end - p, &at)) {
            *start = p;
            *len = end - p;
            return LLMRETRY_OK;
        }
    }

    if (have_bad_fence && bad_fence_len == 0)
        set_err(err, errlen, "fenced block is not valid JSON: the block is empty");
    else if (have_bad_fence)
        set_err(err, errlen, "fenced block is not valid JSON: parse error at byte %zu of %zu",
                bad_fence_at, bad_fence_len);
    else if (unterminated)
        set_err(err, errlen, "no JSON object or array found in the text (a ``` fence is unterminated)");
    else if (b == e) /* step 2 trimmed the whole text to nothing */
        set_err(err, errlen, "no JSON object or array found in the text (the text is empty)");
    else
        set_err(err, errlen, "no JSON object or array found in the text");
    return LLMRETRY_EINVAL;
}

/* ------------------------------------------------------------------ */
/* llmretry_assert_shape                                              */
/* ------------------------------------------------------------------ */

/* The path being checked, grown and shrunk as the checkers descend. */
typedef struct path {
    char buf[PATH_MAX_LEN];
    size_t len;
} path;

/* Append to the path; returns the old length for path_pop. */
static size_t path_push(path *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t path_push(path *p, const char *fmt, ...)
{
    size_t old = p->len, room = sizeof p->buf - old;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p->buf + old, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
        p->buf[old] = '\0';
    } else if ((size_t)n >= room) {
        utf8_drop_partial_tail(p->buf);
        p->len = strlen(p->buf);
    } else {
        p->len = old + (size_t)n;
    }
    return old;
}

static void path_pop(path *p, size_t old)
{
    p->len = old;
    p->buf[old] = '\0';
}

typedef enum leaf_type { T_STRING, T_NUMBER, T_BOOLEAN, T_ARRAY, T_OBJECT, T_UNKNOWN } leaf_type;

static const char *const leaf_names[] = {"string", "number", "boolean", "array", "object"};

static leaf_type leaf_of(const char *name)
{
    for (int t = T_STRING; t < T_UNKNOWN; t++)
        if (strcmp(name, leaf_names[t]) == 0)
            return (leaf_type)t;
    return T_UNKNOWN;
}

/* Check the shape itself, all of it, before looking at any data: a typo
 * under an array shape would otherwise hide while the data's arrays are
 * empty, and a shape mistake is a bug to report as such, not as a bad
 * response. */
static int shape_ok(const cJSON *shape, path *p, int depth, char *err, size_t errlen)
{
    if (depth > SHAPE_MAX_DEPTH) {
        set_err(err, errlen, "invalid shape at %s: nested more than %d levels deep", p->buf,
                SHAPE_MAX_DEPTH);
        return 0;
    }
    if (cJSON_IsString(shape)) {
        if (leaf_of(shape->valuestring) != T_UNKNOWN)
            return 1;
        set_err(err, errlen,
                "invalid shape at %s: unknown type \"%s\" (expected string, number, "
                "boolean, array or object)",
                p->buf, shape->valuestring);
        return 0;
    }
    if (cJSON_IsObject(shape)) {
        for (const cJSON *k = shape->child; k != NULL; k = k->next) {
            size_t old = path_push(p, ".%s", k->string);
            int ok = shape_ok(k, p, depth + 1, err, errlen);
            path_pop(p, old);
            if (!ok)
                return 0;
        }
        return 1;
    }
    if (cJSON_IsArray(shape)) {
        if (cJSON_GetArraySize(shape) != 1) {
            set_err(err, errlen, "invalid shape at %s: an array shape must have exactly one element",
                    p->buf);
            return 0;
        }
        size_t old = path_push(p, "[]");
        int ok = shape_ok(shape->child, p, depth + 1, err, errlen);
        path_pop(p, old);
        return ok;
    }
    set_err(err, errlen,
            "invalid shape at %s: expected a type name, an object or a one-element array", p->buf);
    return 0;
}

static int leaf_matches(const cJSON *v, leaf_type t)
{
    switch (t) {
    case T_STRING:
        /* Non-empty, as in the seed: "" is what a model sends when it had
         * nothing to say. */
        return cJSON_IsString(v) && v->valuestring[0] != '\0';
    case T_NUMBER:
        return cJSON_IsNumber(v);
    case T_BOOLEAN:
        return cJSON_IsBool(v);
    case T_ARRAY:
        return cJSON_IsArray(v);
    case T_OBJECT:
        /* Unlike JavaScript's typeof, neither null nor an array is an
         * object here. */
        return cJSON_IsObject(v);
    case T_UNKNOWN:
        break;
    }
    return 0;
}

static int bad_value(path *p, const char *expected, char *err, size_t errlen)
{
    set_err(err, errlen, "invalid response at %s: expected %s", p->buf, expected);
    return 0;
}

/* Match `v` (NULL = absent) against a shape already checked by shape_ok,
 * so the recursion depth is bounded by SHAPE_MAX_DEPTH. */
static int value_ok(const cJSON *v, const cJSON *shape, path *p, char *err, size_t errlen)
{
    if (cJSON_IsString(shape)) {
        leaf_type t = leaf_of(shape->valuestring);
        return leaf_matches(v, t) ? 1 : bad_value(p, leaf_names[t], err, errlen);
    }
    if (cJSON_IsObject(shape)) {
        if (!cJSON_IsObject(v))
            return bad_value(p, "object", err, errlen);
        for (const cJSON *k = shape->child; k != NULL; k = k->next) {
            size_t old = path_push(p, ".%s", k->string);
            int ok = value_ok(cJSON_GetObjectItemCaseSensitive(v, k->string), k, p, err, errlen);
            path_pop(p, old);
            if (!ok)
                return 0;
        }
        return 1;
    }
    /* A one-element array shape: every element must match it. */
    if (!cJSON_IsArray(v))
        return bad_value(p, "array", err, errlen);
    size_t i = 0;
    for (const cJSON *el = v->child; el != NULL; el = el->next, i++) {
        size_t old = path_push(p, "[%zu]", i);
        int ok = value_ok(el, shape->child, p, err, errlen);
        path_pop(p, old);
        if (!ok)
            return 0;
    }
    return 1;
}

llmretry_status llmretry_assert_shape(const char *json, size_t json_len,
                                      const char *shape, size_t shape_len,
                                      const char *root_path,
                                      char *err, size_t errlen)
{
    /* An empty root_path would give paths like ".name"; read it as NULL. */
    if (root_path == NULL || root_path[0] == '\0')
        root_path = "root";
    if (shape == NULL) {
        set_err(err, errlen, "invalid shape: shape is NULL");
        return LLMRETRY_EINVAL;
    }

    path p;
    p.len = 0;
    p.buf[0] = '\0';
    path_push(&p, "%s", root_path);

    size_t at;
    cJSON *s = parse_exact(shape, shape_len, &at);
    if (s == NULL) {
        set_err(err, errlen, "invalid shape: not valid JSON (parse error at byte %zu)", at);
        return LLMRETRY_EINVAL;
    }
    if (!shape_ok(s, &p, 0, err, errlen)) {
        cJSON_Delete(s);
        return LLMRETRY_EINVAL;
    }

    /* The data's parse error offset is left out on purpose: no hints about
     * the content of a response in messages. */
    cJSON *v = json != NULL ? parse_exact(json, json_len, &at) : NULL;
    if (v == NULL) {
        set_err(err, errlen, "invalid response at %s: not valid JSON", p.buf);
        cJSON_Delete(s);
        return LLMRETRY_EINVAL;
    }
    int ok = value_ok(v, s, &p, err, errlen);
    cJSON_Delete(v);
    cJSON_Delete(s);
    return ok ? LLMRETRY_OK : LLMRETRY_EINVAL;
}

int llmretry_json_text_opens(const char *text, size_t len)
{
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n'))
        i++;
    return i < len && (text[i] == '{' || text[i] == '[');
}
