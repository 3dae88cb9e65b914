/* Endpoint health and fallbacks (core/src/health.c, targets.c; docs/reliability.md)
 * against the mock server: the retry budget bounds a retry storm and does
 * not count server-timed retries nor any after a 429; the circuit breaker opens after N
 * transient failures, fails calls at once (nothing sent), lets one probe
 * through after its cooldown and closes on its success or reopens on its
 * failure; fallbacks move a failing call to the next target within its
 * deadline (the body's model replaced, the caller's key never sent to
 * another host), not after a 400, and straight away on an open breaker;
 * endpoint stats say all of it; bad fallbacks are refused naming the field.
 * Counts come from the mock's records. */
#include "harness.h"

#include <sys/stat.h>
#include <unistd.h>
#include "llmretry.h"

#include <cJSON.h>
#include <stdlib.h>
#include <time.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
#define KEY "sk-test-PRIMARY-KEY"
#define MAX_CALLS 64

static th_mock mock;

static void opts_for(llmretry_options *o, const char *name, char *url, size_t urllen)
{
    llmretry_options_defaults(o);
    o->base_url = th_mock_scenario_url(&mock, name, url, urllen);
    o->api_key = KEY;
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 10;
    o->timeout_ms = 10000;
    o->events = 0;
}

/* Wait for the call; its events' JSON lines appended to `log` (if any). */
static const llmretry_result *wait_done(llmretry_call *c, char *log, size_t loglen)
{
    int64_t until = th_now_ms() + 20000;
    while (c && th_now_ms() < until) {
        llmretry_event *ev;
        llmretry_mail m = llmretry_call_next(c, &ev);
        if (m == LLMRETRY_MAIL_DONE)
            return llmretry_call_result(c);
        if (m == LLMRETRY_MAIL_EVENT) {
            char *j = log ? llmretry_event_to_json(ev) : NULL;
            if (j) {
                size_t used = strlen(log);
                snprintf(log + used, loglen - used, "%s\n", j);
                llmretry_free(j);
            }
            llmretry_event_free(ev);
        } else {
            llmretry_call_wait(c, 50);
        }
    }
    return NULL;
}

/* The requests the mock recorded for a scenario; -1 when they cannot be
 * read (never 0: "nothing was sent" must not be what a failed read says). */
static int requests_of(const char *name)
{
    char *text = th_mock_requests(&mock, name);
    cJSON *a = text ? cJSON_Parse(text) : NULL;
    free(text);
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    cJSON_Delete(a);
    return n;
}

/* The stats of the endpoint whose URL contains `name`. */
static int stats_of(llmretry_engine *e, const char *name, llmretry_endpoint_stats *out)
{
    llmretry_endpoint_stats all[32];
    size_t n = llmretry_engine_endpoint_stats(e, all, 32);
    /* Not found leaves *out defined too: the CHECKs after a failed
     * stats_of then fail on zeros, not on stack garbage. */
    memset(out, 0, sizeof *out);
    char needle[96];
    snprintf(needle, sizeof needle, "/s/%s/", name);
    for (size_t i = 0; i < n && i < 32; i++)
        if (strstr(all[i].url, needle)) {
            *out = all[i];
            return 1;
        }
    return 0;
}

/* 60 calls at once against a dead endpoint, max_retries 3: without a
 * budget 240 requests; with the default one (0.2 x requests + 10) at most
 * 60 + 12 + 10. */
static void test_retry_budget_bounds_a_storm(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "storm", "{\"steps\": [], \"after\": {\"status\": 503}}") != 0)
        goto out;
    opts_for(&o, "storm", url, sizeof url);
    o.max_retries = 3;
    llmretry_call *calls[60];
    for (int i = 0; i < 60; i++)
        calls[i] = th_submit(e, &o);
    int exhausted = 0, retries_exhausted = 0;
    for (int i = 0; i < 60; i++) {
        const llmretry_result *r = wait_done(calls[i], NULL, 0);
        CHECK(r && !r->ok);
        if (r && r->reason == LLMRETRY_REASON_RETRY_BUDGET_EXHAUSTED)
            exhausted++;
        if (r && r->reason == LLMRETRY_REASON_RETRIES_EXHAUSTED)
            retries_exhausted++;
        if (r && r->reason == LLMRETRY_REASON_RETRY_BUDGET_EXHAUSTED)
            CHECK_MSG(strstr(r->message, "retry budget") != NULL, "message: %s", r->message);
        llmretry_call_free(calls[i]);
    }
    int n = requests_of("storm");
    CHECK_MSG(n <= 60 + 12 + 10 && n >= 60 + 10, "%d requests (want 70..82, 240 unbudgeted)", n);
    CHECK_MSG(exhausted >= 50, "%d calls gave up on the budget", exhausted);
    llmretry_endpoint_stats s;
    CHECK(stats_of(e, "storm", &s));
    CHECK_INT(s.requests, 60);
    CHECK_INT(s.retries, n - 60);
    CHECK_INT(s.retries_refused, exhausted);
    CHECK_INT(s.window_requests, 60);
    CHECK(s.has_key);
    CHECK_STR(s.breaker, "closed");
out:
    llmretry_engine_free(e);
}

/* The budget can be opened up, and a retry the server timed is free. */
static void test_retry_budget_options_and_server_timed_retries(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "timed", "{\"steps\": [], \"after\": {\"status\": 503, "
                             "\"retry_after_ms\": \"5\"}}") != 0)
        goto out;
    opts_for(&o, "timed", url, sizeof url);
    o.max_retries = 2;
    o.retry_budget_min = 0;
    o.retry_budget_ratio = 0.0;
    llmretry_call *calls[20];
    for (int i = 0; i < 20; i++)
        calls[i] = th_submit(e, &o);
    for (int i = 0; i < 20; i++) {
        const llmretry_result *r = wait_done(calls[i], NULL, 0);
        CHECK_MSG(r && r->reason == LLMRETRY_REASON_RETRIES_EXHAUSTED, "reason %s",
                  r ? llmretry_reason_name(r->reason) : "-");
        llmretry_call_free(calls[i]);
    }
    CHECK_INT(requests_of("timed"), 60);        /* every server-timed retry went */
    /* The same with our own backoff: a budget of 0 allows no retry. */
    if (th_mock_script(&mock, "nobudget", "{\"steps\": [], \"after\": {\"status\": 503}}") != 0)
        goto out;
    opts_for(&o, "nobudget", url, sizeof url);
    o.max_retries = 2;
    o.retry_budget_min = 0;
    o.retry_budget_ratio = 0.0;
    llmretry_call *c = th_submit(e, &o);
    const llmretry_result *r = wait_done(c, NULL, 0);
    CHECK(r && r->reason == LLMRETRY_REASON_RETRY_BUDGET_EXHAUSTED && r->attempts == 1);
    llmretry_call_free(c);
    CHECK_INT(requests_of("nobudget"), 1);
out:
    llmretry_engine_free(e);
}

/* A 429 is the server asking to slow down, which the endpoint's pace does:
 * its retries spend no retry budget, even with a budget of 0 and no wait
 * named (issue 27 item 8: a batch lost items as retry_budget_exhausted). */
static void test_429_retries_spend_no_budget(void)
{
    char url[128];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "slowdown", "{\"steps\": [{\"status\": 429}, "
                             "{\"status\": 429}]}") != 0) {
        CHECK_MSG(0, "setup: engine and script");
        goto out;
    }
    opts_for(&o, "slowdown", url, sizeof url);
    o.max_retries = 2;
    o.retry_budget_min = 0;
    o.retry_budget_ratio = 0.0;
    llmretry_call *c = th_submit(e, &o);
    const llmretry_result *r = wait_done(c, NULL, 0);
    CHECK_MSG(r && r->ok && r->attempts == 3, "ok on the third attempt (ok %d, %d attempts, %s)",
              r ? r->ok : -1, r ? r->attempts : -1, r ? llmretry_reason_name(r->reason) : "-");
    llmretry_call_free(c);
    llmretry_endpoint_stats s;
    CHECK(stats_of(e, "slowdown", &s));
    CHECK_INT(s.retries, 2);
    CHECK_INT(s.retries_refused, 0);
out:
    llmretry_engine_free(e);
}

static const llmretry_result *one(llmretry_engine *e, const llmretry_options *o,
                                  llmretry_call **keep, char *log, size_t loglen)
{
    *keep = th_submit(e, o);
    return wait_done(*keep, log, loglen);
}

/* breaker_failures 3: three 503s open it; calls then fail at once, nothing
 * sent; after the cooldown one probe goes, its success closes it. */
static void test_breaker_opens_probes_and_closes(void)
{
    char url[128];
    llmretry_options o;
    llmretry_call *c;
    const llmretry_result *r;
    llmretry_endpoint_stats s;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "brk", "{\"steps\": [{\"status\": 503}, {\"status\": 503}, "
                             "{\"status\": 503}, {\"status\": 503}]}") != 0)
        goto out;
    opts_for(&o, "brk", url, sizeof url);
    o.max_retries = 0;
    o.breaker_failures = 3;
    o.breaker_cooldown_ms = 300;
    for (int i = 0; i < 3; i++) {
        r = one(e, &o, &c, NULL, 0);
        CHECK(r && !r->ok && r->kind == LLMRETRY_ERR_HTTP_STATUS);
        llmretry_call_free(c);
    }
    CHECK(stats_of(e, "brk", &s) && strcmp(s.breaker, "open") == 0);
    CHECK_INT(s.breaker_opened, 1);
    CHECK_INT(s.consecutive_failures, 3);
    CHECK_MSG(s.open_ms_left > 0 && s.open_ms_left <= 300, "open for %lld", (long long)s.open_ms_left);
    int64_t t0 = th_now_ms();
    r = one(e, &o, &c, NULL, 0);
    CHECK(r && !r->ok && r->kind == LLMRETRY_ERR_CIRCUIT_OPEN &&
          r->reason == LLMRETRY_REASON_CIRCUIT_OPEN && r->attempts == 0);
    CHECK_MSG(th_now_ms() - t0 < 200, "failed at once (%lld ms)", (long long)(th_now_ms() - t0));
    CHECK_MSG(r && strstr(r->message, "circuit open after 3 consecutive failures"), "%s",
              r ? r->message : "");
    llmretry_call_free(c);
    CHECK_INT(requests_of("brk"), 3);            /* nothing sent while open */
    CHECK(stats_of(e, "brk", &s) && s.short_circuited == 1);
    /* The cooldown over (the client's own timer: real time must pass): the
     * probe meets the 4th 503 and opens it again. */
    th_sleep_ms(350);
    r = one(e, &o, &c, NULL, 0);
    CHECK(r && !r->ok && r->kind == LLMRETRY_ERR_HTTP_STATUS && r->attempts == 1);
    llmretry_call_free(c);
    CHECK(stats_of(e, "brk", &s) && strcmp(s.breaker, "open") == 0 && s.breaker_opened == 2);
    r = one(e, &o, &c, NULL, 0);
    CHECK(r && r->kind == LLMRETRY_ERR_CIRCUIT_OPEN);
    llmretry_call_free(c);
    /* The next probe, after the client's cooldown again, meets a 200 (the
     * script is over): closed again. */
    th_sleep_ms(350);
    r = one(e, &o, &c, NULL, 0);
    CHECK(r && r->ok);
    llmretry_call_free(c);
    CHECK(stats_of(e, "brk", &s) && strcmp(s.breaker, "closed") == 0 &&
          s.consecutive_failures == 0);
    r = one(e, &o, &c, NULL, 0);
    CHECK(r && r->ok);
    llmretry_call_free(c);
    CHECK_INT(requests_of("brk"), 6);
out:
    llmretry_engine_free(e);
}

/* While a probe is out, other calls still fail at once; a 400 is an
 * answer (it resets the count). */
static void test_breaker_one_probe_and_4xx_resets(void)
{
    char url[128];
    llmretry_options o;
    llmretry_call *c;
    const llmretry_result *r;
    llmretry_endpoint_stats s;
    llmretry_engine *e = th_engine_new();
    /* A manual clock: the probe's delay lasts until the test advances it. */
    if (!e || th_mock_script(&mock, "probe", "{\"clock\": \"manual\", \"steps\": [{\"status\": 500}, "
                             "{\"status\": 500}, {\"delay_ms\": 300}, {\"status\": 500}, "
                             "{\"status\": 400}, {\"status\": 500}]}") != 0)
        goto out;
    opts_for(&o, "probe", url, sizeof url);
    o.max_retries = 0;
    o.breaker_failures = 2;
    o.breaker_cooldown_ms = 100;
    for (int i = 0; i < 2; i++) {
        r = one(e, &o, &c, NULL, 0);
        llmretry_call_free(c);
    }
    th_sleep_ms(150);                              /* the client's own 100 ms cooldown */
    llmretry_call *probe = th_submit(e, &o);       /* meets the held success */
    CHECK_MSG(TH_EVENTUALLY(requests_of("probe") == 3, 10000), "the probe never reached the mock");
    r = one(e, &o, &c, NULL, 0);
    CHECK_MSG(r && r->kind == LLMRETRY_ERR_CIRCUIT_OPEN && strstr(r->message, "probe is in flight"),
              "%s", r ? r->message : "");
    llmretry_call_free(c);
    th_mock_advance_clock(&mock, "probe", 300);    /* the probe's answer comes */
    r = wait_done(probe, NULL, 0);
    CHECK(r && r->ok);
    llmretry_call_free(probe);
    /* closed: a 500 (1 failure), a 400 (reset), a 500 (1 failure): still closed */
    for (int i = 0; i < 3; i++) {
        r = one(e, &o, &c, NULL, 0);
        CHECK(r && !r->ok && r->kind == LLMRETRY_ERR_HTTP_STATUS);
        llmretry_call_free(c);
    }
    CHECK(stats_of(e, "probe", &s) && strcmp(s.breaker, "closed") == 0 &&
          s.consecutive_failures == 1 && s.breaker_opened == 1);
out:
    llmretry_engine_free(e);
}

/* The primary dies (503, retries spent): the fallback, on another endpoint
 * with another model and no key, answers; events and result say target. */
static void test_fallback_to_another_endpoint(void)
{
    char url[128], url2[128], fb[512], log[8192] = "";
    llmretry_options o;
    llmretry_call *c;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "fbp", "{\"steps\": [], \"after\": {\"status\": 503}}") != 0 ||
        th_mock_script(&mock, "fbb", "{\"steps\": []}") != 0)
        goto out;
    opts_for(&o, "fbp", url, sizeof url);
    o.max_retries = 1;
    o.events = LLMRETRY_EVENTS_ALL;
    snprintf(fb, sizeof fb, "[{\"model\": \"backup-model\", \"base_url\": \"%s\"}]",
             th_mock_scenario_url(&mock, "fbb", url2, sizeof url2));
    char err[LLMRETRY_ERRBUF];
    CHECK_INT(llmretry_options_set_json(&o, "fallbacks", fb, err, sizeof err), LLMRETRY_OK);
    const llmretry_result *r = one(e, &o, &c, log, sizeof log);
    CHECK(r && r->ok && r->target == 1 && r->n_targets == 2 && r->attempts == 3);
    CHECK_STR(r ? r->model : "", "backup-model");
    llmretry_target_report t;
    CHECK(llmretry_call_target_report(c, 0, &t) == LLMRETRY_OK && t.attempts == 2 &&
          t.status == 503 && t.kind == LLMRETRY_ERR_HTTP_STATUS &&
          t.reason == LLMRETRY_REASON_RETRIES_EXHAUSTED && strcmp(t.model, "gpt-test") == 0);
    CHECK(llmretry_call_target_report(c, 1, &t) == LLMRETRY_OK && t.attempts == 1 &&
          t.kind == LLMRETRY_ERR_NONE && strcmp(t.model, "backup-model") == 0);
    CHECK(llmretry_call_target_report(c, 2, &t) == LLMRETRY_EINVAL);
    llmretry_call_free(c);
    CHECK_MSG(strstr(log, "\"delay_source\":\"fallback\"") && strstr(log, "\"target\":1") &&
              strstr(log, "\"model\":\"backup-model\""), "events:\n%s", log);
    CHECK_MSG(strstr(log, "\"event\":\"llm_request_started\",\"request_id\"") != NULL, "%s", log);
    CHECK_INT(requests_of("fbp"), 2);
    char *text = th_mock_requests(&mock, "fbb");
    CHECK_MSG(text && strstr(text, "backup-model") && !strstr(text, KEY) &&
              !strstr(text, "authorization"), "backup's request: %s", text ? text : "");
    free(text);
out:
    llmretry_engine_free(e);
}

/* A model-only fallback uses the caller's endpoint and key; a 400 does
 * not fall back (the request itself is wrong); an open breaker falls back
 * at once without a request to the primary. */
static void test_fallback_rules(void)
{
    char url[128], url2[128], fb[512], err[LLMRETRY_ERRBUF];
    llmretry_options o;
    llmretry_call *c;
    const llmretry_result *r;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "same", "{\"steps\": [{\"status\": 500}]}") != 0)
        goto out;
    opts_for(&o, "same", url, sizeof url);
    o.max_retries = 0;
    CHECK_INT(llmretry_options_set_json(&o, "fallbacks", "[{\"model\": \"mini\"}]", err,
                                        sizeof err), LLMRETRY_OK);
    r = one(e, &o, &c, NULL, 0);
    CHECK(r && r->ok && r->target == 1 && r->attempts == 2);
    llmretry_call_free(c);
    char *text = th_mock_requests(&mock, "same");
    CHECK_MSG(text && strstr(text, "\\\"model\\\":\\\"mini\\\"") && strstr(text, KEY), "%s",
              text ? text : "");
    free(text);

    if (th_mock_script(&mock, "bad", "{\"steps\": [{\"status\": 400}]}") != 0 ||
        th_mock_script(&mock, "bad_b", "{\"steps\": []}") != 0)
        goto out;
    opts_for(&o, "bad", url, sizeof url);
    snprintf(fb, sizeof fb, "[{\"base_url\": \"%s\"}]",
             th_mock_scenario_url(&mock, "bad_b", url2, sizeof url2));
    CHECK_INT(llmretry_options_set_json(&o, "fallbacks", fb, err, sizeof err), LLMRETRY_OK);
    r = one(e, &o, &c, NULL, 0);
    CHECK(r && !r->ok && r->status == 400 && r->target == 0);
    llmretry_call_free(c);
    CHECK_INT(requests_of("bad_b"), 0);

    /* Open the primary's breaker, then a call with a fallback skips it. */
    if (th_mock_script(&mock, "down", "{\"steps\": [], \"after\": {\"status\": 502}}") != 0 ||
        th_mock_script(&mock, "down_b", "{\"steps\": []}") != 0)
        goto out;
    opts_for(&o, "down", url, sizeof url);
    o.max_retries = 0;
    o.breaker_failures = 1;
    r = one(e, &o, &c, NULL, 0);
    llmretry_call_free(c);
    snprintf(fb, sizeof fb, "[{\"base_url\": \"%s\"}]",
             th_mock_scenario_url(&mock, "down_b", url2, sizeof url2));
    CHECK_INT(llmretry_options_set_json(&o, "fallbacks", fb, err, sizeof err), LLMRETRY_OK);
    r = one(e, &o, &c, NULL, 0);
    CHECK(r && r->ok && r->target == 1 && r->attempts == 1);
    llmretry_target_report t;
    CHECK(llmretry_call_target_report(c, 0, &t) == LLMRETRY_OK && t.attempts == 0 &&
          t.kind == LLMRETRY_ERR_CIRCUIT_OPEN);
    llmretry_call_free(c);
    CHECK_INT(requests_of("down"), 1);
    CHECK_INT(requests_of("down_b"), 1);
    /* Every target failing: the error is the last one's and says so. */
    if (th_mock_script(&mock, "down_b", "{\"steps\": [], \"after\": {\"status\": 504}}") != 0)
        goto out;
    r = one(e, &o, &c, NULL, 0);
    CHECK(r && !r->ok && r->target == 1 && r->status == 504);
    CHECK_MSG(r && strstr(r->message, "on 2 targets"), "%s", r ? r->message : "");
    llmretry_call_free(c);
out:
    llmretry_engine_free(e);
}

static void expect_refused(const char *json, const char *want)
{
    llmretry_options o;
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_options_defaults(&o);
    CHECK_MSG(llmretry_options_set_json(&o, "fallbacks", json, err, sizeof err) == LLMRETRY_EINVAL &&
              strstr(err, want) != NULL, "%s: got \"%s\", want \"%s\"", json, err, want);
    CHECK(o.fallbacks == NULL);
    CHECK_MSG(strstr(err, "sk-SECRET") == NULL, "the key is not repeated: %s", err);
}

static void test_bad_fallbacks_are_refused(void)
{
    expect_refused("{}", "fallbacks must be a list of targets");
    expect_refused("[1]", "fallbacks[0] must be an object");
    expect_refused("[{\"modle\": \"x\"}]", "fallbacks[0]: unknown key 'modle'");
    expect_refused("[{\"model\": 3}]", "fallbacks[0].model must be a string");
    expect_refused("[{\"model\": \"a\"}, {\"base_url\": \"ftp://x\"}]",
                   "fallbacks[1].base_url must start with http:// or https://");
    expect_refused("[{\"api_key\": \"sk-SECRET\"}]", "fallbacks[0].api_key needs the target's own url");
    expect_refused("[{\"base_url\": \"http://x\", \"url\": \"http://y\"}]", "sets both url and base_url");
    expect_refused("[{}]", "names neither a model nor a url");
    expect_refused("[{\"base_url\": \"http://x\", \"headers\": {\"Host\": \"y\"}}]",
                   "must not set Host");
    expect_refused("[{\"base_url\": \"http://x\", \"headers\": {\"X-A\": \"a\\nb\"}}]",
                   "must not contain CR or LF");
    expect_refused("not json", "not valid JSON");
    llmretry_options o;
    char err[LLMRETRY_ERRBUF];
    llmretry_options_defaults(&o);
    CHECK_INT(llmretry_options_set_number(&o, "retry_budget_ratio", -1, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK_STR(err, "retry_budget_ratio must be >= 0 (got -1)");
    CHECK_INT(llmretry_options_set_int(&o, "retry_budget_ratio", 2, err, sizeof err), LLMRETRY_OK);
    CHECK(o.retry_budget_ratio == 2.0);
}

/* Two engines stand for two processes: each has its own endpoints, and
 * only the `shared` store links them. One's failures open the breaker for
 * both, and the other's call fails fast, sending nothing; the retry
 * budget's window counts both. Unshared, the second engine knows nothing. */
static llmretry_engine *engine_sharing(const char *spec)
{
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    eo.shared = spec;
    llmretry_engine *e = NULL;
    char err[LLMRETRY_ERRBUF];
    CHECK_MSG(llmretry_engine_new(&eo, &e, err, sizeof err) == LLMRETRY_OK, "engine_new: %s", err);
    return e;
}

static void test_breaker_shared_by_engines(void)
{
    char url[128], spec[64], path[96];
    snprintf(spec, sizeof spec, "shm:test-health-%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm/llmretry-%s", spec + 4);
    unlink(path);
    for (int shared = 1; shared >= 0; shared--) {
        const char *name = shared ? "shdown" : "lonedown";
        llmretry_engine *a = engine_sharing(shared ? spec : NULL);
        llmretry_engine *b = engine_sharing(shared ? spec : NULL);
        if (!a || !b || th_mock_script(&mock, name, "{\"steps\": [], \"after\": {\"status\": 503}}") != 0)
            goto next;
        llmretry_options o;
        opts_for(&o, name, url, sizeof url);
        o.max_retries = 0;
        o.breaker_failures = 3;
        o.breaker_cooldown_ms = 60000;
        for (int i = 0; i < 3; i++) {
            llmretry_call *c = th_submit(a, &o);
            const llmretry_result *r = wait_done(c, NULL, 0);
            CHECK(r && !r->ok && r->status == 503);
            llmretry_call_free(c);
        }
        CHECK_INT(requests_of(name), 3);
        llmretry_call *c = th_submit(b, &o);
        const llmretry_result *r = wait_done(c, NULL, 0);
        llmretry_endpoint_stats s;
        CHECK(stats_of(b, name, &s));
        if (shared) {
            CHECK_MSG(r && r->kind == LLMRETRY_ERR_CIRCUIT_OPEN && r->attempts == 0,
                      "the other engine's call: kind %d, %d attempts", r ? (int)r->kind : -1,
                      r ? r->attempts : -1);
            CHECK_INT(requests_of(name), 3);
            CHECK_STR(s.breaker, "open");
            CHECK_INT(s.window_requests, 3);     /* a's first attempts, seen from b */
            CHECK_INT(s.requests, 0);            /* b's own: none */
        } else {
            CHECK(r && r->status == 503 && r->attempts == 1);
            CHECK_INT(requests_of(name), 4);
            CHECK_STR(s.breaker, "closed");
        }
        llmretry_call_free(c);
    next:
        llmretry_engine_free(a);
        llmretry_engine_free(b);
    }
    struct stat st;
    CHECK_MSG(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "%s", path);
    unlink(path);
    /* A bad store is refused when the engine is made, naming the option. */
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    eo.shared = "shm:../x";
    llmretry_engine *bad = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_INT(llmretry_engine_new(&eo, &bad, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_MSG(!bad && strstr(err, "shared") != NULL, "%s", err);
}

/* A base_url's query stays the request's query (after the endpoint's
 * path, as Azure's "?api-version=" needs), and the endpoint's stats never
 * show the URL's user info or query: a password or a key can be there,
 * and stats go to logs and dashboards. */
static void test_endpoint_url_shown(void)
{
    char base[128], url[320], want[320];
    llmretry_options o;
    llmretry_engine *e = th_engine_new();
    if (!e || th_mock_script(&mock, "shown", "{\"steps\": []}") != 0 ||
        !th_mock_scenario_url(&mock, "shown", base, sizeof base)) {
        CHECK_MSG(0, "setup failed");
        goto out;
    }
    const char *host = base + strlen("http://");       /* 127.0.0.1:PORT/s/shown/v1 */
    snprintf(url, sizeof url, "http://user:pw-SECRET@%s/?api-version=7&key=QSECRET#frag", host);
    opts_for(&o, "shown", base, sizeof base);
    o.base_url = url;
    llmretry_call *c = th_submit(e, &o);
    const llmretry_result *r = wait_done(c, NULL, 0);
    CHECK_MSG(r && r->ok, "%s", r && r->message ? r->message : "(no result)");
    llmretry_call_free(c);
    char *text = th_mock_requests(&mock, "shown");
    cJSON *recs = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(recs, 0), "path");
    CHECK_MSG(cJSON_GetArraySize(recs) == 1 && cJSON_IsString(path) &&
              strcmp(path->valuestring, "/s/shown/v1/chat/completions?api-version=7&key=QSECRET")
                  == 0,
              "the mock saw %s", cJSON_IsString(path) ? path->valuestring : "(no request)");
    cJSON_Delete(recs);
    llmretry_endpoint_stats s;
    CHECK(stats_of(e, "shown", &s));
    snprintf(want, sizeof want, "http://***@%.*s/chat/completions?***",
             (int)strcspn(host, "?"), host);
    CHECK_STR(s.url, want);
    CHECK_MSG(!strstr(s.url, "SECRET") && !strstr(s.url, "frag"), "%s", s.url);
    /* The two rules on their own (llmretry/url.h), for hosts. */
    static const char *const cases[][3] = {   /* url, joined with "/x", shown */
        { "https://h/v1/", "https://h/v1/x", "https://h/v1/" },
        { "https://u:p@w@h:8/v1?a=1#f", "https://u:p@w@h:8/v1/x?a=1", "https://***@h:8/v1?***" },
        { "https://h/p@q#f", "https://h/p@q/x", "https://h/p@q" },
        { "https://h?a=b/c", "https://h/x?a=b/c", "https://h?***" },
        /* No scheme (libcurl guesses http://): a URL in the query is not
         * the authority. */
        { "u:pw@h:8/v1?next=https://a@b/c", "u:pw@h:8/v1/x?next=https://a@b/c",
          "***@h:8/v1?***" },
        { "h/v1?r=http://x", "h/v1/x?r=http://x", "h/v1?***" },
        /* A misspelt scheme is still one: the password stays hidden. */
        { "htps://u:pw@h/v1", "htps://u:pw@h/v1/x", "htps://***@h/v1" },
        { "-x://@h", "-x://@h/x", "-x://***@h" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *joined = llmretry_url_join(cases[i][0], "/x");
        char *shown = llmretry_url_shown(cases[i][0]);
        CHECK_STR(joined ? joined : "(null)", cases[i][1]);
        CHECK_STR(shown ? shown : "(null)", cases[i][2]);
        llmretry_free(joined);
        llmretry_free(shown);
    }
out:
    llmretry_engine_free(e);
}

int main(void)
{
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_health");
    }
    static const th_case tests[] = {
        { "retry_budget_storm", test_retry_budget_bounds_a_storm },
        { "retry_budget_options", test_retry_budget_options_and_server_timed_retries },
        { "retry_budget_429", test_429_retries_spend_no_budget },
        { "breaker_cycle", test_breaker_opens_probes_and_closes },
        { "breaker_probe_4xx", test_breaker_one_probe_and_4xx_resets },
        { "fallback_endpoint", test_fallback_to_another_endpoint },
        { "fallback_rules", test_fallback_rules },
        { "bad_fallbacks", test_bad_fallbacks_are_refused },
        { "breaker_shared", test_breaker_shared_by_engines },
        { "endpoint_url_shown", test_endpoint_url_shown },
    };
    TH_RUN(tests);
    th_mock_stop(&mock);
    return th_summary("test_health");
}
