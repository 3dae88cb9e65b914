/* Fork safety (issue 13 item 7): in a child forked while the engine works,
 * every entry point returns at once without touching the parent's engine,
 * calls, groups or channels: no lock the parent's I/O thread may have held
 * at the fork is taken (a stress loop under alarm()), and the child never
 * consumes the parent's news. */
#include "harness.h"
#include "llmretry.h"

#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[]}"

static th_mock mock;

static void opts_for(llmretry_options *o, const char *name, char *url, size_t len)
{
    llmretry_options_defaults(o);
    o->base_url = th_mock_scenario_url(&mock, name, url, len);
    o->api_key = "sk-test";
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->base_delay_ms = 5;
    o->jitter = LLMRETRY_JITTER_NONE;
}

/* Run `child` in a fork with a 5 s alarm; its exit code (128+sig if killed). */
static int in_child(int (*child)(void *), void *arg)
{
    pid_t pid = fork();
    if (pid == 0) {
        alarm(5);
        _exit(child(arg));
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

typedef struct world {
    llmretry_engine *e;
    llmretry_call **calls;
    int n;
    llmretry_group *g;
    llmretry_channel *ch;
} world;

static int child_touches_everything(void *arg)
{
    world *w = arg;
    if (!llmretry_engine_forked(w->e))
        return 10;
    llmretry_call *got[64];
    if (llmretry_channel_poll(llmretry_engine_channel(w->e), got, 64) != 0)
        return 11;              /* the parent's news are the parent's */
    if (llmretry_channel_poll(w->ch, got, 64) != 0 ||
        llmretry_channel_poll(llmretry_group_channel(w->g), got, 64) != 0)
        return 12;
    llmretry_options o;
    char url[128], err[LLMRETRY_ERRBUF];
    opts_for(&o, "fork", url, sizeof url);
    llmretry_call *c = NULL;
    if (llmretry_engine_submit(w->e, &o, 0, &c, err, sizeof err) != LLMRETRY_ESTATE)
        return 13;
    for (int i = 0; i < w->n; i++) {
        llmretry_event *ev;
        if (llmretry_call_next(w->calls[i], &ev) != LLMRETRY_MAIL_EMPTY)
            return 14;
        if (llmretry_call_wait(w->calls[i], -1) != LLMRETRY_ESTATE)
            return 15;
        llmretry_call_cancel(w->calls[i]);
        llmretry_call_free(w->calls[i]);
    }
    llmretry_group_stats st;
    llmretry_group_stats_get(w->g, &st);
    llmretry_group_free(w->g);
    llmretry_channel_free(w->ch);
    llmretry_engine_free(w->e);
    return 0;
}

static int child_sees_fork(void *arg)
{
    return llmretry_engine_forked(arg) ? 0 : 10;
}

static void test_fork_while_busy(void)
{
    char url[128], err[LLMRETRY_ERRBUF];
    world w = { 0 };
    llmretry_call *calls[48];
    w.calls = calls;
    if (llmretry_engine_new(NULL, &w.e, err, sizeof err) != LLMRETRY_OK ||
        llmretry_group_new(w.e, NULL, &w.g, err, sizeof err) != LLMRETRY_OK ||
        llmretry_channel_new(w.e, &w.ch, err, sizeof err) != LLMRETRY_OK ||
        th_mock_script(&mock, "fork", "{\"steps\": [], \"after\": {\"delay_ms\": 20}}") != 0) {
        CHECK_MSG(0, "setup: %s", err);
        return;
    }
    llmretry_options o;
    opts_for(&o, "fork", url, sizeof url);
    for (int i = 0; i < 48; i++) {
        o.group = i % 3 == 1 ? w.g : NULL;
        o.channel = i % 3 == 2 ? w.ch : NULL;
        CHECK_INT(llmretry_engine_submit(w.e, &o, LLMRETRY_SUBMIT_POLL, &calls[i], err, sizeof err),
                  LLMRETRY_OK);
        w.n = i + 1;
    }
    /* News waiting on the engine's channel: a child must not take it. */
    CHECK_INT(llmretry_channel_wait(llmretry_engine_channel(w.e), 5000), LLMRETRY_OK);
    int bad = 0, first_code = 0;
    for (int k = 0; k < 40; k++) {
        int code = in_child(child_touches_everything, &w);
        if (code != 0 && !bad++)
            first_code = code;
    }
    CHECK_MSG(bad == 0, "%d of 40 children failed (first exit code %d: 10+ = a check, 142 = hung)",
              bad, first_code);
    /* The parent's calls are untouched by all that. */
    for (int i = 0; i < w.n; i++) {
        while (llmretry_call_result(calls[i]) == NULL)
            llmretry_call_wait(calls[i], 100);
        llmretry_event *ev;
        while (llmretry_call_next(calls[i], &ev) == LLMRETRY_MAIL_EVENT)
            llmretry_event_free(ev);
        CHECK_MSG(llmretry_call_result(calls[i])->ok, "parent's call %d failed", i);
        llmretry_call_free(calls[i]);
    }
    llmretry_group_free(w.g);
    llmretry_channel_free(w.ch);
    llmretry_engine_free(w.e);
}

/* getpid() counted: this definition takes the place of libc's for the
 * whole program (the core is linked in statically). */
static atomic_long getpid_calls;

pid_t getpid(void)
{
    atomic_fetch_add(&getpid_calls, 1);
    return (pid_t)syscall(SYS_getpid);
}

/* getentropy() counted too (the definition in libc does the same call). */
static atomic_long getentropy_calls;

int getentropy(void *buf, size_t len)
{
    atomic_fetch_add(&getentropy_calls, 1);
    return syscall(SYS_getrandom, buf, len, 0) == (long)len ? 0 : -1;
}

/* Request ids take their random bytes from the kernel 256 at a time (issue
 * 36: a getrandom per call), and a fork's child never repeats the
 * parent's: it drops the bytes it inherited. */
static void test_ids_batched_and_fork_safe(void)
{
    char id[37], prev[37] = "";
    long before = atomic_load(&getentropy_calls);
    for (int i = 0; i < 200; i++) {
        CHECK_INT(llmretry_uuid4(id), LLMRETRY_OK);
        CHECK_MSG(strcmp(id, prev) != 0, "the same id twice: %s", id);
        memcpy(prev, id, sizeof id);
    }
    /* 200 ids of 16 bytes are 3,200 bytes: 12 batches of 256 at the least
     * (one may be left over from earlier ids), 14 at the most. None seen is
     * not batching but a source this count does not see: a failure too. */
    long made = atomic_load(&getentropy_calls) - before;
    CHECK_MSG(made >= 12 && made <= 14, "%ld getentropy() calls for 200 ids", made);
    /* Three forks, an id apart: at most one finds the pool used up. */
    for (int k = 0; k < 3; k++) {
        int fds[2];
        CHECK_INT(pipe(fds), 0);
        pid_t pid = fork();
        if (pid == 0) {
            char mine[37];
            int ok = llmretry_uuid4(mine) == LLMRETRY_OK &&
                     write(fds[1], mine, sizeof mine) == (ssize_t)sizeof mine;
            _exit(ok ? 0 : 1);
        }
        char child[37] = "", parent[37];
        CHECK_INT(llmretry_uuid4(parent), LLMRETRY_OK);
        CHECK_INT((int)read(fds[0], child, sizeof child), (int)sizeof child);
        int st = 0;
        waitpid(pid, &st, 0);
        close(fds[0]);
        close(fds[1]);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed");
        CHECK_MSG(strcmp(child, parent) != 0, "parent and child made the same id %s", parent);
    }
}

/* The counter sees the core's calls, not only this file's: accepting a
 * socket channel's connection asks getpid() (SO_PEERCRED's pid against
 * this process's), so it must count at least one. Without this, a build
 * whose core reached libc's getpid() by another way would pass the
 * "no more than a handful" check below with none counted. */
static int core_getpid_is_counted(llmretry_engine *e)
{
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_channel *ch = NULL;
    if (llmretry_channel_new_socket(e, &ch, err, sizeof err) != LLMRETRY_OK) {
        CHECK_MSG(0, "socket channel: %s", err);
        return 0;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", llmretry_channel_socket_path(ch));
    long before = atomic_load(&getpid_calls);
    int accepted = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
                   llmretry_channel_accept(ch, 1000, err, sizeof err) == LLMRETRY_OK;
    CHECK_MSG(accepted, "accept: %s", err);
    long counted = atomic_load(&getpid_calls) - before;
    if (fd >= 0)
        close(fd);
    llmretry_channel_free(ch);
    return accepted && counted >= 1;
}

/* Checking for a fork costs no system call per call (issue 36): a batch
 * checks several times per item, and getpid() was the calling thread's
 * most frequent system call. 200 calls through a group, as call_many
 * makes them, with a handful of getpid()s at most (none from the core). */
static void test_fork_check_costs_no_syscall(void)
{
    char url[128], err[LLMRETRY_ERRBUF];
    llmretry_engine *e = NULL;
    llmretry_group *g = NULL;
    if (llmretry_engine_new(NULL, &e, err, sizeof err) != LLMRETRY_OK ||
        llmretry_group_new(e, NULL, &g, err, sizeof err) != LLMRETRY_OK ||
        th_mock_script(&mock, "nofork", "{\"steps\": []}") != 0) {
        CHECK_MSG(0, "setup: %s", err);
        return;
    }
    enum { N = 200 };
    llmretry_call *calls[N];
    llmretry_options o;
    opts_for(&o, "nofork", url, sizeof url);
    o.group = g;
    long before = atomic_load(&getpid_calls);
    for (int i = 0; i < N; i++)
        CHECK_INT(llmretry_engine_submit(e, &o, 0, &calls[i], err, sizeof err), LLMRETRY_OK);
    int done = 0, ok = 0;
    while (done < N) {
        llmretry_call *got[64];
        size_t k = llmretry_channel_poll(llmretry_group_channel(g), got, 64);
        if (k == 0) {
            llmretry_channel_wait(llmretry_group_channel(g), 1000);
            continue;
        }
        for (size_t j = 0; j < k; j++) {
            llmretry_event *ev;
            llmretry_mail m;
            while ((m = llmretry_call_next(got[j], &ev)) == LLMRETRY_MAIL_EVENT ||
                   m == LLMRETRY_MAIL_CHUNK)
                llmretry_event_free(ev);
            if (m != LLMRETRY_MAIL_DONE)
                continue;               /* news, not the end yet */
            ok += llmretry_call_result(got[j])->ok;
            llmretry_call_free(got[j]);
            done++;
        }
    }
    long calls_made = atomic_load(&getpid_calls) - before;
    CHECK_INT(ok, N);
    CHECK_MSG(calls_made < 10, "%ld getpid() calls for %d calls", calls_made, N);
    CHECK_MSG(core_getpid_is_counted(e), "the core's own getpid() calls are not counted: "
              "the check above could not fail");
    /* And a child still knows it is one. */
    CHECK_INT(in_child(child_sees_fork, e), 0);
    llmretry_group_free(g);
    llmretry_engine_free(e);
}

int main(void)
{
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_fork");
    }
    test_fork_while_busy();
    test_fork_check_costs_no_syscall();
    test_ids_batched_and_fork_safe();
    th_mock_stop(&mock);
    return th_summary("test_fork");
}
