/* One call: building its request from the options, capturing responses
 * within max_response_bytes, and turning a finished transfer into an
 * outcome the policy can judge. Runs on the host thread (lr_call_new) and
 * on the engine thread (everything else). */
#include "engine.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define DEFAULT_BASE_URL "https://api.openai.com/v1"
#define PREVIEW_BYTES 500

static void forget_headers(llmretry_call *c);

/* The URL to call; *is_default says it is OpenAI's because nothing else
 * was given (no url, base_url or $OPENAI_BASE_URL). */
static char *build_url(const llmretry_options *o, int *is_default)
{
    *is_default = 0;
    if (o->url)
        return lr_strdup(o->url);
    const char *base = o->base_url;
    if (!base || !*base)
        base = getenv("OPENAI_BASE_URL");
    if (!base || !*base) {
        base = DEFAULT_BASE_URL;
        *is_default = 1;
    }
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        n--;
    static const char path[] = "/chat/completions";
    char *url = malloc(n + sizeof path);
    if (url) {
        memcpy(url, base, n);
        memcpy(url + n, path, sizeof path);
    }
    return url;
}

/* "model" from the request body, or NULL; *bad_json says the body is not
 * JSON at all (a programming error, reported before any I/O). */
static char *model_from_body(const char *body, size_t len, int *bad_json)
{
    cJSON *doc = cJSON_ParseWithLength(body, len);
    *bad_json = doc == NULL;
    if (!doc)
        return NULL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(doc, "model");
    char *model = cJSON_IsString(m) ? lr_strdup(m->valuestring) : NULL;
    cJSON_Delete(doc);
    return model;
}

static int append_header(struct curl_slist **list, const char *name, const char *value)
{
    size_t n = strlen(name) + strlen(value) + 3;
    char *line = malloc(n);
    if (!line)
        return -1;
    snprintf(line, n, "%s: %s", name, value);
    struct curl_slist *l = curl_slist_append(*list, line);
    free(line);
    if (!l)
        return -1;
    *list = l;
    return 0;
}

/* Did the caller pass a header of this name? */
static int caller_sets(const llmretry_call *c, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < c->o.n_headers; i++)
        if (strncasecmp(c->o.headers[i], name, n) == 0 && c->o.headers[i][n] == ':')
            return 1;
    return 0;
}

/* The caller's "Name: value" as libcurl must get it: "Name:" with nothing
 * but blanks after it would tell libcurl to drop the header (and its own
 * of that name), "Name;" sends it empty. */
static int append_caller_header(struct curl_slist **list, const char *line)
{
    const char *colon = strchr(line, ':');
    const char *v = colon + 1;
    v += strspn(v, " \t");
    struct curl_slist *l;
    if (*v == '\0') {
        char *semi = lr_strndup(line, (size_t)(colon - line) + 1);
        if (!semi)
            return -1;
        semi[colon - line] = ';';
        l = curl_slist_append(*list, semi);
        free(semi);
    } else {
        l = curl_slist_append(*list, line);
    }
    if (!l)
        return -1;
    *list = l;
    return 0;
}

static int build_headers(llmretry_call *c, const char *api_key, int key_from_env)
{
    struct curl_slist *h = NULL;
    int rc = 0;
    /* A key from the environment yields to the caller's own Authorization
     * (one for another provider, say): never two Authorization lines. An
     * explicit api_key with one was refused by llmretry_options_check. */
    if (key_from_env && caller_sets(c, "Authorization"))
        api_key = NULL;
    if (api_key && *api_key) {
        /* The key lives only in this list (and libcurl's copy of the line). */
        size_t n = strlen(api_key) + 32;
        char *line = malloc(n);
        if (!line)
            return -1;
        snprintf(line, n, "Authorization: Bearer %s", api_key);
        h = curl_slist_append(NULL, line);
        explicit_bzero(line, n);
        free(line);
        if (!h)
            return -1;
    }
    if (!caller_sets(c, "Content-Type"))
        rc |= append_header(&h, "Content-Type", "application/json");
    if (!caller_sets(c, "Accept"))
        rc |= append_header(&h, "Accept", "application/json");
    if (!caller_sets(c, "User-Agent"))
        rc |= append_header(&h, "User-Agent", "llmretry/" LLMRETRY_VERSION);
    rc |= append_header(&h, "X-Client-Request-Id", c->request_id);
    if (c->o.idempotency_key)
        rc |= append_header(&h, "Idempotency-Key", c->o.idempotency_key);
    /* An empty Expect stops libcurl waiting for 100-continue on big bodies. */
    struct curl_slist *l = curl_slist_append(h, "Expect:");
    if (l)
        h = l;
    else
        rc = -1;
    for (size_t i = 0; i < c->o.n_headers && rc == 0; i++)
        rc |= append_caller_header(&h, c->o.headers[i]);
    c->headers = h;
    return rc;
}

static void call_destroy(llmretry_call *c)
{
    /* The mailbox is empty here: each queued event held a reference. */
    free(c->url);
    free(c->body);
    free(c->model);
    free(c->policy);
    free(c->ca_file);
    free((void *)c->o.idempotency_key);
    if (c->o.headers) {
        for (size_t i = 0; i < c->o.n_headers; i++)
            free((void *)c->o.headers[i]);
        free((void *)c->o.headers);
    }
    curl_slist_free_all(c->headers);
    forget_headers(c);
    free(c->resp.data);
    free(c->last_message);
    free(c->last_error_code);
    free(c->last_body_preview);
    free(c->v_response_model);
    free(c->v_fingerprint);
    free(c->validate_msg);
    free((void *)c->result.message);
    free((void *)c->result.error_code);
    free((void *)c->result.body_preview);
    free((void *)c->result.response_model);
    free((void *)c->result.system_fingerprint);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    llmretry_engine *e = c->engine;
    if (c->group)
        lr_group_unref(c->group);
    if (c->channel)
        lr_channel_unref(c->channel);
    free(c);
    if (e)
        lr_engine_unref(e);
}

void lr_call_ref(llmretry_call *c)
{
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

void lr_call_unref(llmretry_call *c)
{
    if (c && atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
        call_destroy(c);
}

static int copy_headers(llmretry_call *c, const llmretry_options *opts)
{
    c->o.headers = NULL;
    if (opts->n_headers == 0)
        return 0;
    char **copy = calloc(opts->n_headers, sizeof *copy);
    if (!copy)
        return -1;
    c->o.headers = (const char *const *)copy;
    for (size_t i = 0; i < opts->n_headers; i++)
        if (!(copy[i] = lr_strdup(opts->headers[i])))
            return -1;
    return 0;
}

llmretry_status lr_call_new(llmretry_engine *e, const llmretry_options *opts,
                            unsigned flags, llmretry_call **out, char *err, size_t errlen)
{
    llmretry_status st = llmretry_options_check(opts, err, errlen);
    if (st != LLMRETRY_OK)
        return st;
    if (opts->group && opts->group->engine != e) {
        lr_errf(err, errlen, "group belongs to another engine");
        return LLMRETRY_EINVAL;
    }
    llmretry_call *c = calloc(1, sizeof *c);
    if (!c)
        return LLMRETRY_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&c->refs, 1);
    c->engine = e;                  /* the engine reference is taken by the caller */
    c->flags = flags;
    c->o = *opts;
    c->o.url = c->o.base_url = c->o.api_key = c->o.body = c->o.model = NULL;
    c->o.request_id = c->o.idempotency_key = c->o.policy = c->o.ca_file = NULL;
    c->o.n_headers = opts->n_headers;
    c->last_retry_after_ms = -1;
    c->deadline_at = -1;

    int bad_json = 0, no_key = 0, default_url = 0;
    int oom = 0;
    c->url = build_url(opts, &default_url);
    c->body = lr_strndup(opts->body, opts->body_len);
    oom |= !c->url || !c->body;
    if (opts->model)
        oom |= !(c->model = lr_strdup(opts->model));
    else if (!oom)
        c->model = model_from_body(opts->body, opts->body_len, &bad_json);
    if (opts->policy)
        oom |= !(c->policy = lr_strdup(opts->policy));
    if (opts->ca_file)
        oom |= !(c->ca_file = lr_strdup(opts->ca_file));
    if (opts->idempotency_key)
        oom |= !(c->o.idempotency_key = lr_strdup(opts->idempotency_key));
    oom |= copy_headers(c, opts) != 0;
    if (opts->request_id)
        snprintf(c->request_id, sizeof c->request_id, "%s", opts->request_id);
    else if (lr_uuid4(c->request_id) != 0)
        oom = 1;

    if (!oom && !bad_json) {
        c->o.body = c->body;
        c->o.body_len = opts->body_len;
        c->o.model = c->model;
        c->o.policy = c->policy;
        c->o.ca_file = c->ca_file;
        c->o.url = c->url;
        const char *key = opts->api_key;
        int from_env = 0;
        if (!key && opts->use_env_api_key) {
            key = getenv("OPENAI_API_KEY");
            from_env = 1;
        }
        oom |= build_headers(c, key, from_env) != 0;
        /* OpenAI's endpoint without a key can only answer 401 (or, offline,
         * fail to resolve, retried for seconds): say what is missing now. */
        no_key = default_url && !(key && *key) && !caller_sets(c, "Authorization");
    }
    int bad_scheme = c->url && strncasecmp(c->url, "http://", 7) != 0
                     && strncasecmp(c->url, "https://", 8) != 0;
    /* Before any I/O: else each attempt fails as a TLS verification error. */
    int ca_errno = c->ca_file && access(c->ca_file, R_OK) != 0 ? errno : 0;
    c->is_https = c->url && strncasecmp(c->url, "https://", 8) == 0;
    if (oom || bad_json || bad_scheme || no_key || ca_errno) {
        c->engine = NULL;
        lr_call_unref(c);
        if (no_key && !oom) {
            lr_errf(err, errlen, "%s: %s needs a key (or set base_url for another server)",
                    opts->use_env_api_key ? "api_key is not set and OPENAI_API_KEY is empty or unset"
                                          : "api_key is not set (and use_env_api_key is off, so "
                                            "OPENAI_API_KEY is not read)", DEFAULT_BASE_URL);
            return LLMRETRY_EINVAL;
        }
        if (bad_json) {
            lr_errf(err, errlen, "body is not valid JSON");
            return LLMRETRY_EINVAL;
        }
        if (bad_scheme) {
            lr_errf(err, errlen, "%s must start with http:// or https://",
                    opts->url ? "url" : opts->base_url ? "base_url" : "OPENAI_BASE_URL");
            return LLMRETRY_EINVAL;
        }
        if (ca_errno) {
            lr_errf(err, errlen, "ca_file cannot be read: %s: %s", opts->ca_file,
                    strerror(ca_errno));
            return LLMRETRY_EINVAL;
        }
        return LLMRETRY_ENOMEM;
    }
    c->submitted_at = lr_mono_ms();
    if (opts->deadline_ms != LLMRETRY_NO_DEADLINE)
        c->deadline_at = c->submitted_at + opts->deadline_ms;
    if (opts->group) {
        /* No item of a batch runs past the batch's deadline. */
        c->group = opts->group;
        atomic_fetch_add_explicit(&c->group->refs, 1, memory_order_relaxed);
        if (c->group->deadline_at >= 0 &&
            (c->deadline_at < 0 || c->group->deadline_at < c->deadline_at))
            c->deadline_at = c->group->deadline_at;
    }
    *out = c;
    return LLMRETRY_OK;
}

/* ---- response capture ------------------------------------------------- */

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    llmretry_call *c = ud;
    size_t n = size * nmemb;
    if ((int64_t)(c->resp.len + n) > c->o.max_response_bytes) {
        c->too_large = 1;
        return 0;                   /* aborts the transfer: CURLE_WRITE_ERROR */
    }
    if (c->resp.len + n + 1 > c->resp.cap) {
        size_t cap = c->resp.cap ? c->resp.cap : 1024;
        while (cap < c->resp.len + n + 1)
            cap *= 2;
        char *p = realloc(c->resp.data, cap);
        if (!p)
            return 0;
        c->resp.data = p;
        c->resp.cap = cap;
    }
    memcpy(c->resp.data + c->resp.len, data, n);
    c->resp.len += n;
    return n;
}

static const char *const captured_names[LR_H_COUNT] = {
    "retry-after", "retry-after-ms", "x-should-retry",
    "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens",
};

static const char *hdr_value(const llmretry_call *c, int i)
{
    return c->hdr_long[i] ? c->hdr_long[i] : c->hdr[i];
}

static void forget_headers(llmretry_call *c)
{
    for (int i = 0; i < LR_H_COUNT; i++) {
        free(c->hdr_long[i]);
        c->hdr_long[i] = NULL;
        c->hdr_set[i] = 0;
    }
}

/* The wait a captured header asks for (ms), -1 when none or unusable. */
static int64_t wait_of(int i, const char *v, int64_t now_unix_ms)
{
    switch (i) {
    case LR_H_RETRY_AFTER: return llmretry_parse_retry_after(v, now_unix_ms);
    case LR_H_RETRY_AFTER_MS: return llmretry_parse_retry_after_ms(v);
    case LR_H_RESET_REQUESTS: case LR_H_RESET_TOKENS: return llmretry_parse_reset_duration(v);
    default: return -1;
    }
}

/* Keep header i's whole value: the policy must parse what the server sent,
 * not a prefix of it ("0.3" and 400 spaces and "garbage" is garbage, not
 * 300 ms). Short values stay in the call record; long ones, rare, on the
 * heap. When a wait header comes twice with different values, the longest
 * usable wait wins: the server asked for at least that. */
static void capture(llmretry_call *c, int i, const char *v, size_t len)
{
    char small[LR_HVAL];
    char *big = NULL;
    const char *val = small;
    if (len < LR_HVAL) {
        memcpy(small, v, len);
        small[len] = '\0';
    } else if ((big = lr_strndup(v, len)) != NULL) {
        val = big;
    } else {
        small[0] = '\0';           /* out of memory: unusable, like garbage */
    }
    if (c->hdr_set[i] && i != LR_H_SHOULD_RETRY) {
        int64_t now = lr_unix_ms();
        if (wait_of(i, val, now) <= wait_of(i, hdr_value(c, i), now)) {
            free(big);
            return;
        }
    }
    free(c->hdr_long[i]);
    c->hdr_long[i] = big;
    if (!big)
        memcpy(c->hdr[i], small, strlen(small) + 1);
    c->hdr_set[i] = 1;
}

/* "HTTP/1.1 103 Early Hints" -> 1 for a 1xx status line. */
static int is_interim(const char *line, size_t n)
{
    const char *sp = memchr(line, ' ', n);
    return sp && (size_t)(sp - line) + 1 < n && sp[1] == '1';
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *ud)
{
    llmretry_call *c = ud;
    size_t n = size * nmemb;
    if (n >= 5 && memcmp(line, "HTTP/", 5) == 0) {
        /* A new response (after a 100 Continue, say): forget the last. */
        forget_headers(c);
        c->interim = is_interim(line, n);
        return n;
    }
    const char *colon = memchr(line, ':', n);
    if (!colon)
        return n;
    size_t name_len = (size_t)(colon - line);
    /* A 1xx response has no body: its Content-Length (if any) says nothing
     * about the final response's size. */
    if (name_len == 14 && strncasecmp(line, "content-length", 14) == 0 && !c->interim) {
        /* Refuse an announced oversized body before reading any of it.
         * The line is not NUL-terminated: parse a bounded copy. 31 digits
         * still saturate strtoll, so a cut value stays oversized. */
        const char *v = colon + 1, *end = line + n;
        char num[32];
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        size_t len = (size_t)(end - v) < sizeof num - 1 ? (size_t)(end - v) : sizeof num - 1;
        memcpy(num, v, len);
        num[len] = '\0';
        long long cl = strtoll(num, NULL, 10);
        if (cl > c->o.max_response_bytes) {
            c->too_large = 1;
            return 0;
        }
        return n;
    }
    for (int i = 0; i < LR_H_COUNT; i++) {
        if (strlen(captured_names[i]) != name_len || strncasecmp(line, captured_names[i], name_len) != 0)
            continue;
        const char *v = colon + 1, *end = line + n;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        while (end > v && isspace((unsigned char)end[-1]))
            end--;
        capture(c, i, v, (size_t)(end - v));
    }
    return n;
}

/* One attempt must be one request, with few exceptions: re-sends of a
 * request that provably never reached the server, or (safe mode only) of
 * one on a reused connection that died before any byte came back. libcurl
 * re-sends the latter kinds on its own; on_prereq sees each request it
 * begins and lets attempt.c (lr_resend_allowed) decide: allowed, it is a
 * free re-send (no attempt, no backoff); refused, the transfer aborts and
 * the policy sees a failed attempt. */
#if LIBCURL_VERSION_NUM >= 0x075000
/* Bytes waiting (or EOF) on the idle HTTP/1.1 connection libcurl is about
 * to send on: an answer to nothing, which libcurl 7.88 would read as this
 * request's response (and every later answer would be one off). Only for
 * plain http, which this engine speaks as HTTP/1.1 only: over TLS the
 * socket's bytes may be OpenSSL's or an HTTP/2 connection's frames. */
static int connection_is_stale(llmretry_call *c, int local_port, int remote_port)
{
    long new_connections = 1;
    if (c->is_https || curl_easy_getinfo(c->easy, CURLINFO_NUM_CONNECTS, &new_connections) != CURLE_OK
        || new_connections != 0)
        return 0;               /* a new connection has had no time to go stale */
    curl_socket_t fd = lr_socktab_find(&c->engine->socks, local_port, remote_port);
    if (fd == CURL_SOCKET_BAD)
        return 0;
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* The number after `key` in a line of libcurl's text, or 0. */
static unsigned long text_number(const char *data, size_t size, const char *key)
{
    size_t kl = strlen(key);
    const char *p = memmem(data, size, key, kl);
    if (!p)
        return 0;
    unsigned long n = 0;
    for (p += kl; p < data + size && *p >= '0' && *p <= '9'; p++)
        n = n * 10 + (unsigned long)(*p - '0');
    return n;
}

/* libcurl tells what makes an HTTP/2 re-send free only in its informational
 * text (7.88 and 8.x): "REFUSED_STREAM", the stream id it uses ("Using
 * Stream ID: N") and a GOAWAY's last-stream-id ("GOAWAY, error=E,
 * last_stream=N"), which holds for the connection the frame came on: the
 * one this call's request went out on. Nothing of the text is kept. */
static int on_debug(CURL *easy, curl_infotype type, char *data, size_t size, void *ud)
{
    llmretry_call *c = ud;
    (void)easy;
    if (type != CURLINFO_TEXT)
        return 0;
    static const char refused[] = "REFUSED_STREAM";
    if (memmem(data, size, refused, sizeof refused - 1))
        c->saw_refused = 1;
    unsigned long id = text_number(data, size, "Using Stream ID: ");
    if (id)
        c->h2_stream = id;
    if (memmem(data, size, "GOAWAY", 6) && memmem(data, size, "last_stream=", 12))
        lr_goaway_note(c->engine, c->conn_lport, c->conn_rport,
                       text_number(data, size, "last_stream="));
    return 0;
}

/* A re-send after the connection of the request died: was the request's
 * stream above the last one a GOAWAY on that connection let through? */
static int refused_by_goaway(llmretry_call *c)
{
    unsigned long last;
    return c->h2_stream && lr_goaway_find(c->engine, c->conn_lport, c->conn_rport, &last) &&
           c->h2_stream > last;
}

/* libcurl calls this before each request it begins, after the connection
 * is chosen. (With POSTFIELDS a small body leaves with the headers.) */
static int on_prereq(void *ud, char *primary_ip, char *local_ip, int primary_port, int local_port)
{
    llmretry_call *c = ud;
    (void)primary_ip;
    (void)local_ip;
    if (c->prereq_calls++ > 0) {
        /* Judged on the last request's connection and stream, below. */
        /* libcurl's own re-send: it re-sends only what got no byte back. */
        lr_resend_why why = c->saw_refused || refused_by_goaway(c) ? LR_RESEND_REFUSED
                                                                    : LR_RESEND_REUSED_DIED;
        if (!lr_resend_allowed(c, why)) {
            c->resend_refused = why;
            return CURL_PREREQFUNC_ABORT;
        }
    }
    c->saw_refused = 0;
    c->h2_stream = 0;
    c->conn_lport = local_port;
    c->conn_rport = primary_port;
    long new_connections = 0;
    if (curl_easy_getinfo(c->easy, CURLINFO_NUM_CONNECTS, &new_connections) == CURLE_OK &&
        new_connections > 0)
        lr_goaway_forget(c->engine, local_port, primary_port);   /* ports reused */
    if (connection_is_stale(c, local_port, primary_port)) {
        /* Abort before sending (libcurl closes a connection whose transfer
         * a callback aborted); attempt.c re-sends on a fresh one. */
        c->resend_pending = LR_RESEND_STALE;
        return CURL_PREREQFUNC_ABORT;
    }
    return CURL_PREREQFUNC_OK;
}

static void set_body(llmretry_call *c, CURL *easy)
{
    c->prereq_calls = 0;
    c->saw_refused = 0;
    c->h2_stream = 0;
    c->resend_pending = c->resend_refused = LR_RESEND_NONE;
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, c->body);
    curl_easy_setopt(easy, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(easy, CURLOPT_PREREQDATA, c);
    if (!c->is_https) {
        lr_socktab_attach(&c->engine->socks, easy);
    } else {
        /* HTTP/2 only happens over TLS here. */
        curl_easy_setopt(easy, CURLOPT_DEBUGFUNCTION, on_debug);
        curl_easy_setopt(easy, CURLOPT_DEBUGDATA, c);
        curl_easy_setopt(easy, CURLOPT_VERBOSE, 1L);
    }
}
#else
/* Older libcurl: send through a read callback that cannot rewind, so the
 * re-send fails with CURLE_SEND_FAIL_REWIND instead. */
static size_t on_send(char *buf, size_t size, size_t nitems, void *ud)
{
    llmretry_call *c = ud;
    size_t n = size * nitems, left = c->o.body_len - c->send_pos;
    if (n > left)
        n = left;
    memcpy(buf, c->body + c->send_pos, n);
    c->send_pos += n;
    return n;
}

static int refuse_rewind(void *ud, curl_off_t offset, int origin)
{
    (void)ud;
    (void)offset;
    (void)origin;
    return CURL_SEEKFUNC_CANTSEEK;
}

static void set_body(llmretry_call *c, CURL *easy)
{
    c->send_pos = 0;
    curl_easy_setopt(easy, CURLOPT_READFUNCTION, on_send);
    curl_easy_setopt(easy, CURLOPT_READDATA, c);
    curl_easy_setopt(easy, CURLOPT_SEEKFUNCTION, refuse_rewind);
    curl_easy_setopt(easy, CURLOPT_SEEKDATA, c);
}
#endif

void lr_call_setup_resend(llmretry_call *c, int64_t timeout_ms)
{
    lr_call_reset_response(c);
    set_body(c, c->easy);
    curl_easy_setopt(c->easy, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(c->easy, CURLOPT_FRESH_CONNECT, 1L);
}

void lr_call_reset_response(llmretry_call *c)
{
    c->resp.len = 0;
    c->too_large = 0;
    c->curl_err[0] = '\0';
    c->interim = 0;
    forget_headers(c);
}

void lr_call_setup_easy(llmretry_call *c, CURL *easy, int64_t timeout_ms)
{
    lr_call_reset_response(c);
    curl_easy_setopt(easy, CURLOPT_URL, c->url);
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->o.body_len);
    set_body(c, easy);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, c->curl_err);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
#if LIBCURL_VERSION_NUM >= 0x075700
    /* Ending a transfer that is still resolving (timeout, cancel, engine
     * shutdown) would otherwise join the threaded resolver, stalling the
     * I/O thread and so every call until getaddrinfo gives up. With this
     * the resolver thread is left to finish on its own. */
    curl_easy_setopt(easy, CURLOPT_QUICK_EXIT, 1L);
#endif
    curl_easy_setopt(easy, CURLOPT_PRIVATE, c);
    /* Never follow redirects: the key must not reach another host. */
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
    /* Over TLS, waiting for the first connection's ALPN lets calls share
     * one HTTP/2 connection. Plain http is HTTP/1.1 only, where waiting
     * would queue every call behind the first response. */
    if (c->is_https)
        curl_easy_setopt(easy, CURLOPT_PIPEWAIT, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    if (c->ca_file)
        curl_easy_setopt(easy, CURLOPT_CAINFO, c->ca_file);
}

/* ---- reading an outcome ------------------------------------------------ */

static char *preview_of(const char *data, size_t len)
{
    if (!data || len == 0)
        return NULL;
    if (len > PREVIEW_BYTES) {
        len = PREVIEW_BYTES;
        /* Cut on a UTF-8 boundary so hosts can decode the preview. */
        while (len > 0 && ((unsigned char)data[len] & 0xC0) == 0x80)
            len--;
    }
    return lr_strndup(data, len);
}

static char *printf_alloc(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *printf_alloc(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return lr_strdup(buf);
}

static void classify_transport(llmretry_call *c, CURLcode rc, lr_outcome *out)
{
    llmretry_failure *f = &out->f;
    const char *detail = c->curl_err[0] ? c->curl_err : curl_easy_strerror(rc);
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        f->kind = c->cut_by_deadline ? LLMRETRY_ERR_DEADLINE_EXCEEDED : LLMRETRY_ERR_TIMEOUT;
        out->message = printf_alloc("%s: %s",
                                    c->cut_by_deadline ? "deadline reached during the attempt"
                                                       : "attempt timed out", detail);
        break;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
        f->kind = LLMRETRY_ERR_NETWORK;
        f->never_connected = 1;
        out->message = printf_alloc("could not connect: %s", detail);
        break;
    case CURLE_SSL_CONNECT_ERROR:
        if (strstr(detail, "wrong version number")) {
            /* TLS to a port that answers in plain text: retrying cannot help. */
            f->kind = LLMRETRY_ERR_NETWORK;
            f->fatal = 1;
            out->message = printf_alloc("TLS handshake failed (not retried): the server does "
                                        "not speak TLS on this port (an http:// URL?): %s",
                                        detail);
        } else {
            f->kind = LLMRETRY_ERR_NETWORK;
            out->message = printf_alloc("network error: %s", detail);
        }
        break;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_ISSUER_ERROR:
        f->kind = LLMRETRY_ERR_NETWORK;
        f->fatal = 1;
        out->message = printf_alloc("TLS verification failed (not retried): %s", detail);
        break;
    case CURLE_URL_MALFORMAT:
        f->kind = LLMRETRY_ERR_NETWORK;
        f->fatal = 1;
        f->never_connected = 1;
        out->message = printf_alloc("bad URL (not retried): %s", detail);
        break;
    case CURLE_ABORTED_BY_CALLBACK:
        /* Only on_prereq aborts, before a re-send lr_resend_allowed refused. */
        f->kind = LLMRETRY_ERR_NETWORK;
        if (c->resend_refused == LR_RESEND_REUSED_DIED && c->o.retry_mode == LLMRETRY_RETRY_UNSAFE)
            out->message = printf_alloc("connection closed before a response (the server may "
                                        "have read the request: retry_mode=unsafe does not "
                                        "send it again)");
        else if (c->resend_refused == LR_RESEND_REUSED_DIED)
            out->message = printf_alloc("connection lost before a response (the request may "
                                        "have reached the server)");
        else {
            /* Refused streams or stale connections, past LR_MAX_RESENDS:
             * the request never reached the server. */
            f->never_connected = 1;
            out->message = printf_alloc(c->resend_refused == LR_RESEND_STALE
                                        ? "every idle connection had unread bytes (%d tries); "
                                          "the request was not sent"
                                        : "the server refused the request %d times without "
                                          "processing it", LR_MAX_RESENDS + 1);
        }
        break;
    case CURLE_WRITE_ERROR:
        if (c->too_large) {
            f->kind = LLMRETRY_ERR_RESPONSE_TOO_LARGE;
            out->message = printf_alloc("response larger than max_response_bytes (%lld)",
                                        (long long)c->o.max_response_bytes);
            break;
        }
        /* out of memory while reading: a network-ish failure */
        __attribute__((fallthrough));
    default:
        f->kind = LLMRETRY_ERR_NETWORK;
        out->message = printf_alloc("network error: %s", detail);
        break;
    }
}

void lr_call_read_outcome(llmretry_call *c, CURLcode rc, lr_outcome *out)
{
    memset(out, 0, sizeof *out);
    out->duration_ms = lr_mono_ms() - c->attempt_started_at;
    long status = 0;
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &status);
    out->f.status = (int)status;
    if (rc != CURLE_OK) {
        classify_transport(c, rc, out);
    } else if (status >= 200 && status < 300) {
        /* The body must be UTF-8 JSON, as every host decodes it. */
        cJSON *doc = lr_parse_body(c->resp.data ? c->resp.data : "", c->resp.len);
        if (doc && cJSON_IsObject(doc)) {
            out->success = 1;
            lr_read_success(doc, &out->usage, &out->response_model, &out->fingerprint);
        } else {
            out->f.kind = LLMRETRY_ERR_INVALID_RESPONSE;
            out->message = printf_alloc("HTTP %ld with a body that is not a UTF-8 JSON object",
                                        status);
        }
        cJSON_Delete(doc);
    } else {
        out->f.kind = LLMRETRY_ERR_HTTP_STATUS;
        out->message = lr_http_error(c, status, &out->error_code);
        out->f.error_code = out->error_code;
    }
    const char **slots[LR_H_COUNT] = {
        &out->f.retry_after, &out->f.retry_after_ms, &out->f.should_retry,
        &out->f.ratelimit_reset_requests, &out->f.ratelimit_reset_tokens,
    };
    for (int i = 0; i < LR_H_COUNT; i++)
        *slots[i] = c->hdr_set[i] ? hdr_value(c, i) : NULL;
}

void lr_outcome_clear(lr_outcome *o)
{
    free(o->message);
    free(o->response_model);
    free(o->fingerprint);
    free(o->error_code);
    memset(o, 0, sizeof *o);
}

char *lr_call_preview(const llmretry_call *c)
{
    return preview_of(c->resp.data, c->resp.len);
}
