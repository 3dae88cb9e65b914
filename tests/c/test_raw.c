/* The core against a raw-socket server that sends exactly the bytes a test
 * gives it: what the mock server cannot say (duplicate headers, 1xx interim
 * responses, very long header values, invalid UTF-8 bodies). Each
 * connection reads one request and gets the canned response, then closes. */
#include "harness.h"
#include "llmretry.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static int listen_fd = -1, port;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char *response;          /* what every connection gets (mu) */
static size_t response_len;
static char last_request[8192]; /* the last request's head and body (mu) */
static int requests;

/* Read one request: headers, then Content-Length bytes of body. */
static void read_request(int fd)
{
    char buf[8192];
    size_t len = 0;
    long body = -1;
    for (;;) {
        ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end && body < 0) {
            char *cl = strcasestr(buf, "\r\nContent-Length:");
            body = cl && cl < end ? strtol(cl + 17, NULL, 10) : 0;
        }
        if (end && (size_t)(end + 4 - buf) + (size_t)body <= len)
            break;
        if (len >= sizeof buf - 1)
            break;
    }
    buf[len] = '\0';
    pthread_mutex_lock(&mu);
    memcpy(last_request, buf, len + 1);
    requests++;
    pthread_mutex_unlock(&mu);
}

static void *serve(void *ud)
{
    (void)ud;
    for (;;) {
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0)
            return NULL;
        read_request(fd);
        pthread_mutex_lock(&mu);
        size_t off = 0;
        while (off < response_len) {
            ssize_t w = write(fd, response + off, response_len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        pthread_mutex_unlock(&mu);
        close(fd);
    }
}

static int start_server(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(listen_fd, 16) != 0 || getsockname(listen_fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    port = ntohs(a.sin_port);
    pthread_t t;
    if (pthread_create(&t, NULL, serve, NULL) != 0)
        return -1;
    pthread_detach(t);
    return 0;
}

/* Set the canned response: `head` (status line and headers, each ending
 * in \r\n, without the blank line) and a body of `blen` bytes. */
static void set_response(const char *head, const char *body, size_t blen)
{
    char cl[64];
    snprintf(cl, sizeof cl, "Content-Length: %zu\r\nConnection: close\r\n\r\n", blen);
    pthread_mutex_lock(&mu);
    free(response);
    response_len = strlen(head) + strlen(cl) + blen;
    response = malloc(response_len);
    memcpy(response, head, strlen(head));
    memcpy(response + strlen(head), cl, strlen(cl));
    memcpy(response + strlen(head) + strlen(cl), body, blen);
    requests = 0;
    pthread_mutex_unlock(&mu);
}

static void opts(llmretry_options *o, char *url, size_t len)
{
    snprintf(url, len, "http://127.0.0.1:%d/v1", port);
    llmretry_options_defaults(o);
    o->base_url = url;
    o->api_key = "sk-test";
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->timeout_ms = 5000;
    o->max_retries = 0;
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 10;
}

static int ev_count[8];

static void count_event(const llmretry_event *ev, void *ud)
{
    (void)ud;
    int t = (int)llmretry_event_type_of(ev);
    if (t >= 0 && t < 8)
        ev_count[t]++;
}

static llmretry_call *run(const llmretry_options *o)
{
    static llmretry_engine *e;
    char err[LLMRETRY_ERRBUF] = "";
    if (!e && llmretry_engine_new(NULL, &e, err, sizeof err) != LLMRETRY_OK)
        return NULL;
    if (!o) {
        llmretry_engine_free(e);
        e = NULL;
        return NULL;
    }
    llmretry_call *c = NULL;
    memset(ev_count, 0, sizeof ev_count);
    llmretry_status st = llmretry_call_blocking(e, o, count_event, NULL, &c, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_OK && c, "call: %s (%s)", llmretry_status_name(st), err);
    return c;
}

#define ERR_BODY "{\"error\":{\"message\":\"busy\",\"type\":\"server_error\"}}"

/* The server's wait as the call read it (result.retry_after_ms). */
static int64_t retry_after_of(const char *head)
{
    char url[64];
    llmretry_options o;
    opts(&o, url, sizeof url);
    set_response(head, ERR_BODY, strlen(ERR_BODY));
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    int64_t v = r ? r->retry_after_ms : -2;
    CHECK_MSG(r && !r->ok && r->status == 503, "expected a 503 result");
    llmretry_call_free(c);
    return v;
}

static void test_retry_after_whole_value(void)
{
    char head[1024];
    char pad[401];
    memset(pad, ' ', 400);
    pad[400] = '\0';
    /* Cut at 95 bytes this read as 300 ms. */
    snprintf(head, sizeof head, "HTTP/1.1 503 Busy\r\nRetry-After: 0.3%sgarbage\r\n", pad);
    CHECK_INT(retry_after_of(head), -1);
    snprintf(head, sizeof head, "HTTP/1.1 503 Busy\r\nretry-after-ms: 300%sgarbage\r\n", pad);
    CHECK_INT(retry_after_of(head), -1);
    /* A long value that is one number is read whole. */
    char zeros[301];
    memset(zeros, '0', 300);
    zeros[300] = '\0';
    snprintf(head, sizeof head, "HTTP/1.1 503 Busy\r\nRetry-After: 0.5%s\r\n", zeros);
    CHECK_INT(retry_after_of(head), 500);
    snprintf(head, sizeof head, "HTTP/1.1 503 Busy\r\nRetry-After: 1%s\r\n", zeros);
    CHECK_INT(retry_after_of(head), LLMRETRY_MAX_WAIT_MS);
}

static void test_duplicate_retry_after(void)
{
    CHECK_INT(retry_after_of("HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nRetry-After: 2\r\n"), 7000);
    CHECK_INT(retry_after_of("HTTP/1.1 503 Busy\r\nRetry-After: 2\r\nRetry-After: 7\r\n"), 7000);
    CHECK_INT(retry_after_of("HTTP/1.1 503 Busy\r\nRetry-After: 3\r\nRetry-After: soon\r\n"), 3000);
    CHECK_INT(retry_after_of("HTTP/1.1 503 Busy\r\nretry-after-ms: 900\r\n"
                             "Retry-After-Ms: 40\r\n"), 900);
    /* A 429 with two resets: the longest (the result keeps the decided
     * delay out of retry_after_ms, so look at the giving-up reason). */
    char url[64];
    llmretry_options o;
    opts(&o, url, sizeof url);
    o.max_retries = 1;
    o.max_retry_after_ms = 5000;
    set_response("HTTP/1.1 429 Slow\r\nx-ratelimit-reset-requests: 10s\r\n"
                 "x-ratelimit-reset-requests: 1s\r\n", ERR_BODY, strlen(ERR_BODY));
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->reason == LLMRETRY_REASON_RETRY_AFTER_TOO_LONG,
              "duplicate reset headers 10s, 1s: reason %s, want retry_after_too_long",
              r ? llmretry_reason_name(r->reason) : "(none)");
    llmretry_call_free(c);
}

static void test_interim_content_length(void)
{
    static const char ok[] = "{\"id\":\"x\",\"object\":\"chat.completion\",\"model\":\"gpt-test\","
                             "\"choices\":[]}";
    char url[64];
    llmretry_options o;
    opts(&o, url, sizeof url);
    o.max_response_bytes = 1000;
    set_response("HTTP/1.1 103 Early Hints\r\nContent-Length: 999999999\r\n"
                 "Link: </x>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"
                 "Content-Type: application/json\r\n", ok, strlen(ok));
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->ok, "a 1xx Content-Length counted toward max_response_bytes: %s",
              r && r->message ? r->message : "(no message)");
    llmretry_call_free(c);
}

/* The provider's text in an error cannot start a log line of its own, and
 * the error names the path called, never the query or credentials. */
static void test_error_message(void)
{
    char url[160];
    llmretry_options o;
    opts(&o, url, sizeof url);
    snprintf(url, sizeof url, "http://user:pw-SECRET@127.0.0.1:%d/v1/chat/completions?key=Q-SECRET",
             port);
    o.url = url;
    o.base_url = NULL;
    o.api_key = "sk-test-ECHOED";
    static const char body[] =
        "{\"error\":{\"message\":\"bad key sk-test-ECHOED for SECRET-PROMPT\","
        "\"code\":\"bad\\n2026-12-01 INFO forged\\r\\u001b[31m\xff\"}}";
    set_response("HTTP/1.1 401 No\r\nContent-Type: application/json\r\n", body, strlen(body));
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    const char *m = r && r->message ? r->message : "";
    static const char want[] = "HTTP 401 from /v1/chat/completions (bad\\n2026-12-01 INFO "
                               "forged\\r\\x1b[31m\\xff); gave up";
    CHECK_MSG(strncmp(m, want, strlen(want)) == 0, "message: %s", m);
    CHECK_MSG(!strpbrk(m, "\r\n\x1b"), "raw control characters in: %s", m);
    CHECK_MSG(!strstr(m, "SECRET") && !strstr(m, "ECHOED") && !strstr(m, "?"),
              "credentials, prompt or query in: %s", m);
    CHECK_MSG(r && r->error_code && strncmp(r->error_code, "bad\n2026", 8) == 0,
              "error_code is data, kept raw: %s", r && r->error_code ? r->error_code : "");
    llmretry_call_free(c);

    opts(&o, url, sizeof url);
    static const char rl[] = "{\"error\":{\"message\":\"slow down\",\"code\":\"429\"}}";
    set_response("HTTP/1.1 429 Slow\r\n", rl, strlen(rl));
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    m = r && r->message ? r->message : "";
    CHECK_MSG(strncmp(m, "HTTP 429 from /v1/chat/completions; gave up", 43) == 0,
              "message: %s", m);
    llmretry_call_free(c);
}

/* A 2xx body must be UTF-8 JSON as every host decodes it: anything else is
 * an invalid response, retried, and no event says it succeeded. */
static void test_body_must_be_utf8_json(void)
{
    static const struct { const char *body; int ok; } t[] = {
        { "{\"choices\":[],\"x\":\"\xff\"}", 0 },          /* invalid UTF-8 */
        { "{\"choices\":[],\"x\":\"\xc0\xaf\"}", 0 },       /* overlong */
        { "{\"choices\":[],\"x\":\"\xed\xa0\x80\"}", 0 },   /* a surrogate */
        { "{\"choices\":[],\"x\":\"a\x01b\"}", 0 },         /* raw control char */
        { "{\"choices\":[],\"x\":\"a\nb\"}", 0 },           /* raw newline in a string */
        { "{\x01\"choices\":[]}", 0 },                       /* control char outside */
        { "{\"choices\":[],\"x\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}", 1 },
        { "{\"choices\":[],\"x\":\"a\\u0000b\\\"\\\\\"}", 1 },   /* escapes are fine */
        { "{\"choices\":[]}\r\n\t ", 1 },
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        char url[64];
        llmretry_options o;
        opts(&o, url, sizeof url);
        o.max_retries = 1;
        set_response("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n", t[i].body,
                     strlen(t[i].body));
        llmretry_call *c = run(&o);
        const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
        if (t[i].ok) {
            CHECK_MSG(r && r->ok, "body %zu: not ok (%s)", i, r && r->message ? r->message : "");
        } else {
            CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_INVALID_RESPONSE && r->attempts == 2,
                      "body %zu: ok=%d kind=%s attempts=%d", i, r ? r->ok : -1,
                      r ? llmretry_error_kind_name(r->kind) : "", r ? r->attempts : -1);
            CHECK_MSG(ev_count[LLMRETRY_EV_REQUEST_SUCCEEDED] == 0 &&
                      ev_count[LLMRETRY_EV_REQUEST_ERROR] == 2,
                      "body %zu: %d succeeded, %d error events", i,
                      ev_count[LLMRETRY_EV_REQUEST_SUCCEEDED], ev_count[LLMRETRY_EV_REQUEST_ERROR]);
        }
        llmretry_call_free(c);
    }
}

int main(void)
{
    if (start_server() != 0) {
        CHECK_MSG(0, "raw server did not start");
        return th_summary("test_raw");
    }
    struct { const char *name; void (*fn)(void); } tests[] = {
        { "retry_after_whole_value", test_retry_after_whole_value },
        { "duplicate_retry_after", test_duplicate_retry_after },
        { "interim_content_length", test_interim_content_length },
        { "error_message", test_error_message },
        { "body_must_be_utf8_json", test_body_must_be_utf8_json },
    };
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        int before = th_failed;
        tests[i].fn();
        fprintf(stderr, "%-28s %s\n", tests[i].name, th_failed == before ? "ok" : "FAILED");
    }
    run(NULL);
    shutdown(listen_fd, SHUT_RDWR);
    close(listen_fd);
    free(response);
    return th_summary("test_raw");
}
