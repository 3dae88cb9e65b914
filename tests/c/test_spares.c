/* spares.c: an engine keeps the call records and host exchanges its calls
 * freed, for the next calls, as many as it runs at once (max_in_flight,
 * 256 at the least and 4,096 at the most). A gateway's engine holds a
 * thousand calls and frees them in bursts: kept to 256, most of a burst's
 * records were freed and made again (issue 36). No server: a host engine's
 * attempts wait for their host, and the calls are cancelled. */
#include "harness.h"
#include "llmretry.h"
#include "engine.h"

#include <pthread.h>

static int kept(llmretry_engine *e, lr_spares *s)
{
    pthread_mutex_lock(&e->spare_mu);
    int n = s->n;
    pthread_mutex_unlock(&e->spare_mu);
    return n;
}

#define BODY "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}"
enum { N = 600 };

/* N calls at once, each with its attempt handed to the host, all cancelled
 * and freed: every record and every exchange is kept. Then N more take
 * them back. */
static void test_keeps_what_it_ran(void)
{
    llmretry_engine *e = th_host_engine_new(1000);
    if (!e)
        return;
    llmretry_options o;
    llmretry_options_defaults(&o);
    o.url = "http://127.0.0.1:9/v1/chat/completions";
    o.api_key = "sk-test-spares";
    o.use_env_api_key = 0;
    o.body = BODY;
    o.body_len = strlen(BODY);
    static llmretry_call *calls[N];
    for (int round = 0; round < 2; round++) {
        char err[LLMRETRY_ERRBUF] = "";
        int submitted = 0, exchanges = 0;
        for (int i = 0; i < N; i++)
            submitted += llmretry_engine_submit(e, &o, LLMRETRY_SUBMIT_POLL, &calls[i], err,
                                                sizeof err) == LLMRETRY_OK;
        CHECK_MSG(submitted == N, "%d of %d submitted: %s", submitted, N, err);
        if (submitted != N)
            break;
        if (round == 1) {
            CHECK_INT(kept(e, &e->spare_calls), 0);   /* all taken again */
        }
        int64_t next = 0;
        CHECK_INT(llmretry_engine_run(e, &next), LLMRETRY_OK);
        for (int i = 0; i < N; i++) {
            llmretry_exchange x;
            exchanges += llmretry_call_exchange(calls[i], &x);
        }
        CHECK_INT(exchanges, N);
        if (round == 1) {
            CHECK_INT(kept(e, &e->spare_xfers), 0);
        }
        for (int i = 0; i < N; i++)
            llmretry_call_cancel(calls[i]);
        CHECK_INT(llmretry_engine_run(e, &next), LLMRETRY_OK);
        for (int i = 0; i < N; i++) {
            llmretry_event *ev;
            llmretry_mail m;
            while ((m = llmretry_call_next(calls[i], &ev)) == LLMRETRY_MAIL_EVENT)
                llmretry_event_free(ev);
            CHECK_MSG(m == LLMRETRY_MAIL_DONE, "call %d did not end (mail %d)", i, (int)m);
            llmretry_call_free(calls[i]);
        }
        CHECK_INT(kept(e, &e->spare_calls), N);
        CHECK_INT(kept(e, &e->spare_xfers), N);
    }
    llmretry_engine_free(e);
}

/* How many are kept: max_in_flight, within 256 and 4,096. */
static void test_bounds(void)
{
    static const struct { int max_in_flight, cap; } cases[] = {
        { 1, 256 }, { 256, 256 }, { 1000, 1000 }, { 4096, 4096 }, { 100000, 4096 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        llmretry_engine *e = th_host_engine_new(cases[i].max_in_flight);
        if (!e)
            continue;
        CHECK_INT(lr_spares_cap(e), cases[i].cap);
        llmretry_engine_free(e);
    }
    CHECK_INT(lr_spares_cap(NULL), 256);
}

int main(void)
{
    static const th_case cases[] = {
        { "keeps_what_it_ran", test_keeps_what_it_ran },
        { "bounds", test_bounds },
    };
    TH_RUN(cases);
    return th_summary("test_spares");
}
