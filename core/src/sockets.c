/* The engine's open sockets, known by their local and remote ports.
 *
 * on_prereq (call.c) must look at the socket of the connection libcurl is
 * about to reuse, and libcurl 7.88 does not say which it is at that point
 * (CURLINFO_ACTIVESOCKET is -1 until the transfer is done). It does say
 * the connection's ports, so the engine opens and closes its sockets
 * itself (CURLOPT_OPENSOCKETFUNCTION / CLOSESOCKETFUNCTION) and finds one
 * by its ports. The same ports name the connection a GOAWAY came on.
 * I/O thread only. */
#include "engine.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* The port of a socket address, 0 if it has none. */
static int port_of(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)ss)->sin_port);
    if (ss->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    return 0;
}

/* Learn a socket's ports once it has them (after connect starts). */
static void learn_ports(lr_sock *s)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (s->lport == 0 && getsockname(s->fd, (struct sockaddr *)&ss, &len) == 0)
        s->lport = port_of(&ss);
    len = sizeof ss;
    if (s->rport == 0 && getpeername(s->fd, (struct sockaddr *)&ss, &len) == 0)
        s->rport = port_of(&ss);
}

static curl_socket_t on_open(void *ud, curlsocktype purpose, struct curl_sockaddr *a)
{
    lr_socktab *t = ud;
    (void)purpose;
#ifdef SOCK_CLOEXEC
    curl_socket_t fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
#else
    /* macOS has no SOCK_CLOEXEC: set it right after (a fork in between may
     * leak the socket into the child, as libcurl's own sockets would). */
    curl_socket_t fd = socket(a->family, a->socktype, a->protocol);
    if (fd != CURL_SOCKET_BAD)
        fcntl(fd, F_SETFD, FD_CLOEXEC);
#endif
    if (fd == CURL_SOCKET_BAD)
        return fd;
    if (t->len == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        lr_sock *p = realloc(t->socks, cap * sizeof *p);
        if (!p)
            return fd;          /* untracked: on_prereq will not find it */
        t->socks = p;
        t->cap = cap;
    }
    t->socks[t->len++] = (lr_sock){ fd, 0, 0 };
    return fd;
}

static int on_close(void *ud, curl_socket_t fd)
{
    lr_socktab *t = ud;
    for (size_t i = 0; i < t->len; i++) {
        if (t->socks[i].fd == fd) {
            t->socks[i] = t->socks[--t->len];
            break;
        }
    }
    return close(fd);
}

void lr_socktab_attach(lr_socktab *t, CURL *easy)
{
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, on_open);
    curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, t);
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, on_close);
    curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, t);
}

curl_socket_t lr_socktab_find(lr_socktab *t, int local_port, int remote_port)
{
    for (size_t i = 0; i < t->len; i++) {
        lr_sock *s = &t->socks[i];
        if (s->lport == 0 || s->rport == 0)
            learn_ports(s);
        if (s->lport == local_port && s->rport == remote_port)
            return s->fd;
    }
    return CURL_SOCKET_BAD;
}

void lr_socktab_free(lr_socktab *t)
{
    free(t->socks);
    t->socks = NULL;
    t->len = t->cap = 0;
}

/* ---- GOAWAYs by connection ------------------------------------------------ */

static lr_goaway *goaway_slot(lr_socktab *t, int lport, int rport)
{
    for (unsigned i = 0; i < LR_GOAWAYS; i++)
        if (t->goaways[i].lport == lport && t->goaways[i].rport == rport)
            return &t->goaways[i];
    return NULL;
}

void lr_goaway_note(llmretry_engine *e, int lport, int rport, unsigned long last_stream)
{
    if (lport == 0)
        return;
    lr_socktab *t = &e->socks;
    lr_goaway *g = goaway_slot(t, lport, rport);
    if (!g)
        g = &t->goaways[t->next_goaway++ % LR_GOAWAYS];
    *g = (lr_goaway){ lport, rport, last_stream };
}

int lr_goaway_find(llmretry_engine *e, int lport, int rport, unsigned long *last_stream)
{
    lr_goaway *g = lport ? goaway_slot(&e->socks, lport, rport) : NULL;
    if (g)
        *last_stream = g->last_stream;
    return g != NULL;
}

void lr_goaway_forget(llmretry_engine *e, int lport, int rport)
{
    lr_goaway *g = lport ? goaway_slot(&e->socks, lport, rport) : NULL;
    if (g)
        g->lport = g->rport = 0;
}
