/* A tiny test harness shared by the C tests: checks that count, a closing
 * "N passed, N failed" line, and a launcher for the project's mock server
 * (python3 -m llmretry.testing) with helpers to script it over HTTP. */
#ifndef LLMRETRY_TEST_HARNESS_H
#define LLMRETRY_TEST_HARNESS_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

extern int th_passed;
extern int th_failed;

void th_fail(const char *file, int line, const char *fmt, ...);

#define CHECK(cond) do { if (cond) th_passed++; else \
    th_fail(__FILE__, __LINE__, "CHECK(%s)", #cond); } while (0)
#define CHECK_MSG(cond, ...) do { if (cond) th_passed++; else \
    th_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)
#define CHECK_INT(a, b) do { long long a_ = (long long)(a), b_ = (long long)(b); \
    if (a_ == b_) th_passed++; else \
    th_fail(__FILE__, __LINE__, "%s == %lld, expected %s == %lld", #a, a_, #b, b_); } while (0)
#define CHECK_STR(a, b) do { const char *a_ = (a), *b_ = (b); \
    if (a_ && b_ && strcmp(a_, b_) == 0) th_passed++; else \
    th_fail(__FILE__, __LINE__, "%s == \"%s\", expected \"%s\"", #a, a_ ? a_ : "(null)", b_ ? b_ : "(null)"); } while (0)

/* Print "<suite>: N passed, N failed" and return the process exit code. */
int th_summary(const char *suite);

/* Milliseconds on the monotonic clock. */
int64_t th_now_ms(void);

/* Sleep ms milliseconds (resumed when a signal interrupts it). Tests wait for
 * a condition with TH_EVENTUALLY; a bare sleep is for time that must pass
 * (a client's own timeout, cooldown or deadline) and says so. */
void th_sleep_ms(int64_t ms);

/* Poll cond every 2 ms until it holds or max_ms pass: 1 if it held. The
 * deadline is generous on purpose (a loaded machine is slow, not wrong). */
#define TH_EVENTUALLY(cond, max_ms) ({ int64_t th_until_ = th_now_ms() + (max_ms); \
    int th_ok_ = 0; \
    while (!(th_ok_ = !!(cond)) && th_now_ms() < th_until_) { th_sleep_ms(2); } \
    th_ok_; })

/* Read a whole file (malloc'd, NUL-terminated), NULL on error. */
char *th_read_file(const char *path, size_t *len);

/* The mock server, started as `python3 -m llmretry.testing --port 0` with
 * PYTHONPATH=<source>/python; it prints its port on its first line. */
typedef struct th_mock {
    pid_t pid;
    int port;
    char base_url[64];          /* http://127.0.0.1:PORT/v1 */
} th_mock;

int th_mock_start(th_mock *m);  /* 0 on success */
void th_mock_stop(th_mock *m);

/* base_url for scenario `name` (http://127.0.0.1:PORT/s/<name>/v1) into buf. */
const char *th_mock_scenario_url(const th_mock *m, const char *name, char *buf, size_t len);

/* PUT /_mock/scenarios/<name> with `scenario_json` ({"steps": [...], ...}).
 * 0 on success. Resets the scenario's cursor and its request records. */
int th_mock_script(th_mock *m, const char *name, const char *scenario_json);

/* PUT `json` to a control path (e.g. "/_mock/batches"); 0 on a 2xx, else a
 * counted failure. */
int th_mock_put(th_mock *m, const char *path, const char *json);

/* POST /_mock/clock/<name> {"advance_ms": ms}: the scenario's clock moves on
 * (a script with "clock": "manual" holds its step delays until then). 0 on
 * success, else a counted failure. */
int th_mock_advance_clock(th_mock *m, const char *name, int64_t ms);

/* GET /_mock/requests/<name>: the JSON array of recorded requests
 * (malloc'd text), NULL on error. */
char *th_mock_requests(th_mock *m, const char *name);

/* GET a control path (e.g. "/_mock/connections"); malloc'd body or NULL. */
char *th_mock_get(th_mock *m, const char *path);

/* A real redis-server (Debian's redis-server, installed by
 * tools/ensure-deps.sh) on a free loopback port, in a temporary directory,
 * saving nothing; with `password` it requires it. A missing redis-server
 * is a failure, not a skip. th_redis_kill stops it at once (SIGKILL, as a
 * crash would); th_redis_restart brings it back on the same port. */
typedef struct th_redis {
    pid_t pid;
    int port;
    char dir[64];
    char password[64];
    char url[160];              /* redis://[:password@]127.0.0.1:PORT/0 */
} th_redis;

int th_redis_start(th_redis *r, const char *password);  /* 0 on success */
void th_redis_kill(th_redis *r);
int th_redis_restart(th_redis *r);                       /* 0 on success */
void th_redis_stop(th_redis *r);

/* Run each case, printing "<name> ok|FAILED (N ms)" on stderr. */
typedef struct th_case {
    const char *name;
    void (*fn)(void);
} th_case;
void th_run_cases(const th_case *cases, size_t n);
#define TH_RUN(cases) th_run_cases((cases), sizeof (cases) / sizeof *(cases))

/* The engine-level tests' plumbing (a CHECK fails on any error): a default
 * engine; submit(e, o) with no flags; the call's result once its mailbox
 * said DONE (events dropped), or NULL after max_ms. */
struct llmretry_engine;
struct llmretry_call;
struct llmretry_options;
struct llmretry_result;
struct llmretry_engine *th_engine_new(void);
/* An engine whose host moves the bytes (io_loop host); max_in_flight 0:
 * the default. */
struct llmretry_engine *th_host_engine_new(int max_in_flight);
struct llmretry_call *th_submit(struct llmretry_engine *e, const struct llmretry_options *o);
const struct llmretry_result *th_wait_done(struct llmretry_call *c, int64_t max_ms);
/* The io_loop LLMRETRY_TEST_IO_LOOP asks every engine to run (the default
 * loop when unset), and llmretry_engine_new without that override. */
struct llmretry_engine_options;
int th_io_loop(void);
/* How many times the core called epoll_ctl (every test is linked with
 * -Wl,--wrap=epoll_ctl; libcurl's own calls are not counted). */
extern atomic_long th_epoll_ctls;
/* How many share handles the core made and freed (curl_share_init and
 * curl_share_cleanup, wrapped as epoll_ctl is): the engine's
 * connection-cache shards. */
extern atomic_long th_share_inits, th_share_cleanups;
int th_engine_new_as_asked(const struct llmretry_engine_options *opts,
                           struct llmretry_engine **out, char *err, size_t errlen);

#endif
