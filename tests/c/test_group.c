/* Groups against the mock server: the limit holds, a 429 with Retry-After
 * pauses every new start of the batch, bursts of 429s halve the window,
 * the batch deadline fails what has not started, and a group can be
 * cancelled into or freed early without harm. */
#include "harness.h"
#include "llmretry.h"

#include <cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
#define MAXN 64

static th_mock mock;

static void opts_for(llmretry_options *o, const char *name, char *url, size_t len,
                     llmretry_group *g)
{
    llmretry_options_defaults(o);
    o->base_url = th_mock_scenario_url(&mock, name, url, len);
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 10;
    o->timeout_ms = 5000;
    o->events = 0;
    o->group = g;
}

static llmretry_group *new_group(llmretry_engine *e, int limit, int64_t deadline_ms, int adaptive)
{
    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    go.limit = limit;
    go.deadline_ms = deadline_ms;
    go.adaptive = adaptive;
    llmretry_group *g = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = llmretry_group_new(e, &go, &g, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_OK, "group_new: %s", err);
    return g;
}

/* Submit n calls; 0 on success. */
static int submit_n(llmretry_engine *e, const llmretry_options *o, llmretry_call **calls, int n)
{
    char err[LLMRETRY_ERRBUF] = "";
    for (int i = 0; i < n; i++) {
        if (llmretry_engine_submit(e, o, 0, &calls[i], err, sizeof err) != LLMRETRY_OK) {
            CHECK_MSG(0, "submit %d: %s", i, err);
            for (int k = 0; k < i; k++)
                llmretry_call_free(calls[k]);
            return -1;
        }
    }
    return 0;
}

static int done(llmretry_call *c)
{
    return llmretry_call_result(c) != NULL;
}

/* Wait for every call; while waiting, sample the group's stats. */
static void wait_all(llmretry_call **calls, int n, llmretry_group *g, int *max_active,
                     int64_t timeout_ms)
{
    int64_t end = th_now_ms() + timeout_ms;
    *max_active = 0;
    for (;;) {
        int all = 1;
        for (int i = 0; i < n; i++)
            all &= done(calls[i]);
        llmretry_group_stats st;
        llmretry_group_stats_get(g, &st);
        if (st.active > *max_active)
            *max_active = st.active;
        if (all || th_now_ms() > end)
            break;
        th_sleep_ms(2);
    }
}

static double *request_times(const char *name, int *n)
{
    char *t = th_mock_requests(&mock, name);
    cJSON *a = t ? cJSON_Parse(t) : NULL;
    free(t);
    *n = cJSON_GetArraySize(a);
    double *times = calloc((size_t)(*n ? *n : 1), sizeof *times);
    for (int i = 0; i < *n; i++)
        times[i] = cJSON_GetObjectItem(cJSON_GetArrayItem(a, i), "time")->valuedouble;
    cJSON_Delete(a);
    return times;
}

static void free_all(llmretry_call **calls, int n)
{
    for (int i = 0; i < n; i++)
        llmretry_call_free(calls[i]);
}

static void test_limit_holds(llmretry_engine *e)
{
    enum { N = 12, LIMIT = 3 };
    th_mock_script(&mock, "g_limit", "{\"steps\": [], \"after\": {\"delay_ms\": 150}}");
    llmretry_group *g = new_group(e, LIMIT, LLMRETRY_NO_DEADLINE, 1);
    char url[128];
    llmretry_options o;
    opts_for(&o, "g_limit", url, sizeof url, g);
    llmretry_call *calls[N];
    int64_t t0 = th_now_ms();
    if (!g || submit_n(e, &o, calls, N) != 0)
        return;
    int max_active;
    wait_all(calls, N, g, &max_active, 10000);
    int64_t took = th_now_ms() - t0;
    int ok = 0;
    for (int i = 0; i < N; i++)
        ok += done(calls[i]) && llmretry_call_result(calls[i])->ok;
    CHECK_INT(ok, N);
    CHECK_MSG(max_active <= LIMIT && max_active >= 2, "max active %d, limit %d", max_active, LIMIT);
    /* 12 items of 150 ms, 3 at a time: at least 4 rounds. */
    CHECK_MSG(took >= 550, "12 items at limit 3 took only %lld ms", (long long)took);
    llmretry_group_stats st;
    llmretry_group_stats_get(g, &st);
    CHECK_INT(st.active, 0);
    CHECK_INT(st.queued, 0);
    free_all(calls, N);
    llmretry_group_free(g);
}

/* The first request of the batch gets a 429 with Retry-After 0.5: the
 * items still waiting must not start before that wait is over. */
static void test_retry_after_pauses_the_batch(llmretry_engine *e)
{
    enum { N = 10 };
    th_mock_script(&mock, "g_pause",
                   "{\"steps\": [{\"status\": 429, \"retry_after\": \"0.5\"}], "
                   "\"after\": {\"delay_ms\": 20}}");
    llmretry_group *g = new_group(e, 1, LLMRETRY_NO_DEADLINE, 0);
    char url[128];
    llmretry_options o;
    opts_for(&o, "g_pause", url, sizeof url, g);
    llmretry_call *calls[N];
    if (!g || submit_n(e, &o, calls, 1) != 0)
        return;
    /* Let the first item take its 429 alone, then widen nothing: the
     * others come with the pause already in force. */
    int64_t end = th_now_ms() + 3000;
    for (int seen = 0; !seen && th_now_ms() < end;) {
        free(request_times("g_pause", &seen));
        th_sleep_ms(5);
    }
    if (submit_n(e, &o, calls + 1, N - 1) != 0) {
        llmretry_call_free(calls[0]);
        return;
    }
    int max_active;
    wait_all(calls, N, g, &max_active, 10000);
    int n;
    double *t = request_times("g_pause", &n);
    CHECK_INT(n, N + 1);          /* the 429, its retry, and 9 more */
    for (int i = 1; i < n; i++)
        CHECK_MSG(t[i] - t[0] >= 0.45, "request %d went out %.3f s after the 429", i,
                  t[i] - t[0]);
    llmretry_group_stats st;
    llmretry_group_stats_get(g, &st);
    CHECK_MSG(st.pauses >= 1, "pauses %d", st.pauses);
    CHECK_INT(st.halvings, 0);    /* not adaptive */
    free(t);
    free_all(calls, N);
    llmretry_group_free(g);
}

/* A wider batch: while one item waits out its Retry-After, the others
 * already running finish, but nothing new starts. */
static void test_pause_stops_new_starts_in_a_wide_batch(llmretry_engine *e)
{
    enum { N = 16, LIMIT = 4 };
    th_mock_script(&mock, "g_wide",
                   "{\"steps\": [{\"status\": 429, \"retry_after\": \"0.6\"}], "
                   "\"after\": {\"delay_ms\": 100}}");
    llmretry_group *g = new_group(e, LIMIT, LLMRETRY_NO_DEADLINE, 0);
    char url[128];
    llmretry_options o;
    opts_for(&o, "g_wide", url, sizeof url, g);
    llmretry_call *calls[N];
    if (!g || submit_n(e, &o, calls, N) != 0)
        return;
    int max_active;
    wait_all(calls, N, g, &max_active, 10000);
    int n;
    double *t = request_times("g_wide", &n);
    CHECK_INT(n, N + 1);
    /* The first LIMIT requests left together; the 429 came back at once
     * while the others took 100 ms, so every later request waited. */
    int late = 0;
    for (int i = LIMIT; i < n; i++)
        late += t[i] - t[0] >= 0.55;
    CHECK_MSG(late == n - LIMIT, "%d of %d later requests respected the pause", late, n - LIMIT);
    free(t);
    free_all(calls, N);
    llmretry_group_free(g);
}

static void test_burst_halves_the_window(llmretry_engine *e)
{
    enum { N = 24, LIMIT = 8 };
    th_mock_script(&mock, "g_burst",
                   "{\"steps\": [{\"status\": 429}, {\"status\": 429}, {\"status\": 429}, "
                   "{\"status\": 429}, {\"status\": 429}, {\"status\": 429}], \"after\": "
                   "{\"delay_ms\": 30}}");
    llmretry_group *g = new_group(e, LIMIT, LLMRETRY_NO_DEADLINE, 1);
    char url[128];
    llmretry_options o;
    opts_for(&o, "g_burst", url, sizeof url, g);
    llmretry_call *calls[N];
    if (!g || submit_n(e, &o, calls, N) != 0)
        return;
    int max_active;
    wait_all(calls, N, g, &max_active, 10000);
    llmretry_group_stats st;
    llmretry_group_stats_get(g, &st);
    int ok = 0;
    for (int i = 0; i < N; i++)
        ok += done(calls[i]) && llmretry_call_result(calls[i])->ok;
    CHECK_INT(ok, N);
    /* Six 429s within one burst halve once; the window then grows back. */
    CHECK_INT(st.halvings, 1);
    CHECK_MSG(st.window >= LIMIT / 2 && st.window <= LIMIT, "window %d", st.window);
    free_all(calls, N);
    llmretry_group_free(g);
}

static void test_batch_deadline(llmretry_engine *e)
{
    enum { N = 5 };
    /* Item 1 gets 700 ms in flight before the deadline cuts it: with 200 ms
     * (a 500 ms deadline after a 300 ms item 0) a loaded CI machine cut it
     * before the mock had read it. */
    th_mock_script(&mock, "g_deadline",
                   "{\"steps\": [{\"delay_ms\": 300}], \"after\": {\"delay_ms\": 3000}}");
    llmretry_group *g = new_group(e, 1, 1000, 1);
    char url[128];
    llmretry_options o;
    opts_for(&o, "g_deadline", url, sizeof url, g);
    llmretry_call *calls[N];
    int64_t t0 = th_now_ms();
    if (!g || submit_n(e, &o, calls, N) != 0)
        return;
    int max_active;
    wait_all(calls, N, g, &max_active, 5000);
    int64_t took = th_now_ms() - t0;
    const llmretry_result *r0 = llmretry_call_result(calls[0]);
    CHECK(r0 && r0->ok);
    for (int i = 1; i < N; i++) {
        const llmretry_result *r = llmretry_call_result(calls[i]);
        CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_DEADLINE_EXCEEDED &&
                      r->reason == LLMRETRY_REASON_DEADLINE,
                  "item %d: %s", i, r ? (r->message ? r->message : "ok") : "not done");
        if (r && i >= 2)
            CHECK_INT(r->attempts, 0);   /* never started */
    }
    /* Item 1 started at ~300 ms and was cut at the 1000 ms deadline. */
    CHECK_INT(llmretry_call_result(calls[1]) ? llmretry_call_result(calls[1])->attempts : -1, 1);
    CHECK_MSG(took >= 950 && took < 2500, "the batch ended after %lld ms", (long long)took);
    int n;
    free(request_times("g_deadline", &n));
    CHECK_INT(n, 2);
    free_all(calls, N);
    llmretry_group_free(g);
}

static void test_cancel_and_early_free(llmretry_engine *e)
{
    enum { N = 6 };
    th_mock_script(&mock, "g_cancel", "{\"steps\": [], \"after\": {\"delay_ms\": 200}}");
    llmretry_group *g = new_group(e, 1, LLMRETRY_NO_DEADLINE, 1);
    char url[128];
    llmretry_options o;
    opts_for(&o, "g_cancel", url, sizeof url, g);
    llmretry_call *calls[N];
    if (!g || submit_n(e, &o, calls, N) != 0)
        return;
    llmretry_group_free(g);                    /* the calls keep it alive */
    llmretry_call_cancel(calls[3]);            /* waiting in the group */
    int64_t end = th_now_ms() + 3000;
    while (!done(calls[3]) && th_now_ms() < end)
        th_sleep_ms(2);
    const llmretry_result *r = llmretry_call_result(calls[3]);
    CHECK_MSG(r && r->kind == LLMRETRY_ERR_CANCELLED && r->attempts == 0,
              "queued item not cancelled at once");
    CHECK_MSG(!done(calls[5]), "a later item finished before its turn");
    free_all(calls, N);                        /* frees unfinished ones too */
}

/* Two batches on one engine, each draining its own group's news: each
 * sees exactly its own calls (by user_data), every one once when done. */
struct batch {
    llmretry_engine *e;
    const char *scenario;
    int n, finished, foreign, twice;
    int seen[MAXN];
};

static void *run_batch(void *arg)
{
    struct batch *b = arg;
    llmretry_group *g = new_group(b->e, 4, LLMRETRY_NO_DEADLINE, 1);
    char url[128];
    llmretry_options o;
    opts_for(&o, b->scenario, url, sizeof url, g);
    o.events = LLMRETRY_EVENTS_ALL;
    llmretry_call *calls[MAXN];
    for (int i = 0; i < b->n; i++) {
        o.user_data = &b->seen[i];
        if (llmretry_engine_submit(b->e, &o, 0, &calls[i], NULL, 0) != LLMRETRY_OK)
            return NULL;
    }
    int64_t end = th_now_ms() + 10000;
    while (b->finished < b->n && th_now_ms() < end) {
        llmretry_channel_wait(llmretry_group_channel(g), 100);
        llmretry_call *ready[16];
        size_t k = llmretry_channel_poll(llmretry_group_channel(g), ready, 16);
        for (size_t j = 0; j < k; j++) {
            int *slot = llmretry_call_user_data(ready[j]);
            if (slot < b->seen || slot >= b->seen + b->n) {
                b->foreign++;
                continue;
            }
            llmretry_event *ev;
            llmretry_mail m;
            while ((m = llmretry_call_next(ready[j], &ev)) == LLMRETRY_MAIL_EVENT)
                llmretry_event_free(ev);
            if (m == LLMRETRY_MAIL_DONE) {
                b->twice += *slot;
                *slot = 1;
                b->finished++;
            }
        }
    }
    for (int i = 0; i < b->n; i++)
        llmretry_call_free(calls[i]);
    llmretry_group_free(g);
    return NULL;
}

static void test_two_batches_poll_their_own_groups(llmretry_engine *e)
{
    th_mock_script(&mock, "g_two_a", "{\"steps\": [], \"after\": {\"delay_ms\": 20}}");
    th_mock_script(&mock, "g_two_b", "{\"steps\": [{\"status\": 503}], \"after\": {}}");
    struct batch a = { .e = e, .scenario = "g_two_a", .n = 30 };
    struct batch b = { .e = e, .scenario = "g_two_b", .n = 30 };
    pthread_t ta, tb;
    pthread_create(&ta, NULL, run_batch, &a);
    pthread_create(&tb, NULL, run_batch, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK_INT(a.finished, 30);
    CHECK_INT(b.finished, 30);
    CHECK_INT(a.foreign + b.foreign, 0);
    CHECK_INT(a.twice + b.twice, 0);
    /* The engine-wide poll saw none of it. */
    llmretry_call *stray[4];
    CHECK_INT(llmretry_channel_poll(llmretry_engine_channel(e), stray, 4), 0);
}

static void test_wrong_engine(llmretry_engine *e)
{
    llmretry_engine *other = NULL;
    char url[128], err[LLMRETRY_ERRBUF] = "";
    if (llmretry_engine_new(NULL, &other, err, sizeof err) != LLMRETRY_OK) {
        CHECK_MSG(0, "setup: engine_new: %s", err);
        return;
    }
    llmretry_group *g = new_group(other, 2, LLMRETRY_NO_DEADLINE, 1);
    llmretry_options o;
    opts_for(&o, "g_wrong", url, sizeof url, g);
    llmretry_call *c = NULL;
    CHECK_INT(llmretry_engine_submit(e, &o, 0, &c, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_MSG(strstr(err, "group") != NULL, "message \"%s\" does not name the group", err);
    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    go.limit = 0;
    llmretry_group *bad = NULL;
    CHECK_INT(llmretry_group_new(e, &go, &bad, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_MSG(strstr(err, "limit") != NULL, "message \"%s\" does not name limit", err);
    llmretry_group_free(g);
    llmretry_engine_free(other);
}

/* The engine's and a group's channels are the one readiness object: owned
 * by them (free leaves them alone), a pacing-only group has none, and a
 * group's channel takes only its group's calls. */
static void test_owned_channels(llmretry_engine *e)
{
    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    go.poll = 0;
    llmretry_group *pacer = NULL, *g = new_group(e, 2, LLMRETRY_NO_DEADLINE, 1);
    CHECK_INT(llmretry_group_new(e, &go, &pacer, NULL, 0), LLMRETRY_OK);
    CHECK_MSG(pacer && llmretry_group_channel(pacer) == NULL, "a pacing group has a channel");
    llmretry_channel *gch = g ? llmretry_group_channel(g) : NULL;
    CHECK_MSG(gch && llmretry_channel_fd(gch) >= 0, "a polling group has no channel fd");
    char url[128], err[LLMRETRY_ERRBUF] = "";
    llmretry_options o;
    opts_for(&o, "g_owned", url, sizeof url, NULL);
    o.channel = gch;
    llmretry_call *c = NULL;
    CHECK_INT(llmretry_engine_submit(e, &o, 0, &c, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_MSG(strstr(err, "channel") != NULL, "message \"%s\" does not name the channel", err);
    /* Naming the engine's own channel is LLMRETRY_SUBMIT_POLL; freeing it
     * is a no-op (the engine still reports there). */
    llmretry_channel *ech = llmretry_engine_channel(e);
    llmretry_channel_free(ech);
    o.channel = ech;
    CHECK_INT(llmretry_engine_submit(e, &o, 0, &c, err, sizeof err), LLMRETRY_OK);
    llmretry_call *got[4];
    size_t n = 0;
    for (int i = 0; i < 100 && n == 0; i++) {
        llmretry_channel_wait(ech, 100);
        n = llmretry_channel_poll(ech, got, 4);
    }
    CHECK_MSG(n == 1 && got[0] == c, "the engine's channel did not report the call (%zu)", n);
    llmretry_call_free(c);
    llmretry_group_free(pacer);
    llmretry_group_free(g);
}

int main(void)
{
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_group");
    }
    llmretry_engine *e = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_MSG(llmretry_engine_new(NULL, &e, err, sizeof err) == LLMRETRY_OK, "engine_new: %s", err);
    if (e) {
        test_limit_holds(e);
        test_retry_after_pauses_the_batch(e);
        test_pause_stops_new_starts_in_a_wide_batch(e);
        test_burst_halves_the_window(e);
        test_batch_deadline(e);
        test_cancel_and_early_free(e);
        test_two_batches_poll_their_own_groups(e);
        test_wrong_engine(e);
        test_owned_channels(e);
        llmretry_engine_free(e);
    }
    th_mock_stop(&mock);
    return th_summary("test_group");
}
