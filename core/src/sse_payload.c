/* sse_payload.c — what one SSE event's data says (docs/streaming.md, "Errors
 * inside the stream"): a chunk, and whether it finishes its choices; an
 * error, judged by its code the way an HTTP status would be; or data no
 * host could decode. The text is checked and parsed by lr_parse_body
 * (response.c), the same gate a 2xx body goes through: UTF-8, no raw
 * control characters, at most LLMRETRY_MAX_BODY_DEPTH deep, an object.
 *
 * Shapes seen in the wild, all handled:
 *   OpenAI, LiteLLM, vLLM: data: {"error": {"message", "type", "code", "param"}}
 *   Anthropic:             event: error / data: {"type": "error", "error": {"type": ...}}
 *   llama.cpp server:      error: {"code": 500, "message": ..., "type": "server_error"}
 *                          (the reader types it "error"; the object is the error)
 *   Gemini (OpenAI compat): {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}
 * The message is never kept: providers echo the request in it. */
#include "sse.h"
#include "internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Codes and types by what a retry would make of them, compared without
 * case (Google's statuses are upper case). */
static const char *const quota_names[] = {"insufficient_quota", NULL};
static const char *const rate_names[] = {"rate_limit_exceeded", "rate_limit_error",
                                         "too_many_requests", "resource_exhausted", NULL};
static const char *const busy_names[] = {"overloaded", "overloaded_error",
                                         "service_unavailable", "unavailable", NULL};
static const char *const internal_names[] = {"server_error", "api_error", "internal_error",
                                             "internal", NULL};

static int ieq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char c = *a >= 'A' && *a <= 'Z' ? (char)(*a - 'A' + 'a') : *a;
        if (c != *b)
            return 0;
    }
    return *a == *b;
}

static int in_list(const char *s, const char *const *names)
{
    for (; s && *names; names++)
        if (ieq(s, *names))
            return 1;
    return 0;
}

static const cJSON *item(const cJSON *obj, const char *key)
{
    return obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

/* A non-empty string member, or NULL. */
static const char *str_item(const cJSON *obj, const char *key)
{
    const cJSON *v = item(obj, key);
    return cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

/* An HTTP error status carried by a value: a whole number, or a string of
 * three digits, in 400..599. 0 otherwise. */
static int http_status(const cJSON *v)
{
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d >= 400 && d <= 599 && d == (double)(int)d)
            return (int)d;
    } else if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        if (strlen(s) == 3 && s[0] >= '4' && s[0] <= '5' && s[1] >= '0' && s[1] <= '9' &&
            s[2] >= '0' && s[2] <= '9')
            return (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
    }
    return 0;
}

/* The provider's code as text: code, else type, else status (the order
 * lr_http_error uses for an HTTP error body, so both paths name an error
 * alike), else a numeric code. *nomem set when a copy failed. */
static char *code_text(const cJSON *e, int *nomem)
{
    const char *s = str_item(e, "code");
    char num[32];
    if (!s)
        s = str_item(e, "type");
    if (!s)
        s = str_item(e, "status");
    if (!s) {
        const cJSON *c = item(e, "code");
        if (!cJSON_IsNumber(c) || !(c->valuedouble >= -1e15 && c->valuedouble <= 1e15) ||
            c->valuedouble != (double)(long long)c->valuedouble)
            return NULL;            /* not a whole number: no code */
        snprintf(num, sizeof num, "%lld", (long long)c->valuedouble);
        s = num;
    }
    char *copy = lr_strdup(s);
    *nomem = copy == NULL;
    return copy;
}

/* Fill the error fields from the error object e (NULL: an error with
 * nothing known about it). unknown_status is the status of an error whose
 * object names none and no class: 400 (a request the server refused), or
 * 500 for a model that failed while answering (finish_reason "error"). */
static int classify_error(const cJSON *e, int unknown_status, lr_sse_payload *p)
{
    const char *names[3] = {str_item(e, "code"), str_item(e, "type"), str_item(e, "status")};
    int nomem = 0;
    int status = http_status(item(e, "code"));
    if (!status)
        status = http_status(item(e, "status"));
    p->kind = LR_SSE_ERROR;
    p->err_class = LR_SSE_ERR_OTHER;
    for (int i = 0; i < 3 && p->err_class == LR_SSE_ERR_OTHER; i++) {
        if (in_list(names[i], quota_names))
            p->err_class = LR_SSE_ERR_QUOTA;
        else if (in_list(names[i], rate_names))
            p->err_class = LR_SSE_ERR_RATE_LIMIT;
        else if (in_list(names[i], busy_names) || in_list(names[i], internal_names))
            p->err_class = LR_SSE_ERR_SERVER;
    }
    /* The quota check of the policy (rule 3) looks for this exact code on a
     * 429, whatever field or case the provider used. */
    p->code = p->err_class == LR_SSE_ERR_QUOTA ? lr_strdup("insufficient_quota")
                                               : code_text(e, &nomem);
    if (p->err_class == LR_SSE_ERR_QUOTA && !p->code)
        nomem = 1;
    /* A status the provider gave is the truth; else the class's own. */
    if (!status) {
        int busy = 0;
        for (int i = 0; i < 3; i++)
            busy = busy || in_list(names[i], busy_names);
        status = p->err_class == LR_SSE_ERR_RATE_LIMIT || p->err_class == LR_SSE_ERR_QUOTA ? 429
               : p->err_class == LR_SSE_ERR_SERVER ? (busy ? 503 : 500)
               : unknown_status;
        if (p->err_class == LR_SSE_ERR_OTHER && unknown_status >= 500)
            p->err_class = LR_SSE_ERR_SERVER;
    } else if (p->err_class == LR_SSE_ERR_OTHER && llmretry_status_retryable(NULL, status)) {
        p->err_class = status == 429 ? LR_SSE_ERR_RATE_LIMIT : LR_SSE_ERR_SERVER;
    }
    p->status = status;
    return nomem ? LR_SSE_NOMEM : 0;
}

/* Which choices a chunk finishes: a finish_reason that is neither null
 * nor "" ends its choice. */
static void classify_chunk(const cJSON *doc, lr_sse_payload *p)
{
    const cJSON *choices = item(doc, "choices"), *ch;
    p->kind = LR_SSE_CHUNK;
    if (!cJSON_IsArray(choices))
        return;
    cJSON_ArrayForEach(ch, choices) {
        if (!cJSON_IsObject(ch))
            continue;
        const cJSON *fr = item(ch, "finish_reason");
        if (fr && !cJSON_IsNull(fr) && !(cJSON_IsString(fr) && fr->valuestring[0] == '\0'))
            p->has_finish_reason = 1;
        else
            p->has_open_choice = 1;
    }
}

/* An error the object doc says it is, whatever the event (1, p filled),
 * else 0: a top-level "error" that is an object or a string (the
 * Responses API's null is none), or a choice ended by finish_reason
 * "error" (OpenRouter's, for a model that failed mid-answer; judged by
 * that choice's own "error" object). LR_SSE_NOMEM when out of memory. */
static int error_in(const cJSON *doc, lr_sse_payload *p)
{
    const cJSON *e = item(doc, "error"), *ch;
    if (cJSON_IsObject(e) || cJSON_IsString(e)) {
        int rc = classify_error(cJSON_IsObject(e) ? e : NULL, 400, p);
        return rc ? rc : 1;
    }
    const cJSON *choices = item(doc, "choices");
    if (!cJSON_IsArray(choices))
        return 0;
    cJSON_ArrayForEach(ch, choices) {
        const cJSON *fr = item(ch, "finish_reason");
        if (cJSON_IsString(fr) && strcmp(fr->valuestring, "error") == 0) {
            const cJSON *ce = item(ch, "error");
            int rc = classify_error(cJSON_IsObject(ce) ? ce : NULL, 500, p);
            return rc ? rc : 1;
        }
    }
    return 0;
}

int lr_body_error(const cJSON *doc, int responses, lr_sse_payload *p)
{
    memset(p, 0, sizeof *p);
    const cJSON *st = responses ? item(doc, "status") : NULL;
    if (cJSON_IsString(st) && strcmp(st->valuestring, "failed") == 0) {
        /* A failed Responses answer carries its error, as its stream's
         * response.failed does, and is judged alike. */
        const cJSON *e = item(doc, "error");
        int rc = classify_error(cJSON_IsObject(e) ? e : NULL, 400, p);
        return rc ? rc : 1;
    }
    return error_in(doc, p);
}

const char *lr_sse_type(const char *event, const cJSON *doc)
{
    if (event && strcmp(event, "message") != 0)
        return event;
    /* Only the types of the Responses API (and its "error"): a chat chunk
     * of some vendor with a "type" of its own stays a chunk. */
    const char *type = cJSON_IsObject(doc) ? str_item(doc, "type") : NULL;
    if (type && (strcmp(type, "error") == 0 || strncmp(type, "response.", 9) == 0))
        return type;
    return "message";
}

/* ---- U+0000 in chunk strings --------------------------------------------- */

/* Is s (n bytes left, s[0] a backslash) the escape of U+0000 or U+001F? */
static int masked_escape(const char *s, size_t n)
{
    return n >= 6 && s[1] == 'u' && s[2] == '0' && s[3] == '0' &&
           ((s[4] == '0' && s[5] == '0') || (s[4] == '1' && (s[5] == 'f' || s[5] == 'F')));
}

/* The text with "\u0000" written "\u001f0" and "\u001f" "\u001f1"
 * (malloc'd, *out_n its length), or NULL when it has neither: the usual
 * case, parsed as it is. Escapes are read in pairs, so the text "\\u0000"
 * (a backslash, then "u0000") is left alone. */
static char *mask_text(const char *data, size_t n, size_t *out_n, int *nomem)
{
    size_t extra = 0;
    for (size_t i = 0; i < n; i++)
        if (data[i] == '\\') {
            extra += (size_t)masked_escape(data + i, n - i);
            i++;                    /* the escaped character */
        }
    if (extra == 0)
        return NULL;
    char *out = malloc(n + extra + 1);
    if (!out) {
        *nomem = 1;
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (data[i] == '\\' && masked_escape(data + i, n - i)) {
            memcpy(out + o, "\\u001f", 6);
            out[o + 6] = data[i + 4] == '0' ? '0' : '1';
            o += 7;
            i += 6;
        } else if (data[i] == '\\' && i + 1 < n) {
            out[o++] = data[i++];
            out[o++] = data[i++];
        } else {
            out[o++] = data[i++];
        }
    }
    out[o] = '\0';
    *out_n = o;
    return out;
}

size_t lr_sse_unmask(char *text, size_t n)
{
    if (!strstr(text, "\\u001f"))
        return n;                   /* nothing masked: the usual case */
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (text[i] == '\\' && n - i >= 7 && memcmp(text + i, "\\u001f", 6) == 0 &&
            (text[i + 6] == '0' || text[i + 6] == '1')) {
            memcpy(text + o, text[i + 6] == '0' ? "\\u0000" : "\\u001f", 6);
            o += 6;
            i += 7;
        } else if (text[i] == '\\' && i + 1 < n) {
            text[o++] = text[i++];
            text[o++] = text[i++];
        } else {
            text[o++] = text[i++];
        }
    }
    text[o] = '\0';
    return o;
}

cJSON *lr_sse_parse(const char *data, size_t n, const char **why, int *nomem)
{
    size_t masked_len = 0;
    char *masked = mask_text(data, n, &masked_len, nomem);
    if (*nomem)
        return NULL;
    cJSON *doc = masked ? lr_parse_body(masked, masked_len, why) : lr_parse_body(data, n, why);
    free(masked);
    return doc;
}

/* ---- classifying ---------------------------------------------------------- */

int lr_sse_classify(const char *event, const char *data, size_t len, lr_sse_payload *p,
                    cJSON **doc_out)
{
    const char *why;
    int rc = 0, nomem = 0;
    memset(p, 0, sizeof *p);
    if (doc_out)
        *doc_out = NULL;
    if (!data) {
        data = "";
        len = 0;
    }
    cJSON *doc = lr_sse_parse(data, len, &why, &nomem);
    if (nomem)
        return LR_SSE_NOMEM;
    if (!doc || !cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        if (event && strcmp(event, "error") == 0)
            return classify_error(NULL, 400, p); /* an error, nothing known about it */
        p->kind = LR_SSE_INVALID;
        p->why = why;
        return 0;
    }
    event = lr_sse_type(event, doc);
    int error_event = strcmp(event, "error") == 0;
    if (strcmp(event, "response.failed") == 0) {
        /* The Responses API: the failed response carries its error. */
        const cJSON *re = item(item(doc, "response"), "error");
        rc = classify_error(cJSON_IsObject(re) ? re : NULL, 400, p);
    } else if ((rc = error_in(doc, p)) == 1) {
        rc = 0;
    } else if (rc == 0 && error_event) {
        /* llama.cpp: the object is the error */
        rc = classify_error(item(doc, "error") ? NULL : doc, 400, p);
    } else if (rc == 0) {
        classify_chunk(doc, p);
    }
    if (doc_out)
        *doc_out = doc;
    else
        cJSON_Delete(doc);
    return rc;
}

void lr_sse_payload_clear(lr_sse_payload *p)
{
    free(p->code);
    memset(p, 0, sizeof *p);
}

void lr_sse_payload_failure(const lr_sse_payload *p, llmretry_failure *f)
{
    memset(f, 0, sizeof *f);
    if (p->kind == LR_SSE_ERROR) {
        f->kind = LLMRETRY_ERR_HTTP_STATUS;
        f->status = p->status;
        f->error_code = p->code;
    } else if (p->kind == LR_SSE_INVALID) {
        f->kind = LLMRETRY_ERR_INVALID_RESPONSE;
    }
}
