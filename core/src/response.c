/* What the server sent, judged once for every host: whether a 2xx body is
 * a valid body (UTF-8 JSON), its token usage, and the text of an HTTP
 * error: the path called, the provider's code and message, escaped so a
 * hostile server cannot forge log lines. The server's text is screened
 * first (lr_error_code_checked, echoes): a code shows only as a short
 * token, and neither it nor the message may quote the request (servers
 * echo it: "... for <prompt>") or a credential; errors never show those.
 * Engine thread only. */
#include "internal.h"
#include "json_pull.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

/* The bytes a string's text can hold as they are: ASCII from 0x20 on,
 * but not '"' (0x22) or '\\' (0x5C). Looked up in one step in
 * json_text_problem's inner loop: every answer's body is scanned on the
 * I/O thread, and most of a body is string text. */
#define LR_X16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v
static const unsigned char str_plain[256] = {
    LR_X16(0), LR_X16(0),                                   /* 0x00-0x1F: controls */
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,         /* 0x20-0x2F: '"' */
    LR_X16(1), LR_X16(1),                                   /* 0x30-0x4F */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,         /* 0x50-0x5F: '\\' */
    LR_X16(1), LR_X16(1),                                   /* 0x60-0x7F */
    LR_X16(0), LR_X16(0), LR_X16(0), LR_X16(0),             /* 0x80-0xFF: UTF-8, */
    LR_X16(0), LR_X16(0), LR_X16(0), LR_X16(0),             /* checked below */
};
#undef LR_X16

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
        if (in_string) {
            while (i < n && str_plain[s[i]])
                i++;
            if (i == n)
                break;
        }
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
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    /* cJSON stops at the value's end: "{} {}" (JSON Lines) is not one value. */
    while (doc && end < text + n && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
        end++;
    if (doc && end != text + n) {
        cJSON_Delete(doc);
        doc = NULL;
    }
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
        /* The Responses API says input_tokens / output_tokens. */
        int chat = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens") ||
                   cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        usage->prompt_tokens = json_count(u, chat ? "prompt_tokens" : "input_tokens");
        usage->completion_tokens = json_count(u, chat ? "completion_tokens" : "output_tokens");
        /* Some servers send only the parts (an embeddings answer's
         * prompt_tokens): the total is then their sum, not 0. */
        usage->total_tokens = cJSON_GetObjectItemCaseSensitive(u, "total_tokens")
            ? json_count(u, "total_tokens")
            : usage->prompt_tokens + usage->completion_tokens;
    }
    *model = json_str(doc, "model");
    *fingerprint = json_str(doc, "system_fingerprint");
}

/* Does the key read at k name `name`? As cJSON compares: the decoded key
 * up to its first U+0000. Our names are short: a longer key is not one. */
static int key_is(const lr_jp_str *k, const char *name, size_t name_len)
{
    if (!k->escaped)
        return k->len == name_len && memcmp(k->raw, name, name_len) == 0;
    char buf[32];
    return lr_jp_decode(k, buf, sizeof buf) == name_len && memcmp(buf, name, name_len) == 0;
}

/* The object at j->p ('{'), checked to its '}': for each of the n names,
 * where its first member's value starts (NULL if none), as
 * cJSON_GetObjectItemCaseSensitive finds the first. 0, or -1 when the
 * object is not JSON. One pass: the body's check and its reading. */
static int find_members(lr_jp *j, const char *const *names, const char **at, size_t n)
{
    size_t lens[8];
    for (size_t i = 0; i < n; i++) {
        at[i] = NULL;
        lens[i] = strlen(names[i]);
    }
    if (lr_jp_enter(j) != 0)
        return -1;
    lr_jp_ws(j);
    if (lr_jp_peek(j) == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        lr_jp_str key;
        if (lr_jp_peek(j) != '"' || lr_jp_string(j, &key) != 0)
            return -1;
        lr_jp_ws(j);
        if (lr_jp_peek(j) != ':')
            return -1;
        j->p++;
        lr_jp_ws(j);
        for (size_t i = 0; i < n; i++)
            if (!at[i] && key_is(&key, names[i], lens[i])) {
                at[i] = j->p;
                break;
            }
        if (lr_jp_skip(j) != 0)
            return -1;
        lr_jp_ws(j);
        char c = lr_jp_peek(j);
        if (c != '}' && c != ',')
            return -1;
        j->p++;
        if (c == '}')
            return 0;
        lr_jp_ws(j);
    }
}

/* json_count for a value at v (NULL: missing). */
static int64_t count_at(const char *v, const char *end)
{
    double d;
    lr_jp j;
    if (!v || !(*v == '-' || (*v >= '0' && *v <= '9')))
        return 0;
    lr_jp_init(&j, v, (size_t)(end - v));
    if (lr_jp_number(&j, &d) != 0)
        return 0;
    if (!(d >= 0.0 && d <= 9007199254740992.0))  /* also NaN */
        return 0;
    int64_t count = (int64_t)d;
    return (double)count == d ? count : 0;
}

/* json_str for a value at v: its decoded text up to a first U+0000. */
static char *str_at(const char *v, const char *end)
{
    lr_jp j;
    lr_jp_str s;
    if (!v || *v != '"')
        return NULL;
    lr_jp_init(&j, v, (size_t)(end - v));
    lr_jp_string(&j, &s);
    size_t len = s.escaped ? lr_jp_decode(&s, NULL, 0) : s.len;
    char *out = malloc(len + 1);
    if (!out)
        return NULL;
    if (s.escaped)
        lr_jp_decode(&s, out, len + 1);
    else
        memcpy(out, s.raw, len), out[len] = '\0';
    return out;
}

int lr_read_body(const char *text, size_t n, const char **why, llmretry_usage *usage,
                 char **model, char **fingerprint)
{
    *model = *fingerprint = NULL;
    const char *end = text + n;
    lr_jp j;
    lr_jp_init(&j, text, n);
    if (n >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        j.p += 3;                   /* a UTF-8 byte-order mark, as cJSON skips it */
    lr_jp_ws(&j);
    static const char *const top[] = { "usage", "model", "system_fingerprint" };
    const char *at[3];
    int object = lr_jp_peek(&j) == '{';
    int bad = object ? find_members(&j, top, at, 3) != 0 : lr_jp_skip(&j) != 0;
    lr_jp_ws(&j);
    /* Strict JSON holds to every rule of json_text_problem but the depth:
     * that scan runs only to say why a body is refused. */
    if (bad || j.p != end || j.max_depth > LLMRETRY_MAX_BODY_DEPTH) {
        *why = json_text_problem(text, n);
        if (!*why)
            *why = "is not JSON";
        return -1;
    }
    if (!object) {
        *why = "is not a JSON object";
        return -1;
    }
    if (at[0] && *at[0] == '{') {
        /* as lr_read_success reads a usage object, member for member */
        static const char *const names[] = { "prompt_tokens", "completion_tokens",
                                             "input_tokens", "output_tokens", "total_tokens" };
        const char *u[5];
        lr_jp_init(&j, at[0], (size_t)(end - at[0]));
        find_members(&j, names, u, 5);
        usage->present = 1;
        int chat = u[0] || u[1];
        usage->prompt_tokens = count_at(chat ? u[0] : u[2], end);
        usage->completion_tokens = count_at(chat ? u[1] : u[3], end);
        usage->total_tokens = u[4] ? count_at(u[4], end)
                                   : usage->prompt_tokens + usage->completion_tokens;
    }
    *model = str_at(at[1], end);
    *fingerprint = str_at(at[2], end);
    return 0;
}

/* Append s (n bytes) to out (room for cap bytes with the NUL), escaping
 * control characters, DEL and bytes that are not UTF-8 as \n, \r, \t or
 * \xNN: a server's text must not start a new log line or break a host's
 * decoder. Whole characters only; returns the new length, and in *taken
 * (when non-NULL) how many bytes of s it holds. */
static size_t put_escaped_n(char *out, size_t len, size_t cap, const char *s, size_t n,
                            size_t *taken)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
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

/* Is a header of this name a credential (Authorization, api-key,
 * x-goog-api-key, a token, a cookie)? Other headers (an organization, a
 * title) are not secrets, and a message naming them helps. */
static int credential_header(const char *name, size_t n)
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

/* The texts of c's request an error must not quote: the strings of its
 * messages (and the Responses API's input and instructions, the
 * completions prompt, a system text) and its credential headers' values
 * (after a scheme such as "Bearer "). */
static void texts_init(const llmretry_call *c, req_texts *t)
{
    static const char *const keys[] = { "messages", "input", "instructions", "prompt",
                                        "system" };
    memset(t, 0, sizeof *t);
    t->doc = c->body ? cJSON_ParseWithLength(c->body, c->o.body_len) : NULL;
    if (c->body && !t->doc)
        texts_add(t, c->body, c->o.body_len, 0);    /* not JSON (a C caller's): all of it */
    for (size_t k = 0; t->doc && k < sizeof keys / sizeof *keys; k++)
        texts_add_strings(t, cJSON_GetObjectItemCaseSensitive(t->doc, keys[k]));
    for (const struct curl_slist *h = c->headers; h; h = h->next) {
        const char *colon = strchr(h->data, ':');
        if (!colon || !credential_header(h->data, (size_t)(colon - h->data)))
            continue;
        const char *v = colon + 1 + strspn(colon + 1, " \t");
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

/* The provider's message in an error body: error.message (OpenAI and
 * alike), error as a string, else a top-level message (vLLM) or detail
 * (FastAPI). NULL when there is none. */
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
    const char *said = doc ? provider_message(doc) : NULL;
    req_texts t;
    texts_init(c, &t);
    *error_code = NULL;
    if (cJSON_IsObject(e)) {
        /* The provider's code: error.code when it is a string, else error.type. */
        *error_code = json_str(e, "code");
        if (!*error_code)
            *error_code = json_str(e, "type");
        *error_code = code_checked(&t, *error_code);
    }

    /* At most LR_HTTP_ERROR_MAX bytes: the give-up adds its own text to it. */
    char buf[LR_HTTP_ERROR_MAX + 1];
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
        if (echoes(&t, said, shown)) {
            len = put_escaped(buf, len, sizeof buf, withheld, sizeof withheld - 1);
        } else {
            len = put_escaped(buf, len, sizeof buf - 4, ": \"", 3);
            len = put_escaped_n(buf, len, sizeof buf - 4, said, shown, &taken);
            len = put_escaped(buf, len, sizeof buf, taken < n ? "...\"" : "\"", taken < n ? 4 : 1);
        }
    }
    texts_free(&t);
    cJSON_Delete(doc);
    return lr_strdup(buf);
}
