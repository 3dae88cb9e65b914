/* Ready lists: how a poll-mode host (an event loop, a batch) learns which
 * calls have news without waiting on each. The eventfd is readable exactly
 * while the list is non-empty; both change under the engine's mutex. */
#include "internal.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

int lr_ready_init(lr_ready *r)
{
    r->head = r->tail = NULL;
    r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return r->efd < 0 ? -1 : 0;
}

void lr_ready_close(lr_ready *r)
{
    if (r->efd >= 0)
        close(r->efd);
    r->efd = -1;
}

int lr_ready_add(lr_ready *r, llmretry_call *c)
{
    if (c->in_ready || c->host_freed || atomic_load(&c->done_read))
        return 0;
    c->in_ready = 1;
    c->ready_next = NULL;
    if (r->tail) {
        r->tail->ready_next = c;
    } else {
        r->head = c;
        uint64_t one = 1;
        ssize_t n = write(r->efd, &one, sizeof one);
        (void)n;                    /* a full counter is still readable */
    }
    r->tail = c;
    return 1;
}

size_t lr_ready_take(lr_ready *r, llmretry_call **calls, size_t max)
{
    size_t n = 0;
    while (r->head && n < max) {
        llmretry_call *c = r->head;
        r->head = c->ready_next;
        c->in_ready = 0;
        c->ready_next = NULL;
        /* Published while the host was draining it: its DONE is read. */
        if (!atomic_load(&c->done_read))
            calls[n++] = c;
    }
    if (!r->head) {
        r->tail = NULL;
        uint64_t v;
        ssize_t got = read(r->efd, &v, sizeof v);
        (void)got;                  /* EAGAIN when already clear */
    }
    return n;
}

void lr_ready_remove(lr_ready *r, llmretry_call *c)
{
    if (!c->in_ready)
        return;
    llmretry_call **pp = &r->head, *prev = NULL;
    while (*pp != c) {
        prev = *pp;
        pp = &(*pp)->ready_next;
    }
    *pp = c->ready_next;
    if (r->tail == c)
        r->tail = prev;
    c->in_ready = 0;
    c->ready_next = NULL;
    if (!r->head) {
        uint64_t v;
        ssize_t got = read(r->efd, &v, sizeof v);
        (void)got;
    }
}

llmretry_status lr_ready_wait(const lr_ready *r, int64_t timeout_ms)
{
    struct pollfd p = { .fd = r->efd, .events = POLLIN };
    int t = timeout_ms < 0 ? -1 : timeout_ms > 2147483647 ? 2147483647 : (int)timeout_ms;
    return poll(&p, 1, t) > 0 ? LLMRETRY_OK : LLMRETRY_ETIMEDOUT;
}
