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
 * With LLMRETRY_BENCH_SHARDS=K in the environment, handles past the first K
 * get libcurl connection caches of their own, K handles to each (share
 * handles with CURL_LOCK_DATA_CONNECT), as the engine spreads its transfers
 * (core/src/conn_shards.c), and prog is bare-shards.
 * (cpu_us = user+sys CPU of the process over the timed run / N, in µs).
 * With --rss it also samples VmRSS (baseline before the handles exist, and
 * the peak during the run) and adds rss_base_kib, rss_peak_kib, kib_per_call.
 * The timed run includes creating the handles and connecting.
 *
 *   bare_multi --url BASE --concurrency C --requests N [--warmup W]
 *
 * The benchmark-suite client (bench/clients/README.md): POSTs the suite's
 * request to BASE/chat/completions, C in flight, W untimed warm-up requests
 * on the same handles (connections open) first, then N timed ones. A
 * response counts as ok when it is a 2xx whose choices[0].message.content
 * is a string. No retries: this is the ceiling of the stack, not a policy.
 * The last line of stdout is {"ok", "failed", "seconds", "cpu_seconds"}.
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
 * set, one whose user message is padded to that many bytes (a long prompt).
 * The suite's clients all send {"model":"bench-model",...,"Say hi"}. */
static char *BODY;
static size_t BODY_LEN;

static void make_body(int suite)
{
    const char *env = getenv("LLMRETRY_BENCH_BODY_BYTES");
    long pad = env && !suite ? atol(env) : 0;
    static const char head_core[] = "{\"model\":\"gpt-4.1-mini\",\"messages\":[{\"role\":\"user\","
                                    "\"content\":\"Say ok.";
    static const char head_suite[] = "{\"model\":\"bench-model\",\"messages\":[{\"role\":\"user\","
                                     "\"content\":\"Say hi";
    const char *head = suite ? head_suite : head_core;
    static const char tail[] = "\"}]}";
    if (pad < 0)
        pad = 0;
    size_t hlen = strlen(head);
    BODY = malloc(hlen + (size_t)pad + sizeof tail);
    if (!BODY)
        exit(1);
    memcpy(BODY, head, hlen);
    memset(BODY + hlen, 'x', (size_t)pad);
    memcpy(BODY + hlen + pad, tail, sizeof tail);
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

/* 1 when the response is a 2xx chat.completion we can read: the suite's
 * check is choices[0].message.content, the core bench's (strict) also the
 * canned answer's usage.total_tokens and model. */
static int SUITE;

static int check_response(slot *s, CURLcode rc)
{
    long status = 0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK || status < 200 || status >= 300)
        return 0;
    cJSON *doc = cJSON_ParseWithLength(s->buf ? s->buf : "", s->len);
    int ok = 0;
    if (doc && cJSON_IsObject(doc)) {
        if (SUITE) {
            const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "choices"), 0);
            const cJSON *msg = cJSON_GetObjectItemCaseSensitive(choice, "message");
            ok = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(msg, "content"));
        } else {
            const cJSON *usage = cJSON_GetObjectItemCaseSensitive(doc, "usage");
            const cJSON *tot = cJSON_GetObjectItemCaseSensitive(usage, "total_tokens");
            const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
            ok = cJSON_IsNumber(tot) && tot->valuedouble == 13 && cJSON_IsString(model);
        }
    }
    cJSON_Delete(doc);
    return ok;
}

/* LLMRETRY_BENCH_SHARDS: handles per connection cache, 0 = one cache. */
static int shard_size(void)
{
    const char *env = getenv("LLMRETRY_BENCH_SHARDS");
    return env ? atoi(env) : 0;
}

/* Handle i's connection cache: NULL (the multi's own) for the first K,
 * then a share handle per K. Made once, kept for the process. */
static CURLSH *share_for(int i)
{
    static CURLSH **shares;
    static int n;
    int k = shard_size();
    if (k <= 0 || i < k)
        return NULL;
    int s = i / k - 1;
    if (s >= n) {
        CURLSH **more = realloc(shares, (size_t)(s + 1) * sizeof *more);
        if (!more)
            exit(1);
        shares = more;
        while (n <= s) {
            shares[n] = curl_share_init();
            curl_share_setopt(shares[n], CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
            n++;
        }
    }
    return shares[s];
}

/* INFLIGHT easy handles, each with its own header list (a distinct request
 * id), set up for URL and ready to be added to the multi. */
static void make_slots(slot *slots, struct curl_slist **hdrs, int inflight, const char *url,
                       const char *auth)
{
    for (int i = 0; i < inflight; i++) {
        slot *s = &slots[i];
        struct curl_slist *h = NULL;
        char rid[80];
        /* Same length as a UUID v4, so the bytes on the wire match. */
        snprintf(rid, sizeof rid, "X-Client-Request-Id: 00000000-0000-4000-8000-%012d", i);
        h = curl_slist_append(h, auth);
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
        curl_easy_setopt(s->h, CURLOPT_SHARE, share_for(i));
    }
}

/* N requests, at most INFLIGHT at once, on the slots' handles (a finished
 * handle is removed and added again for the next request, as the engine
 * does; the multi keeps its connections between runs). Returns the ok ones. */
static long run_requests(CURLM *m, slot *slots, int inflight, long n)
{
    long started = 0, done = 0, ok = 0;
    for (int i = 0; i < inflight && started < n; i++) {
        slots[i].len = 0;
        curl_multi_add_handle(m, slots[i].h);
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
    return ok;
}

static void free_slots(slot *slots, struct curl_slist **hdrs, int inflight)
{
    for (int i = 0; i < inflight; i++) {
        curl_easy_cleanup(slots[i].h);
        curl_slist_free_all(hdrs[i]);
        free(slots[i].buf);
    }
    free(slots);
    free(hdrs);
}

/* 1,024 connections do not fit under the usual soft limit of 1,024 files. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* bare_multi --url BASE --concurrency C --requests N [--warmup W] */
static int suite_main(int argc, char **argv)
{
    const char *base = NULL;
    long n = 0, warmup = 0, conc = 0;
    int bad = argc % 2 == 0; /* flags come in pairs */
    for (int i = 1; !bad && i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--url") == 0)
            base = argv[i + 1];
        else if (strcmp(argv[i], "--concurrency") == 0)
            conc = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--requests") == 0)
            n = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--warmup") == 0)
            warmup = atol(argv[i + 1]);
        else
            bad = 1;
    }
    if (bad || !base || conc < 1 || n < 1 || warmup < 0 || conc > 1000000) {
        fprintf(stderr, "usage: %s --url BASE --concurrency C --requests N [--warmup W]\n",
                argv[0]);
        return 2;
    }
    char *url = malloc(strlen(base) + sizeof "/chat/completions");
    if (!url)
        return 2;
    strcpy(url, base);
    size_t ul = strlen(url);
    while (ul > 0 && url[ul - 1] == '/')
        url[--ul] = '\0';
    strcat(url, "/chat/completions");

    SUITE = 1;
    make_body(1);
    raise_nofile();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int inflight = (int)conc;
    CURLM *m = curl_multi_init();
    /* Keep a connection per slot whatever the moment's handle count (the
     * default cache is 4x the handles added at the time). */
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)(inflight > 16 ? inflight : 16));
    slot *slots = calloc((size_t)inflight, sizeof *slots);
    struct curl_slist **hdrs = calloc((size_t)inflight, sizeof *hdrs);
    if (!m || !slots || !hdrs)
        return 2;
    make_slots(slots, hdrs, inflight, url, "Authorization: Bearer bench-key");

    if (warmup > 0) {
        long wok = run_requests(m, slots, inflight, warmup);
        if (wok < warmup)
            fprintf(stderr, "bare_multi: %ld of %ld warm-up requests failed\n", warmup - wok,
                    warmup);
    }
    double t0 = now_s(), c0 = cpu_s();
    long ok = run_requests(m, slots, inflight, n);
    double secs = now_s() - t0, cpu = cpu_s() - c0;
    if (ok < n)
        fprintf(stderr, "bare_multi: %ld of %ld requests failed\n", n - ok, n);
    printf("{\"ok\": %ld, \"failed\": %ld, \"seconds\": %.6f, \"cpu_seconds\": %.6f}\n", ok,
           n - ok, secs, cpu);
    fflush(stdout);

    free_slots(slots, hdrs, inflight);
    curl_multi_cleanup(m);
    curl_global_cleanup();
    free(url);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strncmp(argv[1], "--", 2) == 0)
        return suite_main(argc, argv);
    if (argc < 4) {
        fprintf(stderr, "usage: %s URL N INFLIGHT [--rss]\n"
                        "       %s --url BASE --concurrency C --requests N [--warmup W]\n",
                argv[0], argv[0]);
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

    make_body(0);
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
    make_slots(slots, hdrs, inflight, url, "Authorization: Bearer sk-bench-not-a-real-key");
    long ok = run_requests(m, slots, inflight, n);
    double secs = now_s() - t0, cpu = cpu_s() - c0;
    if (rss) {
        atomic_store(&sampling, 0);
        pthread_join(samp, NULL);
    }

    printf("RESULT prog=%s n=%ld ok=%ld secs=%.4f rps=%.0f cpu_us=%.2f", rss ? "bare-rss" : shard_size() > 0 ? "bare-shards" : "bare", n,
           ok, secs, n / secs, cpu / n * 1e6);
    if (rss) {
        long peak = atomic_load(&rss_peak);
        printf(" inflight=%d rss_base_kib=%ld rss_peak_kib=%ld kib_per_call=%.1f", inflight,
               rss_base, peak, (double)(peak - rss_base) / inflight);
    }
    printf("\n");

    free_slots(slots, hdrs, inflight);
    curl_multi_cleanup(m);
    curl_global_cleanup();
    return ok == n ? 0 : 1;
}
