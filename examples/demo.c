/* A tour of the engine against the mock server: a clean call, a 429 with
 * Retry-After, a flaky 503, a non-retryable 400, and 20 calls in flight at
 * once. Every event is printed as one JSON line, as a logger would see it.
 *
 *   llmretry_demo http://127.0.0.1:PORT
 */
#include "llmretry.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static void print_event(const llmretry_event *ev, void *ud)
{
    (void)ud;
    char *line = llmretry_event_to_json(ev);
    printf("    %s\n", line ? line : "(event)");
    llmretry_free(line);
}

static void show(const char *title, const llmretry_call *c)
{
    const llmretry_result *r = llmretry_call_result(c);
    if (r->ok)
        printf("  => %s: ok after %d attempt(s), %lld ms, %lld tokens\n\n", title, r->attempts,
               (long long)r->total_ms, (long long)r->usage.total_tokens);
    else
        printf("  => %s: %s (%s): %s\n\n", title, llmretry_error_kind_name(r->kind),
               llmretry_reason_name(r->reason), r->message);
}

static int run(llmretry_engine *e, const char *root, const char *scenario, const char *title)
{
    char base[256];
    snprintf(base, sizeof base, "%s/s/%s/v1", root, scenario);
    static const char body[] =
        "{\"model\":\"demo-model\",\"messages\":[{\"role\":\"user\",\"content\":\"Say ok.\"}]}";
    llmretry_options o;
    llmretry_options_defaults(&o);
    o.base_url = base;
    o.api_key = "sk-demo-never-logged";
    o.body = body;
    o.body_len = strlen(body);
    o.base_delay_ms = 200;
    printf("%s\n", title);
    llmretry_call *c;
    char err[LLMRETRY_ERRBUF];
    if (llmretry_call_blocking(e, &o, print_event, NULL, &c, err, sizeof err) != LLMRETRY_OK) {
        fprintf(stderr, "demo: %s\n", err);
        return 1;
    }
    show(scenario, c);
    llmretry_call_free(c);
    return 0;
}

static int run_many(llmretry_engine *e, const char *root)
{
    enum { N = 20 };
    char base[256];
    snprintf(base, sizeof base, "%s/s/slow/v1", root);
    static const char body[] = "{\"model\":\"demo-model\",\"messages\":[]}";
    llmretry_options o;
    llmretry_options_defaults(&o);
    o.base_url = base;
    o.body = body;
    o.body_len = strlen(body);
    o.events = 0;
    llmretry_call *calls[N];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < N; i++)
        if (llmretry_engine_submit(e, &o, 0, &calls[i], NULL, 0) != LLMRETRY_OK)
            return 1;
    int ok = 0;
    for (int i = 0; i < N; i++) {
        llmretry_call_wait(calls[i], -1);
        while (!llmretry_call_result(calls[i]))
            llmretry_call_wait(calls[i], -1);
        ok += llmretry_call_result(calls[i])->ok;
        llmretry_call_free(calls[i]);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("20 calls of 300 ms each, all in flight at once: %d ok in %.0f ms (one engine thread)\n",
           ok, ms);
    return ok == N ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s http://127.0.0.1:PORT\n", argv[0]);
        return 2;
    }
    llmretry_engine *e;
    char err[LLMRETRY_ERRBUF];
    if (llmretry_engine_new(NULL, &e, err, sizeof err) != LLMRETRY_OK) {
        fprintf(stderr, "demo: %s\n", err);
        return 1;
    }
    int rc = 0;
    rc |= run(e, argv[1], "clean", "1. A clean call");
    rc |= run(e, argv[1], "rate_limited", "2. 429 with Retry-After: 0.5 -> waits as told, then ok");
    rc |= run(e, argv[1], "flaky", "3. Two 503s -> exponential backoff with jitter, then ok");
    rc |= run(e, argv[1], "bad_request", "4. A 400 is not retried");
    rc |= run_many(e, argv[1]);
    llmretry_engine_free(e);
    return rc;
}
