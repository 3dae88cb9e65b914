/* Engines whose host moves the bytes (io_loop host, llmretry/host_io.h):
 * the HTTP/1.1 response parser on its own (http1.c, fed in pieces of every
 * size), then whole calls against the project's mock server over loopback,
 * with this test as the host: blocking sockets, a pool of kept-alive
 * connections by pool_key, each exchange's timeout, run between. */
#include "harness.h"
#include "llmretry.h"
#include "../../core/src/http1.h"

#include <arpa/inet.h>
#include <cJSON.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static th_mock mock;

/* ---- the parser ----------------------------------------------------------- */

typedef struct {
    char head[4096];
    size_t head_len;
    char body[4096];
    size_t body_len;
    int heads;                      /* status lines seen */
} sink;

static size_t on_head(char *d, size_t s, size_t n, void *ud)
{
    sink *k = ud;
    size_t len = s * n;
    if (len >= 5 && memcmp(d, "HTTP/", 5) == 0)
        k->heads++;
    if (k->head_len + len < sizeof k->head) {
        memcpy(k->head + k->head_len, d, len);
        k->head_len += len;
    }
    return len;
}

static size_t on_data(char *d, size_t s, size_t n, void *ud)
{
    sink *k = ud;
    size_t len = s * n;
    if (k->body_len + len < sizeof k->body) {
        memcpy(k->body + k->body_len, d, len);
        k->body_len += len;
    }
    return len;
}

/* Feed `text` in pieces of `piece` bytes (0: whole); the parser's state. */
static lr_h1_state parse(const char *text, size_t piece, sink *k, lr_http1 *p, size_t *taken)
{
    memset(k, 0, sizeof *k);
    lr_http1_init(p, on_head, on_data, k);
    size_t len = strlen(text), pos = 0;
    *taken = 0;
    while (pos < len) {
        size_t n = piece && len - pos > piece ? piece : len - pos;
        size_t used = lr_http1_feed(p, text + pos, n);
        *taken += used;
        if (used < n)
            break;
        pos += n;
    }
    lr_h1_state st = p->state;
    return st;
}

static void test_parser_framings(void)
{
    static const struct {
        const char *text, *body;
        int status, keep, heads;
    } ok[] = {
        { "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "hello", 200, 1, 1 },
        { "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n"
          "6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n", "hello world", 200, 1, 1 },
        { "HTTP/1.1 200 OK\nContent-Length: 2\n\nhi", "hi", 200, 1, 1 },
        { "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
          "ok", 201, 1, 2 },
        { "HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n", "", 204, 1, 1 },
        { "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive, close\r\n\r\nok",
          "ok", 200, 0, 1 },
        { "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", 200, 0, 1 },
        { "HTTP/1.1 503 Busy\r\nContent-Length: 0\r\nRetry-After: 1\r\n\r\n", "", 503, 1, 1 },
        { "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", "ok", 200, 1, 1 },
    };
    static const size_t pieces[] = { 0, 1, 2, 3, 7 };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        for (size_t j = 0; j < sizeof pieces / sizeof *pieces; j++) {
            sink k;
            lr_http1 p;
            size_t taken;
            lr_h1_state st = parse(ok[i].text, pieces[j], &k, &p, &taken);
            CHECK_MSG(st == LR_H1_DONE, "case %zu piece %zu: state %d (%s)", i, pieces[j], st,
                      p.error ? p.error : "");
            CHECK_INT(p.status, ok[i].status);
            CHECK_INT(p.keep_alive, ok[i].keep);
            CHECK_INT(k.heads, ok[i].heads);
            CHECK_MSG(k.body_len == strlen(ok[i].body) &&
                      memcmp(k.body, ok[i].body, k.body_len) == 0,
                      "case %zu piece %zu: body \"%.*s\"", i, pieces[j], (int)k.body_len, k.body);
            CHECK_INT(taken, strlen(ok[i].text));
            lr_http1_free(&p);
        }
    }
    /* Head lines go on as libcurl hands them: each with its end, the blank one too. */
    sink k;
    lr_http1 p;
    size_t taken;
    static const char head[] = "HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n";
    parse(head, 1, &k, &p, &taken);
    CHECK_MSG(k.head_len == strlen(head) && memcmp(k.head, head, k.head_len) == 0,
              "head \"%.*s\"", (int)k.head_len, k.head);
    lr_http1_free(&p);

    /* A body to the close: complete only at the end of the connection. */
    lr_h1_state st = parse("HTTP/1.1 200 OK\r\n\r\nall of it", 4, &k, &p, &taken);
    CHECK_INT(st, LR_H1_BODY_CLOSE);
    lr_http1_eof(&p);
    CHECK_INT(p.state, LR_H1_DONE);
    CHECK_INT(p.keep_alive, 0);
    CHECK_INT(k.body_len, 9);
    lr_http1_free(&p);

    /* Cut short: EOF leaves it unfinished. */
    st = parse("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 0, &k, &p, &taken);
    lr_http1_eof(&p);
    CHECK_INT(p.state, LR_H1_BODY_LENGTH);
    lr_http1_free(&p);

    /* Bytes after a complete response: an answer to nothing, never kept. */
    st = parse("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n", 0, &k, &p,
               &taken);
    CHECK_INT(st, LR_H1_DONE);
    CHECK_INT(p.keep_alive, 0);
    CHECK_INT(taken, 40);
    lr_http1_free(&p);
}

static size_t refuse_body(char *d, size_t s, size_t n, void *ud)
{
    (void)d;
    (void)s;
    (void)n;
    (void)ud;
    return 0;                       /* as max_response_bytes refuses */
}

/* A body its sink refused is never complete, even one read to the close. */
static void test_parser_refused_body(void)
{
    lr_http1 p;
    lr_http1_init(&p, NULL, refuse_body, NULL);
    static const char text[] = "HTTP/1.1 200 OK\r\n\r\ntoo much";
    size_t took = lr_http1_feed(&p, text, strlen(text));
    CHECK(p.aborted);
    CHECK_INT(took, strlen(text) - 8);
    lr_http1_eof(&p);
    CHECK_MSG(p.state != LR_H1_DONE, "a refused body read to the close reads as complete");
    lr_http1_free(&p);
}

static void test_parser_refuses(void)
{
    static const char *bad[] = {
        "HTTP/2 200\r\n\r\n",
        "SSH-2.0-OpenSSH\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 101 Switching Protocols\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        for (size_t piece = 0; piece <= 1; piece++) {
            sink k;
            lr_http1 p;
            size_t taken;
            lr_h1_state st = parse(bad[i], piece, &k, &p, &taken);
            CHECK_MSG(st == LR_H1_ERROR && p.error, "bad case %zu (piece %zu): state %d", i,
                      piece, st);
            lr_http1_free(&p);
        }
    }
    /* A head past its bound fails instead of growing for ever. */
    size_t n = LR_H1_MAX_HEAD + 100;
    char *big = malloc(n + 64);
    strcpy(big, "HTTP/1.1 200 OK\r\nX-Big: ");
    size_t at = strlen(big);
    memset(big + at, 'a', n - at);
    strcpy(big + n, "\r\n\r\n");
    sink k;
    lr_http1 p;
    size_t taken;
    CHECK_INT(parse(big, 1000, &k, &p, &taken), LR_H1_ERROR);
    lr_http1_free(&p);
    free(big);
}

/* ---- a blocking host ------------------------------------------------------- */

typedef struct {
    char key[300];
    int fd;
} pooled;

typedef struct host {
    pooled pool[8];
    int n_pool;
    int exchanges, connects;
} host;

static int pool_take(host *h, const char *key)
{
    for (int i = 0; i < h->n_pool; i++)
        if (strcmp(h->pool[i].key, key) == 0) {
            int fd = h->pool[i].fd;
            h->pool[i] = h->pool[--h->n_pool];
            return fd;
        }
    return -1;
}

static void pool_put(host *h, const char *key, int fd)
{
    if (h->n_pool == 8) {
        close(fd);
        return;
    }
    snprintf(h->pool[h->n_pool].key, sizeof h->pool[h->n_pool].key, "%s", key);
    h->pool[h->n_pool++].fd = fd;
}

static void pool_clear(host *h)
{
    while (h->n_pool > 0)
        close(h->pool[--h->n_pool].fd);
}

static int connect_to(const char *hostname, int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    if (inet_pton(AF_INET, hostname, &a.sin_addr) != 1)
        return -2;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Perform one exchange as a host would. */
static void perform(host *h, llmretry_call *c, const llmretry_exchange *x)
{
    h->exchanges++;
    int fd = pool_take(h, x->pool_key), reused = fd >= 0;
    if (fd < 0) {
        fd = connect_to(x->host, x->port);
        if (fd < 0) {
            llmretry_call_exchange_failed(c, x->token, fd == -2 ? LLMRETRY_XFER_RESOLVE
                                                                : LLMRETRY_XFER_CONNECT,
                                          0, strerror(errno));
            return;
        }
        h->connects++;
    }
    int64_t until = x->timeout_ms > 0 ? th_now_ms() + x->timeout_ms : -1;
    if (send(fd, x->request, x->request_len, MSG_NOSIGNAL) != (ssize_t)x->request_len) {
        close(fd);
        llmretry_call_exchange_failed(c, x->token, LLMRETRY_XFER_SEND, reused, strerror(errno));
        return;
    }
    char buf[1500];
    for (;;) {
        if (until >= 0) {
            int64_t left = until - th_now_ms();
            if (left <= 0) {
                close(fd);
                llmretry_call_exchange_failed(c, x->token, LLMRETRY_XFER_TIMEOUT, reused,
                                              "timed out");
                return;
            }
            struct timeval tv = { left / 1000, (left % 1000) * 1000 };
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        }
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            continue;               /* the deadline check above decides */
        if (n <= 0) {
            close(fd);
            llmretry_call_exchange_failed(c, x->token, LLMRETRY_XFER_CLOSED, reused,
                                          n < 0 ? strerror(errno) : "closed");
            return;
        }
        llmretry_feed f = llmretry_call_exchange_feed(c, x->token, buf, (size_t)n);
        if (f == LLMRETRY_FEED_MORE)
            continue;
        if (f == LLMRETRY_FEED_DONE)
            pool_put(h, x->pool_key, fd);
        else
            close(fd);
        return;
    }
}

/* Drive the engine until c is done; its events counted by type. */
static const llmretry_result *drive(llmretry_engine *e, host *h, llmretry_call *c, int *events)
{
    int64_t give_up = th_now_ms() + 20000;
    while (th_now_ms() < give_up) {
        int64_t next = 0;
        CHECK_INT(llmretry_engine_run(e, &next), LLMRETRY_OK);
        llmretry_exchange x;
        while (llmretry_call_exchange(c, &x)) {
            perform(h, c, &x);
            llmretry_engine_run(e, &next);
        }
        llmretry_event *ev;
        llmretry_mail m;
        while ((m = llmretry_call_next(c, &ev)) == LLMRETRY_MAIL_EVENT) {
            llmretry_event_type t = llmretry_event_type_of(ev);
            if (events && (int)t >= 0 && (int)t < 32)
                events[t]++;
            llmretry_event_free(ev);
        }
        if (m == LLMRETRY_MAIL_DONE)
            return llmretry_call_result(c);
        th_sleep_ms(next > 5 ? 5 : next);
    }
    CHECK_MSG(0, "the call did not end in 20 s");
    return NULL;
}

#define BODY "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}"

static void opts_for(llmretry_options *o, const char *name, char *url, size_t len)
{
    llmretry_options_defaults(o);
    o->base_url = th_mock_scenario_url(&mock, name, url, len);
    o->api_key = "sk-test-host-io";
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 10;
    o->timeout_ms = 5000;
}

static llmretry_call *submit(llmretry_engine *e, const llmretry_options *o)
{
    llmretry_call *c = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_MSG(llmretry_engine_submit(e, o, 0, &c, err, sizeof err) == LLMRETRY_OK, "%s", err);
    return c;
}

static int requests_seen(const char *name)
{
    char *j = th_mock_requests(&mock, name);
    int n = 0;
    for (const char *p = j; p && (p = strstr(p, "\"index\"")); p++)
        n++;
    free(j);
    return n;
}

static void test_call_succeeds(void)
{
    if (th_mock_script(&mock, "host_ok", "{\"steps\": [{\"content\": \"hello host\"}]}") != 0)
        return;
    llmretry_engine *e = th_host_engine_new(0);
    host h = { 0 };
    char url[128];
    llmretry_options o;
    opts_for(&o, "host_ok", url, sizeof url);
    llmretry_call *c = e ? submit(e, &o) : NULL;
    int events[32] = { 0 };
    const llmretry_result *r = c ? drive(e, &h, c, events) : NULL;
    CHECK_MSG(r && r->ok && r->status == 200, "ok=%d status=%d %s", r ? r->ok : -1,
              r ? r->status : -1, r && r->message ? r->message : "");
    CHECK(r && r->body && strstr(r->body, "hello host"));
    CHECK(r && r->usage.present && r->usage.total_tokens == 15);
    CHECK_INT(r ? r->attempts : -1, 1);
    CHECK_INT(events[LLMRETRY_EV_REQUEST_STARTED], 1);
    CHECK_INT(events[LLMRETRY_EV_REQUEST_SUCCEEDED], 1);
    /* What the server got: the request the engine would send through libcurl. */
    char *j = th_mock_requests(&mock, "host_ok");
    CHECK_MSG(j && strstr(j, "\"authorization\": \"Bearer sk-test-host-io\""), "%s", j);
    CHECK(j && strstr(j, "\"content-type\": \"application/json\""));
    CHECK(j && r && strstr(j, r->request_id));
    CHECK(j && strstr(j, "\"path\": \"/s/host_ok/v1/chat/completions\""));
    CHECK(j && strstr(j, "\\\"content\\\": \\\"hi\\\""));
    CHECK(j && !strstr(j, "\"expect\""));
    free(j);
    llmretry_call_free(c);
    pool_clear(&h);
    llmretry_engine_free(e);
}

/* Two calls in a row share one kept-alive connection. */
static void test_keep_alive(void)
{
    if (th_mock_script(&mock, "host_keep", "{\"steps\": []}") != 0)
        return;
    llmretry_engine *e = th_host_engine_new(0);
    host h = { 0 };
    char url[128];
    llmretry_options o;
    opts_for(&o, "host_keep", url, sizeof url);
    for (int i = 0; i < 3 && e; i++) {
        llmretry_call *c = submit(e, &o);
        const llmretry_result *r = c ? drive(e, &h, c, NULL) : NULL;
        CHECK(r && r->ok);
        llmretry_call_free(c);
    }
    CHECK_INT(h.exchanges, 3);
    CHECK_INT(h.connects, 1);
    /* What the server saw: three requests on one connection (the mock
     * numbers every connection it accepted, its control requests' too). */
    char *j = th_mock_requests(&mock, "host_keep");
    cJSON *recs = j ? cJSON_Parse(j) : NULL;
    int n = cJSON_GetArraySize(recs), same = n > 0;
    double first = -1;
    for (int i = 0; i < n; i++) {
        const cJSON *conn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(recs, i),
                                                             "connection");
        double id = cJSON_IsNumber(conn) ? conn->valuedouble : -1;
        if (i == 0)
            first = id;
        same &= id > 0 && id == first;
    }
    CHECK_MSG(n == 3 && same, "3 requests on one connection, not: %s", j ? j : "(no records)");
    cJSON_Delete(recs);
    free(j);
    pool_clear(&h);
    llmretry_engine_free(e);
}

/* The policy is the engine's: a 503 retried after its backoff, a 429's
 * Retry-After waited, max_retries bounding what the server sees. */
static void test_retries(void)
{
    if (th_mock_script(&mock, "host_retry", "{\"steps\": [{\"status\": 503}, "
                       "{\"status\": 429, \"retry_after\": \"0.3\"}, {}]}") != 0)
        return;
    llmretry_engine *e = th_host_engine_new(0);
    host h = { 0 };
    char url[128];
    llmretry_options o;
    opts_for(&o, "host_retry", url, sizeof url);
    int64_t t0 = th_now_ms();
    llmretry_call *c = e ? submit(e, &o) : NULL;
    int events[32] = { 0 };
    const llmretry_result *r = c ? drive(e, &h, c, events) : NULL;
    CHECK_MSG(r && r->ok, "%s", r && r->message ? r->message : "");
    CHECK_INT(r ? r->attempts : -1, 3);
    CHECK_INT(events[LLMRETRY_EV_RETRY_SCHEDULED], 2);
    CHECK_INT(events[LLMRETRY_EV_REQUEST_FAILED], 2);
    CHECK_MSG(th_now_ms() - t0 >= 300, "Retry-After 0.3 s not waited: %lld ms",
              (long long)(th_now_ms() - t0));
    CHECK_INT(requests_seen("host_retry"), 3);
    llmretry_call_free(c);

    if (th_mock_script(&mock, "host_bound", "{\"steps\": [], \"after\": {\"status\": 500}}") != 0)
        return;
    opts_for(&o, "host_bound", url, sizeof url);
    o.max_retries = 2;
    c = e ? submit(e, &o) : NULL;
    r = c ? drive(e, &h, c, NULL) : NULL;
    CHECK(r && !r->ok && r->kind == LLMRETRY_ERR_HTTP_STATUS && r->status == 500);
    CHECK(r && r->reason == LLMRETRY_REASON_RETRIES_EXHAUSTED);
    CHECK_INT(r ? r->attempts : -1, 3);
    CHECK_INT(requests_seen("host_bound"), 3);
    llmretry_call_free(c);
    pool_clear(&h);
    llmretry_engine_free(e);
}

/* The exchange's timeout is the attempt's: a slow answer times out. */
static void test_timeout_and_refused(void)
{
    if (th_mock_script(&mock, "host_slow", "{\"steps\": [{\"delay_ms\": 2000}]}") != 0)
        return;
    llmretry_engine *e = th_host_engine_new(0);
    host h = { 0 };
    char url[128];
    llmretry_options o;
    opts_for(&o, "host_slow", url, sizeof url);
    o.timeout_ms = 150;
    o.max_retries = 0;
    llmretry_call *c = e ? submit(e, &o) : NULL;
    const llmretry_result *r = c ? drive(e, &h, c, NULL) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_TIMEOUT, "kind %d: %s",
              r ? (int)r->kind : -1, r && r->message ? r->message : "");
    llmretry_call_free(c);

    /* Nobody listens there: a network error, retried, then given up. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", ntohs(a.sin_port));
    opts_for(&o, "unused", url, 0);
    o.base_url = url;
    o.max_retries = 1;
    c = e ? submit(e, &o) : NULL;
    r = c ? drive(e, &h, c, NULL) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_NETWORK && r->attempts == 2,
              "kind %d attempts %d: %s", r ? (int)r->kind : -1, r ? r->attempts : -1,
              r && r->message ? r->message : "");
    CHECK(r && r->message && strstr(r->message, "could not connect"));
    llmretry_call_free(c);
    pool_clear(&h);
    llmretry_engine_free(e);
}

/* A kept-alive connection reset after the request went: the server may
 * have read it, so it is an attempt (not a free re-send), retried at once
 * in safe mode; in unsafe mode it stops. */
static void test_reused_died(void)
{
    static const llmretry_retry_mode modes[] = { LLMRETRY_RETRY_SAFE, LLMRETRY_RETRY_UNSAFE };
    for (int m = 0; m < 2; m++) {
        if (th_mock_script(&mock, "host_reset",
                           "{\"steps\": [{}, {\"fault\": \"reset\"}, {}]}") != 0)
            return;
        llmretry_engine *e = th_host_engine_new(0);
        host h = { 0 };
        char url[128];
        llmretry_options o;
        opts_for(&o, "host_reset", url, sizeof url);
        o.base_delay_ms = 3000;     /* a backoff would show */
        o.retry_mode = modes[m];
        llmretry_call *c = e ? submit(e, &o) : NULL;
        const llmretry_result *r = c ? drive(e, &h, c, NULL) : NULL;
        CHECK(r && r->ok);
        llmretry_call_free(c);
        int64_t t0 = th_now_ms();
        c = e ? submit(e, &o) : NULL;
        r = c ? drive(e, &h, c, NULL) : NULL;
        if (modes[m] == LLMRETRY_RETRY_SAFE) {
            CHECK_MSG(r && r->ok && r->attempts == 2, "safe: ok=%d attempts=%d %s",
                      r ? r->ok : -1, r ? r->attempts : -1, r && r->message ? r->message : "");
            CHECK_MSG(th_now_ms() - t0 < 2000, "the retry waited a backoff (%lld ms)",
                      (long long)(th_now_ms() - t0));
            CHECK_INT(requests_seen("host_reset"), 3);
        } else {
            CHECK_MSG(r && !r->ok && r->reason == LLMRETRY_REASON_UNSAFE_MODE && r->attempts == 1,
                      "unsafe: ok=%d reason=%d attempts=%d", r ? r->ok : -1,
                      r ? (int)r->reason : -1, r ? r->attempts : -1);
            CHECK_INT(requests_seen("host_reset"), 2);
        }
        llmretry_call_free(c);
        pool_clear(&h);
        llmretry_engine_free(e);
    }
}

/* What the server sends is bounded and checked as for the engine's own
 * transfers: too large, cut short, not JSON. */
static void test_bad_answers(void)
{
    static const struct { const char *step; llmretry_error_kind kind; } cases[] = {
        { "{\"fault\": \"huge\", \"size\": 200000}", LLMRETRY_ERR_RESPONSE_TOO_LARGE },
        { "{\"fault\": \"truncate\"}", LLMRETRY_ERR_NETWORK },
        { "{\"fault\": \"invalid_json\"}", LLMRETRY_ERR_INVALID_RESPONSE },
        { "{\"fault\": \"close\"}", LLMRETRY_ERR_NETWORK },
    };
    llmretry_engine *e = th_host_engine_new(0);
    for (size_t i = 0; i < sizeof cases / sizeof *cases && e; i++) {
        char script[256];
        snprintf(script, sizeof script, "{\"steps\": [%s]}", cases[i].step);
        if (th_mock_script(&mock, "host_bad", script) != 0)
            break;
        host h = { 0 };
        char url[128];
        llmretry_options o;
        opts_for(&o, "host_bad", url, sizeof url);
        o.max_retries = 0;
        o.max_response_bytes = 100000;
        llmretry_call *c = submit(e, &o);
        const llmretry_result *r = c ? drive(e, &h, c, NULL) : NULL;
        CHECK_MSG(r && !r->ok && r->kind == cases[i].kind, "case %zu: ok=%d kind=%d (%s)", i,
                  r ? r->ok : -1, r ? (int)r->kind : -1, r && r->message ? r->message : "");
        CHECK(r && r->request_id && r->message && !strstr(r->message, "sk-test-host-io"));
        llmretry_call_free(c);
        pool_clear(&h);
    }
    llmretry_engine_free(e);
}

/* A server that answers an event stream to a call that did not ask for
 * one: read as the engine's own transfers read it (an assembled answer). */
static void test_unasked_stream(void)
{
    if (th_mock_script(&mock, "host_sse", "{\"steps\": [{\"stream\": {\"chunks\": 5}}]}") != 0)
        return;
    llmretry_engine *e = th_host_engine_new(0);
    host h = { 0 };
    char url[128];
    llmretry_options o;
    opts_for(&o, "host_sse", url, sizeof url);
    o.max_retries = 0;
    llmretry_call *c = e ? submit(e, &o) : NULL;
    const llmretry_result *r = c ? drive(e, &h, c, NULL) : NULL;
    CHECK_MSG(r && r->ok && r->stream, "ok=%d stream=%d kind=%d %s", r ? r->ok : -1,
              r ? r->stream : -1, r ? (int)r->kind : -1, r && r->message ? r->message : "");
    llmretry_call_free(c);
    pool_clear(&h);
    llmretry_engine_free(e);
}

/* A call's mail taken to its end (events freed): its result, once DONE. */
static const llmretry_result *ended(llmretry_call *c)
{
    llmretry_event *ev;
    llmretry_mail m;
    while ((m = llmretry_call_next(c, &ev)) == LLMRETRY_MAIL_EVENT)
        llmretry_event_free(ev);
    CHECK_INT(m, LLMRETRY_MAIL_DONE);
    return m == LLMRETRY_MAIL_DONE ? llmretry_call_result(c) : NULL;
}

/* A cancelled call's exchange is gone; streams and ca_file are refused at
 * submit; run is for host engines only. */
static void test_cancel_and_refusals(void)
{
    if (th_mock_script(&mock, "host_cancel", "{\"steps\": []}") != 0)
        return;
    llmretry_engine *e = th_host_engine_new(0);
    char url[128];
    llmretry_options o;
    opts_for(&o, "host_cancel", url, sizeof url);
    llmretry_call *c = e ? submit(e, &o) : NULL;
    llmretry_exchange x;
    llmretry_engine_run(e, NULL);
    CHECK(c && llmretry_call_exchange(c, &x) == 1);
    /* The line that differs from call to call: its request id's. */
    char id_line[80];
    snprintf(id_line, sizeof id_line, "X-Client-Request-Id: %s\r\n",
             c ? llmretry_call_request_id(c) : "");
    CHECK_MSG(x.vary_len == strlen(id_line) && x.vary_at + x.vary_len < x.request_len &&
              memcmp(x.request + x.vary_at, id_line, x.vary_len) == 0,
              "vary_at %zu vary_len %zu", x.vary_at, x.vary_len);
    CHECK(x.timeout_ms == 5000 && x.port == mock.port && !x.tls);
    llmretry_call_cancel(c);
    llmretry_engine_run(e, NULL);
    CHECK(c && llmretry_call_exchange(c, &x) == 0);
    CHECK_INT(c ? (int)llmretry_call_exchange_feed(c, x.token, "HTTP/1.1", 8) : -1,
              LLMRETRY_FEED_GONE);
    const llmretry_result *r = ended(c);
    CHECK(r && r->reason == LLMRETRY_REASON_CANCELLED);
    llmretry_call_free(c);

    static const char stream_body[] =
        "{\"model\": \"m\", \"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    o.body = stream_body;
    o.body_len = strlen(stream_body);
    char err[LLMRETRY_ERRBUF] = "";
    c = NULL;
    CHECK_INT(llmretry_engine_submit(e, &o, 0, &c, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_MSG(strncmp(err, "stream:", 7) == 0, "%s", err);
    opts_for(&o, "host_cancel", url, sizeof url);
    o.ca_file = "/etc/ssl/certs/ca-certificates.crt";
    CHECK_INT(llmretry_engine_submit(e, &o, 0, &c, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_MSG(strncmp(err, "ca_file:", 8) == 0, "%s", err);
    llmretry_engine_free(e);

    llmretry_engine *t = NULL;
    CHECK_INT(llmretry_engine_new(NULL, &t, err, sizeof err), LLMRETRY_OK);
    CHECK_INT(llmretry_engine_run(t, NULL), LLMRETRY_ESTATE);
    llmretry_engine_free(t);
}

/* A host engine's channel: polled after each turn, its fd left alone until
 * a host asks for it, and then readable exactly while it has news. */
static void test_channel(void)
{
    llmretry_engine *e = th_host_engine_new(0);
    llmretry_channel *ch = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_INT(e ? (int)llmretry_channel_new(e, &ch, err, sizeof err) : -1, LLMRETRY_OK);
    char url[128];
    llmretry_options o;
    opts_for(&o, "host_channel", url, sizeof url);
    o.channel = ch;
    llmretry_call *c = e && ch ? submit(e, &o) : NULL;
    llmretry_engine_run(e, NULL);
    llmretry_call *got[4];
    CHECK_INT(ch ? llmretry_channel_poll(ch, got, 4) : 0, 1);    /* its exchange is waiting */
    CHECK(got[0] == c);
    llmretry_call_cancel(c);
    llmretry_engine_run(e, NULL);               /* news: cancelled */
    int fd = ch ? llmretry_channel_fd(ch) : -1;
    struct pollfd p = { fd, POLLIN, 0 };
    CHECK_MSG(fd >= 0 && poll(&p, 1, 0) == 1, "the fd asked for with news waiting is not readable");
    CHECK_INT(ch ? llmretry_channel_poll(ch, got, 4) : 0, 1);
    CHECK_MSG(poll(&p, 1, 0) == 0, "the fd stays readable once the news is taken");
    llmretry_call_free(c);
    llmretry_channel_free(ch);
    llmretry_engine_free(e);
}

/* One answer got some other way (a Batch API result line), judged as an
 * attempt's: the call's result from its status and body alone. */
static const llmretry_result *answered(llmretry_engine *e, llmretry_call **cp, int status,
                                       const char *body)
{
    static const char req[] = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", "
                              "\"content\": \"the secret plan for the harbour\"}]}";
    llmretry_options o;
    llmretry_options_defaults(&o);
    o.url = "http://127.0.0.1:9/v1/chat/completions";     /* never reached */
    o.api_key = "sk-answered-0123456789";
    o.body = req;
    o.body_len = strlen(req);
    o.max_retries = 0;
    *cp = e ? th_submit(e, &o) : NULL;
    llmretry_call *c = *cp;
    llmretry_exchange x;
    llmretry_engine_run(e, NULL);
    if (!c || llmretry_call_exchange(c, &x) != 1) {
        CHECK_MSG(0, "no exchange to answer");
        return NULL;
    }
    llmretry_feed f = llmretry_call_exchange_answer(c, x.token, status, body, strlen(body));
    CHECK_MSG(f == LLMRETRY_FEED_DONE || (status < 200 || status > 599),
              "status %d: feed %d", status, (int)f);
    llmretry_engine_run(e, NULL);
    CHECK_INT(llmretry_call_exchange_answer(c, x.token, status, body, strlen(body)),
              LLMRETRY_FEED_GONE);
    return ended(c);
}

static void test_exchange_answer(void)
{
    llmretry_engine *e = th_host_engine_new(0);
    llmretry_call *c;
    const llmretry_result *r = answered(e, &c, 200,
        "{\"model\": \"m-1\", \"choices\": [{\"index\": 0, \"message\": {\"role\": \"assistant\", "
        "\"content\": \"ok\"}, \"finish_reason\": \"stop\"}], \"usage\": {\"prompt_tokens\": 3, "
        "\"completion_tokens\": 2, \"total_tokens\": 5}}");
    CHECK(r && r->ok && r->status == 200 && r->attempts == 1);
    CHECK(r && r->usage.present && r->usage.total_tokens == 5);
    CHECK(r && r->response_model && strcmp(r->response_model, "m-1") == 0);
    llmretry_call_free(c);

    /* A 200 whose body is an error: a failed attempt, as on the wire. */
    r = answered(e, &c, 200, "{\"error\": {\"code\": 502, \"message\": \"Provider returned error\"}}");
    CHECK(r && !r->ok && r->kind == LLMRETRY_ERR_HTTP_STATUS && r->status == 502);
    CHECK_MSG(r && r->message && strstr(r->message, "Provider returned error"), "%s",
              r && r->message ? r->message : "");
    llmretry_call_free(c);
    r = answered(e, &c, 200, "{\"id\": \"x\", \"choices\": []}");
    CHECK(r && !r->ok && r->kind == LLMRETRY_ERR_INVALID_RESPONSE);
    llmretry_call_free(c);

    /* An error's message that quotes the prompt, or the key, is withheld. */
    r = answered(e, &c, 400, "{\"error\": {\"code\": \"bad\", \"message\": \"Invalid content: the "
                             "secret plan for the harbour\"}}");
    CHECK(r && !r->ok && r->status == 400 && r->reason == LLMRETRY_REASON_NOT_RETRYABLE);
    CHECK_MSG(r && r->message && !strstr(r->message, "secret plan") && strstr(r->message, "withheld"),
              "%s", r && r->message ? r->message : "");
    llmretry_call_free(c);
    r = answered(e, &c, 401, "{\"error\": {\"message\": \"bad key sk-answered-0123456789\"}}");
    CHECK_MSG(r && r->message && !strstr(r->message, "sk-answered"), "%s",
              r && r->message ? r->message : "");
    llmretry_call_free(c);

    /* An empty body, not JSON, a status that is none. */
    r = answered(e, &c, 200, "");
    CHECK(r && !r->ok && r->kind == LLMRETRY_ERR_INVALID_RESPONSE);
    llmretry_call_free(c);
    r = answered(e, &c, 204, "{}");
    CHECK(r && !r->ok && r->kind == LLMRETRY_ERR_INVALID_RESPONSE);
    llmretry_call_free(c);
    static const int odd[] = { 0, 100, 199, 600, -1 };
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        r = answered(e, &c, odd[i], "{}");
        CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_NETWORK && r->message &&
                  strstr(r->message, "not an HTTP status"), "status %d: %s", odd[i],
                  r && r->message ? r->message : "");
        llmretry_call_free(c);
    }
    llmretry_engine_free(e);
}

/* An engine freed with calls in flight cancels them, on the host's thread. */
static void test_free_in_flight(void)
{
    llmretry_engine *e = th_host_engine_new(0);
    char url[128];
    llmretry_options o;
    opts_for(&o, "host_free", url, sizeof url);
    llmretry_call *c[3] = { 0 };
    for (int i = 0; i < 3 && e; i++)
        c[i] = submit(e, &o);
    llmretry_engine_run(e, NULL);
    llmretry_engine_free(e);
    for (int i = 0; i < 3; i++) {
        const llmretry_result *r = ended(c[i]);
        CHECK(r && r->reason == LLMRETRY_REASON_CANCELLED);
        llmretry_call_free(c[i]);
    }
}

int main(void)
{
    static const th_case pure[] = {
        { "parser_framings", test_parser_framings },
        { "parser_refuses", test_parser_refuses },
        { "parser_refused_body", test_parser_refused_body },
        { "exchange_answer", test_exchange_answer },
    };
    TH_RUN(pure);
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "the mock server did not start");
        return th_summary("test_host_io");
    }
    static const th_case cases[] = {
        { "call_succeeds", test_call_succeeds },
        { "keep_alive", test_keep_alive },
        { "retries", test_retries },
        { "timeout_and_refused", test_timeout_and_refused },
        { "reused_died", test_reused_died },
        { "bad_answers", test_bad_answers },
        { "unasked_stream", test_unasked_stream },
        { "cancel_and_refusals", test_cancel_and_refusals },
        { "channel", test_channel },
        { "free_in_flight", test_free_in_flight },
    };
    TH_RUN(cases);
    th_mock_stop(&mock);
    return th_summary("test_host_io");
}
