/* The baseline for bench_engine: a bare libcurl multi loop with no policy.
 *
 * INFLIGHT easy handles are kept busy on one multi handle, each POSTing the
 * same body with headers like the engine's (Authorization, Content-Type,
 * Accept, User-Agent, X-Client-Request-Id, an empty Expect), and every
 * response is parsed with cJSON (usage.total_tokens and model are read).
 * Handles and their header lists are reused; a finished handle is removed
 * from the multi and added again for the next request, as the engine does.
 *
 *   bare_multi URL N INFLIGHT [--rss]
 *
 * Prints one line:  RESULT prog=bare (bare-rss with --rss) n=.. ok=.. secs=.. rps=.. cpu_us=..
 * (cpu_us = user+sys CPU of the process over the timed run / N, in µs).
 * With --rss it also samples VmRSS (baseline before the handles exist, and
 * the peak during the run) and adds rss_base_kib, rss_peak_kib, kib_per_call.
 */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <cjson/cJSON.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* The request body: a short chat request, or with LLMRETRY_BENCH_BODY_BYTES
 * set, one whose user message is padded to that many bytes (a long prompt). */
static char *BODY;
static size_t BODY_LEN;

static void make_body(void)
{
    const char *env = getenv("LLMRETRY_BENCH_BODY_BYTES");
    long pad = env ? atol(env) : 0;
    static const char head[] = "{\"model\":\"gpt-4.1-mini\",\"messages\":[{\"role\":\"user\","
                               "\"content\":\"Say ok.";
    static const char tail[] = "\"}]}";
    if (pad < 0)
        pad = 0;
    BODY = malloc(sizeof head + (size_t)pad + sizeof tail);
    if (!BODY)
        exit(1);
    memcpy(BODY, head, sizeof head - 1);
    memset(BODY + sizeof head - 1, 'x', (size_t)pad);
    memcpy(BODY + sizeof head - 1 + pad, tail, sizeof tail);
    BODY_LEN = strlen(BODY);
}

typedef struct slot {
    CURL *h;
    char *buf;
    size_t len, cap;
} slot;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) {
            v = strtol(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static atomic_long rss_peak;
static atomic_int sampling;

static void *sampler(void *arg)
{
    (void)arg;
    while (atomic_load(&sampling)) {
        long v = rss_kib();
        if (v > atomic_load(&rss_peak))
            atomic_store(&rss_peak, v);
        usleep(1000);
    }
    return NULL;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    slot *s = ud;
    size_t n = size * nmemb;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 1024;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *p = realloc(s->buf, cap);
        if (!p)
            return 0;
        s->buf = p;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    return n;
}

/* 1 when the response is a 2xx chat.completion we can read. */
static int check_response(slot *s, CURLcode rc)
{
    long status = 0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK || status < 200 || status >= 300)
        return 0;
    cJSON *doc = cJSON_ParseWithLength(s->buf ? s->buf : "", s->len);
    int ok = 0;
    if (doc && cJSON_IsObject(doc)) {
        const cJSON *usage = cJSON_GetObjectItemCaseSensitive(doc, "usage");
        const cJSON *tot = cJSON_GetObjectItemCaseSensitive(usage, "total_tokens");
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
        ok = cJSON_IsNumber(tot) && tot->valuedouble == 13 && cJSON_IsString(model);
    }
    cJSON_Delete(doc);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s URL N INFLIGHT [--rss]\n", argv[0]);
        return 2;
    }
    const char *url = argv[1];
    long n = atol(argv[2]);
    int inflight = atoi(argv[3]);
    int rss = argc > 4 && strcmp(argv[4], "--rss") == 0;
    if (n < 1 || inflight < 1)
        return 2;
    if (inflight > n)
        inflight = (int)n;

    make_body();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    long rss_base = rss_kib();
    pthread_t samp;
    if (rss) {
        atomic_store(&rss_peak, rss_base);
        atomic_store(&sampling, 1);
        pthread_create(&samp, NULL, sampler, NULL);
    }

    double t0 = now_s(), c0 = cpu_s();
    CURLM *m = curl_multi_init();
    slot *slots = calloc((size_t)inflight, sizeof *slots);
    struct curl_slist **hdrs = calloc((size_t)inflight, sizeof *hdrs);
    long started = 0, done = 0, ok = 0;
    for (int i = 0; i < inflight; i++) {
        slot *s = &slots[i];
        struct curl_slist *h = NULL;
        char rid[80];
        /* Same length as a UUID v4, so the bytes on the wire match. */
        snprintf(rid, sizeof rid, "X-Client-Request-Id: 00000000-0000-4000-8000-%012d", i);
        h = curl_slist_append(h, "Authorization: Bearer sk-bench-not-a-real-key");
        h = curl_slist_append(h, "Content-Type: application/json");
        h = curl_slist_append(h, "Accept: application/json");
        h = curl_slist_append(h, "User-Agent: llmretry/0.1.0");
        h = curl_slist_append(h, rid);
        h = curl_slist_append(h, "Expect:");
        hdrs[i] = h;
        s->h = curl_easy_init();
        curl_easy_setopt(s->h, CURLOPT_URL, url);
        curl_easy_setopt(s->h, CURLOPT_POST, 1L);
        curl_easy_setopt(s->h, CURLOPT_POSTFIELDS, BODY);
        curl_easy_setopt(s->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)BODY_LEN);
        curl_easy_setopt(s->h, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
        curl_easy_setopt(s->h, CURLOPT_TIMEOUT_MS, 60000L);
        curl_easy_setopt(s->h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(s->h, CURLOPT_PRIVATE, s);
        curl_multi_add_handle(m, s->h);
        started++;
    }
    while (done < n) {
        int running = 0;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            slot *s = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            CURLcode rc = msg->data.result; /* msg is invalid after remove */
            ok += check_response(s, rc);
            done++;
            curl_multi_remove_handle(m, s->h);
            if (started < n) {
                s->len = 0;
                curl_multi_add_handle(m, s->h);
                started++;
            }
        }
        if (done < n)
            curl_multi_poll(m, NULL, 0, 1000, NULL);
    }
    double secs = now_s() - t0, cpu = cpu_s() - c0;
    if (rss) {
        atomic_store(&sampling, 0);
        pthread_join(samp, NULL);
    }

    printf("RESULT prog=%s n=%ld ok=%ld secs=%.4f rps=%.0f cpu_us=%.2f", rss ? "bare-rss" : "bare", n,
           ok, secs, n / secs, cpu / n * 1e6);
    if (rss) {
        long peak = atomic_load(&rss_peak);
        printf(" inflight=%d rss_base_kib=%ld rss_peak_kib=%ld kib_per_call=%.1f", inflight,
               rss_base, peak, (double)(peak - rss_base) / inflight);
    }
    printf("\n");

    for (int i = 0; i < inflight; i++) {
        curl_easy_cleanup(slots[i].h);
        curl_slist_free_all(hdrs[i]);
        free(slots[i].buf);
    }
    free(slots);
    free(hdrs);
    curl_multi_cleanup(m);
    curl_global_cleanup();
    return ok == n ? 0 : 1;
}
