/* Requests sent again (docs/reliability.md, Re-sends). Free, at once, no
 * attempt counted, only when the request provably never reached the
 * server: a keep-alive connection with unread bytes, or one the server
 * closed while it idled. A request written on a reused connection that
 * then dies without a byte of a response may have been read: that is an
 * attempt (retried at once in safe mode, a stop in unsafe mode), so the
 * server sees at most 1 + max_retries of them.
 *
 * Two servers: a raw socket in a thread, which can misbehave in ways the
 * mock server (and any sane HTTP library) will not (answer a request
 * nobody sent), and the project's mock, whose request records are the
 * count of what a server saw. ctest runs this under fail_send.so, which
 * fails one send() on cue. */
#include "harness.h"
#include "llmretry.h"

#include <arpa/inet.h>
#include <cJSON.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

/* How long after its answer the server sends an answer to nothing
 * (test_unsolicited_response says why it matters). */
#define UNSOLICITED_GAP_MS 50

typedef enum {
    MODE_UNSOLICITED,   /* after each answer, an answer to nothing */
    MODE_HANGUP_REUSED, /* the second request of a connection: read, then close */
} srv_mode;

typedef struct srv {
    int lfd, port;
    srv_mode mode;
    atomic_int requests;        /* requests read, all connections */
    atomic_int connections;
    atomic_int unsolicited;     /* answers to nothing written */
    atomic_int stop;
    pthread_t thread;
} srv;

/* Read one request (headers and a Content-Length body); 0 at EOF. */
static int read_request(int fd)
{
    char buf[8192];
    size_t len = 0;
    for (;;) {
        ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (n <= 0)
            return 0;
        len += (size_t)n;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (!end)
            continue;
        const char *cl = strcasestr(buf, "content-length:");
        size_t want = (size_t)(end + 4 - buf) + (cl ? (size_t)atol(cl + 15) : 0);
        while (len < want) {
            n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
            if (n <= 0)
                return 0;
            len += (size_t)n;
        }
        return 1;
    }
}

static void answer(int fd, const char *content)
{
    char body[256], msg[512];
    int bl = snprintf(body, sizeof body,
                      "{\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":"
                      "{\"role\":\"assistant\",\"content\":\"%s\"}}]}", content);
    int ml = snprintf(msg, sizeof msg,
                      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s", bl, body);
    (void)!send(fd, msg, (size_t)ml, MSG_NOSIGNAL);
}

static void serve(srv *s, int fd)
{
    atomic_fetch_add(&s->connections, 1);
    for (int on_conn = 1; !atomic_load(&s->stop); on_conn++) {
        if (!read_request(fd))
            break;
        int n = atomic_fetch_add(&s->requests, 1) + 1;
        if (s->mode == MODE_HANGUP_REUSED && on_conn == 2)
            break;              /* read it, never answer: FIN */
        char content[32];
        snprintf(content, sizeof content, "request %d", n);
        answer(fd, content);
        if (s->mode == MODE_UNSOLICITED) {
            th_sleep_ms(UNSOLICITED_GAP_MS);    /* a separate write, after the answer */
            answer(fd, "unsolicited");
            atomic_fetch_add(&s->unsolicited, 1);
        }
    }
    close(fd);
}

/* One connection at a time is all these tests need. */
static void *srv_main(void *ud)
{
    srv *s = ud;
    while (!atomic_load(&s->stop)) {
        struct pollfd p = { s->lfd, POLLIN, 0 };
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd >= 0)
            serve(s, fd);
    }
    return NULL;
}

static int srv_start(srv *s, srv_mode mode)
{
    memset(s, 0, sizeof *s);
    s->mode = mode;
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(s->lfd, 16) != 0 || getsockname(s->lfd, (struct sockaddr *)&a, &al) != 0)
        return -1;
    s->port = ntohs(a.sin_port);
    return pthread_create(&s->thread, NULL, srv_main, s) == 0 ? 0 : -1;
}

static void srv_stop(srv *s)
{
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
    close(s->lfd);
}

static void opts_for(llmretry_options *o, const srv *s, char *url, size_t len)
{
    llmretry_options_defaults(o);
    snprintf(url, len, "http://127.0.0.1:%d/v1", s->port);
    o->base_url = url;
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 3000;      /* a backoff would show in total_ms */
    o->timeout_ms = 5000;
}

static llmretry_call *run(llmretry_engine *e, const llmretry_options *o)
{
    llmretry_call *c = NULL;
    char err[256] = "";
    llmretry_status st = llmretry_call_blocking(e, o, NULL, NULL, &c, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_OK, "call_blocking: %s", err);
    return c;
}

static int says(const llmretry_result *r, const char *content)
{
    return r && r->ok && r->body && strstr(r->body, content) != NULL;
}

/* Each call gets its own answer, though the server put an answer to
 * nothing on every idle connection: a connection with unread bytes is
 * never reused (its bytes would be read as the next call's answer).
 * Who notices decides the count. Normally the stray answer comes while
 * the connection is idle, and the engine's check before the next request
 * is written (transfer.c, connection_is_stale) makes it one free re-send.
 * But an I/O thread that reads the real answer late (CI, under ASan on a
 * loaded machine) gets both in one read: libcurl calls the rest excess and
 * closes the connection itself, and the next call's new connection makes
 * it none (a server writing both at once makes every call so). The stray
 * answer comes UNSOLICITED_GAP_MS after the real one, and over four reuses
 * the engine's own check must have caught at least one. */
#define UNSOLICITED_CALLS 5
static void test_unsolicited_response(void)
{
    srv s;
    if (srv_start(&s, MODE_UNSOLICITED) != 0) {
        CHECK_MSG(0, "could not start the raw server");
        return;
    }
    llmretry_engine *e = NULL;
    char err[256], url[64];
    CHECK(llmretry_engine_new(NULL, &e, err, sizeof err) == LLMRETRY_OK);
    llmretry_options o;
    opts_for(&o, &s, url, sizeof url);
    int caught = 0;
    for (int i = 1; e && i <= UNSOLICITED_CALLS; i++) {
        llmretry_call *c = run(e, &o);
        const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
        char want[32];
        snprintf(want, sizeof want, "\"request %d\"", i);
        CHECK_MSG(says(r, want), "call %d got %.*s, expected %s", i,
                  r && r->body ? (int)r->body_len : 6, r && r->body ? r->body : "(none)", want);
        CHECK_MSG(r && r->attempts == 1, "call %d took %d attempts", i, r ? r->attempts : -1);
        CHECK_MSG(r && r->resends <= (i > 1), "call %d: %d free re-sends, expected %s", i,
                  r ? r->resends : -1, i > 1 ? "0 or 1" : "0");
        caught += r && r->resends == 1;
        llmretry_call_free(c);
        CHECK_MSG(TH_EVENTUALLY(atomic_load(&s.unsolicited) == i, 10000),
                  "the unsolicited answer %d was never written", i);
    }
    CHECK_MSG(caught >= 1, "the engine's own check caught none of %d stale connections",
              UNSOLICITED_CALLS - 1);
    /* Never a request on a stale connection: one per call, each on its own. */
    CHECK_INT(atomic_load(&s.requests), UNSOLICITED_CALLS);
    CHECK_INT(atomic_load(&s.connections), UNSOLICITED_CALLS);
    llmretry_engine_free(e);
    srv_stop(&s);
}

/* Safe mode: a request on a reused keep-alive connection that the server
 * read and hung up on without a byte is a failed attempt (the server may
 * have acted on it), retried at once on a new connection: no backoff. */
static void test_hangup_on_reused_safe(void)
{
    srv s;
    if (srv_start(&s, MODE_HANGUP_REUSED) != 0) {
        CHECK_MSG(0, "could not start the raw server");
        return;
    }
    llmretry_engine *e = NULL;
    char err[256], url[64];
    CHECK(llmretry_engine_new(NULL, &e, err, sizeof err) == LLMRETRY_OK);
    llmretry_options o;
    opts_for(&o, &s, url, sizeof url);
    llmretry_call *c = e ? run(e, &o) : NULL;     /* warms the connection */
    CHECK(c && says(llmretry_call_result(c), "\"request 1\""));
    llmretry_call_free(c);
    c = e ? run(e, &o) : NULL;
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(says(r, "\"request 3\""), "second call: ok=%d %s", r ? r->ok : -1,
              r && r->message ? r->message : "");
    CHECK_MSG(r && r->attempts == 2, "second call took %d attempts", r ? r->attempts : -1);
    CHECK_MSG(r && r->resends == 0, "second call: %d free re-sends", r ? r->resends : -1);
    CHECK_MSG(r && r->total_ms < 2000, "second call took %lld ms (a backoff?)",
              r ? (long long)r->total_ms : -1LL);
    llmretry_call_free(c);
    CHECK_INT(atomic_load(&s.requests), 3);
    llmretry_engine_free(e);
    srv_stop(&s);
}

/* Unsafe mode keeps refusing that re-send: the server read the request,
 * so it may have acted on it. */
static void test_hangup_on_reused_unsafe(void)
{
    srv s;
    if (srv_start(&s, MODE_HANGUP_REUSED) != 0) {
        CHECK_MSG(0, "could not start the raw server");
        return;
    }
    llmretry_engine *e = NULL;
    char err[256], url[64];
    CHECK(llmretry_engine_new(NULL, &e, err, sizeof err) == LLMRETRY_OK);
    llmretry_options o;
    opts_for(&o, &s, url, sizeof url);
    o.retry_mode = LLMRETRY_RETRY_UNSAFE;
    llmretry_call *c = e ? run(e, &o) : NULL;
    llmretry_call_free(c);
    c = e ? run(e, &o) : NULL;
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_NETWORK && r->resends == 0,
              "unsafe call on a hung-up reused connection: ok=%d resends=%d",
              r ? r->ok : -1, r ? r->resends : -1);
    llmretry_call_free(c);
    CHECK_INT(atomic_load(&s.requests), 2);
    llmretry_engine_free(e);
    srv_stop(&s);
}

/* ---- against the mock: the requests a server saw ------------------------ */

static th_mock mock;

static void mock_opts(llmretry_options *o, const char *name, char *url, size_t len,
                      llmretry_retry_mode mode)
{
    llmretry_options_defaults(o);
    o->base_url = th_mock_scenario_url(&mock, name, url, len);
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 10;
    o->timeout_ms = 5000;
    o->max_retries = 2;
    o->retry_mode = mode;
}

/* The scenario's request records (a cJSON array to delete), NULL on error. */
static cJSON *records(const char *name)
{
    char *t = th_mock_requests(&mock, name);
    cJSON *a = t ? cJSON_Parse(t) : NULL;
    free(t);
    if (!cJSON_IsArray(a)) {
        cJSON_Delete(a);
        return NULL;
    }
    return a;
}

/* Record i's number field `key`, -1 when absent. */
static double rec_num(const cJSON *a, int i, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(a, i), key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* After a first answer, the server reads every request and resets the
 * connection without a byte of an answer (a proxy dropping generations it
 * has started: each one billed). The first of them comes on the first
 * call's kept-alive connection, which libcurl would send again on its own.
 * The second call may cost the server 1 + max_retries requests in safe
 * mode (3: it was 4, one a free re-send), exactly 1 in unsafe mode. */
static void reset_after_read(llmretry_retry_mode mode)
{
    const char *name = mode == LLMRETRY_RETRY_UNSAFE ? "reset_after_read_unsafe"
                                                     : "reset_after_read_safe";
    if (th_mock_script(&mock, name, "{\"steps\": [{}], \"after\": {\"fault\": \"reset\"}}") != 0) {
        CHECK_MSG(0, "could not script %s", name);
        return;
    }
    llmretry_engine *e = th_engine_new();
    char url[128];
    llmretry_options o;
    mock_opts(&o, name, url, sizeof url, mode);
    llmretry_call *c = e ? run(e, &o) : NULL;
    CHECK_MSG(c && llmretry_call_result(c)->ok, "the first call failed");
    llmretry_call_free(c);
    c = e ? run(e, &o) : NULL;
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    int unsafe = mode == LLMRETRY_RETRY_UNSAFE;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_NETWORK &&
              r->reason == (unsafe ? LLMRETRY_REASON_UNSAFE_MODE
                                   : LLMRETRY_REASON_RETRIES_EXHAUSTED),
              "%s: ok=%d kind=%d reason=%d", name, r ? r->ok : -1, r ? (int)r->kind : -1,
              r ? (int)r->reason : -1);
    CHECK_INT(r ? r->attempts : -1, unsafe ? 1 : 3);
    CHECK_INT(r ? r->resends : -1, 0);
    llmretry_call_free(c);
    llmretry_engine_free(e);
    cJSON *a = records(name);
    CHECK_INT(a ? cJSON_GetArraySize(a) : -1, unsafe ? 2 : 4);
    /* The case at hand: the first reset request was on the reused connection. */
    CHECK_MSG(a && rec_num(a, 0, "connection") > 0
                && rec_num(a, 1, "connection") == rec_num(a, 0, "connection"),
              "%s: the second call's first request was not on the kept-alive connection", name);
    cJSON_Delete(a);
}

static void test_reset_after_read_safe(void)
{
    reset_after_read(LLMRETRY_RETRY_SAFE);
}

static void test_reset_after_read_unsafe(void)
{
    reset_after_read(LLMRETRY_RETRY_UNSAFE);
}

/* The server closes the first call's kept-alive connection while it idles
 * (uvicorn's keep-alive timeout, here 20 ms): the next request never goes
 * out on it, so it costs no attempt, in either mode. */
static void idle_closed(llmretry_retry_mode mode)
{
    const char *name = mode == LLMRETRY_RETRY_UNSAFE ? "idle_closed_unsafe" : "idle_closed_safe";
    if (th_mock_script(&mock, name, "{\"steps\": [{\"idle_close_ms\": 20}]}") != 0) {
        CHECK_MSG(0, "could not script %s", name);
        return;
    }
    llmretry_engine *e = th_engine_new();
    char url[128];
    llmretry_options o;
    mock_opts(&o, name, url, sizeof url, mode);
    llmretry_call *c = e ? run(e, &o) : NULL;
    CHECK_MSG(c && llmretry_call_result(c)->ok, "the first call failed");
    llmretry_call_free(c);
    int closed = 0;
    for (int64_t until = th_now_ms() + 5000; !closed && th_now_ms() < until;) {
        cJSON *a = records(name);
        closed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(a, 0),
                                                               "idle_closed"));
        cJSON_Delete(a);
        if (!closed)
            th_sleep_ms(5);
    }
    CHECK_MSG(closed, "%s: the mock never closed the idle connection", name);
    c = e ? run(e, &o) : NULL;
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->ok, "%s: second call: %s", name, r && r->message ? r->message : "");
    CHECK_INT(r ? r->attempts : -1, 1);
    llmretry_call_free(c);
    llmretry_engine_free(e);
    cJSON *a = records(name);
    CHECK_INT(a ? cJSON_GetArraySize(a) : -1, 2);
    CHECK_MSG(a && rec_num(a, 1, "connection") != rec_num(a, 0, "connection"),
              "%s: a request went out on the closed connection", name);
    cJSON_Delete(a);
}

static void test_idle_closed_safe(void)
{
    idle_closed(LLMRETRY_RETRY_SAFE);
}

static void test_idle_closed_unsafe(void)
{
    idle_closed(LLMRETRY_RETRY_UNSAFE);
}

/* fail_send.so's controls (CMakeLists preloads it), found at run time. */
static void (*fail_send_arm)(int port);
static int (*fail_send_armed)(void);

/* The first call's kept-alive connection is found dead as the second
 * call's request is written: the send fails, not a byte leaves (the shim
 * fails it, a race no server can win on cue). libcurl sends it again on a
 * new connection by itself; the server never saw the first, so that is
 * free (no attempt) in either mode. */
static void dead_before_write(llmretry_retry_mode mode)
{
    const char *name = mode == LLMRETRY_RETRY_UNSAFE ? "dead_before_write_unsafe"
                                                     : "dead_before_write_safe";
    if (!fail_send_arm || !fail_send_armed) {
        CHECK_MSG(0, "fail_send.so is not preloaded (run through ctest)");
        return;
    }
    if (th_mock_script(&mock, name, "{\"steps\": []}") != 0) {
        CHECK_MSG(0, "could not script %s", name);
        return;
    }
    llmretry_engine *e = th_engine_new();
    char url[128];
    llmretry_options o;
    mock_opts(&o, name, url, sizeof url, mode);
    llmretry_call *c = e ? run(e, &o) : NULL;
    CHECK_MSG(c && llmretry_call_result(c)->ok, "the first call failed");
    llmretry_call_free(c);
    fail_send_arm(mock.port);
    c = e ? run(e, &o) : NULL;
    CHECK_MSG(fail_send_armed() == 0, "%s: no send failed", name);
    fail_send_arm(0);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->ok, "%s: second call: %s", name, r && r->message ? r->message : "");
    CHECK_INT(r ? r->attempts : -1, 1);
    CHECK_INT(r ? r->resends : -1, 1);
    llmretry_call_free(c);
    llmretry_engine_free(e);
    cJSON *a = records(name);
    CHECK_INT(a ? cJSON_GetArraySize(a) : -1, 2);
    CHECK_MSG(a && rec_num(a, 1, "connection") != rec_num(a, 0, "connection"),
              "%s: both requests on one connection", name);
    cJSON_Delete(a);
}

static void test_dead_before_write_safe(void)
{
    dead_before_write(LLMRETRY_RETRY_SAFE);
}

static void test_dead_before_write_unsafe(void)
{
    dead_before_write(LLMRETRY_RETRY_UNSAFE);
}

int main(void)
{
    fail_send_arm = (void (*)(int))dlsym(RTLD_DEFAULT, "fail_send_arm");
    fail_send_armed = (int (*)(void))dlsym(RTLD_DEFAULT, "fail_send_armed");
    unsetenv("LD_PRELOAD");         /* the mock server (python) need not carry it */
    static const th_case tests[] = {
        { "unsolicited_response", test_unsolicited_response },
        { "hangup_on_reused_safe", test_hangup_on_reused_safe },
        { "hangup_on_reused_unsafe", test_hangup_on_reused_unsafe },
    };
    TH_RUN(tests);
    static const th_case mock_tests[] = {
        { "reset_after_read_safe", test_reset_after_read_safe },
        { "reset_after_read_unsafe", test_reset_after_read_unsafe },
        { "idle_closed_safe", test_idle_closed_safe },
        { "idle_closed_unsafe", test_idle_closed_unsafe },
        { "dead_before_write_safe", test_dead_before_write_safe },
        { "dead_before_write_unsafe", test_dead_before_write_unsafe },
    };
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
    } else {
        TH_RUN(mock_tests);
        th_mock_stop(&mock);
    }
    return th_summary("test_resend");
}
