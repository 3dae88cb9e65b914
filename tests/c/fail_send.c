/* An LD_PRELOAD shim for test_resend: fail_send_arm(port) makes the next
 * send() to a peer on that port fail with ECONNRESET before any byte
 * leaves, as on a kept-alive connection the server reset just before the
 * request was written (a race no server can be made to win on cue). Every
 * other send() goes to libc's (dlsym RTLD_NEXT); unarmed, it only adds a
 * load. */
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/types.h>

typedef ssize_t (*send_fn)(int, const void *, size_t, int);

static atomic_int armed_port;

void fail_send_arm(int port);
void fail_send_arm(int port)
{
    atomic_store(&armed_port, port);
}

/* The port still armed: 0 once the failure happened. */
int fail_send_armed(void);
int fail_send_armed(void)
{
    return atomic_load(&armed_port);
}

static int peer_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    int port = atomic_load(&armed_port);
    if (port && peer_port(fd) == port && atomic_compare_exchange_strong(&armed_port, &port, 0)) {
        errno = ECONNRESET;
        return -1;
    }
    send_fn real = (send_fn)dlsym(RTLD_NEXT, "send");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    return real(fd, buf, len, flags);
}
