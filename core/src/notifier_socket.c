/* Socket notifiers: a channel's notifier for a host that can connect to an
 * address but cannot watch a descriptor it did not open. An nginx cosocket
 * (ngx.socket.tcp) is such a host: it connects to "unix:/path" and nothing
 * else, so an eventfd is no use to it.
 *
 * The channel listens on a fresh path in a private (0700) directory; the
 * host connects; lr_notifier_accept takes that one connection, checks that
 * it comes from this process, and removes the path, the directory and the
 * listener, so nobody else can ever reach the channel. From then on each
 * signal (the ready list going from empty to non-empty, under the engine
 * mutex as for the other kinds) writes one byte to the connection. The
 * bytes only say "look": the host reads whatever is there at its end, then
 * takes calls until the list is empty, and the next signal comes only after
 * that. Nothing is cleared on this side. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE                 /* struct ucred */
#endif
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct lr_listener {
    int fd;
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

/* The listener's directory, socket and descriptor, gone (what exists). */
static void listener_free(lr_listener *l)
{
    if (!l)
        return;
    if (l->fd >= 0)
        close(l->fd);
    if (l->path[0])
        unlink(l->path);
    if (l->dir[0])
        rmdir(l->dir);
    free(l);
}

/* $TMPDIR when the socket's path fits there, else /tmp: sun_path holds
 * about 100 bytes, and a long TMPDIR (macOS's) would not fit. */
static int make_dir(lr_listener *l)
{
    const char *base = getenv("TMPDIR");
    const char *tail = "/llmretry-XXXXXX";
    size_t room = sizeof l->path - sizeof "/notify";
    if (!base || !base[0] || strlen(base) + strlen(tail) >= room)
        base = "/tmp";
    snprintf(l->dir, sizeof l->dir, "%s%s", base, tail);
    if (!mkdtemp(l->dir)) {             /* mode 0700: only our user gets in */
        l->dir[0] = '\0';
        return -1;
    }
    size_t len = strlen(l->dir);   /* fits: `room` kept space for the name */
    memcpy(l->path, l->dir, len);
    memcpy(l->path + len, "/notify", sizeof "/notify");
    return 0;
}

int lr_notifier_listen(lr_notifier *n, char *err, size_t errlen)
{
    n->rfd = n->wfd = -1;
    n->is_socket = 1;
    n->listener = NULL;
    lr_listener *l = calloc(1, sizeof *l);
    if (!l) {
        lr_errf(err, errlen, "out of memory");
        return -1;
    }
    l->fd = -1;
    const char *what = "mkdtemp";
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (make_dir(l) != 0)
        goto fail;
    memcpy(sa.sun_path, l->path, strlen(l->path) + 1);
    what = "socket";
    l->fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (l->fd < 0 || lr_fd_nonblock_cloexec(l->fd) != 0)
        goto fail;
    what = "bind";
    if (bind(l->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        l->path[0] = '\0';              /* not ours to unlink */
        goto fail;
    }
    what = "listen";
    if (listen(l->fd, 1) != 0)
        goto fail;
    n->listener = l;
    return 0;
fail:
    lr_errf(err, errlen, "could not make the channel's socket (%s: %s)", what, strerror(errno));
    listener_free(l);
    return -1;
}

const char *lr_notifier_path(const lr_notifier *n)
{
    return n->listener ? n->listener->path : NULL;
}

/* The connection was made by this very process (an nginx worker connecting
 * to its own channel), not by another one of the same user that found the
 * path first. Where there is no SO_PEERCRED, the user is what is known. */
static int from_this_process(int fd)
{
#if defined(SO_PEERCRED)
    struct ucred cr;
    socklen_t len = sizeof cr;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.pid == getpid();
#else
    uid_t uid;
    gid_t gid;
    return getpeereid(fd, &uid, &gid) == 0 && uid == geteuid();
#endif
}

llmretry_status lr_notifier_accept(lr_notifier *n, int64_t timeout_ms, int *out, char *err,
                                   size_t errlen)
{
    lr_listener *l = n->listener;
    *out = -1;
    if (!l) {
        lr_errf(err, errlen, "the channel %s", n->is_socket ? "has accepted its connection already"
                                                             : "is not a socket channel");
        return LLMRETRY_ESTATE;
    }
    int64_t until = timeout_ms < 0 ? -1 : lr_time_add(lr_mono_ms(), timeout_ms);
    for (;;) {
        int fd = accept(l->fd, NULL, NULL);
        if (fd >= 0) {
            if (!from_this_process(fd)) {
                close(fd);              /* someone else's: keep waiting for ours */
                continue;
            }
#if defined(SO_NOSIGPIPE)
            int one = 1;                /* no MSG_NOSIGNAL there */
            setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
            if (lr_fd_nonblock_cloexec(fd) != 0) {
                lr_errf(err, errlen, "could not set up the channel's connection (%s)",
                        strerror(errno));
                close(fd);
                return LLMRETRY_EINTERNAL;
            }
            n->listener = NULL;         /* nobody else may connect from now on */
            listener_free(l);
            *out = fd;
            return LLMRETRY_OK;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            lr_errf(err, errlen, "accept on the channel's socket failed (%s)", strerror(errno));
            return LLMRETRY_EINTERNAL;
        }
        int64_t left = until < 0 ? -1 : until - lr_mono_ms();
        if (until >= 0 && left <= 0) {
            lr_errf(err, errlen, "nobody connected to the channel's socket in time");
            return LLMRETRY_ETIMEDOUT;
        }
        struct pollfd p = { .fd = l->fd, .events = POLLIN };
        (void)poll(&p, 1, left < 0 ? -1 : left > 2147483647 ? 2147483647 : (int)left);
    }
}

void lr_notifier_socket_signal(lr_notifier *n)
{
    if (n->wfd < 0)
        return;                     /* not connected yet: accept looks at the list */
#if defined(MSG_NOSIGNAL)
    int flags = MSG_NOSIGNAL;       /* a host gone away must not kill the process */
#else
    int flags = 0;
#endif
    ssize_t w;
    do
        w = send(n->wfd, "", 1, flags);
    while (w < 0 && errno == EINTR);
    /* EAGAIN: bytes the host has not read yet will wake it all the same;
     * EPIPE: the host has gone, nobody is left to wake. */
    (void)w;
}

void lr_notifier_socket_close(lr_notifier *n)
{
    listener_free(n->listener);
    n->listener = NULL;
    if (n->wfd >= 0)
        close(n->wfd);
    n->rfd = n->wfd = -1;
}
