/* What the server sent, judged once for every host: whether a 2xx body is
 * a valid body (UTF-8 JSON), its token usage, and the text of an HTTP
 * error (the path called and the provider's code, escaped so a hostile
 * server cannot forge log lines). The provider's error.message is not
 * quoted: servers echo the request in it ("... for <prompt>"), and errors
 * never show prompts; it stays in body_preview. Engine thread only. */
#include "internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Length of the UTF-8 sequence at s (n bytes left), 0 when invalid:
 * overlong forms, surrogates and code points above U+10FFFF included
 * (RFC 3629), as Python's decoder sees them. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;              /* no UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

/* The rules cJSON does not check but every host's decoder does: the text
 * is UTF-8, strings hold no raw control characters, outside strings only
 * JSON whitespace (cJSON skips any byte <= 0x20), and arrays and objects
 * nest at most LLMRETRY_MAX_BODY_DEPTH deep (cJSON allows 1000; Python's
 * decoder recurses out earlier, by how deep the caller's stack already
 * is). Run before cJSON, so a body a host could not decode is never
 * called a success. Returns what is wrong, or NULL. */
static const char *json_text_problem(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    int in_string = 0, depth = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            size_t len = utf8_seq(s + i, n - i);
            if (len == 0)
                return "is not UTF-8";
            i += len;
            continue;
        }
        if (in_string) {
            if (c < 0x20)
                return "has a raw control character in a string";
            if (c == '"')
                in_string = 0;
            else if (c == '\\' && i + 1 < n && s[i + 1] < 0x80)
                i++;                /* the escaped byte cannot end the string */
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > LLMRETRY_MAX_BODY_DEPTH)
                return "nests deeper than " LR_STR(LLMRETRY_MAX_BODY_DEPTH) " levels";
        } else if (c == ']' || c == '}') {
            depth--;
        } else if (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            return "has a control character outside strings";
        }
        i++;
    }
    return NULL;
}

cJSON *lr_parse_body(const char *text, size_t n, const char **why)
{
    *why = json_text_problem(text, n);
    if (*why)
        return NULL;
    cJSON *doc = cJSON_ParseWithLength(text, n);
    if (!doc)
        *why = "is not JSON";
    else if (!cJSON_IsObject(doc))
        *why = "is not a JSON object";
    return doc;
}

/* A token count the server reports: a whole number in 0..2^53 (exact in a
 * double, so in every host), else 0 like a missing one. Usage is the
 * server's data, not truth: a negative, fractional or huge count summed
 * into totals would corrupt every batch figure. The raw usage stays in
 * the body. */
static int64_t json_count(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= 9007199254740992.0))  /* also NaN */
        return 0;
    int64_t count = (int64_t)d;
    return (double)count == d ? count : 0;
}

static char *json_str(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? lr_strdup(v->valuestring) : NULL;
}

void lr_read_success(const cJSON *doc, llmretry_usage *usage, char **model, char **fingerprint)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(doc, "usage");
    if (cJSON_IsObject(u)) {
        usage->present = 1;
        usage->prompt_tokens = json_count(u, "prompt_tokens");
        usage->completion_tokens = json_count(u, "completion_tokens");
        usage->total_tokens = json_count(u, "total_tokens");
    }
    *model = json_str(doc, "model");
    *fingerprint = json_str(doc, "system_fingerprint");
}

/* Append s (n bytes) to out (room for cap bytes with the NUL), escaping
 * control characters, DEL and bytes that are not UTF-8 as \n, \r, \t or
 * \xNN: a server's text must not start a new log line or break a host's
 * decoder. Whole characters only; returns the new length. */
static size_t put_escaped(char *out, size_t len, size_t cap, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        char esc[5];
        size_t k = utf8_seq(u + i, n - i);
        const char *piece = s + i;
        size_t plen = k;
        if (k == 0 || (k == 1 && (u[i] < 0x20 || u[i] == 0x7f))) {
            unsigned char c = u[i];
            if (c == '\n' || c == '\r' || c == '\t') {
                esc[0] = '\\';
                esc[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
                esc[2] = '\0';
            } else {
                snprintf(esc, sizeof esc, "\\x%02x", c);
            }
            piece = esc;
            plen = strlen(esc);
            k = 1;
        }
        if (len + plen + 1 > cap)
            break;
        memcpy(out + len, piece, plen);
        len += plen;
        i += k;
    }
    out[len] = '\0';
    return len;
}

/* The path of a URL: no scheme, no credentials or host, no query. */
static void url_path(const char *url, const char **p, size_t *n)
{
    const char *s = strstr(url, "://");
    s = s ? s + 3 : url;
    s += strcspn(s, "/?#");
    *p = *s == '/' ? s : "/";
    *n = *s == '/' ? strcspn(s, "?#") : 1;
}

char *lr_http_error(const llmretry_call *c, long status, char **error_code)
{
    const char *body = c->resp.data ? c->resp.data : "";
    cJSON *doc = cJSON_ParseWithLength(body, c->resp.len);
    const cJSON *e = doc ? cJSON_GetObjectItemCaseSensitive(doc, "error") : NULL;
    *error_code = NULL;
    if (cJSON_IsObject(e)) {
        /* The provider's code: error.code when it is a string, else error.type. */
        *error_code = json_str(e, "code");
        if (!*error_code)
            *error_code = json_str(e, "type");
    }

    char buf[768];
    const char *path;
    size_t plen;
    url_path(c->url, &path, &plen);
    size_t len = (size_t)snprintf(buf, sizeof buf, "HTTP %ld from ", status);
    len = put_escaped(buf, len, 256, path, plen);
    char st[16];
    snprintf(st, sizeof st, "%ld", status);
    /* No "HTTP 429 (429)": a code that repeats the status says nothing. */
    if (*error_code && strcmp(*error_code, st) != 0) {
        len = put_escaped(buf, len, sizeof buf, " (", 2);
        len = put_escaped(buf, len, len + 128, *error_code, strlen(*error_code));
        len = put_escaped(buf, len, sizeof buf, ")", 1);
    }
    cJSON_Delete(doc);
    return lr_strdup(buf);
}
