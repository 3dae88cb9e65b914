/* A name whose DNS never answers must not stall the engine (issue 13,
 * item 1). Runs under the slow_dns.so LD_PRELOAD shim (see CMakeLists):
 * getaddrinfo("never.invalid") sleeps 3 s. With libcurl's threaded
 * resolver, ending a transfer that is still resolving joins the resolver
 * thread unless CURLOPT_QUICK_EXIT is set, so a 300 ms attempt would end
 * after 3 s and every other call, cancel and the engine's shutdown would
 * wait with it. */
#include "harness.h"
#include "llmretry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static th_mock mock;
static int (*resolving)(void);  /* the shim's count of lookups under way */

/* Threads of this process (/proc/self/task), -1 if unreadable. */
static int threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Wait until one more lookup of the stuck name than `before` is under way. */
static void until_resolving(int before)
{
    CHECK_MSG(TH_EVENTUALLY(resolving() > before, 10000), "the lookup never started");
}

static void base_opts(llmretry_options *o, const char *base_url)
{
    llmretry_options_defaults(o);
    o->base_url = base_url;
    o->api_key = "sk-test";
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->max_retries = 0;
}

static llmretry_call *submit(llmretry_engine *e, const llmretry_options *o)
{
    llmretry_call *c = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = llmretry_engine_submit(e, o, 0, &c, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_OK && c, "submit: %s (%s)", llmretry_status_name(st), err);
    return st == LLMRETRY_OK ? c : NULL;
}

/* Drain the mailbox until DONE; the ms it took from `t0`, -1 on timeout. */
static int64_t wait_done(llmretry_call *c, int64_t t0, int64_t timeout_ms)
{
    int64_t end = th_now_ms() + timeout_ms;
    for (;;) {
        llmretry_event *ev = NULL;
        llmretry_mail m = llmretry_call_next(c, &ev);
        if (m == LLMRETRY_MAIL_DONE)
            return th_now_ms() - t0;
        if (m == LLMRETRY_MAIL_EVENT) {
            llmretry_event_free(ev);
            continue;
        }
        int64_t left = end - th_now_ms();
        if (left <= 0)
            return -1;
        llmretry_call_wait(c, left);
    }
}

static void test_stuck_dns(void)
{
    char url[160];
    llmretry_engine *e = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK(llmretry_engine_new(NULL, &e, err, sizeof err) == LLMRETRY_OK);
    if (!e)
        return;
    llmretry_options stuck, loop;
    base_opts(&stuck, "http://never.invalid:9/v1");
    stuck.timeout_ms = 300;
    th_mock_script(&mock, "dns_ok", "{\"steps\": []}");
    base_opts(&loop, th_mock_scenario_url(&mock, "dns_ok", url, sizeof url));
    loop.timeout_ms = 5000;

    int64_t t0 = th_now_ms();
    llmretry_call *a = submit(e, &stuck);
    /* Let the 300 ms attempt time out while its name is still resolving:
     * the I/O thread must not be stuck in that resolver's join now. */
    int64_t a_ms = a && TH_EVENTUALLY(llmretry_call_result(a), 10000) ? th_now_ms() - t0 : -1;
    CHECK_MSG(resolving() == 1, "the stuck lookup ended before the attempt (%d)", resolving());
    int64_t t1 = th_now_ms();
    llmretry_call *b = submit(e, &loop);
    int64_t b_ms = b ? wait_done(b, t1, 10000) : -1;
    if (a)
        wait_done(a, t0, 10000);
    CHECK_MSG(a_ms >= 0 && a_ms < 1000, "the 300 ms attempt to a stuck name took %lld ms",
              (long long)a_ms);
    CHECK_MSG(b_ms >= 0 && b_ms < 1000, "a loopback call beside it took %lld ms", (long long)b_ms);
    const llmretry_result *ra = a ? llmretry_call_result(a) : NULL;
    CHECK(ra && !ra->ok && ra->kind == LLMRETRY_ERR_TIMEOUT);
    const llmretry_result *rb = b ? llmretry_call_result(b) : NULL;
    CHECK(rb && rb->ok);
    llmretry_call_free(a);
    llmretry_call_free(b);

    /* A cancel and the engine's shutdown while a name is resolving. */
    stuck.timeout_ms = 5000;
    int before = resolving();
    llmretry_call *c = submit(e, &stuck);
    until_resolving(before);
    int64_t t2 = th_now_ms();
    if (c) {
        llmretry_call_cancel(c);
        int64_t c_ms = wait_done(c, t2, 10000);
        CHECK_MSG(c_ms >= 0 && c_ms < 1000, "cancel of a resolving call took %lld ms",
                  (long long)c_ms);
    }
    before = resolving();
    llmretry_call *d = submit(e, &stuck);
    until_resolving(before);
    int64_t t3 = th_now_ms();
    llmretry_engine_free(e);
    int64_t free_ms = th_now_ms() - t3;
    CHECK_MSG(free_ms < 1000, "engine free with a resolving call took %lld ms",
              (long long)free_ms);
    llmretry_call_free(c);
    llmretry_call_free(d);
}

int main(void)
{
    int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "slow_dns_active");
    resolving = (int (*)(void))dlsym(RTLD_DEFAULT, "slow_dns_resolving");
    if (!active || !resolving) {
        CHECK_MSG(0, "slow_dns.so is not preloaded (run through ctest)");
        return th_summary("test_dns");
    }
    /* The mock server (python) need not carry the shim. */
    unsetenv("LD_PRELOAD");
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_dns");
    }
    test_stuck_dns();
    th_mock_stop(&mock);
    /* Detached resolver threads end when their getaddrinfo returns; wait
     * for them (the engine's own threads are joined), so the leak checker
     * sees them finished. */
    CHECK_MSG(TH_EVENTUALLY(resolving() == 0 && threads() == 1, active() + 10000),
              "resolver threads left: %d lookups, %d threads", resolving(), threads());
    return th_summary("test_dns");
}
