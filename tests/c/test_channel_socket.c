/* Socket channels (core/src/notifier_socket.c): the path is in a private
 * directory and gone once the host's connection is taken; a connection from
 * another process is refused; one byte per empty -> non-empty change of the
 * list, none for news that finds it non-empty, one at accept for news that
 * came before; a host that went away does not kill the process (SIGPIPE);
 * and, against the mock server, calls submitted to the channel wake the
 * reader of the socket, which then takes them with llmretry_channel_poll. */
#include "harness.h"
#include "internal.h"
#include "engine.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static th_mock mock;
static int have_mock;

/* The host's end: a client connected to path (-1 on failure). */
static int connect_to(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Bytes waiting at the host's end within wait_ms (then none for 20 ms), read. */
static int bytes_within(int fd, int wait_ms)
{
    int n = 0;
    struct pollfd p = { .fd = fd, .events = POLLIN };
    while (poll(&p, 1, n ? 20 : wait_ms) == 1 && (p.revents & POLLIN)) {
        char buf[64];
        ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r <= 0)
            break;
        n += (int)r;
    }
    return n;
}

static llmretry_call *new_call(void)
{
    llmretry_call *c = calloc(1, sizeof *c);
    CHECK_MSG(c != NULL, "calloc");
    return c;
}

/* The notifier alone: where it listens, what accept takes, what it writes. */
/* Is `c` on its channel's ready list (read under the engine's lock)? */
static int on_ready_list(llmretry_engine *e, llmretry_call *c)
{
    pthread_mutex_lock(&e->mu);
    int on = c->in_ready;
    pthread_mutex_unlock(&e->mu);
    return on;
}

static void test_bytes_on_edges(void)
{
    lr_channel r;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_MSG(lr_channel_init_socket(&r, err, sizeof err) == 0, "init_socket: %s", err);
    const char *path = lr_notifier_path(&r.notifier);
    CHECK_MSG(path != NULL, "a path to connect to");
    if (!path)
        return;
    char path_copy[128], dir[128];
    snprintf(path_copy, sizeof path_copy, "%s", path);
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    struct stat st;
    CHECK_INT(stat(dir, &st), 0);
    CHECK_MSG((st.st_mode & 0777) == 0700, "the directory is 0%o, not 0700", st.st_mode & 0777);
    CHECK_INT(stat(path_copy, &st), 0);
    CHECK_MSG(S_ISSOCK(st.st_mode), "the path is a socket");
    CHECK_INT(r.notifier.rfd, -1);

    /* Nobody connected: accept gives up after its timeout. */
    int fd = -1;
    int64_t t0 = th_now_ms();
    CHECK_INT(lr_notifier_accept(&r.notifier, 50, &fd, err, sizeof err), LLMRETRY_ETIMEDOUT);
    int64_t took = th_now_ms() - t0;
    CHECK_MSG(took >= 40 && took < 2000, "accept timed out after %lld ms", (long long)took);

    int host = connect_to(path_copy);
    CHECK_MSG(host >= 0, "connect: %s", strerror(errno));
    CHECK_INT(lr_notifier_accept(&r.notifier, 1000, &fd, err, sizeof err), LLMRETRY_OK);
    r.notifier.wfd = fd;
    CHECK_MSG(lr_notifier_path(&r.notifier) == NULL, "no path once accepted");
    CHECK_MSG(stat(path_copy, &st) != 0 && stat(dir, &st) != 0, "path and directory removed");
    CHECK_INT(connect_to(path_copy), -1);
    CHECK_INT(lr_notifier_accept(&r.notifier, 0, &fd, err, sizeof err), LLMRETRY_ESTATE);

    llmretry_call *a = new_call(), *b = new_call();
    CHECK_INT(bytes_within(host, 0), 0);
    CHECK_INT(lr_channel_add(&r, a), 1);
    CHECK_INT(lr_channel_add(&r, b), 1);          /* the list was not empty: no byte */
    CHECK_INT(bytes_within(host, 200), 1);
    llmretry_call *got[4];
    CHECK_INT((int)lr_channel_take(&r, got, 1), 1);
    CHECK_INT(lr_channel_add(&r, a), 1);          /* b still listed: no byte */
    CHECK_INT(bytes_within(host, 0), 0);
    CHECK_INT((int)lr_channel_take(&r, got, 4), 2);
    CHECK_INT(bytes_within(host, 0), 0);          /* taking clears nothing here */
    CHECK_INT(lr_channel_add(&r, b), 1);          /* empty again: a byte */
    CHECK_INT(bytes_within(host, 200), 1);
    lr_channel_remove(&r, b);

    /* The host has gone: the next signal must not raise SIGPIPE. */
    close(host);
    CHECK_INT(lr_channel_add(&r, a), 1);
    CHECK_INT((int)lr_channel_take(&r, got, 4), 1);
    CHECK_INT(lr_channel_add(&r, a), 1);
    lr_channel_close(&r);
    free(a);
    free(b);
}

/* A process other than the channel's connects first: refused, and the
 * channel goes on waiting for its own process's connection. */
static void test_other_process_refused(void)
{
    lr_channel r;
    char err[LLMRETRY_ERRBUF] = "";
    if (lr_channel_init_socket(&r, err, sizeof err) != 0) {
        CHECK_MSG(0, "init_socket: %s", err);
        return;
    }
    char path[128];
    snprintf(path, sizeof path, "%s", lr_notifier_path(&r.notifier));
    int sync[2];
    CHECK_INT(pipe(sync), 0);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = connect_to(path);
        char c = fd >= 0 ? 'y' : 'n';
        (void)!write(sync[1], &c, 1);
        char buf[8];
        /* Held open until the parent has refused it (EOF), or 5 s. */
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (fd >= 0 && poll(&p, 1, 5000) == 1)
            (void)!read(fd, buf, sizeof buf);
        _exit(fd >= 0 ? 0 : 1);
    }
    char c = 0;
    CHECK_INT(read(sync[0], &c, 1), 1);
    CHECK_MSG(c == 'y', "the other process could connect");
    int fd = -1;
    CHECK_INT(lr_notifier_accept(&r.notifier, 100, &fd, err, sizeof err), LLMRETRY_ETIMEDOUT);
    CHECK_MSG(lr_notifier_path(&r.notifier) != NULL, "still listening for its own process");
    int host = connect_to(path);
    CHECK_INT(lr_notifier_accept(&r.notifier, 1000, &fd, err, sizeof err), LLMRETRY_OK);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child saw its connection end");
    r.notifier.wfd = fd;
    lr_channel_close(&r);
    close(host);
    close(sync[0]);
    close(sync[1]);
}

static void opts_for(llmretry_options *o, const char *name, char *url, size_t urllen)
{
    llmretry_options_defaults(o);
    o->base_url = th_mock_scenario_url(&mock, name, url, urllen);
    o->api_key = "sk-test";
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->timeout_ms = 10000;
}

/* Read every item of the call's mailbox; 1 once DONE was read. */
static int drain(llmretry_call *c)
{
    llmretry_event *ev;
    llmretry_mail m;
    while ((m = llmretry_call_next(c, &ev)) != LLMRETRY_MAIL_EMPTY) {
        if (m == LLMRETRY_MAIL_EVENT || m == LLMRETRY_MAIL_CHUNK)
            llmretry_event_free(ev);
        if (m == LLMRETRY_MAIL_DONE)
            return 1;
    }
    return 0;
}

/* Through the public API on a real engine: news published before the host
 * connects is signalled at accept; every call's news wakes the reader of
 * the socket; the reader drains and sees each call finish. */
static void test_engine_wakes_the_socket(void)
{
    char err[LLMRETRY_ERRBUF] = "", url[128];
    llmretry_engine *e = NULL;
    llmretry_channel *ch = NULL;
    if (llmretry_engine_new(NULL, &e, err, sizeof err) != LLMRETRY_OK ||
        llmretry_channel_new_socket(e, &ch, err, sizeof err) != LLMRETRY_OK) {
        CHECK_MSG(0, "engine or channel: %s", err);
        llmretry_engine_free(e);
        return;
    }
    CHECK_INT(llmretry_channel_fd(ch), -1);
    CHECK_INT(llmretry_channel_wait(ch, 0), LLMRETRY_ESTATE);
    llmretry_channel *plain = NULL;
    CHECK_INT(llmretry_channel_new(e, &plain, err, sizeof err), LLMRETRY_OK);
    CHECK_MSG(llmretry_channel_socket_path(plain) == NULL, "an eventfd channel has no path");
    CHECK_INT(llmretry_channel_accept(plain, 0, err, sizeof err), LLMRETRY_ESTATE);
    llmretry_channel_free(plain);

    th_mock_script(&mock, "sock", "{\"steps\": [], \"after\": {\"delay_ms\": 100}}");
    llmretry_options o;
    opts_for(&o, "sock", url, sizeof url);
    o.channel = ch;
    /* A call that finishes before anyone connected. */
    o.deadline_ms = 0;
    llmretry_call *early = NULL;
    CHECK_INT(llmretry_engine_submit(e, &o, 0, &early, err, sizeof err), LLMRETRY_OK);
    /* Wait until the engine has put it on the channel's ready list (after
     * its result: lr_publish, at the end of an I/O round). */
    CHECK_MSG(TH_EVENTUALLY(on_ready_list(e, early), 10000), "the early call was never published");
    int host = connect_to(llmretry_channel_socket_path(ch));
    CHECK_INT(llmretry_channel_accept(ch, 1000, err, sizeof err), LLMRETRY_OK);
    CHECK_INT(bytes_within(host, 500), 1);
    llmretry_call *got[8];
    CHECK_INT((int)llmretry_channel_poll(ch, got, 8), 1);
    CHECK_INT(drain(early), 1);
    llmretry_call_free(early);

    o.deadline_ms = LLMRETRY_NO_DEADLINE;
    enum { N = 8 };
    llmretry_call *calls[N];
    for (int i = 0; i < N; i++)
        CHECK_INT(llmretry_engine_submit(e, &o, 0, &calls[i], err, sizeof err), LLMRETRY_OK);
    int done = 0, wakes = 0;
    int64_t until = th_now_ms() + 10000;
    while (done < N && th_now_ms() < until) {
        if (bytes_within(host, 500) == 0)
            continue;
        wakes++;
        size_t n;
        while ((n = llmretry_channel_poll(ch, got, 8)) > 0)
            for (size_t i = 0; i < n; i++)
                done += drain(got[i]);
    }
    CHECK_INT(done, N);
    CHECK_MSG(wakes >= 1, "the socket woke the reader");
    for (int i = 0; i < N; i++) {
        CHECK_MSG(llmretry_call_result(calls[i]) && llmretry_call_result(calls[i])->ok,
                  "call %d succeeded", i);
        llmretry_call_free(calls[i]);
    }
    CHECK_INT(bytes_within(host, 50), 0);
    CHECK_INT((int)llmretry_channel_poll(ch, got, 8), 0);
    llmretry_channel_free(ch);
    /* The channel is gone: its end of the connection is closed. */
    char b;
    CHECK_INT(recv(host, &b, 1, 0), 0);
    close(host);
    llmretry_engine_free(e);
}

int main(void)
{
    signal(SIGPIPE, SIG_DFL);           /* a write to a closed socket must not raise it */
    test_bytes_on_edges();
    test_other_process_refused();
    have_mock = th_mock_start(&mock) == 0;
    CHECK_MSG(have_mock, "mock server did not start");
    if (have_mock) {
        test_engine_wakes_the_socket();
        th_mock_stop(&mock);
    }
    return th_summary("test_channel_socket");
}
