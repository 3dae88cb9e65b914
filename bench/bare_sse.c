/* The floor of the streaming benchmark (bench/run_stream.sh): a bare libcurl
 * loop reading the same SSE stream as the Python clients, with no policy.
 *
 * Each transfer POSTs a short chat request to URL (bench/sse_server.py:
 * its "model" names the stream the server sends; Authorization,
 * Content-Type, Accept: text/event-stream) and a write callback splits the body into
 * lines (memchr, the partial line kept across callbacks) and counts the
 * `data:` lines that are not `[DONE]`: what any SSE reader has to do at the
 * least. With `parse`, each payload is also parsed with cJSON and freed (the
 * engine parses every chunk too).
 *
 *   bare_sse cpu URL MODEL WARM_MODEL [parse]
 *       one warm-up transfer of WARM_MODEL, then MODEL on the same handle
 *       (the connection reused); CPU = getrusage(RUSAGE_SELF) over the second.
 *   bare_sse latency URL MODEL
 *       MODEL's chunks carry the server's CLOCK_MONOTONIC nanoseconds at the
 *       write in delta.content; the callback takes the clock when the
 *       buffer holding the line's end arrives: delay = receive - send.
 *   bare_sse rss URL MODEL RELEASE_URL STREAMS
 *       STREAMS transfers on one multi handle; VmRSS before the handles
 *       exist and once every transfer has delivered its first chunk (the
 *       server holds the rest); then RELEASE_URL is POSTed and every
 *       transfer is read to its end.
 *
 * Prints one line:  RESULT client=bare|bare-parse mode=.. key=value ...
 * and exits non-zero when a transfer failed or a count is off.
 */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* The request body for a model (the server's stream selector). */
static char *body_for(const char *model)
{
    static const char fmt[] = "{\"model\":\"%s\",\"stream\":true,\"stream_options\":"
                              "{\"include_usage\":true},\"messages\":[{\"role\":\"user\","
                              "\"content\":\"Say ok.\"}]}";
    char *b = NULL;
    if (asprintf(&b, fmt, model) < 0)
        exit(1);
    return b;
}

typedef struct reader {
    char *line;          /* the partial line carried across callbacks */
    size_t len, cap;
    long chunks;         /* data: lines, [DONE] excluded */
    int done;            /* saw data: [DONE] */
    int parse;           /* cJSON-parse each payload */
    int stamps;          /* latency mode: record receive - send */
    long long *delays;   /* ns, one per chunk carrying a stamp */
    size_t ndelays, capdelays;
    int oom;
} reader;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
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

/* One complete line (no line end). */
static void on_line(reader *r, const char *p, size_t n, long long t_recv)
{
    if (n && p[n - 1] == '\r')
        n--;
    if (n < 5 || memcmp(p, "data:", 5) != 0)
        return;
    p += 5;
    n -= 5;
    if (n && *p == ' ') {
        p++;
        n--;
    }
    if (n == 6 && memcmp(p, "[DONE]", 6) == 0) {
        r->done = 1;
        return;
    }
    r->chunks++;
    if (r->parse) {
        cJSON *j = cJSON_ParseWithLength(p, n);
        if (!j)
            r->oom = 1;
        cJSON_Delete(j);
    }
    if (r->stamps) {
        static const char key[] = "\"content\":\"";
        const char *k = memmem(p, n, key, sizeof key - 1);
        if (!k)
            return;
        /* The line is not NUL-terminated: parse a bounded copy of the digits. */
        const char *v = k + sizeof key - 1, *end = p + n;
        char digits[32];
        size_t nd = 0;
        while (v + nd < end && nd < sizeof digits - 1 && v[nd] >= '0' && v[nd] <= '9')
            nd++;
        memcpy(digits, v, nd);
        digits[nd] = '\0';
        long long sent = strtoll(digits, NULL, 10);
        if (sent <= 0)
            return;
        if (r->ndelays == r->capdelays) {
            size_t cap = r->capdelays ? r->capdelays * 2 : 1024;
            long long *d = realloc(r->delays, cap * sizeof *d);
            if (!d) {
                r->oom = 1;
                return;
            }
            r->delays = d;
            r->capdelays = cap;
        }
        r->delays[r->ndelays++] = t_recv - sent;
    }
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    reader *r = ud;
    size_t n = size * nmemb;
    long long t = r->stamps ? now_ns() : 0;
    const char *p = data, *end = data + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t take = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (nl && r->len == 0) {
            on_line(r, p, take, t);       /* whole line in this buffer: no copy */
        } else {
            if (r->len + take > r->cap) {
                size_t cap = (r->len + take) * 2 + 256;
                char *l = realloc(r->line, cap);
                if (!l)
                    return 0;
                r->line = l;
                r->cap = cap;
            }
            memcpy(r->line + r->len, p, take);
            r->len += take;
            if (nl) {
                on_line(r, r->line, r->len, t);
                r->len = 0;
            }
        }
        p += take + (nl ? 1 : 0);
    }
    return n;
}

static CURL *make_handle(const char *url, const char *body, struct curl_slist *hdrs, reader *r)
{
    CURL *h = curl_easy_init();
    if (!h)
        exit(1);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    return h;
}

static struct curl_slist *headers(void)
{
    struct curl_slist *h = NULL;
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: text/event-stream");
    h = curl_slist_append(h, "Authorization: Bearer sk-bench");
    h = curl_slist_append(h, "Expect:");
    return h;
}

static int check(CURL *h, CURLcode rc, const reader *r, const char *what)
{
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK || status != 200 || !r->done || r->oom) {
        fprintf(stderr, "bare_sse: %s failed: %s, status %ld, done %d, oom %d\n", what,
                curl_easy_strerror(rc), status, r->done, r->oom);
        return 0;
    }
    return 1;
}

static void reset(reader *r)
{
    r->len = 0;
    r->chunks = 0;
    r->done = 0;
    r->ndelays = 0;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static int mode_cpu(const char *url, const char *model, const char *warm, int parse)
{
    struct curl_slist *hdrs = headers();
    reader r = { .parse = parse };
    char *wbody = body_for(warm), *body = body_for(model);
    CURL *h = make_handle(url, wbody, hdrs, &r);
    if (!check(h, curl_easy_perform(h), &r, "warm-up"))
        return 1;
    reset(&r);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    double c0 = cpu_s(), t0 = now_s();
    CURLcode rc = curl_easy_perform(h);
    double secs = now_s() - t0, cpu = cpu_s() - c0;
    if (!check(h, rc, &r, "stream"))
        return 1;
    printf("RESULT client=%s mode=cpu chunks=%ld secs=%.6f cpu_s=%.6f cpu_us_per_chunk=%.4f\n",
           parse ? "bare-parse" : "bare", r.chunks, secs, cpu,
           r.chunks ? cpu * 1e6 / (double)r.chunks : 0.0);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    free(r.line);
    free(wbody);
    free(body);
    return 0;
}

static int mode_latency(const char *url, const char *model)
{
    struct curl_slist *hdrs = headers();
    reader r = { .stamps = 1 };
    char *body = body_for(model);
    CURL *h = make_handle(url, body, hdrs, &r);
    double c0 = cpu_s();
    CURLcode rc = curl_easy_perform(h);
    double cpu = cpu_s() - c0;
    if (!check(h, rc, &r, "stream") || r.ndelays == 0)
        return 1;
    qsort(r.delays, r.ndelays, sizeof *r.delays, cmp_ll);
    size_t n = r.ndelays;
    size_t i99 = (size_t)((double)(n - 1) * 0.99 + 0.5);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)r.delays[i];
    double med = n % 2 ? (double)r.delays[n / 2]
                       : ((double)r.delays[n / 2 - 1] + (double)r.delays[n / 2]) / 2;
    printf("RESULT client=bare mode=latency chunks=%ld stamped=%zu median_us=%.1f p99_us=%.1f "
           "mean_us=%.1f max_us=%.1f cpu_us_per_chunk=%.4f\n",
           r.chunks, n, med / 1e3, (double)r.delays[i99] / 1e3, sum / (double)n / 1e3,
           (double)r.delays[n - 1] / 1e3, cpu * 1e6 / (double)r.chunks);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    free(r.line);
    free(r.delays);
    free(body);
    return 0;
}

static int drive(CURLM *m, int *running)
{
    if (curl_multi_perform(m, running) != CURLM_OK)
        return 0;
    return curl_multi_poll(m, NULL, 0, 100, NULL) == CURLM_OK;
}

static int mode_rss(const char *url, const char *model, const char *release, int streams)
{
    struct curl_slist *hdrs = headers();
    char *body = body_for(model);
    long before = rss_kib();
    CURLM *m = curl_multi_init();
    reader *rs = calloc((size_t)streams, sizeof *rs);
    CURL **hs = calloc((size_t)streams, sizeof *hs);
    if (!m || !rs || !hs)
        return 1;
    for (int i = 0; i < streams; i++) {
        hs[i] = make_handle(url, body, hdrs, &rs[i]);
        curl_multi_add_handle(m, hs[i]);
    }
    int running = 1, have = 0;
    double t0 = now_s();
    while (have < streams && running) {
        if (!drive(m, &running))
            return 1;
        have = 0;
        for (int i = 0; i < streams; i++)
            have += rs[i].chunks > 0;
        if (now_s() - t0 > 60) {
            fprintf(stderr, "bare_sse: only %d of %d streams delivered a chunk in 60 s\n", have,
                    streams);
            return 1;
        }
    }
    double open_secs = now_s() - t0;
    long during = rss_kib();
    /* release the held streams, then read everything to its end */
    reader rr = { 0 };
    CURL *rel = make_handle(release, "{}", hdrs, &rr);
    curl_multi_add_handle(m, rel);
    while (running)
        if (!drive(m, &running))
            return 1;
    int ok = 0;
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)))
        if (msg->msg == CURLMSG_DONE && msg->easy_handle != rel) {
            for (int i = 0; i < streams; i++)
                if (hs[i] == msg->easy_handle)
                    ok += check(hs[i], msg->data.result, &rs[i], "held stream");
        }
    printf("RESULT client=bare mode=rss streams=%d ok=%d rss_before_kib=%ld rss_open_kib=%ld "
           "kib_per_stream=%.2f open_secs=%.3f\n",
           streams, ok, before, during, (double)(during - before) / streams, open_secs);
    for (int i = 0; i < streams; i++) {
        curl_multi_remove_handle(m, hs[i]);
        curl_easy_cleanup(hs[i]);
        free(rs[i].line);
    }
    curl_multi_remove_handle(m, rel);
    curl_easy_cleanup(rel);
    free(rr.line);
    curl_multi_cleanup(m);
    curl_slist_free_all(hdrs);
    free(hs);
    free(rs);
    free(body);
    return ok == streams ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return 1;
    int rc = -1;
    if (argc >= 5 && strcmp(argv[1], "cpu") == 0)
        rc = mode_cpu(argv[2], argv[3], argv[4], argc >= 6 && strcmp(argv[5], "parse") == 0);
    else if (argc == 4 && strcmp(argv[1], "latency") == 0)
        rc = mode_latency(argv[2], argv[3]);
    else if (argc == 6 && strcmp(argv[1], "rss") == 0 && atoi(argv[5]) > 0)
        rc = mode_rss(argv[2], argv[3], argv[4], atoi(argv[5]));
    if (rc >= 0) {
        fflush(stdout);
        curl_global_cleanup();
        return rc;
    }
    fprintf(stderr, "usage: bare_sse cpu URL MODEL WARM_MODEL [parse] | latency URL MODEL | "
                    "rss URL MODEL RELEASE_URL STREAMS\n");
    return 2;
}
