/* Channels: how a poll-mode host (an event loop, a batch) learns which calls
 * have news without waiting on each: the one readiness object of the API.
 * A channel is a ready list plus a notifier that is readable exactly while
 * the list is non-empty; both change under the engine's mutex. The engine
 * has a channel of its own (llmretry_engine_channel), each polling group
 * has one (llmretry_group_channel), and a host may make more
 * (llmretry_channel_new: one per event loop; llmretry_channel_new_socket:
 * one per nginx worker, whose notifier is a unix socket it connects to), so
 * two consumers never take each other's calls. */
#include "engine.h"

#include <poll.h>
#include <stdlib.h>

int lr_channel_init(lr_channel *r)
{
    r->head = r->tail = NULL;
    r->quiet = 0;
    return lr_notifier_open(&r->notifier);
}

int lr_channel_init_socket(lr_channel *r, char *err, size_t errlen)
{
    r->head = r->tail = NULL;
    r->quiet = 0;
    return lr_notifier_listen(&r->notifier, err, errlen);
}

void lr_channel_close(lr_channel *r)
{
    lr_notifier_close(&r->notifier);
}

int lr_channel_add(lr_channel *r, llmretry_call *c)
{
    if (c->in_ready || c->host_freed || atomic_load(&c->done_read))
        return 0;
    c->in_ready = 1;
    c->ready_next = NULL;
    if (r->tail) {
        r->tail->ready_next = c;
    } else {
        r->head = c;
        if (!r->quiet)
            lr_notifier_signal(&r->notifier);
    }
    r->tail = c;
    return 1;
}

size_t lr_channel_take(lr_channel *r, llmretry_call **calls, size_t max)
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
        if (!r->quiet)
            lr_notifier_clear(&r->notifier);
    }
    return n;
}

void lr_channel_remove(lr_channel *r, llmretry_call *c)
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
    if (!r->head && !r->quiet)
        lr_notifier_clear(&r->notifier);
}

llmretry_status lr_channel_wait(const lr_channel *r, int64_t timeout_ms)
{
    struct pollfd p = { .fd = r->notifier.rfd, .events = POLLIN };
    int t = timeout_ms < 0 ? -1 : timeout_ms > 2147483647 ? 2147483647 : (int)timeout_ms;
    return poll(&p, 1, t) > 0 ? LLMRETRY_OK : LLMRETRY_ETIMEDOUT;
}

/* ---- public: channels a host makes ------------------------------------- */

int lr_channel_embed(llmretry_channel *ch, llmretry_engine *e)
{
    atomic_init(&ch->refs, 1);
    ch->engine = e;                /* no reference: the owner holds the engine */
    ch->owned = 1;
    return lr_channel_init(&ch->ch);
}

static llmretry_status channel_new(llmretry_engine *e, int socket, llmretry_channel **out,
                                   char *err, size_t errlen)
{
    if (!e || !out) {
        lr_errf(err, errlen, "%s must not be NULL", !e ? "engine" : "out");
        return LLMRETRY_EINVAL;
    }
    *out = NULL;
    llmretry_channel *ch = calloc(1, sizeof *ch);
    if (!ch)
        return LLMRETRY_ENOMEM;
    if (socket) {
        if (lr_channel_init_socket(&ch->ch, err, errlen) != 0) {
            free(ch);
            return LLMRETRY_EINTERNAL;
        }
    } else if (lr_channel_init(&ch->ch) != 0) {
        free(ch);
        lr_errf(err, errlen, "could not create the channel's notifier (%s)", llmretry_notifier_kind());
        return LLMRETRY_EINTERNAL;
    }
    atomic_init(&ch->refs, 1);
    ch->engine = e;
    ch->ch.quiet = e->host_io && !socket;
    lr_engine_ref(e);
    *out = ch;
    return LLMRETRY_OK;
}

/* A host asks for the notifier: from now on it is readable exactly while
 * the channel has news. */
static void wake_up(llmretry_channel *ch)
{
    if (!ch->ch.quiet || lr_forked(ch->engine))
        return;
    pthread_mutex_lock(&ch->engine->mu);
    if (ch->ch.quiet) {
        ch->ch.quiet = 0;
        if (ch->ch.head)
            lr_notifier_signal(&ch->ch.notifier);
    }
    pthread_mutex_unlock(&ch->engine->mu);
}

llmretry_status llmretry_channel_new(llmretry_engine *e, llmretry_channel **out,
                                     char *err, size_t errlen)
{
    return channel_new(e, 0, out, err, errlen);
}

llmretry_status llmretry_channel_new_socket(llmretry_engine *e, llmretry_channel **out,
                                            char *err, size_t errlen)
{
    return channel_new(e, 1, out, err, errlen);
}

const char *llmretry_channel_socket_path(const llmretry_channel *ch)
{
    return lr_notifier_path(&ch->ch.notifier);
}

llmretry_status llmretry_channel_accept(llmretry_channel *ch, int64_t timeout_ms, char *err,
                                        size_t errlen)
{
    if (lr_forked(ch->engine)) {
        lr_errf(err, errlen, "the channel belongs to the parent process");
        return LLMRETRY_ESTATE;
    }
    int fd;
    llmretry_status st = lr_notifier_accept(&ch->ch.notifier, timeout_ms, &fd, err, errlen);
    if (st != LLMRETRY_OK)
        return st;
    /* The engine thread signals under the mutex. News published before the
     * host connected found nobody to write to: it is told now. */
    pthread_mutex_lock(&ch->engine->mu);
    ch->ch.notifier.wfd = fd;
    if (ch->ch.head)
        lr_notifier_signal(&ch->ch.notifier);
    pthread_mutex_unlock(&ch->engine->mu);
    return LLMRETRY_OK;
}

void lr_channel_ref(llmretry_channel *ch)
{
    atomic_fetch_add_explicit(&ch->refs, 1, memory_order_relaxed);
}

void lr_channel_unref(llmretry_channel *ch)
{
    if (atomic_fetch_sub_explicit(&ch->refs, 1, memory_order_acq_rel) != 1)
        return;
    llmretry_engine *e = ch->engine;
    lr_channel_close(&ch->ch);
    free(ch);
    lr_engine_unref(e);
}

void llmretry_channel_free(llmretry_channel *ch)
{
    /* The engine's and a group's channels go with their owner. */
    if (ch && !ch->owned && !lr_forked(ch->engine))
        lr_channel_unref(ch);
}

int llmretry_channel_fd(const llmretry_channel *ch)
{
    wake_up((llmretry_channel *)ch);
    return ch->ch.notifier.rfd;
}

size_t llmretry_channel_poll(llmretry_channel *ch, llmretry_call **calls, size_t max)
{
    if (lr_forked(ch->engine))
        return 0;
    pthread_mutex_lock(&ch->engine->mu);
    size_t n = lr_channel_take(&ch->ch, calls, max);
    pthread_mutex_unlock(&ch->engine->mu);
    return n;
}

llmretry_status llmretry_channel_wait(llmretry_channel *ch, int64_t timeout_ms)
{
    if (ch->ch.notifier.is_socket)
        return LLMRETRY_ESTATE;     /* its host waits at its own end of the socket */
    wake_up(ch);
    return lr_channel_wait(&ch->ch, timeout_ms);
}
