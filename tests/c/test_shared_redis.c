/* Shared budgets through Redis (core/src/shared_redis.c, docs/shared.md),
 * engine against the mock and a real redis-server: two engines stand for
 * two processes (each has its own endpoints, only the store links them).
 * Their rate budget and breaker are one; Redis killed mid-batch and brought
 * back costs no call and is reported once each way; a wrong password and
 * an unreachable Redis leave every call working on the local budget. */
#include "harness.h"
#include "llmretry.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <hiredis/hiredis.h>

static th_mock mock;
static th_redis redis;
/* What is shared is tested with a second for Redis to answer: on a loaded
 * machine a 50 ms stall is an outage, which a process rightly meets alone
 * (the outage tests use the default). */
static char patient[200];

#define KEY "sk-test-shared-redis"
#define BODY "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}"
#define SHARED_EVENTS ((1u << LLMRETRY_EV_SHARED_UNAVAILABLE) | (1u << LLMRETRY_EV_SHARED_RECOVERED))

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

static llmretry_engine *engine_on(const char *spec)
{
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    eo.shared = spec;
    eo.max_in_flight = 64;
    llmretry_engine *e = NULL;
    char err[LLMRETRY_ERRBUF];
    CHECK_MSG(llmretry_engine_new(&eo, &e, err, sizeof err) == LLMRETRY_OK, "engine_new: %s", err);
    return e;
}

/* The events a test looks at, as JSON lines. */
typedef struct seen {
    char log[16384];
    int unavailable, recovered;
} seen;

/* Take whatever the call has; 1 once it is done. */
static int drain(llmretry_call *c, seen *s)
{
    llmretry_event *ev;
    llmretry_mail m;
    while ((m = llmretry_call_next(c, &ev)) == LLMRETRY_MAIL_EVENT) {
        char *j = llmretry_event_to_json(ev);
        if (j && s) {
            size_t used = strlen(s->log);
            snprintf(s->log + used, sizeof s->log - used, "%s\n", j);
            s->unavailable += strstr(j, "\"llm_shared_unavailable\"") != NULL;
            s->recovered += strstr(j, "\"llm_shared_recovered\"") != NULL;
        }
        llmretry_free(j);
        llmretry_event_free(ev);
    }
    return m == LLMRETRY_MAIL_DONE;
}

static const llmretry_result *wait_done(llmretry_call *c, seen *s)
{
    int64_t until = th_now_ms() + 20000;
    while (c && th_now_ms() < until) {
        if (drain(c, s))
            return llmretry_call_result(c);
        llmretry_call_wait(c, 50);
    }
    return NULL;
}

static cJSON *limit_stats(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/_mock/limits/%s", name);
    char *text = th_mock_get(&mock, path);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static int stat_int(const cJSON *j, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

/* Two engines, each configured with the provider's limit (20 a second,
 * enforced in any second): sharing the bucket through Redis, together they
 * stay under it. (Alone, each would send 20 a second: about half refused.) */
static void test_rate_shared_by_engines(void)
{
    llmretry_engine *a = engine_on(patient), *b = engine_on(patient);
    char url[128];
    if (!a || !b || th_mock_script(&mock, "rdlim", "{\"steps\": [], \"limits\": {\"rpm\": 20, "
                                   "\"window_ms\": 1000}}") != 0)
        goto out;
    llmretry_options o;
    opts_for(&o, "rdlim", url, sizeof url);
    o.rpm = 1200;
    o.max_retries = 5;
    enum { EACH = 15 };
    llmretry_call *calls[2 * EACH];
    for (int i = 0; i < EACH; i++) {
        calls[2 * i] = th_submit(a, &o);
        calls[2 * i + 1] = th_submit(b, &o);
    }
    int ok = 0;
    for (int i = 0; i < 2 * EACH; i++) {
        const llmretry_result *r = wait_done(calls[i], NULL);
        ok += r && r->ok;
        llmretry_call_free(calls[i]);
    }
    CHECK_INT(ok, 2 * EACH);
    cJSON *st = limit_stats("rdlim");
    CHECK_INT(stat_int(st, "admitted"), 2 * EACH);
    CHECK_MSG(stat_int(st, "refused") <= 1, "%d of %d refused", stat_int(st, "refused"),
              stat_int(st, "admitted") + stat_int(st, "refused"));
    cJSON_Delete(st);
out:
    llmretry_engine_free(a);
    llmretry_engine_free(b);
}

static int stats_of(llmretry_engine *e, const char *name, llmretry_endpoint_stats *out)
{
    llmretry_endpoint_stats all[32];
    size_t n = llmretry_engine_endpoint_stats(e, all, 32);
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

static int requests_of(const char *name)
{
    char *text = th_mock_requests(&mock, name);
    cJSON *a = text ? cJSON_Parse(text) : NULL;
    free(text);
    int n = cJSON_GetArraySize(a);
    cJSON_Delete(a);
    return n;
}

/* One engine's failures open the breaker for the other, whose first call
 * to the endpoint fails fast, sending nothing; the retry budget's window
 * counts both. The first engine is gone by then, as a process that has
 * exited: closing, it told Redis what it did last. */
static void test_breaker_shared_by_engines(void)
{
    llmretry_engine *a = engine_on(patient), *b = engine_on(patient);
    char url[128];
    if (!a || !b || th_mock_script(&mock, "rddown", "{\"steps\": [], \"after\": {\"status\": 503}}") != 0)
        goto out;
    llmretry_options o;
    opts_for(&o, "rddown", url, sizeof url);
    o.max_retries = 0;
    o.breaker_failures = 3;
    o.breaker_cooldown_ms = 60000;
    for (int i = 0; i < 3; i++) {
        llmretry_call *c = th_submit(a, &o);
        const llmretry_result *r = wait_done(c, NULL);
        CHECK(r && !r->ok && r->status == 503);
        llmretry_call_free(c);
    }
    CHECK_INT(requests_of("rddown"), 3);
    llmretry_engine_free(a);
    a = NULL;
    llmretry_call *c = th_submit(b, &o);
    const llmretry_result *r = wait_done(c, NULL);
    CHECK_MSG(r && r->kind == LLMRETRY_ERR_CIRCUIT_OPEN && r->attempts == 0,
              "the other engine's call: kind %d, %d attempts", r ? (int)r->kind : -1,
              r ? r->attempts : -1);
    llmretry_call_free(c);
    CHECK_INT(requests_of("rddown"), 3);
    llmretry_endpoint_stats s;
    CHECK(stats_of(b, "rddown", &s));
    CHECK_STR(s.breaker, "open");
    CHECK_INT(s.window_requests, 3);
    CHECK_INT(s.requests, 0);
out:
    llmretry_engine_free(a);
    llmretry_engine_free(b);
}

/* After the cooldown, calls of both engines find the breaker half open:
 * Redis names one prober, whose call goes (slowly: the endpoint is back);
 * the other engine's call fails fast meanwhile, and once the probe
 * succeeds both engines' calls go. */
static void test_one_probe_across_engines(void)
{
    llmretry_engine *a = engine_on(patient), *b = engine_on(patient);
    char url[128];
    /* The probe's answer is held on a manual clock until b has asked. */
    if (!a || !b || th_mock_script(&mock, "rdprobe", "{\"clock\": \"manual\", \"steps\": "
                                   "[{\"status\": 503}, {\"status\": 503}, {\"status\": 503}, "
                                   "{\"delay_ms\": 400}]}") != 0)
        goto out;
    llmretry_options o;
    opts_for(&o, "rdprobe", url, sizeof url);
    o.max_retries = 0;
    o.breaker_failures = 3;
    o.breaker_cooldown_ms = 300;
    for (int i = 0; i < 3; i++) {
        llmretry_call *c = th_submit(a, &o);
        const llmretry_result *r = wait_done(c, NULL);
        CHECK(r && r->status == 503);
        llmretry_call_free(c);
    }
    th_sleep_ms(400);      /* past the client's own 300 ms cooldown: real time */
    llmretry_call *first = th_submit(a, &o);
    /* The probe is on the wire (its answer held) before b asks. */
    CHECK_MSG(TH_EVENTUALLY(requests_of("rdprobe") == 4, 10000), "the probe never went");
    llmretry_call *second = th_submit(b, &o);
    const llmretry_result *r2 = wait_done(second, NULL);
    CHECK_MSG(r2 && r2->kind == LLMRETRY_ERR_CIRCUIT_OPEN && r2->attempts == 0,
              "b's call while a probes: kind %d, %d attempts", r2 ? (int)r2->kind : -1,
              r2 ? r2->attempts : -1);
    th_mock_advance_clock(&mock, "rdprobe", 400);      /* the probe's answer */
    const llmretry_result *r1 = wait_done(first, NULL);
    CHECK(r1 && r1->ok && r1->attempts == 1);
    CHECK_INT(requests_of("rdprobe"), 4);
    llmretry_call_free(first);
    llmretry_call_free(second);
    /* Closed for both: b's next call goes (once b has read it back). */
    int ok = 0;
    int64_t until = th_now_ms() + 5000;
    while (!ok && th_now_ms() < until) {
        llmretry_call *c = th_submit(b, &o);
        const llmretry_result *r = wait_done(c, NULL);
        ok = r && r->ok;
        llmretry_call_free(c);
        if (!ok)
            th_sleep_ms(10);
    }
    CHECK_MSG(ok, "b never saw the breaker closed");
out:
    llmretry_engine_free(a);
    llmretry_engine_free(b);
}

/* Redis is killed while a paced batch runs and brought back: every call
 * succeeds within its deadline, the first call after each change says so
 * (once), and the batch keeps its pace on the local budget meanwhile. */
static void test_redis_killed_mid_batch(void)
{
    llmretry_engine *e = engine_on(patient);
    char url[128];
    if (!e || th_mock_script(&mock, "rdkill", "{\"steps\": [], \"limits\": {}}") != 0)
        goto out;
    llmretry_options o;
    opts_for(&o, "rdkill", url, sizeof url);
    o.rpm = 3000;
    o.deadline_ms = 8000;
    o.events = SHARED_EVENTS;
    enum { N = 100 };
    llmretry_call *calls[N];
    int done[N] = { 0 }, ok = 0, finished = 0, killed = 0, back = 0;
    seen s = { .log = "" };
    for (int i = 0; i < N; i++)
        calls[i] = th_submit(e, &o);
    int64_t until = th_now_ms() + 20000;
    while (finished < N && th_now_ms() < until) {
        for (int i = 0; i < N; i++) {
            if (done[i] || !calls[i] || !drain(calls[i], &s))
                continue;
            done[i] = 1;
            finished++;
            ok += llmretry_call_result(calls[i])->ok;
        }
        if (finished >= 20 && !killed) {
            th_redis_kill(&redis);
            killed = 1;
        }
        if (finished >= 40 && !back) {
            back = 1;
            if (th_redis_restart(&redis) != 0)
                break;
        }
        th_sleep_ms(2);
    }
    CHECK_INT(ok, N);
    CHECK_MSG(s.unavailable == 1 && s.recovered == 1, "unavailable %d, recovered %d:\n%s",
              s.unavailable, s.recovered, s.log);
    char want[200];
    snprintf(want, sizeof want, "\"shared\":\"redis://127.0.0.1:%d/0?timeout_ms=1000\"",
             redis.port);
    CHECK_MSG(strstr(s.log, want) != NULL, "%s", s.log);
    CHECK_MSG(strstr(s.log, "\"down_ms\":") != NULL, "%s", s.log);
    CHECK_INT(requests_of("rdkill"), N);
    for (int i = 0; i < N; i++)
        llmretry_call_free(calls[i]);
out:
    llmretry_engine_free(e);
}

/* A wrong password: calls work on the local budget, the first says why,
 * and the password is nowhere. */
static void test_wrong_password(void)
{
    th_redis locked;
    if (th_redis_start(&locked, "the-right-one") != 0)
        return;
    char spec[160], url[128];
    snprintf(spec, sizeof spec, "redis://:NOT-THE-PASSWORD@127.0.0.1:%d/0", locked.port);
    llmretry_engine *e = engine_on(spec);
    if (!e || th_mock_script(&mock, "rdpw", "{\"steps\": []}") != 0)
        goto out;
    llmretry_options o;
    opts_for(&o, "rdpw", url, sizeof url);
    o.rpm = 600;
    o.events = LLMRETRY_EVENTS_ALL;
    seen s = { .log = "" };
    for (int i = 0; i < 3; i++) {
        llmretry_call *c = th_submit(e, &o);
        const llmretry_result *r = wait_done(c, &s);
        CHECK(r && r->ok);
        CHECK(r && (!r->message || !strstr(r->message, "NOT-THE-PASSWORD")));
        llmretry_call_free(c);
    }
    CHECK_MSG(s.unavailable == 1 && s.recovered == 0, "%s", s.log);
    CHECK_MSG(strstr(s.log, "refused the password") && strstr(s.log, "redis://***@127.0.0.1"),
              "%s", s.log);
    CHECK_MSG(!strstr(s.log, "NOT-THE-PASSWORD"), "the password in the events:\n%s", s.log);
out:
    llmretry_engine_free(e);
    th_redis_stop(&locked);
}

/* Nothing listens where the URL points: the engine is made, each call
 * works on the local budget at once, and the first says so, once. */
static void test_unreachable_at_start(void)
{
    th_redis gone;
    if (th_redis_start(&gone, NULL) != 0)
        return;
    th_redis_kill(&gone);                       /* a port nothing listens on now */
    llmretry_engine *e = engine_on(gone.url);
    char url[128];
    if (!e || th_mock_script(&mock, "rdgone", "{\"steps\": []}") != 0)
        goto out;
    llmretry_options o;
    opts_for(&o, "rdgone", url, sizeof url);
    o.rpm = 600;
    o.breaker_failures = 3;
    o.events = SHARED_EVENTS;
    seen s = { .log = "" };
    for (int i = 0; i < 3; i++) {
        llmretry_call *c = th_submit(e, &o);
        const llmretry_result *r = wait_done(c, &s);
        CHECK(r && r->ok && r->attempts == 1);
        llmretry_call_free(c);
    }
    CHECK_MSG(s.unavailable == 1, "%s", s.log);
    CHECK_MSG(strstr(s.log, "cannot connect"), "%s", s.log);
out:
    llmretry_engine_free(e);
    th_redis_stop(&gone);
}

/* ---- what processes say of the limits, through either store -------------- */

static char shm_spec[64];

/* test_NAME_shm and test_NAME_redis: NAME(spec) on each store. */
#define ON_BOTH_STORES(name) \
    static void test_##name##_shm(void) { name(shm_spec); } \
    static void test_##name##_redis(void) { name(patient); }

/* Whether some endpoint's hash in Redis holds `field` = `value` (what one
 * engine said has reached the store). */
static int redis_has(const char *field, const char *value)
{
    struct timeval tv = { 1, 0 };
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis.port, tv);
    redisReply *keys = rc && !rc->err ? redisCommand(rc, "KEYS llmretry:1:*") : NULL;
    int found = 0;
    for (size_t i = 0; keys && keys->type == REDIS_REPLY_ARRAY && i < keys->elements && !found; i++) {
        redisReply *v = redisCommand(rc, "HGET %s %s", keys->element[i]->str, field);
        found = v && v->type == REDIS_REPLY_STRING && strcmp(v->str, value) == 0;
        freeReplyObject(v);
    }
    freeReplyObject(keys);
    if (rc)
        redisFree(rc);
    return found;
}


static void run_one(llmretry_engine *e, const llmretry_options *o)
{
    llmretry_call *c = th_submit(e, o);
    const llmretry_result *r = wait_done(c, NULL);
    CHECK(r && r->ok);
    llmretry_call_free(c);
}

/* What each test below starts from: two engines on one store and the mock
 * scenario `prefix` + the store's letter, scripted, with options for it. */
typedef struct {
    llmretry_engine *a, *b;
    char scen[32], url[128];
    llmretry_options o;
} two_engines;

/* 0, or -1 when something did not start (two_end frees what did). */
static int two_start(two_engines *t, const char *spec, const char *prefix, const char *script)
{
    t->a = engine_on(spec);
    t->b = engine_on(spec);
    snprintf(t->scen, sizeof t->scen, "%s%c", prefix, spec[0]);
    if (!t->a || !t->b || th_mock_script(&mock, t->scen, script) != 0)
        return -1;
    opts_for(&t->o, t->scen, t->url, sizeof t->url);
    return 0;
}

static void two_end(two_engines *t)
{
    llmretry_engine_free(t->a);
    llmretry_engine_free(t->b);
}

/* `each` calls on a (options oa) and, unless b is NULL, as many on b (ob),
 * all submitted at once, a's and b's in turn: how many succeeded. */
static int run_at_once(llmretry_engine *a, const llmretry_options *oa, llmretry_engine *b,
                       const llmretry_options *ob, int each)
{
    llmretry_call *calls[64];
    int n = 0, ok = 0;
    for (int i = 0; i < each && n < 63; i++) {
        calls[n++] = th_submit(a, oa);
        if (b)
            calls[n++] = th_submit(b, ob);
    }
    for (int i = 0; i < n; i++) {
        const llmretry_result *r = wait_done(calls[i], NULL);
        ok += r && r->ok;
        llmretry_call_free(calls[i]);
    }
    return ok;
}

/* The server refused at most one of the scenario's requests. Stats that
 * cannot be read (a scenario without limits: the mock enforced nothing)
 * are a failure, not none refused. */
static void check_few_refused(const char *scen, const char *spec)
{
    cJSON *j = limit_stats(scen);
    int refused = stat_int(j, "refused"), admitted = stat_int(j, "admitted");
    if (admitted <= 0 || refused < 0)
        CHECK_MSG(0, "%s: no limit stats for %s: %s", spec, scen, j ? "bad" : "none");
    else
        CHECK_MSG(refused <= 1, "%s: %d of %d refused", spec, refused, admitted + refused);
    cJSON_Delete(j);
}

/* Two engines on one key configured with different limits: the stricter
 * wins for both. The provider allows 20 a second; a says so (rpm 1200),
 * b says ten times as much: paced at b's own 12,000 a minute b alone would
 * send its 12 calls in a burst and see most refused. */
static void stricter_wins(const char *spec)
{
    two_engines t;
    if (two_start(&t, spec, "strict", "{\"steps\": [], \"limits\": {\"rpm\": 20, "
                  "\"window_ms\": 1000, \"rate_headers\": false}}") != 0)
        goto out;
    llmretry_options oa = t.o, ob;
    oa.rpm = 1200;
    oa.max_retries = 5;
    ob = oa;
    ob.rpm = 12000;
    run_one(t.a, &oa);
    run_one(t.b, &ob);
    /* a's claim is in force for b (through Redis, within a round). */
    llmretry_endpoint_stats st;
    CHECK_MSG(TH_EVENTUALLY(stats_of(t.b, t.scen, &st) && st.rpm == 1200, 3000),
              "b paces at %lld a minute", (long long)st.rpm);
    enum { EACH = 12 };
    CHECK_INT(run_at_once(t.a, &oa, t.b, &ob, EACH), 2 * EACH);
    cJSON *j = limit_stats(t.scen);
    CHECK_INT(stat_int(j, "admitted"), 2 * EACH + 2);
    cJSON_Delete(j);
    check_few_refused(t.scen, spec);
out:
    two_end(&t);
}

ON_BOTH_STORES(stricter_wins)

/* A limit one engine learned from the server's headers paces another that
 * has no answer of its own yet: a's one call learns 10 a second; b,
 * configured with nothing, sends 12 at once (alone, it would send them in
 * one burst: 3 or more refused). */
static void learned_for_all(const char *spec)
{
    two_engines t;
    if (two_start(&t, spec, "learned", "{\"steps\": [], \"limits\": {\"rpm\": 10, "
                  "\"window_ms\": 1000}}") != 0)
        goto out;
    t.o.max_retries = 5;
    run_one(t.a, &t.o);
    if (spec[0] == 'r')                 /* a's news has reached Redis */
        CHECK(TH_EVENTUALLY(redis_has("a2", "600"), 3000));
    enum { N = 12 };
    CHECK_INT(run_at_once(t.b, &t.o, NULL, NULL, N), N);
    check_few_refused(t.scen, spec);
out:
    two_end(&t);
}

ON_BOTH_STORES(learned_for_all)

/* The shared slow start: two engines, nothing configured or known of the
 * limit, 20 calls each at once against a server that answers in 600 ms:
 * together at most LR_SHARED_START_CAP (16) go before the first answer,
 * then the rest. (Without it, all 40 go at once.) */
static void slow_start(const char *spec)
{
    two_engines t;
    if (two_start(&t, spec, "start", "{\"steps\": [], \"after\": {\"delay_ms\": 600}}") != 0)
        goto out;
    const char *scen = t.scen;
    enum { EACH = 20 };
    CHECK_INT(run_at_once(t.a, &t.o, t.b, &t.o, EACH), 2 * EACH);
    /* Arrivals before the first answer could have come back (600 ms after
     * the first arrival; 400 leaves the scheduler room). */
    char *text = th_mock_requests(&mock, scen);
    cJSON *recs = text ? cJSON_Parse(text) : NULL;
    free(text);
    int n = cJSON_GetArraySize(recs), early = 0;
    /* The first arrival: records come in the order they were handled. */
    double first = n ? cJSON_GetObjectItem(cJSON_GetArrayItem(recs, 0), "time")->valuedouble : 0;
    for (int i = 1; i < n; i++) {
        double at = cJSON_GetObjectItem(cJSON_GetArrayItem(recs, i), "time")->valuedouble;
        first = at < first ? at : first;
    }
    for (int i = 0; i < n; i++)
        early += cJSON_GetObjectItem(cJSON_GetArrayItem(recs, i), "time")->valuedouble < first + 0.4;
    cJSON_Delete(recs);
    CHECK_INT(n, 2 * EACH);
    CHECK_MSG(early >= 1 && early <= 16, "%s: %d of %d sent before the first answer", spec, early, n);
out:
    two_end(&t);
}

ON_BOTH_STORES(slow_start)

/* The slow-down after a 429 naming no wait is every engine's: a's 429
 * (after two successes) cuts the request rate to half what it was served
 * at; b, configured with nothing, paces at that rate too (alone, at none). */
static void slow_down_for_all(const char *spec)
{
    two_engines t;
    if (two_start(&t, spec, "slowdn", "{\"steps\": [{}, {}, {\"status\": 429}], "
                  "\"after\": {}}") != 0)
        goto out;
    t.o.max_retries = 3;
    for (int i = 0; i < 3; i++)
        run_one(t.a, &t.o);
    llmretry_endpoint_stats sa, sb;
    CHECK(stats_of(t.a, t.scen, &sa) && sa.rpm > 0);
    run_one(t.b, &t.o);
    CHECK_MSG(stats_of(t.b, t.scen, &sb) && sb.rpm > 0 && sb.rpm <= 2 * sa.rpm,
              "%s: b paces at %lld a minute, a at %lld", spec, (long long)sb.rpm,
              (long long)sa.rpm);
out:
    two_end(&t);
}

ON_BOTH_STORES(slow_down_for_all)

/* How many endpoints' hashes in Redis have `field` set (a pause's end is
 * in Redis's clock: only that it is there tells). */
static int redis_count(const char *field)
{
    struct timeval tv = { 1, 0 };
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis.port, tv);
    redisReply *keys = rc && !rc->err ? redisCommand(rc, "KEYS llmretry:1:*") : NULL;
    int found = 0;
    for (size_t i = 0; keys && keys->type == REDIS_REPLY_ARRAY && i < keys->elements; i++) {
        redisReply *v = redisCommand(rc, "HEXISTS %s %s", keys->element[i]->str, field);
        found += v && v->type == REDIS_REPLY_INTEGER && v->integer == 1;
        freeReplyObject(v);
    }
    freeReplyObject(keys);
    if (rc)
        redisFree(rc);
    return found;
}

/* What the server says remains holds every engine on the key: a's answer
 * says none of the `which` limit is left until it resets in 5 s; b, which
 * knows nothing of it, does not send before then: its call, with a 1 s
 * deadline, ends at the deadline without an attempt, and the mock saw a's
 * request alone. (Unshared, b sends at once and is served.) */
static void hold_for_all(const char *spec, const char *which)
{
    two_engines t;
    char prefix[8], script[256];
    snprintf(prefix, sizeof prefix, "hold%c", which[0]);
    snprintf(script, sizeof script, "{\"steps\": [{\"headers\": {"
             "\"x-ratelimit-remaining-%s\": \"0\", \"x-ratelimit-reset-%s\": \"5s\"}}], "
             "\"after\": {}}", which, which);
    if (two_start(&t, spec, prefix, script) != 0)
        goto out;
    llmretry_engine *a = t.a, *b = t.b;
    const char *scen = t.scen;
    llmretry_options o = t.o;
    int paused = spec[0] == 'r' ? redis_count("pz") : 0;
    run_one(a, &o);
    if (spec[0] == 'r')                 /* a's hold has reached Redis */
        CHECK(TH_EVENTUALLY(redis_count("pz") > paused, 3000));
    o.deadline_ms = 1000;
    llmretry_call *c = th_submit(b, &o);
    const llmretry_result *r = wait_done(c, NULL);
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_DEADLINE_EXCEEDED && r->attempts == 0,
              "%s %s: b %s after %d attempts", spec, which, r && r->ok ? "served" : "failed",
              r ? r->attempts : -1);
    llmretry_call_free(c);
    char path[64];
    snprintf(path, sizeof path, "/_mock/requests/%s", scen);
    char *text = th_mock_get(&mock, path);
    cJSON *log = text ? cJSON_Parse(text) : NULL;
    CHECK_INT(cJSON_GetArraySize(log), 1);
    cJSON_Delete(log);
    free(text);
out:
    two_end(&t);
}

static void test_hold_requests_shm(void)
{
    hold_for_all(shm_spec, "requests");
}

static void test_hold_tokens_shm(void)
{
    hold_for_all(shm_spec, "tokens");
}

static void test_hold_requests_redis(void)
{
    hold_for_all(patient, "requests");
}

static void test_hold_tokens_redis(void)
{
    hold_for_all(patient, "tokens");
}

int main(void)
{
    if (th_mock_start(&mock) != 0)
        return th_summary("test_shared_redis");
    if (th_redis_start(&redis, NULL) != 0) {
        th_mock_stop(&mock);
        return th_summary("test_shared_redis");
    }
    snprintf(patient, sizeof patient, "%s?timeout_ms=1000", redis.url);
    snprintf(shm_spec, sizeof shm_spec, "shm:test-limits-%d", (int)getpid());
    static const th_case tests[] = {
        { "rate_shared", test_rate_shared_by_engines },
        { "breaker_shared", test_breaker_shared_by_engines },
        { "one_probe", test_one_probe_across_engines },
        { "redis_killed", test_redis_killed_mid_batch },
        { "wrong_password", test_wrong_password },
        { "unreachable", test_unreachable_at_start },
        { "stricter_wins_shm", test_stricter_wins_shm },
        { "stricter_wins_redis", test_stricter_wins_redis },
        { "learned_for_all_shm", test_learned_for_all_shm },
        { "learned_for_all_redis", test_learned_for_all_redis },
        { "slow_start_shm", test_slow_start_shm },
        { "slow_start_redis", test_slow_start_redis },
        { "slow_down_shm", test_slow_down_for_all_shm },
        { "slow_down_redis", test_slow_down_for_all_redis },
        { "hold_requests_shm", test_hold_requests_shm },
        { "hold_tokens_shm", test_hold_tokens_shm },
        { "hold_requests_redis", test_hold_requests_redis },
        { "hold_tokens_redis", test_hold_tokens_redis },
    };
    TH_RUN(tests);
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/llmretry-%s", shm_spec + 4);
    unlink(path);
    th_redis_stop(&redis);
    th_mock_stop(&mock);
    return th_summary("test_shared_redis");
}
