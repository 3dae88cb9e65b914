/* Notifiers: a file descriptor that is readable exactly while something is
 * waiting, for hosts that join the engine from an event loop (asyncio's
 * add_reader, libuv's poll). Two back-ends behind one interface, as curl
 * keeps its resolvers: an eventfd where the system has one (Linux), else a
 * pipe (macOS, the BSDs). -DLLMRETRY_PIPE_NOTIFIER forces the pipe so Linux
 * CI tests the path the other systems take. A host that cannot watch a
 * descriptor it did not open asks for the third kind, a unix socket it
 * connects to (notifier_socket.c), which signal and close hand over to. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#if !defined(LLMRETRY_PIPE_NOTIFIER) && defined(__linux__)
#define LR_USE_EVENTFD 1
#include <sys/eventfd.h>
#endif

const char *llmretry_notifier_kind(void)
{
#ifdef LR_USE_EVENTFD
    return "eventfd";
#else
    return "pipe";
#endif
}

/* O_NONBLOCK and FD_CLOEXEC on fd (also notifier_socket.c's). */
int lr_fd_nonblock_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    int fdfl = fcntl(fd, F_GETFD);
    if (fl < 0 || fdfl < 0)
        return -1;
    if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) < 0)
        return -1;
    return 0;
}

int lr_notifier_open(lr_notifier *n)
{
    n->is_socket = 0;
    n->listener = NULL;
#ifdef LR_USE_EVENTFD
    n->rfd = n->wfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return n->rfd < 0 ? -1 : 0;
#else
    int fds[2];
    n->rfd = n->wfd = -1;
    if (pipe(fds) != 0)
        return -1;
    if (lr_fd_nonblock_cloexec(fds[0]) != 0 || lr_fd_nonblock_cloexec(fds[1]) != 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    n->rfd = fds[0];
    n->wfd = fds[1];
    return 0;
#endif
}

void lr_notifier_close(lr_notifier *n)
{
    if (n->is_socket) {
        lr_notifier_socket_close(n);
        return;
    }
    if (n->wfd >= 0 && n->wfd != n->rfd)
        close(n->wfd);
    if (n->rfd >= 0)
        close(n->rfd);
    n->rfd = n->wfd = -1;
}

/* Callers signal only on the empty -> non-empty edge and clear only on the
 * way back, so a pipe holds at most one byte and never fills. */
void lr_notifier_signal(lr_notifier *n)
{
    if (n->is_socket) {
        lr_notifier_socket_signal(n);
        return;
    }
#ifdef LR_USE_EVENTFD
    uint64_t one = 1;
    ssize_t w = write(n->wfd, &one, sizeof one);
#else
    char one = 1;
    ssize_t w;
    do
        w = write(n->wfd, &one, 1);
    while (w < 0 && errno == EINTR);
#endif
    (void)w;                        /* a full counter or pipe is still readable */
}

void lr_notifier_clear(lr_notifier *n)
{
    if (n->is_socket)
        return;                     /* the host reads its bytes at its own end */
#ifdef LR_USE_EVENTFD
    uint64_t v;
    ssize_t r = read(n->rfd, &v, sizeof v);
    (void)r;                        /* EAGAIN when already clear */
#else
    char buf[64];
    while (read(n->rfd, buf, sizeof buf) > 0 || errno == EINTR)
        ;                           /* until EAGAIN: empty */
#endif
}
