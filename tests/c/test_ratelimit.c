/* Client-side rate limits (core/src/ratelimit.c, docs/policies.md) against the
 * mock server: configured rpm and tpm pace attempts evenly, a call larger
 * than the token bucket is not starved, limits learned from the server's
 * x-ratelimit-* headers hold new attempts (read per minute, or per the
 * server's window when its remaining and reset say so), a 429's named wait
 * pauses the whole endpoint, 429s naming none slow it down and their
 * retries use up neither max_retries nor the retry budget, a call waiting
 * for budget fails at its deadline, and two API keys are two endpoints.
 * Times come from the mock's records. */
#include "harness.h"
#include "llmretry.h"

#include <cJSON.h>
#include <stdlib.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
#define BODY_400 "{\"model\":\"gpt-test\",\"max_tokens\":400," \
                 "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
#define MAX_CALLS 40

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

/* The arrival times (ms, from the first) of the scenario's requests. */
static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int arrivals(const char *name, double *ms, int max)
{
    char *text = th_mock_requests(&mock, name);
    cJSON *a = text ? cJSON_Parse(text) : NULL;
    free(text);
    int n = 0;
    cJSON *rec;
    cJSON_ArrayForEach(rec, a) {
        if (n < max)
            ms[n++] = cJSON_GetObjectItem(rec, "time")->valuedouble * 1000.0;
    }
    cJSON_Delete(a);
    /* Records come in the order the mock handled them, each timed by its
     * arrival (the kernel's stamp): two that came together may be handled
     * in either order. */
    qsort(ms, (size_t)n, sizeof *ms, by_value);
    for (int i = n - 1; i >= 0; i--)
        ms[i] -= ms[0];
    return n;
}

/* Run n calls at once with these options; 1 when every one succeeded. */
static int run_all(llmretry_engine *e, const llmretry_options *o, int n)
{
    llmretry_call *calls[MAX_CALLS];
    int ok = 1;
    for (int i = 0; i < n; i++)
        calls[i] = th_submit(e, o);
    for (int i = 0; i < n; i++) {
        const llmretry_result *r = th_wait_done(calls[i], 20000);
        ok &= r && r->ok;
        llmretry_call_free(calls[i]);
    }
    return ok;
}

/* rpm = 600: one each 100 ms, evenly (a second's worth at once would be
 * refused by a provider that counts per second). */
static void test_rpm_paces_evenly(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "rpm600", "{\"steps\": []}") != 0)
        goto out;
    opts_for(&o, "rpm600", url, sizeof url);
    o.rpm = 600;
    CHECK_MSG(run_all(e, &o, 20), "every paced call succeeds");
    double t[MAX_CALLS];
    int n = arrivals("rpm600", t, MAX_CALLS);
    CHECK_INT(n, 20);
    /* Measured from the second arrival: the first also waited for its
     * connection, which the others reuse, so under valgrind it comes late
     * and the next ones, paced from its admission, look early. */
    for (int k = 2; k < n; k++)
        CHECK_MSG(t[k] - t[1] >= (k - 1) * 100.0 - 40.0,
                  "request %d at %.0f ms after the second: before %d ms", k, t[k] - t[1],
                  (k - 1) * 100);
    CHECK_MSG(n == 20 && t[19] < 3500, "the last of 20 at %.0f ms (paced: about 1900)",
              n ? t[n - 1] : -1.0);
out:
    llmretry_engine_free(e);
}

/* tpm = 60000 (1000 a second), 401 tokens a call (max_tokens 400 + "hi"):
 * one each 401 ms (a little more: the usage corrects the prompt to 12). */
static void test_tpm_paces_by_tokens(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "tpm", "{\"steps\": []}") != 0)
        goto out;
    opts_for(&o, "tpm", url, sizeof url);
    o.body = BODY_400;
    o.body_len = strlen(BODY_400);
    o.tpm = 60000;
    CHECK_MSG(run_all(e, &o, 5), "every paced call succeeds");
    double t[MAX_CALLS];
    int n = arrivals("tpm", t, MAX_CALLS);
    CHECK_INT(n, 5);
    for (int k = 1; k < n; k++)
        CHECK_MSG(t[k] >= k * 401.0 - 60.0, "request %d at %.0f ms: before %d ms", k, t[k],
                  k * 401);
    CHECK_MSG(n == 5 && t[4] < 3000, "the 5th at %.0f ms (paced: about 1650)",
              n ? t[n - 1] : -1.0);
out:
    llmretry_engine_free(e);
}

/* A call of a minute's worth of tokens and more (5,001 against tpm 6000)
 * is not starved: an idle endpoint lets it go at once. */
static void test_big_call_is_not_starved(void)
{
    static const char big[] = "{\"model\":\"gpt-test\",\"max_tokens\":5000,"
                              "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "big", "{\"steps\": []}") != 0)
        goto out;
    opts_for(&o, "big", url, sizeof url);
    o.body = big;
    o.body_len = strlen(big);
    o.tpm = 6000;
    int64_t t0 = th_now_ms();
    llmretry_call *c = th_submit(e, &o);
    const llmretry_result *r = th_wait_done(c, 5000);
    CHECK_MSG(r && r->ok, "the big call succeeds");
    CHECK_MSG(th_now_ms() - t0 < 1000, "at once (%lld ms)", (long long)(th_now_ms() - t0));
    llmretry_call_free(c);
out:
    llmretry_engine_free(e);
}

/* Nothing configured: the first answer says no request remains until
 * 800 ms from now; the next call waits for that reset. */
static void test_learned_remaining_holds_until_reset(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "remaining",
                             "{\"steps\": [{\"headers\": {\"x-ratelimit-remaining-requests\": \"0\","
                             " \"x-ratelimit-reset-requests\": \"800ms\"}}]}") != 0)
        goto out;
    opts_for(&o, "remaining", url, sizeof url);
    CHECK_MSG(run_all(e, &o, 1), "the first call");
    CHECK_MSG(run_all(e, &o, 1), "the second call");
    double t[4];
    int n = arrivals("remaining", t, 4);
    CHECK_MSG(n == 2 && t[1] >= 700, "the second request waited for the reset (%.0f ms)",
              n == 2 ? t[1] : -1.0);
out:
    llmretry_engine_free(e);
}

/* Nothing configured: x-ratelimit-limit-requests 120 (2 a second) paces
 * what follows as rpm = 120 would. */
static void test_learned_limit_paces(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "limit120", "{\"steps\": [], \"after\": {\"headers\":"
                             " {\"x-ratelimit-limit-requests\": \"120\"}}}") != 0)
        goto out;
    opts_for(&o, "limit120", url, sizeof url);
    CHECK_MSG(run_all(e, &o, 1), "the first call teaches the limit");
    CHECK_MSG(run_all(e, &o, 5), "then five at once");
    double t[8];
    int n = arrivals("limit120", t, 8);
    CHECK_INT(n, 6);
    /* One each 500 ms: the last of the five about 2 s after the first. */
    CHECK_MSG(n == 6 && t[5] - t[1] >= 1800, "five calls took %.0f ms (paced at 2 a second)",
              n == 6 ? t[5] - t[1] : -1.0);
out:
    llmretry_engine_free(e);
}

/* The requests of the scenario the mock refused (429) by its limits. */
static int requests_of(const char *name)
{
    char *text = th_mock_requests(&mock, name);
    cJSON *a = text ? cJSON_Parse(text) : NULL;
    free(text);
    int n = cJSON_GetArraySize(a);
    cJSON_Delete(a);
    return n;
}

/* -1 when the records cannot be read (not "none refused"). */
static int refused(const char *name)
{
    char *text = th_mock_requests(&mock, name);
    cJSON *a = text ? cJSON_Parse(text) : NULL;
    free(text);
    int n = cJSON_IsArray(a) ? 0 : -1;
    cJSON *rec;
    cJSON_ArrayForEach(rec, a)
        n += cJSON_IsTrue(cJSON_GetObjectItem(rec, "rate_limited"));
    cJSON_Delete(a);
    return n;
}

/* The stats of the engine's only endpoint. */
static llmretry_endpoint_stats only_endpoint(llmretry_engine *e)
{
    llmretry_endpoint_stats s;
    memset(&s, 0, sizeof s);
    CHECK_INT(llmretry_engine_endpoint_stats(e, &s, 1), 1);
    return s;
}

/* Nothing configured, every answer says limit 300, remaining 250: with
 * reset 10s (OpenAI's: the 50 used come back in 10 s, at 300 a minute)
 * five calls are paced at 5 a second; with reset 0s (a window that has
 * room now: 50 used and none to wait for, no minute's limit) they go at
 * once, as the server says they may (issue 27 item 7: paced at 5 a second
 * all the same). */
static void test_remaining_is_room_unless_read_per_minute(void)
{
    static const char *const resets[] = { "10s", "0s" };
    for (int i = 0; i < 2; i++) {
        char url[128], name[32], script[256];
        llmretry_options o;
        llmretry_engine *e = th_engine_new();
        snprintf(name, sizeof name, "room%d", i);
        snprintf(script, sizeof script,
                 "{\"steps\": [], \"after\": {\"headers\": {\"x-ratelimit-limit-requests\": \"300\","
                 " \"x-ratelimit-remaining-requests\": \"250\", \"x-ratelimit-reset-requests\": \"%s\"}}}",
                 resets[i]);
        if (!e || th_mock_script(&mock, name, script) != 0) {
            CHECK_MSG(0, "setup: engine and script");
            llmretry_engine_free(e);
            return;
        }
        opts_for(&o, name, url, sizeof url);
        CHECK_MSG(run_all(e, &o, 1), "the first call teaches the limit");
        CHECK_MSG(run_all(e, &o, 5), "then five at once");
        double t[8];
        int n = arrivals(name, t, 8);
        CHECK_INT(n, 6);
        double took = n == 6 ? t[5] - t[1] : -1.0;
        if (i == 0)
            CHECK_MSG(took >= 700, "reset %s: five calls took %.0f ms (paced at 5 a second)",
                      resets[i], took);
        else
            CHECK_MSG(took >= 0 && took < 400, "reset %s: five calls took %.0f ms (at once)",
                      resets[i], took);
        llmretry_engine_free(e);
    }
}

/* The mock enforcing 4 requests per 250 ms and stating the window's own
 * figures (x-ratelimit-limit-requests: 4, not 960 a minute): nothing
 * configured, one call teaches the limit, then 12 at once go at the pace
 * the server's remaining and reset allow (about 16 a second), each within
 * a deadline of 5 s (read per minute, 4 a minute: 3 minutes), hardly ever
 * refused. */
static void test_limit_stated_per_window(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "perwin", "{\"steps\": [], \"limits\": {\"rpm\": 4, "
                             "\"window_ms\": 250, \"stated_per\": \"window\"}}") != 0) {
        CHECK_MSG(0, "setup: engine and script");
        goto out;
    }
    opts_for(&o, "perwin", url, sizeof url);
    o.deadline_ms = 5000;
    CHECK_MSG(run_all(e, &o, 1), "the first call teaches the limit");
    int ok = run_all(e, &o, 12);
    /* The arrivals (ms), for the message. */
    double t[MAX_CALLS];
    char seen[MAX_CALLS * 8] = "";
    int n = arrivals("perwin", t, MAX_CALLS);
    for (int k = 0; k < n; k++)
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), " %.0f", t[k]);
    CHECK_MSG(ok, "then twelve at once, within their deadline (arrivals:%s)", seen);
    int n_refused = refused("perwin");
    CHECK_MSG(n_refused >= 0 && n_refused <= 1, "%d refused (arrivals:%s)", n_refused, seen);
out:
    llmretry_engine_free(e);
}

/* 429s naming no wait (no Retry-After, no x-ratelimit-*, as LiteLLM's rpm
 * limit sends them) past 10 requests per 250 ms: nothing configured and
 * max_retries 3, 40 calls at once: the endpoint slows down, most calls
 * succeed, their retries spend no retry budget (issue 27 item 8: a batch
 * lost items, retry_budget_exhausted and retries_exhausted), and no call
 * sends more than 1 + max_retries requests. */
static void test_429s_naming_no_wait_slow_the_endpoint(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "bare429", "{\"steps\": [], \"limits\": {\"rpm\": 10, "
                             "\"window_ms\": 250, \"retry_after\": false, "
                             "\"rate_headers\": false}}") != 0) {
        CHECK_MSG(0, "setup: engine and script");
        goto out;
    }
    opts_for(&o, "bare429", url, sizeof url);
    o.max_retries = 3;
    llmretry_call *calls[40];
    int ok = 0, attempts = 0;
    for (int i = 0; i < 40; i++)
        calls[i] = th_submit(e, &o);
    for (int i = 0; i < 40; i++) {
        const llmretry_result *r = th_wait_done(calls[i], 20000);
        CHECK(r != NULL);
        if (r) {
            ok += r->ok;
            attempts += r->attempts;
            CHECK_MSG(r->attempts <= 4, "%d attempts", r->attempts);
            CHECK_MSG(r->ok || r->reason == LLMRETRY_REASON_RETRIES_EXHAUSTED, "%s",
                      llmretry_reason_name(r->reason));
        }
        llmretry_call_free(calls[i]);
    }
    CHECK_MSG(ok >= 30, "%d of 40 calls succeed", ok);
    CHECK_INT(requests_of("bare429"), attempts);
    llmretry_endpoint_stats s = only_endpoint(e);
    CHECK_INT(s.retries_refused, 0);
    CHECK_MSG(s.rpm > 0, "the endpoint is paced at what the 429s taught (rpm %lld)",
              (long long)s.rpm);
out:
    llmretry_engine_free(e);
}

/* A 429 naming no wait right after a success, on an endpoint paced at a
 * learned limit: the slow-down halves the rate in force. Two calls at
 * once, nothing configured (both sent before either answer: 300 ms, even
 * under valgrind): the first answer says limit 60 (none remaining: the
 * learned pace is in force), the second, 100 ms later, is a bare 429. The rate served, read from one success within 250 ms, is
 * 240 a minute; halving that (120) left the pace at 60, so a refused
 * stretch was probed at the very pace the server had just refused (make
 * interop: LiteLLM's window, rpm stayed 60 through every refusal). */
static void test_a_bare_429_halves_the_learned_pace(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "halve", "{\"steps\": ["
                             "{\"delay_ms\": 300, \"headers\": {\"x-ratelimit-limit-requests\": "
                             "\"60\", \"x-ratelimit-remaining-requests\": \"0\"}}, "
                             "{\"status\": 429, \"delay_ms\": 400}], \"after\": {}}") != 0) {
        CHECK_MSG(0, "setup: engine and script");
        goto out;
    }
    opts_for(&o, "halve", url, sizeof url);
    o.max_retries = 0;
    llmretry_call *a = th_submit(e, &o), *b = th_submit(e, &o);
    const llmretry_result *ra = th_wait_done(a, 10000), *rb = th_wait_done(b, 10000);
    CHECK_MSG(ra && rb && ra->ok + rb->ok == 1, "one answered, one refused");
    llmretry_endpoint_stats s = only_endpoint(e);
    CHECK_MSG(s.rpm > 0 && s.rpm <= 30, "paced at half the learned 60 a minute (rpm %lld)",
              (long long)s.rpm);
    llmretry_call_free(a);
    llmretry_call_free(b);
out:
    llmretry_engine_free(e);
}

/* One call against five 429s naming no wait, then an answer, on an
 * endpoint of its own (a 429 after a success there would slow the next
 * one down). */
static const llmretry_result *after_five_429s(llmretry_engine *e, llmretry_options *o,
                                              const char *name, char *url, size_t urllen,
                                              llmretry_call **c)
{
    if (th_mock_script(&mock, name, "{\"steps\": [{\"status\": 429}, {\"status\": 429}, "
                       "{\"status\": 429}, {\"status\": 429}, {\"status\": 429}]}") != 0) {
        CHECK_MSG(0, "setup: script %s", name);
        *c = NULL;
        return NULL;
    }
    o->base_url = th_mock_scenario_url(&mock, name, url, urllen);
    *c = th_submit(e, o);
    return th_wait_done(*c, 10000);
}

/* A retry after a 429 naming no wait counts against max_retries like any
 * other (a refused request is one the server saw): five such 429s and
 * max_retries 2 end after 3 attempts, 3 requests; max_retries 0 means one. */
static void test_paced_429_retries_are_attempts(void)
{
    char url[128];
    llmretry_options o;
    llmretry_call *c;
    llmretry_engine *e = th_engine_new();
    if (!e) {
        CHECK_MSG(0, "setup: engine");
        return;
    }
    opts_for(&o, "five429a", url, sizeof url);
    o.max_retries = 2;
    const llmretry_result *r = after_five_429s(e, &o, "five429a", url, sizeof url, &c);
    CHECK_MSG(r && !r->ok && r->attempts == 3 && r->reason == LLMRETRY_REASON_RETRIES_EXHAUSTED,
              "3 attempts (ok %d, %d attempts, %s)", r ? r->ok : -1, r ? r->attempts : -1,
              r ? llmretry_reason_name(r->reason) : "-");
    CHECK_INT(requests_of("five429a"), 3);
    llmretry_call_free(c);

    o.max_retries = 0;
    r = after_five_429s(e, &o, "five429b", url, sizeof url, &c);
    CHECK_MSG(r && !r->ok && r->attempts == 1 && r->reason == LLMRETRY_REASON_RETRIES_EXHAUSTED,
              "max_retries 0: one attempt (%d, %s)", r ? r->attempts : -1,
              r ? llmretry_reason_name(r->reason) : "-");
    CHECK_INT(requests_of("five429b"), 1);
    llmretry_call_free(c);
    llmretry_engine_free(e);
}

/* A server that refuses every request for a while with 429s naming no
 * wait (LiteLLM's rpm window, full since another client used it), while
 * calls wait for the endpoint's pace: each refusal is another call's
 * attempt, none spends them all. Nothing configured: one call teaches the
 * pace (x-ratelimit-limit-requests 1200, one each 51 ms), then six at once;
 * the second of them is answered, then four requests in a row are refused.
 * The refused call's retry (its backoff shorter than the pace) went to the
 * front of the endpoint's queue, so it was every probe: four refusals, its
 * four attempts, retries_exhausted, while the calls behind it had sent
 * nothing (make interop: the openai SDK on llmretry.httpx2 lost 2 of 150
 * this way). Behind them, the four refusals are four calls' one each. */
static void test_refusals_in_a_row_are_spread_over_the_waiting_calls(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "probes", "{\"steps\": ["
                             "{\"headers\": {\"x-ratelimit-limit-requests\": \"1200\"}}, {}, {}, "
                             "{\"status\": 429}, {\"status\": 429}, {\"status\": 429}, "
                             "{\"status\": 429}], \"after\": {}}") != 0) {
        CHECK_MSG(0, "setup: engine and script");
        goto out;
    }
    opts_for(&o, "probes", url, sizeof url);
    o.max_retries = 3;
    o.max_delay_ms = 20;
    CHECK_MSG(run_all(e, &o, 1), "the first call teaches the pace");
    llmretry_call *calls[6];
    for (int i = 0; i < 6; i++)
        calls[i] = th_submit(e, &o);
    int ok = 0, most = 0;
    for (int i = 0; i < 6; i++) {
        const llmretry_result *r = th_wait_done(calls[i], 10000);
        CHECK(r != NULL);
        if (r) {
            ok += r->ok;
            if (r->attempts > most)
                most = r->attempts;
            CHECK_MSG(r->ok, "call %d: %s after %d attempts", i,
                      llmretry_reason_name(r->reason), r->attempts);
        }
        llmretry_call_free(calls[i]);
    }
    CHECK_INT(ok, 6);
    CHECK_MSG(most <= 2, "no call was refused more than once (one made %d attempts)", most);
    CHECK_INT(requests_of("probes"), 11);
out:
    llmretry_engine_free(e);
}

/* A 429 with Retry-After: 1 pauses the endpoint: a call submitted after
 * it waits too, though it never saw the 429. */
static void test_429_pauses_the_endpoint(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "pause429",
                             "{\"steps\": [{\"status\": 429, \"retry_after\": \"1\"}]}") != 0)
        goto out;
    opts_for(&o, "pause429", url, sizeof url);
    llmretry_call *a = th_submit(e, &o);
    /* Once the 429 has come back, another call to the same endpoint. */
    int64_t until = th_now_ms() + 3000;
    double t[4];
    while (arrivals("pause429", t, 4) < 1 && th_now_ms() < until)
        llmretry_call_wait(a, 10);
    llmretry_call_wait(a, 100);
    llmretry_call *b = th_submit(e, &o);
    const llmretry_result *ra = th_wait_done(a, 5000), *rb = th_wait_done(b, 5000);
    CHECK_MSG(ra && ra->ok && ra->attempts == 2, "the 429 call succeeds on its retry");
    CHECK_MSG(rb && rb->ok && rb->attempts == 1, "the other call succeeds");
    int n = arrivals("pause429", t, 4);
    CHECK_INT(n, 3);
    CHECK_MSG(n == 3 && t[1] >= 900 && t[2] >= 900,
              "both waited for the named second (%.0f, %.0f ms)", n == 3 ? t[1] : -1.0,
              n == 3 ? t[2] : -1.0);
    llmretry_call_free(a);
    llmretry_call_free(b);
out:
    llmretry_engine_free(e);
}

/* rpm = 60 (one a second): the second call, with a 300 ms deadline, fails
 * at its deadline while it waits for budget, never sent. */
static void test_deadline_while_waiting_for_budget(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "rpm60", "{\"steps\": []}") != 0)
        goto out;
    opts_for(&o, "rpm60", url, sizeof url);
    o.rpm = 60;
    CHECK_MSG(run_all(e, &o, 1), "the first call");
    o.deadline_ms = 300;
    int64_t t0 = th_now_ms();
    llmretry_call *c = th_submit(e, &o);
    const llmretry_result *r = th_wait_done(c, 5000);
    int64_t took = th_now_ms() - t0;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_DEADLINE_EXCEEDED && r->attempts == 0,
              "deadline_exceeded with no attempt (kind %s)",
              r ? llmretry_error_kind_name(r->kind) : "-");
    CHECK_MSG(took >= 250 && took < 900, "at its deadline (%lld ms)", (long long)took);
    CHECK_MSG(r && r->message && strstr(r->message, "rate budget"), "the message says why: %s",
              r && r->message ? r->message : "(null)");
    double t[4];
    CHECK_INT(arrivals("rpm60", t, 4), 1);
    llmretry_call_free(c);
out:
    llmretry_engine_free(e);
}

/* Endpoints are URL + key: rpm = 60 for two keys lets one call of each
 * go at once. */
static void test_keys_are_separate_endpoints(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "twokeys", "{\"steps\": []}") != 0)
        goto out;
    opts_for(&o, "twokeys", url, sizeof url);
    o.rpm = 60;
    CHECK_MSG(run_all(e, &o, 1), "key A");
    o.api_key = "sk-other";
    int64_t t0 = th_now_ms();
    CHECK_MSG(run_all(e, &o, 1), "key B");
    CHECK_MSG(th_now_ms() - t0 < 500, "key B did not wait for key A's budget (%lld ms)",
              (long long)(th_now_ms() - t0));
out:
    llmretry_engine_free(e);
}

int main(void)
{
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_ratelimit");
    }
    static const th_case tests[] = {
        { "rpm_paces_evenly", test_rpm_paces_evenly },
        { "tpm_paces_by_tokens", test_tpm_paces_by_tokens },
        { "big_call_not_starved", test_big_call_is_not_starved },
        { "learned_remaining", test_learned_remaining_holds_until_reset },
        { "learned_limit", test_learned_limit_paces },
        { "429_pauses_endpoint", test_429_pauses_the_endpoint },
        { "deadline_waiting_budget", test_deadline_while_waiting_for_budget },
        { "keys_separate", test_keys_are_separate_endpoints },
        { "remaining_is_room", test_remaining_is_room_unless_read_per_minute },
        { "stated_per_window", test_limit_stated_per_window },
        { "bare_429_slow_down", test_429s_naming_no_wait_slow_the_endpoint },
        { "paced_429_retries", test_paced_429_retries_are_attempts },
        { "refusals_spread", test_refusals_in_a_row_are_spread_over_the_waiting_calls },
        { "bare_429_halves_learned", test_a_bare_429_halves_the_learned_pace },
    };
    TH_RUN(tests);
    th_mock_stop(&mock);
    return th_summary("test_ratelimit");
}
