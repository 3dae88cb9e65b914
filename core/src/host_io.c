/* host_io.c — attempts the host performs on its own sockets (io_loop
 * host, llmretry/host_io.h). The engine builds the request's bytes, the
 * host sends them and hands back the response's bytes, which the HTTP/1.1
 * parser (http1.c) passes to the same header and write callbacks libcurl
 * calls (transfer.c); the end goes to lr_attempt_finished with the
 * CURLcode libcurl would have given, so the policy and the outcome are read
 * exactly as for the engine's own transfers. Host thread (which is the
 * engine's, with io_loop host). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE             /* memmem */
#endif
#include "engine.h"
#include "http1.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct lr_host_xfer {
    lr_http1 parser;
    lr_buf req;                    /* the request's bytes */
    char *host;                    /* curl_url's, without IPv6 brackets */
    char *pool_key;
    int port, tls;
    size_t vary_at, vary_len;      /* the request id's line in req */
    unsigned token;                /* bumped by each attempt */
    int pending;                   /* the host has this attempt to perform */
    int received;                  /* a byte of the response came back */
    int64_t timeout_ms;
};

long lr_host_status(const llmretry_call *c)
{
    return c->hx->parser.status;
}

void lr_host_xfer_free(llmretry_call *c)
{
    struct lr_host_xfer *hx = c->hx;
    if (!hx)
        return;
    lr_http1_free(&hx->parser);
    free(hx->req.data);
    free(hx->host);
    free(hx->pool_key);
    free(hx);
    c->hx = NULL;
}

/* ---- the request's bytes ----------------------------------------------- */

static int put(lr_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static int puts_(lr_buf *b, const char *s)
{
    return put(b, s, strlen(s));
}

/* Is the header list's line `line` named `name` (NUL-terminated)? */
static int named(const char *line, const char *name)
{
    size_t n = strlen(name);
    return strncasecmp(line, name, n) == 0 && (line[n] == ':' || line[n] == ';');
}

/* The header lines as libcurl would send them: "Name:" with nothing after
 * it removes a header libcurl would add (none is added here but Host and
 * Content-Length), "Name;" sends it empty. */
static int put_header_lines(lr_buf *b, const struct curl_slist *h, int *has_host)
{
    for (; h; h = h->next) {
        const char *line = h->data;
        const char *colon = strchr(line, ':'), *semi = strchr(line, ';');
        if (semi && (!colon || semi < colon) && semi[1] == '\0') {
            if (put(b, line, (size_t)(semi - line)) || puts_(b, ":\r\n"))
                return -1;
            continue;
        }
        if (!colon)
            continue;
        const char *v = colon + 1;
        v += strspn(v, " \t");
        if (*v == '\0')
            continue;               /* "Name:": libcurl's way to drop a header */
        if (named(line, "Content-Length") || named(line, "Transfer-Encoding") ||
            named(line, "Connection"))
            continue;               /* the framing is the engine's */
        if (named(line, "Host"))
            *has_host = 1;
        if (puts_(b, line) || puts_(b, "\r\n"))
            return -1;
    }
    return 0;
}

static const char *method_name(llmretry_method m)
{
    return m == LLMRETRY_METHOD_POST ? "POST" : m == LLMRETRY_METHOD_DELETE ? "DELETE" : "GET";
}

/* The URL's parts and the request's bytes into hx. */
static int build(llmretry_call *c, struct lr_host_xfer *hx, const char **why)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *query = NULL;
    int rc = -1;
    *why = "out of memory building the request";
    if (!u)
        return -1;
    if (curl_url_set(u, CURLUPART_URL, c->url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PATH, &path, 0) != CURLUE_OK) {
        *why = "bad URL (not retried)";
        goto out;
    }
    curl_url_get(u, CURLUPART_QUERY, &query, 0);
    int tls = strcasecmp(scheme, "https") == 0;
    if (!tls && strcasecmp(scheme, "http") != 0) {
        *why = "bad URL (not retried): only http and https";
        goto out;
    }
    int portn = atoi(port);
    /* The Host header keeps the URL's brackets; the connect goes without. */
    size_t hl = strlen(host);
    const char *bare = host;
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        bare = host + 1;
        hl -= 2;
    }
    free(hx->host);
    free(hx->pool_key);
    hx->host = lr_strndup(bare, hl);
    char key[300];
    snprintf(key, sizeof key, "%s%.*s:%d", tls ? "tls:" : "", (int)hl, bare, portn);
    hx->pool_key = lr_strdup(key);
    if (!hx->host || !hx->pool_key)
        goto out;
    hx->port = portn;
    hx->tls = tls;

    lr_buf *b = &hx->req;
    b->len = 0;
    int has_host = 0, default_port = portn == (tls ? 443 : 80);
    char line[64];
    if (puts_(b, method_name(c->o.method)) || puts_(b, " ") || puts_(b, path) ||
        (query && (puts_(b, "?") || puts_(b, query))) || puts_(b, " HTTP/1.1\r\n"))
        goto out;
    size_t host_at = b->len;
    if (put_header_lines(b, c->headers, &has_host) != 0)
        goto out;
    if (!has_host) {
        /* Host first, as libcurl sends it: put it before the others. */
        lr_buf h = { 0 };
        snprintf(line, sizeof line, ":%d", portn);
        if (puts_(&h, "Host: ") || puts_(&h, host) || (!default_port && puts_(&h, line)) ||
            puts_(&h, "\r\n") || put(b, h.data, h.len)) {
            free(h.data);
            goto out;
        }
        memmove(b->data + host_at + h.len, b->data + host_at, b->len - h.len - host_at);
        memcpy(b->data + host_at, h.data, h.len);
        free(h.data);
    }
    static const char id_line[] = "\r\nX-Client-Request-Id: ";
    const char *id = memmem(b->data, b->len, id_line, sizeof id_line - 1);
    const char *id_end = id ? memmem(id + 2, b->len - (size_t)(id + 2 - b->data), "\r\n", 2)
                            : NULL;
    hx->vary_at = id_end ? (size_t)(id + 2 - b->data) : 0;
    hx->vary_len = id_end ? (size_t)(id_end + 2 - (id + 2)) : 0;
    if (c->o.method == LLMRETRY_METHOD_POST) {
        snprintf(line, sizeof line, "Content-Length: %zu\r\n", c->o.body_len);
        if (puts_(b, line))
            goto out;
    }
    if (puts_(b, "\r\n") ||
        (c->o.method == LLMRETRY_METHOD_POST && c->o.body_len && put(b, c->body, c->o.body_len)))
        goto out;
    rc = 0;
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_free(query);
    curl_url_cleanup(u);
    return rc;
}

int lr_host_attempt_start(llmretry_call *c, int64_t timeout_ms, const char **why)
{
    struct lr_host_xfer *hx = c->hx;
    if (!hx) {
        hx = calloc(1, sizeof *hx);
        if (!hx) {
            *why = "out of memory starting an attempt";
            return -1;
        }
        lr_http1_init(&hx->parser, lr_call_on_header, lr_call_on_body, c);
        c->hx = hx;
    }
    lr_call_reset_response(c);
    lr_http1_reset(&hx->parser);
    if (build(c, hx, why) != 0)
        return -1;
    c->resend_pending = c->resend_refused = LR_RESEND_NONE;
    hx->token++;
    hx->pending = 1;
    hx->received = 0;
    hx->timeout_ms = timeout_ms;
    lr_notify(c);                   /* its host may be waiting on the channel */
    return 0;
}

void lr_host_attempt_detach(llmretry_call *c)
{
    if (c->hx)
        c->hx->pending = 0;
}

/* ---- the host's side ----------------------------------------------------- */

static int live(llmretry_call *c, unsigned token)
{
    return c && c->hx && c->hx->pending && c->hx->token == token && c->state == LR_RUNNING &&
           !lr_forked(c->engine);
}

int llmretry_call_exchange(llmretry_call *c, llmretry_exchange *x)
{
    if (!c || !x || !c->hx || !live(c, c->hx->token))
        return 0;
    struct lr_host_xfer *hx = c->hx;
    x->token = hx->token;
    x->host = hx->host;
    x->port = hx->port;
    x->tls = hx->tls;
    x->pool_key = hx->pool_key;
    x->request = hx->req.data;
    x->request_len = hx->req.len;
    x->vary_at = hx->vary_at;
    x->vary_len = hx->vary_len;
    x->timeout_ms = hx->timeout_ms;
    return 1;
}

/* The attempt is over with what libcurl would have said of it. */
static void finish(llmretry_call *c, CURLcode rc)
{
    c->hx->pending = 0;
    lr_attempt_finished(c->engine, c, rc);
}

llmretry_feed llmretry_call_exchange_feed(llmretry_call *c, unsigned token, const char *data,
                                          size_t len)
{
    if (!live(c, token))
        return LLMRETRY_FEED_GONE;
    struct lr_host_xfer *hx = c->hx;
    lr_http1 *p = &hx->parser;
    if (len > 0 && !hx->received) {
        hx->received = 1;
        lr_origin_reached(c->engine, c);
    }
    lr_http1_feed(p, data ? data : "", len);
    if (p->aborted) {
        /* max_response_bytes (too_large), or out of memory: as libcurl's
         * write callback refusing bytes. */
        finish(c, CURLE_WRITE_ERROR);
        return LLMRETRY_FEED_FAILED;
    }
    if (p->state == LR_H1_ERROR) {
        snprintf(c->curl_err, sizeof c->curl_err, "%s", p->error);
        finish(c, CURLE_WEIRD_SERVER_REPLY);
        return LLMRETRY_FEED_FAILED;
    }
    if (p->state != LR_H1_DONE)
        return LLMRETRY_FEED_MORE;
    int keep = p->keep_alive;
    finish(c, CURLE_OK);
    return keep ? LLMRETRY_FEED_DONE : LLMRETRY_FEED_DONE_CLOSE;
}

void llmretry_call_exchange_failed(llmretry_call *c, unsigned token, llmretry_xfer_error why,
                                   int reused, const char *message)
{
    if (!live(c, token))
        return;
    struct lr_host_xfer *hx = c->hx;
    lr_http1 *p = &hx->parser;
    snprintf(c->curl_err, sizeof c->curl_err, "%s", message && *message ? message : "");
    CURLcode rc;
    switch (why) {
    case LLMRETRY_XFER_RESOLVE: rc = CURLE_COULDNT_RESOLVE_HOST; break;
    case LLMRETRY_XFER_CONNECT: rc = CURLE_COULDNT_CONNECT; break;
    case LLMRETRY_XFER_TLS: rc = CURLE_SSL_CONNECT_ERROR; break;
    case LLMRETRY_XFER_TLS_VERIFY: rc = CURLE_PEER_FAILED_VERIFICATION; break;
    case LLMRETRY_XFER_TIMEOUT: rc = CURLE_OPERATION_TIMEDOUT; break;
    case LLMRETRY_XFER_SEND:
    case LLMRETRY_XFER_CLOSED:
    default:
        lr_http1_eof(p);
        if (why == LLMRETRY_XFER_CLOSED && p->state == LR_H1_DONE) {
            rc = CURLE_OK;          /* a body read to the close */
        } else if (reused && !hx->received) {
            /* Written on a kept-alive connection that died without a byte
             * back: the server may have read it (attempt.c retries it at
             * once in safe mode, never for free). */
            c->resend_refused = LR_RESEND_REUSED_DIED;
            rc = CURLE_ABORTED_BY_CALLBACK;
        } else if (!hx->received) {
            rc = why == LLMRETRY_XFER_SEND ? CURLE_SEND_ERROR : CURLE_RECV_ERROR;
            if (!c->curl_err[0])
                snprintf(c->curl_err, sizeof c->curl_err, "%s",
                         "the connection closed before a response");
        } else {
            rc = CURLE_PARTIAL_FILE;
            /* The host's words follow ours, cut to fit. */
            static const char cut[] = "the connection closed before the response was complete";
            char host_words[CURL_ERROR_SIZE - sizeof cut - 2];
            size_t n = strnlen(c->curl_err, sizeof host_words - 1);
            memcpy(host_words, c->curl_err, n);
            host_words[n] = '\0';
            snprintf(c->curl_err, sizeof c->curl_err, "%s%s%s", cut, host_words[0] ? ": " : "",
                     host_words);
        }
        break;
    }
    if (rc == CURLE_OK)
        c->curl_err[0] = '\0';
    finish(c, rc);
}
