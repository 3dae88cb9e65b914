/* An attempt on the wire: setting up the easy handle, capturing the
 * response (body within max_response_bytes, the headers the policy reads),
 * sending the body, and telling libcurl's own re-sends apart: a refused
 * stream or a request that never left its connection is re-sent at once,
 * for free (attempt.c decides), anything else ends the attempt. Engine
 * thread. */
#include "engine.h"
#include "stream.h"

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

/* ---- response capture ------------------------------------------------- */

/* A 2xx text/event-stream answer is read as a stream (stream.c). */
static int streams_now(llmretry_call *c)
{
    if (c->st && c->st->active)
        return 1;
    if (!c->sse)
        return 0;
    long status = lr_call_status(c);
    return status >= 200 && status < 300 ? 1 : 0;
}

long lr_call_status(const llmretry_call *c)
{
    if (c->hx)
        return lr_host_status(c);
    long status = 0;
    if (c->easy)
        curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

/* At a 2xx's first body bytes, what they open decides whether it is an
 * event stream, whatever its Content-Type said (c->sse): a JSON text is
 * not one (a proxy labelling every answer text/event-stream), an event
 * stream is one (a gateway rewriting its label to application/json). The
 * openai SDK reads either by what it asked for, not by the label; read
 * by the label, the first was a stream of no event, the second a body
 * that is not JSON, each retried to the end. Other bytes: the label. */
static void judge_label(llmretry_call *c, const char *data, size_t n)
{
    int json = llmretry_json_text_opens(data, n);
    if (json ? !c->sse : c->sse || !lr_sse_opens(data, n))
        return;                     /* the label says what the bytes do */
    long status = lr_call_status(c);
    if (status >= 200 && status < 300)
        c->sse = !json;
}

/* White space alone says nothing of what a body is (JSON may open with it,
 * and before any field an event stream's blank lines dispatch nothing). */
static int all_space(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r' && p[i] != '\n')
            return 0;
    return 1;
}

size_t lr_call_on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    llmretry_call *c = ud;
    size_t n = size * nmemb;
    c->body_begun = 1;              /* the head is complete (keep_head_line) */
    /* The label is judged by the first bytes that are not white space, which
     * may come in a later chunk (a gateway's blank keep-alive first). */
    if (!c->o.raw_response && !(c->st && c->st->active) && all_space(c->resp.data, c->resp.len)) {
        if (all_space(data, n)) {
            if (streams_now(c))
                return n;           /* the stream begins with its first field */
        } else {
            judge_label(c, data, n);
            if (streams_now(c))
                c->resp.len = 0;    /* the blank lines held under another label */
        }
    }
    if (streams_now(c)) {
        if (!(c->st && c->st->active) && lr_stream_begin(c) != 0)
            return 0;               /* out of memory: a network-ish failure */
        return lr_stream_write(c, data, n);
    }
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

#define PROVIDER_PREFIX "llm_provider-"
#define PROVIDER_PREFIX_LEN (sizeof PROVIDER_PREFIX - 1)

/* The response headers a call keeps (LR_H_*'s order), with their lengths. */
#define CAPTURED(name) { name, sizeof(name) - 1 }
static const struct { const char *name; size_t len; } captured[LR_H_COUNT] = {
    CAPTURED("retry-after"), CAPTURED("retry-after-ms"), CAPTURED("x-should-retry"),
    CAPTURED("x-ratelimit-reset-requests"), CAPTURED("x-ratelimit-reset-tokens"),
    CAPTURED("x-ratelimit-limit-requests"), CAPTURED("x-ratelimit-limit-tokens"),
    CAPTURED("x-ratelimit-remaining-requests"), CAPTURED("x-ratelimit-remaining-tokens"),
};

const char *lr_call_header(const llmretry_call *c, int i)
{
    return c->hdr_long[i] ? c->hdr_long[i] : c->hdr[i];
}

void lr_call_forget_headers(llmretry_call *c)
{
    for (int i = 0; i < LR_H_COUNT; i++) {
        if (c->hdr_long[i]) {           /* rare: most calls never have one */
            free(c->hdr_long[i]);
            c->hdr_long[i] = NULL;
        }
    }
    memset(c->hdr_set, 0, sizeof c->hdr_set);
    free(c->location);
    c->location = NULL;
    c->resp_head.len = 0;
    c->body_begun = 0;
}

/* keep_response: one line of the response's head as received, whole lines
 * up to LLMRETRY_MAX_RESPONSE_HEAD bytes. Not the blank line ending it,
 * nor trailers: once the body has begun the head stays as it is, so a host
 * that has read a chunk may read it (llmretry_call_response_head). */
static void keep_head_line(llmretry_call *c, const char *line, size_t n)
{
    lr_buf *h = &c->resp_head;
    if (c->body_begun || line[0] == '\r' || line[0] == '\n' ||
        h->len + n > LLMRETRY_MAX_RESPONSE_HEAD)
        return;
    if (h->len + n + 1 > h->cap) {
        size_t cap = h->cap ? h->cap : 1024;
        while (cap < h->len + n + 1)
            cap *= 2;
        char *p = realloc(h->data, cap);
        if (!p)
            return;                 /* out of memory: the line is dropped */
        h->data = p;
        h->cap = cap;
    }
    memcpy(h->data + h->len, line, n);
    h->len += n;
    h->data[h->len] = '\0';
}

/* Headers that name a wait (wait_of), the only ones taken from under
 * PROVIDER_PREFIX. */
static int is_wait(int i)
{
    return i == LR_H_RETRY_AFTER || i == LR_H_RETRY_AFTER_MS || i == LR_H_RESET_REQUESTS ||
           i == LR_H_RESET_TOKENS;
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
        if (wait_of(i, val, now) <= wait_of(i, lr_call_header(c, i), now)) {
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

/* "HTTP/1.1 103 Early Hints" -> '1': the first digit of a status line's
 * status, or 0. */
static char status_class(const char *line, size_t n)
{
    const char *sp = memchr(line, ' ', n);
    return sp && (size_t)(sp - line) + 1 < n ? sp[1] : 0;
}

/* A redirect is not followed (docs/security.md: the key would go where
 * nobody named); its Location, up to this long, is kept to say where. */
#define LR_LOCATION_MAX 2048

static void keep_location(llmretry_call *c, const char *v, const char *end)
{
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (end == v || c->location || (size_t)(end - v) > LR_LOCATION_MAX)
        return;
    /* A URL is printable ASCII; anything else (a line break to start a
     * log line of its own, bytes that are not text) gets no hint. */
    for (const char *p = v; p < end; p++)
        if (*p < 0x21 || *p > 0x7e)
            return;
    c->location = lr_strndup(v, (size_t)(end - v));         /* NULL: no hint */
}

size_t lr_call_on_header(char *line, size_t size, size_t nmemb, void *ud)
{
    llmretry_call *c = ud;
    size_t n = size * nmemb;
    if (n >= 5 && memcmp(line, "HTTP/", 5) == 0) {
        /* A new response (after a 100 Continue, say): forget the last. */
        lr_call_forget_headers(c);
        c->sse = 0;
        char cls = status_class(line, n);
        c->interim = cls == '1';
        c->redirect = cls == '3';
        if (c->o.keep_response)
            keep_head_line(c, line, n);
        return n;
    }
    if (c->o.keep_response && n > 0)
        keep_head_line(c, line, n);
    const char *colon = memchr(line, ':', n);
    if (!colon)
        return n;
    size_t name_len = (size_t)(colon - line);
    if (c->redirect && name_len == 8 && strncasecmp(line, "location", 8) == 0) {
        keep_location(c, colon + 1, line + n);
        return n;
    }
    if (name_len == 12 && strncasecmp(line, "content-type", 12) == 0 && !c->interim) {
        const char *v = colon + 1, *end = line + n;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        /* A raw_response call takes the bytes as they come, an event stream too. */
        c->sse = !c->o.raw_response && (size_t)(end - v) >= 17 &&
                 strncasecmp(v, "text/event-stream", 17) == 0;
        return n;
    }
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
    /* LiteLLM's proxy passes its provider's headers on under this prefix,
     * and the waits only so: a provider's "Retry-After: 30" reaches the
     * caller as "llm_provider-retry-after: 30" alone, and without it every
     * retry came back within seconds to a provider that had asked for 30.
     * A prefixed wait counts as the server's (the longest wait wins, as for
     * a header sent twice); the other headers are the proxy's to say
     * unprefixed (it does say x-ratelimit-limit-* and -remaining-*). */
    const char *name = line;
    int waits_only = 0;
    if (name_len > PROVIDER_PREFIX_LEN &&
        strncasecmp(line, PROVIDER_PREFIX, PROVIDER_PREFIX_LEN) == 0) {
        name += PROVIDER_PREFIX_LEN;
        name_len -= PROVIDER_PREFIX_LEN;
        waits_only = 1;
    }
    /* Every name kept starts with r or x: most lines (Date, Server...) stop here. */
    char first = (char)(name[0] | 0x20);
    if (first != 'r' && first != 'x')
        return n;
    for (int i = 0; i < LR_H_COUNT; i++) {
        if (captured[i].len != name_len || strncasecmp(name, captured[i].name, name_len) != 0)
            continue;
        if (waits_only && !is_wait(i))
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

/* One attempt must be one request, the only exceptions being re-sends of
 * a request that provably never reached the server (docs/reliability.md,
 * Re-sends). libcurl re-sends on its own, within the transfer, a request
 * whose reused connection died before any byte of a response: on_prereq
 * sees each request it begins and tells the cases apart. A refused HTTP/2
 * stream, or a connection found dead before the request was written, is a
 * free re-send if attempt.c (lr_resend_allowed) allows it; a request that
 * was written may have been read, so its re-send is aborted and the
 * attempt fails (attempt.c retries it at once in safe mode). */
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
    /* The TLS handshake's ALPN answer (libcurl 7.88 and 8.x word it so):
     * whether the origin's calls can share a connection (origins.c). */
    static const char alpn[] = "ALPN: server ";
    if (size > sizeof alpn && memcmp(data, alpn, sizeof alpn - 1) == 0)
        lr_origin_learned(c, memmem(data, size, "accepted h2", 11) != NULL);
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
    lr_origin_connected(c);         /* the next call to its origin may start */
    lr_origin_reached(c->engine, c);
    long sent = 0;
    curl_easy_getinfo(c->easy, CURLINFO_REQUEST_SIZE, &sent);
    if (c->prereq_calls++ > 0) {
        /* libcurl's own re-send (of what got no byte back), judged on the
         * last request's connection and stream, and on whether any of its
         * bytes left: REQUEST_SIZE adds what each request of the transfer
         * wrote, only once the connection took it. */
        lr_resend_why why = c->saw_refused || refused_by_goaway(c) ? LR_RESEND_REFUSED
                          : sent == c->sent_at_prereq ? LR_RESEND_UNSENT
                          : LR_RESEND_REUSED_DIED;
        if (!lr_resend_allowed(c, why)) {
            c->resend_refused = why;
            return CURL_PREREQFUNC_ABORT;
        }
    }
    c->sent_at_prereq = sent;
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
    c->sent_at_prereq = 0;
    c->saw_refused = 0;
    c->h2_stream = 0;
    c->resend_pending = c->resend_refused = LR_RESEND_NONE;
    if (c->o.method == LLMRETRY_METHOD_POST)
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
    if (c->o.method != LLMRETRY_METHOD_POST)
        return;
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
    c->sse = 0;
    lr_call_forget_headers(c);
    lr_stream_reset(c);
}

void lr_call_setup_easy(llmretry_call *c, CURL *easy, int64_t timeout_ms)
{
    lr_call_reset_response(c);
    curl_easy_setopt(easy, CURLOPT_URL, c->url);
    if (c->o.method == LLMRETRY_METHOD_POST) {
        curl_easy_setopt(easy, CURLOPT_POST, 1L);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->o.body_len);
    } else {
        /* No body; DELETE is a GET's request line with another verb. */
        curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
        if (c->o.method == LLMRETRY_METHOD_DELETE)
            curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    set_body(c, easy);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, lr_call_on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, lr_call_on_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, c->curl_err);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long)timeout_ms);   /* 0 = none */
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
    else if (lr_default_ca_file())
        curl_easy_setopt(easy, CURLOPT_CAINFO, lr_default_ca_file());
}

