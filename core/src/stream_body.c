/* A streamed request's body (stream.h): `"stream": true` set on a body the
 * host encoded, and stream_options.include_usage added where the body sets
 * none, each by editing the text in place so that the rest stays as the
 * caller wrote it. */
#include "stream.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* ---- the request ----------------------------------------------------------- */

char *lr_stream_with_usage(const char *url, const char *body, size_t *len)
{
    static const char usage[] = ",\"stream_options\":{\"include_usage\":true}";
    if (url && lr_url_path_ends(url, "/responses"))
        return NULL;
    /* A JSON object ends with '}' (and maybe spaces): insert before it,
     * leaving the caller's text, numbers included, as it was. */
    size_t n = *len, end = n;
    while (end > 0 && strchr(" \t\r\n", body[end - 1]))
        end--;
    if (end == 0 || body[end - 1] != '}')
        return NULL;
    char *out = malloc(n + sizeof usage);
    if (!out)
        return NULL;
    memcpy(out, body, end - 1);
    memcpy(out + end - 1, usage, sizeof usage - 1);
    memcpy(out + end - 1 + sizeof usage - 1, body + end - 1, n - (end - 1));
    *len = n + sizeof usage - 1;
    out[*len] = '\0';
    return out;
}

/* The index after the JSON string that starts at s[i] ('"'), or len. */
static size_t skip_string(const char *s, size_t i, size_t len)
{
    for (i++; i < len; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return len;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static size_t skip_space(const char *s, size_t i, size_t len)
{
    while (i < len && is_space(s[i]))
        i++;
    return i;
}

/* Where the top-level member "stream" of the object text s has its value:
 * 1 and [*vs, *ve), else 0 (*ve: the object's closing brace, or 0 when s
 * is not an object). Keys are compared as written (a host's encoder never
 * escapes "stream"). */
static int stream_member(const char *s, size_t len, size_t *vs, size_t *ve)
{
    size_t i = skip_space(s, 0, len);
    *ve = 0;
    if (i >= len || s[i] != '{')
        return 0;
    int depth = 0, want_key = 0;
    size_t value_at = 0, found = 0;
    for (; i < len; i++) {
        char ch = s[i];
        if (ch == '"') {
            size_t end = skip_string(s, i, len);
            if (depth == 1 && want_key) {
                want_key = 0;
                size_t colon = skip_space(s, end, len);
                if (end - i == 8 && memcmp(s + i, "\"stream\"", 8) == 0 && colon < len &&
                    s[colon] == ':') {
                    value_at = skip_space(s, colon + 1, len);
                    found = 1;
                }
            }
            i = end - 1;
        } else if (ch == '{' || ch == '[') {
            want_key = ++depth == 1;
        } else if (ch == '}' || ch == ']' || (ch == ',' && depth == 1)) {
            if (depth == 1 && found == 1) {     /* the value ends here */
                size_t end = i;
                while (end > value_at && is_space(s[end - 1]))
                    end--;
                *vs = value_at;
                *ve = end;
                return 1;
            }
            if (ch == ',')
                want_key = 1;
            else if (--depth == 0) {
                *ve = i;
                return 0;
            }
        }
    }
    return 0;
}

char *lr_stream_forced(const char *body, size_t *len)
{
    static const char member[] = "\"stream\":true";
    size_t n = *len, vs = 0, ve = 0, at, cut;
    const char *put;
    size_t put_len;
    if (stream_member(body, n, &vs, &ve)) {
        if (ve - vs == 4 && memcmp(body + vs, "true", 4) == 0)
            return NULL;
        at = vs, cut = ve, put = "true", put_len = 4;
    } else if (ve > 0) {
        /* Added before the closing brace, after a comma unless empty. */
        size_t last = ve;
        while (last > 0 && is_space(body[last - 1]))
            last--;
        int empty = body[last - 1] == '{';
        at = cut = last;
        put = empty ? member : ",\"stream\":true";
        put_len = empty ? sizeof member - 1 : sizeof member;
    } else {
        return NULL;
    }
    char *out = malloc(n - (cut - at) + put_len + 1);
    if (!out)
        return NULL;
    memcpy(out, body, at);
    memcpy(out + at, put, put_len);
    memcpy(out + at + put_len, body + cut, n - cut);
    *len = n - (cut - at) + put_len;
    out[*len] = '\0';
    return out;
}

char *llmretry_stream_body(const char *url, const char *body, size_t *len, int streamed)
{
    char *forced = streamed ? lr_stream_forced(body, len) : NULL;
    const char *b = forced ? forced : body;
    /* Most bodies never mention "stream": those are not parsed. */
    if (!memmem(b, *len, "\"stream\"", 8))
        return forced;
    cJSON *doc = cJSON_ParseWithLength(b, *len);
    int asks = doc && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "stream")) &&
               !cJSON_GetObjectItemCaseSensitive(doc, "stream_options");
    cJSON_Delete(doc);
    char *with_usage = asks ? lr_stream_with_usage(url, b, len) : NULL;
    if (!with_usage)
        return forced;
    free(forced);
    return with_usage;
}
