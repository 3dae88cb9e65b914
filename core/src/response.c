/* What the server sent in an HTTP error, judged once for every host: the
 * path called, the provider's code and message, escaped so a hostile
 * server cannot forge log lines (a 2xx body is response_body.c's). The
 * server's text is screened first (lr_error_code_checked, echoes): a code
 * shows only as a short token, and neither it nor the message may quote
 * the request (servers echo it: "... for <prompt>") or a credential;
 * errors never show those. Engine thread only. */
#include "internal.h"
#include "json_pull.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static size_t put_escaped_n(char *out, size_t len, size_t cap, const char *s, size_t n,
                            size_t *taken)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        char esc[5];
        size_t k = lr_utf8_seq(u + i, n - i);
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
    if (taken)
        *taken = i;
    return len;
}

static size_t put_escaped(char *out, size_t len, size_t cap, const char *s, size_t n)
{
    return put_escaped_n(out, len, cap, s, n, NULL);
}

/* ---- what an error may quote ------------------------------------------- */

/* A text of the request no error may quote: a message content (any run of
 * LR_ECHO_RUN bytes of it), or a credential (also the whole of a short one,
 * from 8 bytes). */
typedef struct req_text {
    const char *p;
    size_t n;
    int credential;
} req_text;

typedef struct req_texts {
    cJSON *doc;                 /* the request body, parsed: p points into it */
    req_text *v;
    size_t n, cap;
    int nomem;                  /* then every text "echoes" (withheld) */
} req_texts;

static void texts_add(req_texts *t, const char *p, size_t n, int credential)
{
    if (n < (credential ? 8 : LR_ECHO_RUN))
        return;                 /* too short to be told from any other text */
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        req_text *v = realloc(t->v, cap * sizeof *v);
        if (!v) {
            t->nomem = 1;
            return;
        }
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = (req_text){ p, n, credential };
}

/* Every string under item (the contents of messages, input, ...). */
static void texts_add_strings(req_texts *t, const cJSON *item)
{
    if (cJSON_IsString(item)) {
        texts_add(t, item->valuestring, strlen(item->valuestring), 0);
        return;
    }
    const cJSON *child;
    cJSON_ArrayForEach(child, item)
        texts_add_strings(t, child);
}

/* Is a header of this name a credential's (Authorization, api-key,
 * x-goog-api-key, a token, a cookie)? Other headers (an organization, a
 * title) are not secrets, and a message naming them helps. */
static int credential_name(const char *name, size_t n)
{
    static const char *const words[] = { "auth", "key", "token", "secret", "cookie",
                                         "password" };
    for (size_t w = 0; w < sizeof words / sizeof *words; w++) {
        size_t wl = strlen(words[w]);
        for (size_t i = 0; i + wl <= n; i++)
            if (strncasecmp(name + i, words[w], wl) == 0)
                return 1;
    }
    return 0;
}

const char *lr_credential_value(const char *line)
{
    const char *colon = strchr(line, ':');
    if (!colon || !credential_name(line, (size_t)(colon - line)))
        return NULL;
    return colon + 1 + strspn(colon + 1, " \t");
}

/* The texts of c's request an error must not quote: the strings of its
 * messages (and the Responses API's input and instructions, the
 * completions prompt, a system text) and its credential headers' values
 * (after a scheme such as "Bearer "). */
static void texts_of_body(req_texts *t, const char *body, size_t len)
{
    static const char *const keys[] = { "messages", "input", "instructions", "prompt",
                                        "system" };
    memset(t, 0, sizeof *t);
    t->doc = body ? cJSON_ParseWithLength(body, len) : NULL;
    if (body && !t->doc)
        texts_add(t, body, len, 0);     /* not JSON (a C caller's): all of it */
    for (size_t k = 0; t->doc && k < sizeof keys / sizeof *keys; k++)
        texts_add_strings(t, cJSON_GetObjectItemCaseSensitive(t->doc, keys[k]));
}

static void texts_init(const llmretry_call *c, req_texts *t)
{
    texts_of_body(t, c->body, c->o.body_len);
    for (const struct curl_slist *h = c->headers; h; h = h->next) {
        const char *v = lr_credential_value(h->data);
        if (!v)
            continue;
        size_t vn = strlen(v);
        while (vn > 0 && (v[vn - 1] == ' ' || v[vn - 1] == '\t'))
            vn--;
        const char *sp = memchr(v, ' ', vn);
        if (sp) {               /* "Bearer <key>": the key */
            vn -= (size_t)(sp + 1 - v);
            v = sp + 1;
        }
        texts_add(t, v, vn, 1);
    }
}

static void texts_free(req_texts *t)
{
    cJSON_Delete(t->doc);
    free(t->v);
    memset(t, 0, sizeof *t);
}

/* Hashes of LR_ECHO_RUN-byte windows, rolled: h = sum b[i] * B^(RUN-1-i). */
#define ECHO_B 1099511628211ull
#define ECHO_MAX_TEXT 512       /* longest text echoes() checks (a cut message) */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Does s (n <= ECHO_MAX_TEXT bytes) quote a text of the request: any run of
 * LR_ECHO_RUN bytes of one, or the whole of a short credential? Linear in
 * the request's size: the windows of s are hashed and sorted once, and
 * each text's windows are rolled past them. */
static int echoes(const req_texts *t, const char *s, size_t n)
{
    if (t->nomem)
        return 1;
    if (n > ECHO_MAX_TEXT)
        n = ECHO_MAX_TEXT;
    uint64_t wins[ECHO_MAX_TEXT], top = 1;      /* top = B^(RUN-1) */
    size_t nw = n >= LR_ECHO_RUN ? n - LR_ECHO_RUN + 1 : 0;
    for (int i = 1; i < LR_ECHO_RUN; i++)
        top *= ECHO_B;
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        h = i >= LR_ECHO_RUN ? h - (unsigned char)s[i - LR_ECHO_RUN] * top : h;
        h = h * ECHO_B + (unsigned char)s[i];
        if (i + 1 >= LR_ECHO_RUN)
            wins[i + 1 - LR_ECHO_RUN] = h;
    }
    qsort(wins, nw, sizeof *wins, cmp_u64);
    for (size_t k = 0; k < t->n; k++) {
        const req_text *x = &t->v[k];
        if (x->n < LR_ECHO_RUN) {               /* a short credential, whole */
            if (x->n <= n && memmem(s, n, x->p, x->n))
                return 1;
            continue;
        }
        if (nw == 0)
            continue;
        h = 0;
        for (size_t i = 0; i < x->n; i++) {
            h = i >= LR_ECHO_RUN ? h - (unsigned char)x->p[i - LR_ECHO_RUN] * top : h;
            h = h * ECHO_B + (unsigned char)x->p[i];
            if (i + 1 >= LR_ECHO_RUN && bsearch(&h, wins, nw, sizeof *wins, cmp_u64) &&
                memmem(s, n, x->p + i + 1 - LR_ECHO_RUN, LR_ECHO_RUN))
                return 1;
        }
    }
    return 0;
}

int llmretry_text_quotes(const char *text, size_t len, const char *body, size_t body_len,
                         const char *const *secrets, size_t n_secrets)
{
    req_texts t;
    texts_of_body(&t, body, body_len);
    for (size_t i = 0; i < n_secrets; i++)
        if (secrets[i])
            texts_add(&t, secrets[i], strlen(secrets[i]), 1);
    int quotes = echoes(&t, text ? text : "", text ? len : 0);
    texts_free(&t);
    return quotes;
}

/* Is s a code errors may show: a short token ([A-Za-z0-9_.:-], at most
 * LR_CODE_MAX bytes)? Anything else (spaces, 200 KB) is the server's
 * free text, which may hold anything. */
static int code_is_token(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char ch = (unsigned char)s[n];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                 (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == ':' || ch == '-';
        if (!ok || n >= LR_CODE_MAX)
            return 0;
    }
    return n > 0;
}

static char *code_checked(const req_texts *t, char *code)
{
    if (code && !code[0]) {
        free(code);             /* "": no code */
        return NULL;
    }
    if (!code)
        return NULL;
    /* insufficient_quota is the policy's own word (a 429 not retried): it
     * says nothing of the request, even one that holds it. */
    if (!code_is_token(code) ||
        (strcmp(code, "insufficient_quota") != 0 && echoes(t, code, strlen(code)))) {
        free(code);
        return lr_strdup(LR_INVALID_CODE);
    }
    return code;
}

char *lr_error_code_checked(const llmretry_call *c, char *code)
{
    if (!code)
        return NULL;
    req_texts t;
    texts_init(c, &t);
    code = code_checked(&t, code);
    texts_free(&t);
    return code;
}

/* What holds the error in a body or event: the body itself (OpenAI and
 * alike), a Responses response.failed event's response, or a chunk's
 * choice that ended with an error of its own. */
static const cJSON *error_holder(const cJSON *doc)
{
    if (cJSON_GetObjectItemCaseSensitive(doc, "error"))
        return doc;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(doc, "response");
    if (cJSON_IsObject(r) && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(r, "error")))
        return r;
    const cJSON *choice;
    cJSON_ArrayForEach(choice, cJSON_GetObjectItemCaseSensitive(doc, "choices"))
        if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(choice, "error")))
            return choice;
    return doc;
}

/* The provider's message where error_holder found its error: error.message,
 * error as a string, else a top-level message (vLLM) or detail (FastAPI).
 * NULL when there is none. */
static const char *provider_message(const cJSON *doc)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(doc, "error");
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message")
                   : cJSON_IsString(e) ? e : NULL;
    if (!cJSON_IsString(m))
        m = cJSON_GetObjectItemCaseSensitive(doc, "message");
    if (!cJSON_IsString(m))
        m = cJSON_GetObjectItemCaseSensitive(doc, "detail");
    return cJSON_IsString(m) && m->valuestring[0] ? m->valuestring : NULL;
}

/* Where the error that error_text tells of was. */
typedef enum error_place {
    IN_STATUS,                  /* an HTTP error status (lr_http_error) */
    IN_BODY,                    /* a 2xx body that is an error (lr_body_error_text) */
    IN_STREAM                   /* an event of a 2xx stream (lr_stream_error_text) */
} error_place;

/* The text of an error the server sent in `body` (len bytes; NULL: none):
 * for IN_BODY and IN_STREAM, one standing for HTTP `like`. */
static char *error_text(const llmretry_call *c, const char *body, size_t blen, long status,
                        error_place place, int like, char **error_code)
{
    cJSON *doc = body ? cJSON_ParseWithLength(body, blen) : NULL;
    const cJSON *holder = doc ? error_holder(doc) : NULL;
    const cJSON *e = holder ? cJSON_GetObjectItemCaseSensitive(holder, "error") : NULL;
    const char *said = holder ? provider_message(holder) : NULL;
    req_texts t;
    texts_init(c, &t);
    *error_code = NULL;
    if (cJSON_IsObject(e)) {
        /* The provider's code: error.code when it is a string, else error.type. */
        *error_code = lr_json_str(e, "code");
        if (!*error_code)
            *error_code = lr_json_str(e, "type");
        *error_code = code_checked(&t, *error_code);
    }

    /* At most LR_HTTP_ERROR_MAX bytes: the give-up adds its own text to it. */
    char buf[LR_HTTP_ERROR_MAX + 1];
    const char *path;
    size_t plen;
    lr_url_path(c->url, &path, &plen);
    size_t len = (size_t)snprintf(buf, sizeof buf, "HTTP %ld from ", status);
    len = put_escaped(buf, len, 256, path, plen);
    if (place == IN_BODY)
        len += (size_t)snprintf(buf + len, sizeof buf - len, " whose body is an error (HTTP "
                                "%d-like)", like);
    else if (place == IN_STREAM)
        len += (size_t)snprintf(buf + len, sizeof buf - len, ": the server sent an error "
                                "inside the stream (HTTP %d-like)", like);
    char st[16];
    snprintf(st, sizeof st, "%ld", place != IN_STATUS ? (long)like : status);
    /* No "HTTP 429 (429)": a code that repeats the status says nothing. */
    if (*error_code && strcmp(*error_code, st) != 0) {
        len = put_escaped(buf, len, sizeof buf, " (", 2);
        len = put_escaped(buf, len, sizeof buf, *error_code, strlen(*error_code));
        len = put_escaped(buf, len, sizeof buf, ")", 1);
    }
    if (said) {
        /* What the user needs to fix the request ("Invalid value for
         * 'temperature'"), cut to LR_MESSAGE_MAX bytes, unless the part
         * shown quotes the request. */
        static const char withheld[] =
            ": (the server's message is withheld because it echoes the request)";
        size_t n = strlen(said), shown = n, taken = 0;
        if (shown > LR_MESSAGE_MAX) {
            shown = LR_MESSAGE_MAX;
            while (shown > 0 && ((unsigned char)said[shown] & 0xC0) == 0x80)
                shown--;        /* whole UTF-8 characters */
        }
        size_t before = len;
        int quotes = echoes(&t, said, shown);
        if (!quotes) {
            len = put_escaped(buf, len, sizeof buf - 4, ": \"", 3);
            size_t start = len;
            len = put_escaped_n(buf, len, sizeof buf - 4, said, shown, &taken);
            /* The text as shown is screened too: an escape can make a
             * quote the server did not send (a tab shown as \t before
             * "he harbour plan" quotes "the harbour plan"). */
            quotes = echoes(&t, buf + start, len - start);
        }
        if (quotes) {
            len = before;
            buf[len] = '\0';
            len = put_escaped(buf, len, sizeof buf, withheld, sizeof withheld - 1);
        } else {
            len = put_escaped(buf, len, sizeof buf, taken < n ? "...\"" : "\"", taken < n ? 4 : 1);
        }
    }
    texts_free(&t);
    cJSON_Delete(doc);
    return lr_strdup(buf);
}

char *lr_http_error(const llmretry_call *c, long status, char **error_code)
{
    return error_text(c, c->resp.data ? c->resp.data : "", c->resp.len, status, IN_STATUS, 0,
                      error_code);
}

char *lr_body_error_text(const llmretry_call *c, long status, int like)
{
    char *code = NULL;
    char *text = error_text(c, c->resp.data ? c->resp.data : "", c->resp.len, status, IN_BODY,
                            like, &code);
    free(code);
    return text;
}

char *lr_stream_error_text(const llmretry_call *c, const char *data, size_t len, int like)
{
    char *code = NULL;
    char *text = error_text(c, data, len, lr_call_status(c), IN_STREAM, like, &code);
    free(code);
    return text;
}
