/* The batch vectors (tests/vectors/batches/NAME.json, format in
 * tests/vectors/README.md): several calls through the engine's admission
 * stage at once. Here the items run as one group of `limit`; the Python and
 * Lua suites run the same files through map_with_concurrency. */
#include "harness.h"
#include "llmretry.h"

#include <cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <time.h>

#define MAX_ITEMS 64

static th_mock mock;

static void sleep_until(int64_t t)
{
    int64_t now;
    while ((now = th_now_ms()) < t) {
        struct timespec ts = { 0, (long)(t - now) * 1000000L };
        nanosleep(&ts, NULL);
    }
}

/* Apply a vector's options object; 0, or -1 naming an unknown key. */
static int apply_options(const cJSON *obj, llmretry_options *o, const char *vec)
{
    const cJSON *kv;
    cJSON_ArrayForEach(kv, obj) {
        const char *k = kv->string;
        int64_t v = (int64_t)kv->valuedouble;
        if (strcmp(k, "timeout_ms") == 0) o->timeout_ms = v;
        else if (strcmp(k, "max_retries") == 0) o->max_retries = (int)v;
        else if (strcmp(k, "base_delay_ms") == 0) o->base_delay_ms = v;
        else if (strcmp(k, "max_delay_ms") == 0) o->max_delay_ms = v;
        else if (strcmp(k, "deadline_ms") == 0) o->deadline_ms = v;
        else if (strcmp(k, "max_retry_after_ms") == 0) o->max_retry_after_ms = v;
        else if (strcmp(k, "retry_budget_ratio") == 0) o->retry_budget_ratio = kv->valuedouble;
        else if (strcmp(k, "retry_budget_min") == 0) o->retry_budget_min = (int)v;
        else if (strcmp(k, "breaker_failures") == 0) o->breaker_failures = (int)v;
        else if (strcmp(k, "breaker_cooldown_ms") == 0) o->breaker_cooldown_ms = v;
        else if (strcmp(k, "jitter") == 0 && cJSON_IsString(kv))
            llmretry_jitter_parse(kv->valuestring, &o->jitter);
        else {
            CHECK_MSG(0, "%s: unknown option '%s'", vec, k);
            return -1;
        }
    }
    return 0;
}

static const char *str_or(const cJSON *obj, const char *key, const char *dflt)
{
    const cJSON *v = cJSON_GetObjectItem(obj, key);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

static void run_vector(const char *path, const char *file)
{
    size_t len;
    char *text = th_read_file(path, &len);
    cJSON *vec = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (!vec) {
        CHECK_MSG(0, "%s: not JSON", file);
        return;
    }
    const char *name = str_or(vec, "name", "");
    char url[160], err[LLMRETRY_ERRBUF] = "";
    char *script = cJSON_PrintUnformatted(cJSON_GetObjectItem(vec, "script"));
    CHECK_MSG(th_mock_script(&mock, name, script) == 0, "%s: could not script", name);
    free(script);

    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    const cJSON *mif = cJSON_GetObjectItem(vec, "max_in_flight");
    if (cJSON_IsNumber(mif))
        eo.max_in_flight = mif->valueint;
    llmretry_engine *e = NULL;
    llmretry_group *g = NULL;
    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    go.limit = cJSON_GetObjectItem(vec, "limit")->valueint;
    if (llmretry_engine_new(&eo, &e, err, sizeof err) != LLMRETRY_OK ||
        llmretry_group_new(e, &go, &g, err, sizeof err) != LLMRETRY_OK) {
        CHECK_MSG(0, "%s: %s", name, err);
        llmretry_engine_free(e);
        cJSON_Delete(vec);
        return;
    }
    const char *body = "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"SECRET\"}]}";
    const cJSON *items = cJSON_GetObjectItem(vec, "items");
    int n = cJSON_GetArraySize(items);
    llmretry_call *calls[MAX_ITEMS] = { 0 };
    int64_t started[MAX_ITEMS], ended[MAX_ITEMS];
    int64_t t0 = th_now_ms();
    for (int i = 0; i < n && i < MAX_ITEMS; i++) {
        const cJSON *item = cJSON_GetArrayItem(items, i);
        llmretry_options o;
        llmretry_options_defaults(&o);
        o.base_url = th_mock_scenario_url(&mock, name, url, sizeof url);
        o.api_key = "sk-test-SECRET-KEY-123";
        o.use_env_api_key = 0;
        o.body = body;
        o.body_len = strlen(body);
        o.events = 0;
        o.group = g;
        if (apply_options(cJSON_GetObjectItem(vec, "options"), &o, name) != 0 ||
            apply_options(cJSON_GetObjectItem(item, "options"), &o, name) != 0)
            break;
        const cJSON *after = cJSON_GetObjectItem(item, "start_after_ms");
        if (cJSON_IsNumber(after))
            sleep_until(t0 + (int64_t)after->valuedouble);
        started[i] = th_now_ms();
        CHECK_MSG(llmretry_engine_submit(e, &o, 0, &calls[i], err, sizeof err) == LLMRETRY_OK,
                  "%s: item %d: %s", name, i, err);
    }
    /* Wait for every item at once, noting when each ended. */
    int left = n;
    for (int i = 0; i < n && i < MAX_ITEMS; i++)
        ended[i] = calls[i] ? -1 : 0;
    int64_t until = th_now_ms() + 20000;
    while (left > 0 && th_now_ms() < until) {
        for (int i = 0; i < n && i < MAX_ITEMS; i++) {
            llmretry_event *ev;
            llmretry_mail m;
            while (ended[i] < 0 && (m = llmretry_call_next(calls[i], &ev)) != LLMRETRY_MAIL_EMPTY) {
                if (m == LLMRETRY_MAIL_EVENT)
                    llmretry_event_free(ev);
                if (m == LLMRETRY_MAIL_DONE) {
                    ended[i] = th_now_ms();
                    left--;
                }
            }
        }
        struct timespec ts = { 0, 2 * 1000000L };
        nanosleep(&ts, NULL);
    }
    const cJSON *expect = cJSON_GetObjectItem(vec, "expect");
    for (int i = 0; i < n && i < MAX_ITEMS; i++) {
        const cJSON *want = cJSON_GetArrayItem(cJSON_GetObjectItem(expect, "items"), i);
        const llmretry_result *r = calls[i] ? llmretry_call_result(calls[i]) : NULL;
        if (!r) {
            CHECK_MSG(0, "%s: item %d did not finish", name, i);
            continue;
        }
        const char *outcome = str_or(want, "outcome", "");
        CHECK_MSG(r->ok == (strcmp(outcome, "ok") == 0), "%s: item %d: ok=%d, want %s (%s)",
                  name, i, r->ok, outcome, r->message ? r->message : "");
        const char *kind = str_or(want, "error_kind", NULL);
        if (kind)
            CHECK_MSG(!r->ok && strcmp(llmretry_error_kind_name(r->kind), kind) == 0,
                      "%s: item %d: kind %s, want %s", name, i,
                      llmretry_error_kind_name(r->kind), kind);
        const char *reason = str_or(want, "reason", NULL);
        if (reason)
            CHECK_MSG(!r->ok && strcmp(llmretry_reason_name(r->reason), reason) == 0,
                      "%s: item %d: reason %s, want %s", name, i,
                      llmretry_reason_name(r->reason), reason);
        const cJSON *attempts = cJSON_GetObjectItem(want, "attempts");
        if (cJSON_IsNumber(attempts))
            CHECK_MSG(r->attempts == attempts->valueint, "%s: item %d: %d attempts, want %d",
                      name, i, r->attempts, attempts->valueint);
        const cJSON *max_ms = cJSON_GetObjectItem(want, "max_ms");
        if (cJSON_IsNumber(max_ms))
            CHECK_MSG(ended[i] - started[i] <= max_ms->valueint,
                      "%s: item %d took %lld ms, want <= %d", name, i,
                      (long long)(ended[i] - started[i]), max_ms->valueint);
    }
    char *recs_text = th_mock_requests(&mock, name);
    cJSON *recs = recs_text ? cJSON_Parse(recs_text) : NULL;
    free(recs_text);
    const cJSON *want_requests = cJSON_GetObjectItem(expect, "requests");
    CHECK_MSG(cJSON_GetArraySize(recs) == want_requests->valueint, "%s: %d requests, want %d",
              name, cJSON_GetArraySize(recs), want_requests->valueint);
    const cJSON *quiet = cJSON_GetObjectItem(expect, "quiet_after_429_ms");
    if (cJSON_IsArray(quiet)) {
        double t429 = -1, from = cJSON_GetArrayItem(quiet, 0)->valuedouble / 1000.0,
               to = cJSON_GetArrayItem(quiet, 1)->valuedouble / 1000.0;
        const cJSON *rec;
        cJSON_ArrayForEach(rec, recs)
            if (t429 < 0 && cJSON_GetObjectItem(rec, "step")->valueint == 0)
                t429 = cJSON_GetObjectItem(rec, "time")->valuedouble;
        int early = 0;     /* requests after the script's two (step -1) */
        cJSON_ArrayForEach(rec, recs) {
            double t = cJSON_GetObjectItem(rec, "time")->valuedouble;
            const cJSON *step = cJSON_GetObjectItem(rec, "step");
            early += cJSON_IsNumber(step) && step->valueint == -1 && t > t429 + from &&
                     t < t429 + to;
        }
        CHECK_MSG(t429 >= 0 && early == 0, "%s: %d requests during the pause", name, early);
    }
    cJSON_Delete(recs);
    for (int i = 0; i < n && i < MAX_ITEMS; i++)
        llmretry_call_free(calls[i]);
    llmretry_group_free(g);
    llmretry_engine_free(e);
    cJSON_Delete(vec);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void)
{
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_batch_vectors");
    }
    const char *dir = LLMRETRY_SOURCE_DIR "/tests/vectors/batches";
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    char *names[64];
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d)) && n < 64;) {
        size_t l = strlen(de->d_name);
        if (l > 5 && strcmp(de->d_name + l - 5, ".json") == 0)
            names[n++] = strdup(de->d_name);
    }
    if (d)
        closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    CHECK_MSG(n >= 2, "%d batch vectors", n);
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        int before = th_failed;
        int64_t t0 = th_now_ms();
        run_vector(path, names[i]);
        fprintf(stderr, "%-40s %s (%lld ms)\n", names[i], th_failed == before ? "ok" : "FAILED",
                (long long)(th_now_ms() - t0));
        free(names[i]);
    }
    th_mock_stop(&mock);
    return th_summary("test_batch_vectors");
}
