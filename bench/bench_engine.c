/* Throughput and memory of the llmretry engine, with the full policy:
 * default call options (retries on, timeout, a UUID request id per call,
 * events ON and drained into a no-op sink on the waiting thread, the
 * response parsed by the engine).
 *
 *   bench_engine poll    URL N INFLIGHT
 *       INFLIGHT calls submitted with LLMRETRY_SUBMIT_POLL; one host thread
 *       waits on the engine's channel (llmretry_channel_wait + _poll), drains each
 *       returned call's mailbox, frees each finished call and submits the
 *       next until N are done.
 *   bench_engine threads URL N THREADS
 *       THREADS host threads each run llmretry_call_blocking in a loop.
 *   bench_engine rss     URL INFLIGHT ROUNDS
 *       VmRSS before the first submit, then ROUNDS rounds of INFLIGHT calls
 *       submitted at once (poll mode) against a slow endpoint, VmRSS sampled
 *       every millisecond while they are in flight.
 *
 * Prints one line:  RESULT prog=engine-poll n=.. ok=.. secs=.. rps=.. cpu_us=..
 * (cpu_us = user+sys CPU of the whole process, engine thread included, over
 * the timed run / N, in µs). Exit status 1 if any call did not succeed.
 */
#define _GNU_SOURCE
#include "llmretry.h"

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

/* CPU time of the calling thread alone (the host thread in poll mode). */
static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
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

/* The no-op event sink: what a host logger that drops everything costs. */
static atomic_ulong n_events;
static void sink(const llmretry_event *ev, void *ud)
{
    (void)ud;
    (void)llmretry_event_type_of(ev);
    atomic_fetch_add_explicit(&n_events, 1, memory_order_relaxed);
}

static void call_options(llmretry_options *o, const char *url)
{
    llmretry_options_defaults(o);  /* retries, timeout, request ids, events */
    o->url = url;
    o->api_key = "sk-bench-not-a-real-key";
    o->body = BODY;
    o->body_len = BODY_LEN;
}

static int result_ok(const llmretry_call *c)
{
    const llmretry_result *r = llmretry_call_result(c);
    if (!r || !r->ok || r->status != 200 || r->usage.total_tokens != 13) {
        static atomic_int reported;
        if (r && atomic_fetch_add(&reported, 1) < 5)
            fprintf(stderr, "bench_engine: call %s failed: %s (status %d)\n", r->request_id,
                    r->message ? r->message : "?", r->status);
        return 0;
    }
    return 1;
}

static llmretry_engine *new_engine(int max_in_flight)
{
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    if (max_in_flight > eo.max_in_flight)
        eo.max_in_flight = max_in_flight;
    llmretry_engine *e;
    char err[LLMRETRY_ERRBUF];
    if (llmretry_engine_new(&eo, &e, err, sizeof err) != LLMRETRY_OK) {
        fprintf(stderr, "bench_engine: %s\n", err);
        exit(1);
    }
    return e;
}

static llmretry_call *submit(llmretry_engine *e, const llmretry_options *o)
{
    llmretry_call *c;
    char err[LLMRETRY_ERRBUF];
    if (llmretry_engine_submit(e, o, LLMRETRY_SUBMIT_POLL, &c, err, sizeof err) != LLMRETRY_OK) {
        fprintf(stderr, "bench_engine: submit: %s\n", err);
        exit(1);
    }
    return c;
}

/* ---- poll mode: one host thread keeps `window` calls in flight ---------- */

typedef struct poll_stats {
    long ok, done;
    long max_started_open;         /* most calls seen started and not done */
} poll_stats;

static void drive_poll(llmretry_engine *e, const llmretry_options *o, long n, int window,
                       poll_stats *st)
{
    long submitted = 0, started_open = 0;
    memset(st, 0, sizeof *st);
    for (; submitted < window && submitted < n; submitted++)
        submit(e, o);
    llmretry_call *ready[1024];
    while (st->done < n) {
        if (llmretry_channel_wait(llmretry_engine_channel(e), 5000) != LLMRETRY_OK) {
            fprintf(stderr, "bench_engine: no news for 5 s (%ld of %ld done)\n", st->done, n);
            exit(3);
        }
        size_t k = llmretry_channel_poll(llmretry_engine_channel(e), ready,
                                         sizeof ready / sizeof *ready);
        for (size_t i = 0; i < k; i++) {
            llmretry_call *c = ready[i];
            for (;;) {
                llmretry_event *ev;
                llmretry_mail m = llmretry_call_next(c, &ev);
                if (m == LLMRETRY_MAIL_EVENT) {
                    if (llmretry_event_type_of(ev) == LLMRETRY_EV_REQUEST_STARTED &&
                        ++started_open > st->max_started_open)
                        st->max_started_open = started_open;
                    sink(ev, NULL);
                    llmretry_event_free(ev);
                } else if (m == LLMRETRY_MAIL_DONE) {
                    started_open--;
                    st->ok += result_ok(c);
                    st->done++;
                    llmretry_call_free(c);
                    if (submitted < n) {
                        submit(e, o);
                        submitted++;
                    }
                    break;
                } else {
                    break;          /* EMPTY (VALIDATE cannot happen) */
                }
            }
        }
    }
}

static int run_poll(const char *url, long n, int window)
{
    llmretry_engine *e = new_engine(window);
    llmretry_options o;
    call_options(&o, url);
    poll_stats st;
    double t0 = now_s(), c0 = cpu_s(), h0 = thread_cpu_s();
    drive_poll(e, &o, n, window, &st);
    double secs = now_s() - t0, cpu = cpu_s() - c0, host = thread_cpu_s() - h0;
    /* host_cpu_us: the host thread's share; the rest is the engine thread. */
    printf("RESULT prog=engine-poll n=%ld ok=%ld secs=%.4f rps=%.0f cpu_us=%.2f host_cpu_us=%.2f "
           "events=%lu\n",
           n, st.ok, secs, n / secs, cpu / n * 1e6, host / n * 1e6, atomic_load(&n_events));
    llmretry_engine_free(e);
    return st.ok == n ? 0 : 1;
}

/* ---- threads mode: host threads each block on one call at a time -------- */

typedef struct thread_arg {
    llmretry_engine *e;
    const char *url;
    long n;
} thread_arg;

static atomic_long issued, thread_ok, thread_done;

static void *worker(void *p)
{
    thread_arg *a = p;
    llmretry_options o;
    call_options(&o, a->url);
    while (atomic_fetch_add(&issued, 1) < a->n) {
        llmretry_call *c;
        char err[LLMRETRY_ERRBUF];
        if (llmretry_call_blocking(a->e, &o, sink, NULL, &c, err, sizeof err) != LLMRETRY_OK) {
            fprintf(stderr, "bench_engine: call_blocking: %s\n", err);
            exit(1);
        }
        atomic_fetch_add(&thread_ok, result_ok(c));
        atomic_fetch_add(&thread_done, 1);
        llmretry_call_free(c);
    }
    return NULL;
}

static int run_threads(const char *url, long n, int nthreads)
{
    llmretry_engine *e = new_engine(nthreads);
    thread_arg a = { e, url, n };
    pthread_t *t = calloc((size_t)nthreads, sizeof *t);
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&t[i], NULL, worker, &a) != 0) {
            fprintf(stderr, "bench_engine: pthread_create failed\n");
            return 1;
        }
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    double secs = now_s() - t0, cpu = cpu_s() - c0;
    long ok = atomic_load(&thread_ok);
    printf("RESULT prog=engine-threads n=%ld ok=%ld secs=%.4f rps=%.0f cpu_us=%.2f events=%lu\n",
           n, ok, secs, n / secs, cpu / n * 1e6, atomic_load(&n_events));
    free(t);
    llmretry_engine_free(e);
    return ok == n && atomic_load(&thread_done) == n ? 0 : 1;
}

/* ---- rss mode: memory per call in flight -------------------------------- */

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

static int run_rss(const char *url, int inflight, int rounds)
{
    /* The engine, its thread and libcurl exist before the baseline: what is
     * measured is what calls in flight add, connections included. */
    llmretry_engine *e = new_engine(inflight + 24);
    llmretry_options o;
    call_options(&o, url);
    long base = rss_kib();
    atomic_store(&rss_peak, base);
    atomic_store(&sampling, 1);
    pthread_t samp;
    pthread_create(&samp, NULL, sampler, NULL);
    int rc = 0;
    long first_peak = 0, last_peak = 0, last_before = 0, last_after = 0;
    double last_secs = 0;
    long min_open = -1;            /* least, over rounds, of the most calls seen in flight */
    for (int r = 0; r < rounds; r++) {
        long before = rss_kib();
        atomic_store(&rss_peak, before);
        poll_stats st;
        double t0 = now_s();
        drive_poll(e, &o, inflight, inflight, &st);
        double secs = now_s() - t0;
        long peak = atomic_load(&rss_peak), after = rss_kib();
        fprintf(stderr, "  rss round %d: before %ld KiB, peak %ld KiB, after %ld KiB, "
                        "%ld/%d ok, max started-not-done %ld, %.0f ms\n",
                r + 1, before, peak, after, st.ok, inflight, st.max_started_open, secs * 1e3);
        if (st.ok != inflight)
            rc = 1;
        if (min_open < 0 || st.max_started_open < min_open)
            min_open = st.max_started_open;
        if (r == 0)
            first_peak = peak;
        if (peak > last_peak)
            last_peak = peak;
        last_before = before;
        last_after = after;
        last_secs = secs;
    }
    atomic_store(&sampling, 0);
    pthread_join(samp, NULL);
    long peak = last_peak > first_peak ? last_peak : first_peak;
    printf("RESULT prog=engine-rss inflight=%d rounds=%d inflight_reached=%ld rss_base_kib=%ld "
           "rss_peak_kib=%ld kib_per_call=%.1f last_round_before_kib=%ld last_round_after_kib=%ld "
           "last_round_ms=%.0f\n",
           inflight, rounds, min_open, base, peak, (double)(peak - base) / inflight, last_before,
           last_after, last_secs * 1e3);
    llmretry_engine_free(e);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr,
                "usage: %s poll URL N INFLIGHT | threads URL N THREADS | rss URL INFLIGHT ROUNDS\n",
                argv[0]);
        return 2;
    }
    make_body();
    const char *mode = argv[1], *url = argv[2];
    long a = atol(argv[3]);
    int b = atoi(argv[4]);
    if (a < 1 || b < 1)
        return 2;
    if (strcmp(mode, "poll") == 0)
        return run_poll(url, a, b);
    if (strcmp(mode, "threads") == 0)
        return run_threads(url, a, b);
    if (strcmp(mode, "rss") == 0)
        return run_rss(url, (int)a, b);
    fprintf(stderr, "bench_engine: unknown mode %s\n", mode);
    return 2;
}
