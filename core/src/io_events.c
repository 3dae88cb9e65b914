/* The events loop (LLMRETRY_IO_LOOP_EVENTS): the I/O thread drives libcurl
 * through its socket interface, on an epoll set of the engine's own.
 *
 * Why: libcurl 7.88's curl_multi_perform runs every transfer at every
 * wake-up, and a transfer waiting for its response polls its own socket
 * there (Curl_readwrite without select_bits): with hundreds of requests
 * waiting on a slow server, one poll(2) each, every time one of them
 * answers (issue 36). curl_multi_socket_action is told which sockets are
 * ready and runs only their transfers (and those whose timers expired).
 * The perform loop stays the default: when most transfers answer together
 * (a batch) it does the same work with fewer system calls.
 *
 * libcurl says which sockets to watch (CURLMOPT_SOCKETFUNCTION); its timers
 * are read with curl_multi_timeout before each wait rather than through
 * CURLMOPT_TIMERFUNCTION: libcurl calls that only when its earliest timer
 * changes, so a timer taken as due a little early (our clock counts whole
 * milliseconds) would never be announced again. Other threads wake the
 * loop through a notifier in the set, as curl_multi_wakeup wakes
 * curl_multi_poll. I/O thread only, except lr_events_wake. */
#include "engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/epoll.h>

/* Ready sockets taken by one wait; more stay ready for the next (the set
 * is level-triggered). */
#define READY_MAX 256

/* What the loop knows of a socket, by its number (sock_state). Only the
 * connections the engine's socket table opened (CONN) are kept in the set
 * while idle: libcurl says CURL_POLL_REMOVE when a transfer ends and the
 * same socket again when the next request reuses the connection, two
 * epoll_ctl per call for nothing. A socket libcurl opens itself (the
 * resolver's socketpair) is added and deleted as libcurl says. */
enum {
    SOCK_IN = 1,                    /* in the set, for reading */
    SOCK_OUT = 2,                   /* in the set, for writing */
    SOCK_CONN = 4,                  /* opened by the socket table, open now */
    SOCK_WATCHED = 8                /* libcurl watches it (not idle) */
};

struct lr_io_events {
    int epfd;
    lr_notifier wake;              /* other threads' wake-ups; in the set */
    unsigned char *sock_state;     /* by socket number; NULL: none yet */
    size_t sock_cap;
    struct epoll_event ready[READY_MAX];
    int n_ready;                   /* taken by the last wait, not yet run */
};

/* fd's state, the table grown to hold it when `grow`; NULL when it is
 * beyond the table (or growing failed: the socket is then handled as
 * libcurl says, without keeping it while idle). */
static unsigned char *sock_state(lr_io_events *ev, curl_socket_t fd, int grow)
{
    if (fd < 0)
        return NULL;
    if ((size_t)fd >= ev->sock_cap) {
        if (!grow)
            return NULL;
        size_t cap = ev->sock_cap ? ev->sock_cap : 64;
        while (cap <= (size_t)fd)
            cap *= 2;
        unsigned char *p = realloc(ev->sock_state, cap);
        if (!p)
            return NULL;
        memset(p + ev->sock_cap, 0, cap - ev->sock_cap);
        ev->sock_state = p;
        ev->sock_cap = cap;
    }
    return &ev->sock_state[fd];
}

/* The socket table opened fd, or is about to close it. A connection still
 * in the set (idle) leaves it first: a forked child holding a copy of the
 * socket would keep the closed one in the set, reported under a number
 * that may by then be another socket's. */
static void on_table_socket(void *arg, curl_socket_t fd, int open)
{
    lr_io_events *ev = arg;
    unsigned char *st = sock_state(ev, fd, open);
    if (!st)
        return;
    if (!open && (*st & (SOCK_IN | SOCK_OUT)))
        epoll_ctl(ev->epfd, EPOLL_CTL_DEL, fd, NULL);
    *st = open ? SOCK_CONN : 0;
}

int lr_events_supported(void)
{
    return 1;
}

/* CURLMOPT_SOCKETFUNCTION: watch s as libcurl asks. A socket already in
 * the set carries a mark (curl_multi_assign) so a change is one epoll_ctl;
 * should the set disagree (a number closed and reused), the other
 * operation is tried. */
static int on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    (void)easy;
    llmretry_engine *e = userp;
    lr_io_events *ev = e->events;
    unsigned char *st = sock_state(ev, s, 0);
    int conn = st && (*st & SOCK_CONN);
    if (what == CURL_POLL_REMOVE) {
        if (conn && (*st & (SOCK_IN | SOCK_OUT)) == SOCK_IN) {
            *st &= (unsigned char)~SOCK_WATCHED;   /* idle: stays, for reading */
            return 0;
        }
        epoll_ctl(ev->epfd, EPOLL_CTL_DEL, s, NULL);   /* ENOENT: never added */
        if (st)
            *st &= SOCK_CONN;
        return 0;
    }
    unsigned char want = (unsigned char)((what & CURL_POLL_IN ? SOCK_IN : 0) |
                                         (what & CURL_POLL_OUT ? SOCK_OUT : 0));
    if (conn && (*st & (SOCK_IN | SOCK_OUT)) == want) {
        *st |= SOCK_WATCHED;        /* an idle connection reused: in the set already */
        return 0;
    }
    struct epoll_event ee = { 0 };
    ee.events = (want & SOCK_IN ? EPOLLIN : 0u) | (want & SOCK_OUT ? EPOLLOUT : 0u);
    ee.data.fd = s;
    int in_set = conn ? (*st & (SOCK_IN | SOCK_OUT)) != 0 : socketp != NULL;
    int op = in_set ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (epoll_ctl(ev->epfd, op, s, &ee) != 0 &&
        epoll_ctl(ev->epfd, op == EPOLL_CTL_ADD ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, s, &ee) != 0)
        return -1;                  /* libcurl fails the transfer */
    if (st)
        *st = (unsigned char)((*st & SOCK_CONN) | want | SOCK_WATCHED);
    if (!socketp)
        curl_multi_assign(e->multi, s, e);
    return 0;
}

lr_io_events *lr_events_open(llmretry_engine *e)
{
    lr_io_events *ev = calloc(1, sizeof *ev);
    if (!ev)
        return NULL;
    ev->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ev->epfd < 0) {
        free(ev);
        return NULL;
    }
    struct epoll_event ee = { 0 };
    if (lr_notifier_open(&ev->wake) != 0) {
        ev->wake.rfd = ev->wake.wfd = -1;
        goto fail;
    }
    ee.events = EPOLLIN;
    ee.data.fd = ev->wake.rfd;
    if (epoll_ctl(ev->epfd, EPOLL_CTL_ADD, ev->wake.rfd, &ee) != 0)
        goto fail;
    if (curl_multi_setopt(e->multi, CURLMOPT_SOCKETFUNCTION, on_socket) != CURLM_OK ||
        curl_multi_setopt(e->multi, CURLMOPT_SOCKETDATA, e) != CURLM_OK)
        goto fail;
    e->socks.watch = on_table_socket;
    e->socks.watch_arg = ev;
    return ev;
fail:
    lr_notifier_close(&ev->wake);
    close(ev->epfd);
    free(ev);
    return NULL;
}

void lr_events_free(llmretry_engine *e)
{
    lr_io_events *ev = e->events;
    if (!ev)
        return;
    e->events = NULL;
    e->socks.watch = NULL;          /* lr_events_open's hook: nothing to tell now */
    e->socks.watch_arg = NULL;
    lr_notifier_close(&ev->wake);
    close(ev->epfd);
    free(ev->sock_state);
    free(ev);
}

void lr_events_wake(lr_io_events *ev)
{
    lr_notifier_signal(&ev->wake);
}

/* What epoll saw, as libcurl's CURL_CSELECT bits. An error or hang-up is
 * handed on as both directions: the transfer then reads or writes (the one
 * it is at) and meets the error there; left unsaid, the socket would stay
 * ready and the loop spin until the transfer's timeout. */
static int cselect_of(uint32_t events)
{
    int bits = 0;
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        bits |= CURL_CSELECT_IN;
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
        bits |= CURL_CSELECT_OUT;
    return bits;
}

void lr_events_drive(llmretry_engine *e)
{
    lr_io_events *ev = e->events;
    int running;
    int n = ev->n_ready;
    ev->n_ready = 0;
    for (int i = 0; i < n; i++) {
        curl_socket_t fd = ev->ready[i].data.fd;
        unsigned char *st = sock_state(ev, fd, 0);
        if (st && (*st & SOCK_CONN) && !(*st & SOCK_WATCHED)) {
            /* An idle connection has news (the server closed it, or sent
             * an answer to nothing): out of the set, or it would be
             * reported at every wait; libcurl finds it dead if it ever
             * picks it again, and adds it back if not. */
            if (*st & (SOCK_IN | SOCK_OUT))
                epoll_ctl(ev->epfd, EPOLL_CTL_DEL, fd, NULL);
            *st = SOCK_CONN;
            continue;
        }
        curl_multi_socket_action(e->multi, fd, cselect_of(ev->ready[i].events), &running);
    }
    /* Timers due (a transfer just added is due at once); a socket's action
     * above ran those that were due then. */
    long ms;
    if (curl_multi_timeout(e->multi, &ms) == CURLM_OK && ms == 0)
        curl_multi_socket_action(e->multi, CURL_SOCKET_TIMEOUT, 0, &running);
}

void lr_events_wait(llmretry_engine *e, int timeout_ms)
{
    lr_io_events *ev = e->events;
    long ms;
    if (curl_multi_timeout(e->multi, &ms) == CURLM_OK && ms >= 0 && ms < timeout_ms)
        timeout_ms = (int)ms;
    int n = epoll_wait(ev->epfd, ev->ready, READY_MAX, timeout_ms);
    if (n >= 0) {
        /* A wake-up is cleared here, before the loop takes the op queue (as
         * curl_multi_poll drains curl_multi_wakeup's): cleared later, it
         * would swallow the wake-up of an op queued after the take, which
         * then waited for some socket's news or a timer. */
        ev->n_ready = 0;
        for (int i = 0; i < n; i++) {
            if (ev->ready[i].data.fd == ev->wake.rfd)
                lr_notifier_clear(&ev->wake);
            else
                ev->ready[ev->n_ready++] = ev->ready[i];
        }
    } else if (errno != EINTR) {
        /* Not a reason to spin: wait a little as epoll would have. */
        struct timespec ts = { 0, 10 * 1000000 };
        nanosleep(&ts, NULL);
    }
}

#else /* no epoll: the perform loop only (llmretry_engine_new refuses the option) */

int lr_events_supported(void)
{
    return 0;
}

lr_io_events *lr_events_open(llmretry_engine *e)
{
    (void)e;
    return NULL;
}

void lr_events_free(llmretry_engine *e)
{
    (void)e;
}

void lr_events_wake(lr_io_events *ev)
{
    (void)ev;
}

void lr_events_drive(llmretry_engine *e)
{
    (void)e;
}

void lr_events_wait(llmretry_engine *e, int timeout_ms)
{
    (void)e;
    (void)timeout_ms;
}

#endif
