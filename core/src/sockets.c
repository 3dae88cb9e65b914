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

/* ---- The index: ports -> socket -------------------------------------------
 * on_prereq looks a socket up for every request on a reused connection: a
 * scan of every open socket was a thousand steps a request with a thousand
 * connections open (issue 36). Ports are learned once a socket has them
 * and the socket is indexed then. Two sockets may share both ports (the
 * same local port towards two hosts on one port): both are indexed and
 * the first found is the answer, as the scan's first match was. */

static uint32_t ports_key(int lport, int rport)
{
    return (uint32_t)lport << 16 | (uint32_t)(rport & 0xffff);
}

static size_t slot_of(const lr_socktab *t, uint32_t key)
{
    /* Mixed, so that ports differing by one land far apart. */
    key ^= key >> 16;
    key *= 0x45d9f3bu;
    key ^= key >> 16;
    return key & (t->index_cap - 1);
}

static int index_grow(lr_socktab *t)
{
    size_t cap = t->index_cap ? 2 * t->index_cap : 64;
    lr_sock_slot *old = t->index, *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return -1;
    size_t old_cap = t->index_cap;
    t->index = slots;
    t->index_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].ports)
            continue;
        size_t j = slot_of(t, old[i].ports);
        while (slots[j].ports)
            j = (j + 1) & (cap - 1);
        slots[j] = old[i];
    }
    free(old);
    return 0;
}

/* 0, or -1 when out of memory (the socket stays unindexed: not found). */
static int index_add(lr_socktab *t, uint32_t key, curl_socket_t fd)
{
    if (2 * (t->index_len + 1) > t->index_cap && index_grow(t) != 0)
        return -1;
    size_t j = slot_of(t, key);
    while (t->index[j].ports)
        j = (j + 1) & (t->index_cap - 1);
    t->index[j] = (lr_sock_slot){ key, fd };
    t->index_len++;
    return 0;
}

/* Remove fd's slot, moving back the slots after it that probed past it
 * (deletion without tombstones: lookups stay one probe run long). */
static void index_remove(lr_socktab *t, uint32_t key, curl_socket_t fd)
{
    if (!t->index_cap)
        return;
    size_t mask = t->index_cap - 1, i = slot_of(t, key);
    while (t->index[i].ports && !(t->index[i].ports == key && t->index[i].fd == fd))
        i = (i + 1) & mask;
    if (!t->index[i].ports)
        return;                 /* never indexed (out of memory then) */
    t->index_len--;
    for (size_t j = (i + 1) & mask; t->index[j].ports; j = (j + 1) & mask) {
        size_t home = slot_of(t, t->index[j].ports);
        /* Slot j may move to the hole at i unless its home lies in (i, j]. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->index[i] = t->index[j];
            i = j;
        }
    }
    t->index[i].ports = 0;
}

static curl_socket_t index_find(const lr_socktab *t, uint32_t key)
{
    if (!t->index_cap)
        return CURL_SOCKET_BAD;
    size_t mask = t->index_cap - 1;
    for (size_t i = slot_of(t, key); t->index[i].ports; i = (i + 1) & mask)
        if (t->index[i].ports == key)
            return t->index[i].fd;
    return CURL_SOCKET_BAD;
}

/* Learn a socket's ports once it has them (after connect starts); index
 * it once both are known. */
static void learn_ports(lr_socktab *t, lr_sock *s)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (s->lport == 0 && getsockname(s->fd, (struct sockaddr *)&ss, &len) == 0)
        s->lport = port_of(&ss);
    len = sizeof ss;
    if (s->rport == 0 && getpeername(s->fd, (struct sockaddr *)&ss, &len) == 0)
        s->rport = port_of(&ss);
    if (s->lport != 0 && s->rport != 0) {
        t->unknown--;
        index_add(t, ports_key(s->lport, s->rport), s->fd);
    }
}

curl_socket_t lr_socktab_open(lr_socktab *t, int family, int socktype, int protocol)
{
#ifdef SOCK_CLOEXEC
    curl_socket_t fd = socket(family, socktype | SOCK_CLOEXEC, protocol);
#else
    /* macOS has no SOCK_CLOEXEC: set it right after (a fork in between may
     * leak the socket into the child, as libcurl's own sockets would). */
    curl_socket_t fd = socket(family, socktype, protocol);
    if (fd != CURL_SOCKET_BAD)
        fcntl(fd, F_SETFD, FD_CLOEXEC);
#endif
    if (fd == CURL_SOCKET_BAD)
        return fd;
    if (t->watch)
        t->watch(t->watch_arg, fd, 1);
    if (t->len == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        lr_sock *p = realloc(t->socks, cap * sizeof *p);
        if (!p)
            return fd;          /* untracked: on_prereq will not find it */
        t->socks = p;
        t->cap = cap;
    }
    t->socks[t->len++] = (lr_sock){ fd, 0, 0 };
    t->unknown++;
    return fd;
}

int lr_socktab_close(lr_socktab *t, curl_socket_t fd)
{
    for (size_t i = 0; i < t->len; i++) {
        lr_sock *s = &t->socks[i];
        if (s->fd == fd) {
            if (s->lport != 0 && s->rport != 0)
                index_remove(t, ports_key(s->lport, s->rport), fd);
            else
                t->unknown--;
            *s = t->socks[--t->len];
            break;
        }
    }
    if (t->watch)
        t->watch(t->watch_arg, fd, 0);
    return close(fd);
}

static curl_socket_t on_open(void *ud, curlsocktype purpose, struct curl_sockaddr *a)
{
    (void)purpose;
    return lr_socktab_open(ud, a->family, a->socktype, a->protocol);
}

static int on_close(void *ud, curl_socket_t fd)
{
    return lr_socktab_close(ud, fd);
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
    if (local_port <= 0 || remote_port <= 0)
        return CURL_SOCKET_BAD;     /* not a TCP connection's (a unix socket's) */
    uint32_t key = ports_key(local_port, remote_port);
    curl_socket_t fd = index_find(t, key);
    if (fd != CURL_SOCKET_BAD || t->unknown == 0)
        return fd;
    /* Not indexed yet: learn the ports of every socket that has them now
     * (a connection's first reuse; steady traffic skips this). */
    for (size_t i = 0; i < t->len && t->unknown > 0; i++) {
        lr_sock *s = &t->socks[i];
        if (s->lport == 0 || s->rport == 0)
            learn_ports(t, s);
    }
    return index_find(t, key);
}

void lr_socktab_free(lr_socktab *t)
{
    free(t->socks);
    free(t->index);
    t->socks = NULL;
    t->index = NULL;
    t->len = t->cap = t->unknown = t->index_cap = t->index_len = 0;
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
