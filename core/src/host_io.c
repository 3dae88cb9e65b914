/* host_io.c — attempts the host performs on its own sockets (io_loop
 * host, llmretry/host_io.h). The engine builds the request's bytes, the
 * host sends them and hands back the response's bytes, which the HTTP/1.1
 * parser (http1.c) passes to the same header and write callbacks libcurl
 * calls (transfer.c); the end goes to lr_attempt_finished with the
 * CURLcode libcurl would have given, so the policy and the outcome are read
 * exactly as for the engine's own transfers. Host thread (which is the
 * engine's, with io_loop host). */
#include "engine.h"
#include "http1.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct lr_host_xfer {
    void *spare_link;              /* first: the engine's spare_xfers' (spares.c) */
    lr_http1 parser;
    lr_buf req;                    /* the request's bytes */
    char host[256];                /* to connect to, without IPv6 brackets */
    char pool_key[300];
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

/* A freed call's exchange is kept for the next call's first attempt, its
 * request buffer and the parser's line buffer with it: a gateway's calls
 * are all alike, and the calloc, the buffer's malloc and the line's
 * realloc were three of a call's dozen allocations (issue 36). At most
 * lr_spares_cap(e), kept and taken as spares.c says. */

static void xfer_destroy(struct lr_host_xfer *hx)
{
    lr_http1_free(&hx->parser);
    free(hx->req.data);
    free(hx);
}

void lr_host_xfer_free(llmretry_call *c)
{
    struct lr_host_xfer *hx = c->hx;
    llmretry_engine *e = c->engine;
    if (!hx)
        return;
    c->hx = NULL;
    if (!e || !lr_spares_put(e, &e->spare_xfers, hx, lr_spares_cap(e)))
        xfer_destroy(hx);
}

/* A spare exchange for c (its buffers kept, its parser reporting to c), or
 * a new one; NULL when out of memory. */
static struct lr_host_xfer *xfer_new(llmretry_call *c)
{
    struct lr_host_xfer *hx = lr_spares_take(c->engine, &c->engine->spare_xfers);
    if (hx) {
        hx->parser.ud = c;
        return hx;
    }
    if ((hx = calloc(1, sizeof *hx)) != NULL)
        lr_http1_init(&hx->parser, lr_call_on_header, lr_call_on_body, c);
    return hx;
}

void lr_host_xfer_spares_free(llmretry_engine *e)
{
    struct lr_host_xfer *hx;
    while ((hx = lr_spares_pop(&e->spare_xfers)) != NULL)
        xfer_destroy(hx);
}

/* ---- the request's bytes ----------------------------------------------- */

static int puts_(lr_buf *b, const char *s)
{
    return lr_buf_add(b, s, strlen(s));
}

/* Is the header list's line `line` named `name` (NUL-terminated)? */
static int named(const char *line, const char *name)
{
    size_t n = strlen(name);
    return strncasecmp(line, name, n) == 0 && (line[n] == ':' || line[n] == ';');
}

/* The header lines as libcurl would send them: "Name:" with nothing after
 * it removes a header libcurl would add (none is added here but Host and
 * Content-Length), "Name;" sends it empty. The request id's line is marked
 * in hx (vary_at, vary_len). */
static int put_header_lines(lr_buf *b, const struct curl_slist *h, struct lr_host_xfer *hx)
{
    for (; h; h = h->next) {
        const char *line = h->data;
        const char *colon = strchr(line, ':'), *semi = strchr(line, ';');
        if (semi && (!colon || semi < colon) && semi[1] == '\0') {
            if (lr_buf_add(b, line, (size_t)(semi - line)) || puts_(b, ":\r\n"))
                return -1;
            continue;
        }
        if (!colon)
            continue;
        const char *v = colon + 1;
        v += strspn(v, " \t");
        if (*v == '\0')
            continue;               /* "Name:": libcurl's way to drop a header */
        char first = (char)(line[0] | 0x20);  /* the names below start with c, t or x */
        if ((first == 'c' && (named(line, "Content-Length") || named(line, "Connection"))) ||
            (first == 't' && named(line, "Transfer-Encoding")))
            continue;               /* the framing is the engine's */
        size_t at = b->len;
        if (puts_(b, line) || puts_(b, "\r\n"))
            return -1;
        if (first == 'x' && named(line, "X-Client-Request-Id")) {
            hx->vary_at = at;
            hx->vary_len = b->len - at;
        }
    }
    return 0;
}

static const char *method_name(llmretry_method m)
{
    return m == LLMRETRY_METHOD_POST ? "POST" : m == LLMRETRY_METHOD_DELETE ? "DELETE" : "GET";
}

/* What the engine keeps of the URL it parsed last (io_loop host): a
 * gateway sends every call to one URL, and curl_url's parse and five
 * copies were a good part of an attempt's start. Host thread. */
struct lr_host_url {
    char *url;                     /* the URL as given */
    char *target;                  /* path and query: the request line's */
    char *host_line;               /* "Host: name[:port]\r\n" */
    char host[256];                /* to connect to, no IPv6 brackets */
    char pool_key[300];
    int port, tls;
};

void lr_host_io_free(llmretry_engine *e)
{
    struct lr_host_url *u = e->host_url;
    if (!u)
        return;
    free(u->url);
    free(u->target);
    free(u->host_line);
    free(u);
    e->host_url = NULL;
}

/* url's parts, parsed now or remembered; NULL with *why. */
static const struct lr_host_url *url_parts(llmretry_engine *e, const char *url, const char **why)
{
    if (e->host_url && strcmp(e->host_url->url, url) == 0)
        return e->host_url;
    CURLU *cu = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *query = NULL;
    struct lr_host_url *u = calloc(1, sizeof *u);
    const struct lr_host_url *out = NULL;
    *why = "out of memory building the request";
    if (!cu || !u)
        goto done;
    if (curl_url_set(cu, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(cu, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(cu, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(cu, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
        curl_url_get(cu, CURLUPART_PATH, &path, 0) != CURLUE_OK) {
        *why = "bad URL (not retried)";
        goto done;
    }
    curl_url_get(cu, CURLUPART_QUERY, &query, 0);
    u->tls = strcasecmp(scheme, "https") == 0;
    if (!u->tls && strcasecmp(scheme, "http") != 0) {
        *why = "bad URL (not retried): only http and https";
        goto done;
    }
    u->port = atoi(port);
    /* The Host header keeps the URL's brackets; the connect goes without. */
    size_t hl = strlen(host);
    const char *bare = host;
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        bare = host + 1;
        hl -= 2;
    }
    if (hl >= sizeof u->host) {
        *why = "bad URL (not retried): its host name is too long";
        goto done;
    }
    memcpy(u->host, bare, hl);
    u->host[hl] = '\0';
    snprintf(u->pool_key, sizeof u->pool_key, "%s%s:%d", u->tls ? "tls:" : "", u->host, u->port);
    int default_port = u->port == (u->tls ? 443 : 80);
    size_t n = strlen(host) + 32;
    u->host_line = malloc(n);
    size_t tn = strlen(path) + (query ? strlen(query) + 1 : 0) + 1;
    u->target = malloc(tn);
    u->url = lr_strdup(url);
    if (!u->host_line || !u->target || !u->url)
        goto done;
    if (default_port)
        snprintf(u->host_line, n, "Host: %s\r\n", host);
    else
        snprintf(u->host_line, n, "Host: %s:%d\r\n", host, u->port);
    snprintf(u->target, tn, "%s%s%s", path, query ? "?" : "", query ? query : "");
    lr_host_io_free(e);
    e->host_url = u;
    out = u;
    u = NULL;
done:
    if (u) {
        free(u->url);
        free(u->target);
        free(u->host_line);
        free(u);
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_free(query);
    curl_url_cleanup(cu);
    return out;
}

/* "Content-Length: n\r\n" for n. */
static int put_length(lr_buf *b, size_t n)
{
    char digits[24];
    int i = (int)sizeof digits;
    do {
        digits[--i] = (char)('0' + n % 10);
        n /= 10;
    } while (n > 0);
    return puts_(b, "Content-Length: ") || lr_buf_add(b, digits + i, sizeof digits - (size_t)i) ||
           puts_(b, "\r\n");
}

/* The URL's parts and the request's bytes into hx. */
static int build(llmretry_call *c, struct lr_host_xfer *hx, const char **why)
{
    const struct lr_host_url *u = url_parts(c->engine, c->url, why);
    if (!u)
        return -1;
    memcpy(hx->host, u->host, sizeof hx->host);
    memcpy(hx->pool_key, u->pool_key, sizeof hx->pool_key);
    hx->port = u->port;
    hx->tls = u->tls;
    *why = "out of memory building the request";

    int has_host = 0;
    for (const struct curl_slist *h = c->headers; h; h = h->next)
        has_host |= (h->data[0] | 0x20) == 'h' && named(h->data, "Host");
    lr_buf *b = &hx->req;
    b->len = 0;
    hx->vary_at = hx->vary_len = 0;
    /* Room for the whole request at once: it would grow from 16 bytes. */
    size_t need = strlen(u->target) + strlen(u->host_line) + c->o.body_len + 64;
    for (const struct curl_slist *h = c->headers; h; h = h->next)
        need += strlen(h->data) + 2;
    if (b->cap < need) {
        char *p = realloc(b->data, need);
        if (!p)
            return -1;
        b->data = p;
        b->cap = need;
    }
    if (puts_(b, method_name(c->o.method)) || puts_(b, " ") || puts_(b, u->target) ||
        puts_(b, " HTTP/1.1\r\n") || (!has_host && puts_(b, u->host_line)) ||
        put_header_lines(b, c->headers, hx) != 0)
        return -1;
    if (c->o.method == LLMRETRY_METHOD_POST && put_length(b, c->o.body_len))
        return -1;
    if (puts_(b, "\r\n") ||
        (c->o.method == LLMRETRY_METHOD_POST && c->o.body_len && lr_buf_add(b, c->body, c->o.body_len)))
        return -1;
    return 0;
}

int lr_host_attempt_start(llmretry_call *c, int64_t timeout_ms, const char **why)
{
    struct lr_host_xfer *hx = c->hx;
    if (!hx) {
        if (!(hx = xfer_new(c))) {
            *why = "out of memory starting an attempt";
            return -1;
        }
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

llmretry_feed llmretry_call_exchange_answer(llmretry_call *c, unsigned token, int status,
                                            const char *body, size_t len)
{
    if (!live(c, token))
        return LLMRETRY_FEED_GONE;
    if (status < 200 || status > 599) {
        /* No interim or made-up status: it would leave the parser waiting
         * for a head that never comes. */
        snprintf(c->curl_err, sizeof c->curl_err, "an answer's status %d is not an HTTP status "
                 "of a final response (200-599)", status);
        finish(c, CURLE_WEIRD_SERVER_REPLY);
        return LLMRETRY_FEED_FAILED;
    }
    char head[80];
    int n = snprintf(head, sizeof head, "HTTP/1.1 %d -\r\nContent-Length: %zu\r\n\r\n", status,
                     len);
    llmretry_feed f = llmretry_call_exchange_feed(c, token, head, (size_t)n);
    /* A 204 or 304 has no body: its head ended the exchange. */
    return f == LLMRETRY_FEED_MORE && len > 0 ? llmretry_call_exchange_feed(c, token, body, len)
                                              : f;
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
