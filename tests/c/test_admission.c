/* The admission stage and its timers (core/src/admission.c, timers.c)
 * against the mock server: a call fails at its deadline wherever it waits
 * (for a free slot, for its batch's window), a server's wait longer than
 * max_retry_after_ms never pauses a batch, and channels keep consumers
 * apart. */
#include "harness.h"
#include "llmretry.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static th_mock mock;

static void opts_for(llmretry_options *o, const char *name, char *url, size_t urllen)
{
    llmretry_options_defaults(o);
    o->base_url = th_mock_scenario_url(&mock, name, url, urllen);
    o->api_key = "sk-test";
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 10;
    o->timeout_ms = 10000;
    o->events = 0;
}

static llmretry_engine *engine_with(int max_in_flight)
{
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    eo.max_in_flight = max_in_flight;
    llmretry_engine *e = NULL;
    char err[LLMRETRY_ERRBUF];
    CHECK_MSG(llmretry_engine_new(&eo, &e, err, sizeof err) == LLMRETRY_OK, "engine_new: %s", err);
    return e;
}

static const char *kind(const llmretry_result *r)
{
    return r ? llmretry_error_kind_name(r->kind) : "(none)";
}

/* max_in_flight=1: a call with a 200 ms deadline queued behind a 2 s call
 * fails at its deadline, not when the slot frees (issue 13 item 2). */
static void test_queued_for_slot_fails_at_deadline(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = engine_with(1);
    if (!e || th_mock_script(&mock, "slow_slot", "{\"steps\": [{\"delay_ms\": 2000}]}") != 0) {
        llmretry_engine_free(e);
        return;
    }
    opts_for(&o, "slow_slot", url, sizeof url);
    llmretry_call *slow = th_submit(e, &o);
    o.deadline_ms = 200;
    int64_t t0 = th_now_ms();
    llmretry_call *quick = th_submit(e, &o);
    const llmretry_result *r = th_wait_done(quick, 5000);
    int64_t took = th_now_ms() - t0;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_DEADLINE_EXCEEDED,
              "queued call: kind %s, expected deadline_exceeded", kind(r));
    CHECK_MSG(r && r->reason == LLMRETRY_REASON_DEADLINE && r->attempts == 0,
              "queued call: reason %s, %d attempts", r ? llmretry_reason_name(r->reason) : "-",
              r ? r->attempts : -1);
    CHECK_MSG(took >= 150 && took < 1000, "queued call with deadline 200 ms ended after %lld ms",
              (long long)took);
    CHECK_MSG(r && r->message && strstr(r->message, "max_in_flight"),
              "the message says what it waited for: %s", r && r->message ? r->message : "(null)");
    const llmretry_result *rs = th_wait_done(slow, 10000);
    CHECK_MSG(rs && rs->ok, "the slow call still succeeds");
    llmretry_call_free(quick);
    llmretry_call_free(slow);
    llmretry_engine_free(e);
}

/* A retry waiting for a slot is failed at its deadline too, keeping the
 * error that made it retry (rule 7). */
static void test_retry_queued_for_slot_fails_at_deadline(void)
{
    char url[128], url2[128];
    llmretry_options o, slow_o;
    llmretry_engine *e = engine_with(1);
    if (!e || th_mock_script(&mock, "retry_slot", "{\"steps\": [{\"status\": 503}]}") != 0 ||
        th_mock_script(&mock, "retry_slot_slow", "{\"steps\": [{\"delay_ms\": 2500}]}") != 0) {
        llmretry_engine_free(e);
        return;
    }
    opts_for(&o, "retry_slot", url, sizeof url);
    o.deadline_ms = 600;
    o.base_delay_ms = 100;
    opts_for(&slow_o, "retry_slot_slow", url2, sizeof url2);
    int64_t t0 = th_now_ms();
    llmretry_call *c = th_submit(e, &o);
    /* Takes the slot while c is in backoff: c's retry then waits for it. */
    llmretry_call *slow = NULL;
    for (int i = 0; i < 100 && !slow; i++) {
        struct pollfd none;
        poll(&none, 0, 5);
        const char *p = th_mock_requests(&mock, "retry_slot");
        if (p && strstr(p, "\"index\""))
            slow = th_submit(e, &slow_o);
        free((void *)p);
    }
    const llmretry_result *r = th_wait_done(c, 5000);
    int64_t took = th_now_ms() - t0;
    CHECK_MSG(r && r->kind == LLMRETRY_ERR_DEADLINE_EXCEEDED && r->status == 503,
              "retry queued past its deadline: kind %s status %d", kind(r), r ? r->status : -1);
    CHECK_MSG(took < 1500, "retry with a 600 ms deadline ended after %lld ms", (long long)took);
    th_wait_done(slow, 10000);
    llmretry_call_free(c);
    llmretry_call_free(slow);
    llmretry_engine_free(e);
}

/* A batch item waiting for its batch's window fails at its own deadline. */
static void test_group_queued_fails_at_deadline(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = engine_with(64);
    llmretry_group *g = NULL;
    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    go.limit = 1;
    char err[LLMRETRY_ERRBUF] = "";
    if (!e || llmretry_group_new(e, &go, &g, err, sizeof err) != LLMRETRY_OK ||
        th_mock_script(&mock, "slow_group", "{\"steps\": [{\"delay_ms\": 2000}]}") != 0) {
        if (e && !g)
            CHECK_MSG(0, "setup: group_new: %s", err);
        llmretry_group_free(g);
        llmretry_engine_free(e);
        return;
    }
    opts_for(&o, "slow_group", url, sizeof url);
    o.group = g;
    llmretry_call *slow = th_submit(e, &o);
    o.deadline_ms = 200;
    int64_t t0 = th_now_ms();
    llmretry_call *quick = th_submit(e, &o);
    const llmretry_result *r = th_wait_done(quick, 5000);
    int64_t took = th_now_ms() - t0;
    CHECK_MSG(r && r->kind == LLMRETRY_ERR_DEADLINE_EXCEEDED, "group item: kind %s", kind(r));
    CHECK_MSG(took < 1000, "group item with deadline 200 ms ended after %lld ms", (long long)took);
    llmretry_group_stats st;
    llmretry_group_stats_get(g, &st);
    CHECK_INT(st.queued, 0);
    const llmretry_result *rs = th_wait_done(slow, 10000);
    CHECK_MSG(rs && rs->ok, "the slow item still succeeds");
    llmretry_call_free(quick);
    llmretry_call_free(slow);
    llmretry_group_free(g);
    llmretry_engine_free(e);
}

/* One 429 asking for a wait longer than max_retry_after_ms ends that call
 * (retry_after_too_long) and pauses nothing: the batch's other items start
 * at once (issue 13 item 3). */
static void test_too_long_retry_after_pauses_nothing(void)
{
    char url[128], url2[128];
    llmretry_options o, ok_o;
    llmretry_engine *e = engine_with(64);
    llmretry_group *g = NULL;
    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    go.limit = 1;
    char err[LLMRETRY_ERRBUF] = "";
    if (!e || llmretry_group_new(e, &go, &g, err, sizeof err) != LLMRETRY_OK ||
        th_mock_script(&mock, "long_429",
                       "{\"steps\": [{\"status\": 429, \"retry_after\": \"100000\"}]}") != 0) {
        if (e && !g)
            CHECK_MSG(0, "setup: group_new: %s", err);
        llmretry_group_free(g);
        llmretry_engine_free(e);
        return;
    }
    opts_for(&o, "long_429", url, sizeof url);
    o.group = g;
    o.max_retry_after_ms = 1000;
    opts_for(&ok_o, "long_429_ok", url2, sizeof url2);
    ok_o.group = g;
    int64_t t0 = th_now_ms();
    llmretry_call *bad = th_submit(e, &o);
    llmretry_call *good[3];
    for (int i = 0; i < 3; i++)
        good[i] = th_submit(e, &ok_o);
    const llmretry_result *r = th_wait_done(bad, 5000);
    CHECK_MSG(r && r->reason == LLMRETRY_REASON_RETRY_AFTER_TOO_LONG, "429 item: reason %s",
              r ? llmretry_reason_name(r->reason) : "-");
    for (int i = 0; i < 3; i++) {
        const llmretry_result *ri = th_wait_done(good[i], 5000);
        CHECK_MSG(ri && ri->ok, "item %d after the long 429: ok=%d", i, ri ? ri->ok : -1);
    }
    int64_t took = th_now_ms() - t0;
    CHECK_MSG(took < 2000, "the batch took %lld ms after a 429 asking for 100000 s", (long long)took);
    llmretry_group_stats st;
    llmretry_group_stats_get(g, &st);
    CHECK_INT(st.pauses, 0);
    llmretry_call_free(bad);
    for (int i = 0; i < 3; i++)
        llmretry_call_free(good[i]);
    llmretry_group_free(g);
    llmretry_engine_free(e);
}

/* Times that cannot be added to the clock saturate (issue 13 item 7): a
 * deadline of INT64_MAX ms and a backoff of INT64_MAX ms mean "never", and
 * the suite runs under UBSan (make test-c-asan), which stops at a signed
 * overflow. The calls wait; a cancel ends them. */
static void test_huge_times_saturate(void)
{
    char url[128], err[LLMRETRY_ERRBUF] = "";
    llmretry_options o;
    llmretry_engine *e = engine_with(8);
    llmretry_group *g = NULL;
    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    go.deadline_ms = INT64_MAX;
    if (!e || llmretry_group_new(e, &go, &g, err, sizeof err) != LLMRETRY_OK ||
        th_mock_script(&mock, "huge_times", "{\"steps\": [], \"after\": {\"status\": 503}}") != 0) {
        if (e && !g)
            CHECK_MSG(0, "setup: group_new: %s", err);
        llmretry_group_free(g);
        llmretry_engine_free(e);
        return;
    }
    opts_for(&o, "huge_times", url, sizeof url);
    o.max_retries = 1;
    o.base_delay_ms = INT64_MAX;
    o.max_delay_ms = INT64_MAX;
    llmretry_call *c[3];
    c[0] = th_submit(e, &o);               /* no deadline: the retry waits "for ever" */
    o.deadline_ms = INT64_MAX;
    o.base_delay_ms = 10;
    c[1] = th_submit(e, &o);               /* a deadline at the end of time */
    o.deadline_ms = LLMRETRY_NO_DEADLINE;
    o.group = g;
    o.base_delay_ms = INT64_MAX / 4;
    c[2] = th_submit(e, &o);               /* in a batch with an endless deadline */
    const llmretry_result *r1 = th_wait_done(c[1], 5000);
    CHECK_MSG(r1 && !r1->ok && r1->attempts == 2 && r1->status == 503,
              "deadline INT64_MAX: %d attempts, kind %s", r1 ? r1->attempts : -1, kind(r1));
    struct pollfd none;
    poll(&none, 0, 300);
    CHECK_MSG(llmretry_call_result(c[0]) == NULL, "a backoff of INT64_MAX ms ended");
    CHECK_MSG(llmretry_call_result(c[2]) == NULL, "a batch item's long backoff ended");
    llmretry_call_cancel(c[0]);
    llmretry_call_cancel(c[2]);
    for (int i = 0; i < 3; i += 2) {
        const llmretry_result *r = th_wait_done(c[i], 5000);
        CHECK_MSG(r && r->kind == LLMRETRY_ERR_CANCELLED && r->attempts == 1,
                  "call %d: kind %s after a cancel", i, kind(r));
    }
    for (int i = 0; i < 3; i++)
        llmretry_call_free(c[i]);
    llmretry_group_free(g);
    llmretry_engine_free(e);
}

/* A TLS server that never answers (a socket that listens, never accepts):
 * the origin gate of core/src/origins.c holds calls back while one
 * connection is being set up, but only for a grace period, so calls to a
 * dead server do not connect one after the other (6 calls of 1.5 s in
 * series would take 9 s). */
static void test_dead_tls_server_not_serialized(void)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t alen = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 64) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &alen) != 0) {
        CHECK_MSG(0, "could not listen");
        if (ls >= 0)
            close(ls);
        return;
    }
    char url[96], unused[128];
    snprintf(url, sizeof url, "https://127.0.0.1:%d/v1", ntohs(a.sin_port));
    llmretry_engine *e = engine_with(64);
    llmretry_options o;
    opts_for(&o, "unused", unused, sizeof unused);
    o.base_url = url;
    o.max_retries = 0;
    o.timeout_ms = 1500;
    llmretry_call *c[6];
    int64_t t0 = th_now_ms();
    for (int i = 0; i < 6; i++)
        c[i] = th_submit(e, &o);
    for (int i = 0; i < 6; i++) {
        const llmretry_result *r = th_wait_done(c[i], 15000);
        CHECK_MSG(r && r->kind == LLMRETRY_ERR_TIMEOUT, "call %d: kind %s", i, kind(r));
    }
    int64_t took = th_now_ms() - t0;
    CHECK_MSG(took < 5000, "6 calls of 1.5 s to a dead TLS server took %lld ms", (long long)took);
    for (int i = 0; i < 6; i++)
        llmretry_call_free(c[i]);
    llmretry_engine_free(e);
    close(ls);
}

/* A call cancelled while its 2xx body waits for the host's validator: the
 * mailbox withdraws the request, so the host never runs the validator of a
 * call that is over (issue 13 item 7): its next item is DONE, cancelled. */
static void test_cancel_withdraws_validation(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = engine_with(8);
    if (!e)
        return;
    opts_for(&o, "validate_cancel", url, sizeof url);
    o.validate = 1;
    llmretry_call *c = th_submit(e, &o);
    /* Wait for the validation request without taking it. */
    CHECK_INT(llmretry_call_wait(c, 5000), LLMRETRY_OK);
    llmretry_call_cancel(c);
    int64_t until = th_now_ms() + 5000;
    while (!llmretry_call_result(c) && th_now_ms() < until)
        llmretry_call_wait(c, 10);
    llmretry_event *ev = NULL;
    llmretry_mail m = llmretry_call_next(c, &ev);
    CHECK_MSG(m == LLMRETRY_MAIL_DONE, "after the cancel the mailbox gave %s, not DONE",
              m == LLMRETRY_MAIL_VALIDATE ? "VALIDATE" : m == LLMRETRY_MAIL_EVENT ? "EVENT" : "nothing");
    const char *body;
    size_t len;
    CHECK_INT(llmretry_call_pending_body(c, &body, &len), LLMRETRY_ESTATE);
    const llmretry_result *r = llmretry_call_result(c);
    CHECK_MSG(r && r->kind == LLMRETRY_ERR_CANCELLED, "kind %s", kind(r));
    llmretry_event_free(ev);
    llmretry_call_free(c);
    llmretry_engine_free(e);
}

static int readable(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* Two channels on one engine: each consumer sees only its own calls, and
 * the engine's default channel sees neither. */
static void test_channels_keep_consumers_apart(void)
{
    char url[128], err[LLMRETRY_ERRBUF];
    llmretry_options o;
    llmretry_engine *e = engine_with(64);
    llmretry_channel *a = NULL, *b = NULL;
    if (!e || llmretry_channel_new(e, &a, err, sizeof err) != LLMRETRY_OK ||
        llmretry_channel_new(e, &b, err, sizeof err) != LLMRETRY_OK) {
        CHECK_MSG(0, "channel_new: %s", err);
        llmretry_channel_free(a);
        llmretry_engine_free(e);
        return;
    }
    opts_for(&o, "channels", url, sizeof url);
    llmretry_call *ca[4], *cb[4];
    for (int i = 0; i < 4; i++) {
        o.channel = a;
        o.user_data = &ca[i];
        ca[i] = th_submit(e, &o);
        o.channel = b;
        o.user_data = &cb[i];
        cb[i] = th_submit(e, &o);
    }
    int done_a = 0, done_b = 0, foreign = 0;
    int64_t until = th_now_ms() + 10000;
    while ((done_a < 4 || done_b < 4) && th_now_ms() < until) {
        llmretry_channel *chs[2] = { a, b };
        for (int k = 0; k < 2; k++) {
            llmretry_call *got[8];
            llmretry_channel_wait(chs[k], 20);
            size_t n = llmretry_channel_poll(chs[k], got, 8);
            for (size_t i = 0; i < n; i++) {
                llmretry_call **slot = llmretry_call_user_data(got[i]);
                int mine = k == 0 ? (slot >= ca && slot < ca + 4) : (slot >= cb && slot < cb + 4);
                foreign += !mine;
                llmretry_event *ev;
                llmretry_mail m;
                while ((m = llmretry_call_next(got[i], &ev)) != LLMRETRY_MAIL_EMPTY) {
                    if (m == LLMRETRY_MAIL_EVENT)
                        llmretry_event_free(ev);
                    if (m == LLMRETRY_MAIL_DONE) {
                        if (k == 0)
                            done_a++;
                        else
                            done_b++;
                        break;
                    }
                }
            }
        }
    }
    CHECK_INT(done_a, 4);
    CHECK_INT(done_b, 4);
    CHECK_INT(foreign, 0);
    CHECK_INT(readable(llmretry_channel_fd(a)), 0);
    CHECK_INT(readable(llmretry_channel_fd(llmretry_engine_channel(e))), 0);
    CHECK_INT((int)llmretry_channel_poll(llmretry_engine_channel(e), ca, 4), 0);
    for (int i = 0; i < 4; i++) {
        llmretry_call_free(ca[i]);
        llmretry_call_free(cb[i]);
    }
    /* Calls hold their channel: freeing it first is safe too. */
    llmretry_channel_free(a);
    llmretry_channel_free(b);
    llmretry_engine_free(e);
}

int main(void)
{
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_admission");
    }
    fprintf(stderr, "notifier: %s\n", llmretry_notifier_kind());
    static const th_case tests[] = {
        { "queued_for_slot_deadline", test_queued_for_slot_fails_at_deadline },
        { "retry_queued_deadline", test_retry_queued_for_slot_fails_at_deadline },
        { "group_queued_deadline", test_group_queued_fails_at_deadline },
        { "too_long_retry_after", test_too_long_retry_after_pauses_nothing },
        { "channels", test_channels_keep_consumers_apart },
        { "huge_times_saturate", test_huge_times_saturate },
        { "dead_tls_server", test_dead_tls_server_not_serialized },
        { "cancel_withdraws_validation", test_cancel_withdraws_validation },
    };
    TH_RUN(tests);
    th_mock_stop(&mock);
    return th_summary("test_admission");
}
