/* The mailbox: what the engine publishes to the host that owns a call, and
 * the host's side of it. Items come out typed (docs/design.md): EVENT, VALIDATE
 * and DONE; reading an item with llmretry_call_next is what "delivered to
 * the caller" means; CHUNK items are stream chunks (stream.c). The
 * engine never calls host code: it appends to the
 * call's mailbox, wakes a thread blocked on it, and lists the call on its
 * channel for a host that polls. */
#include "engine.h"
#include "condvar.h"
#include "stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- engine side ------------------------------------------------------- */

/* Note that a poll-mode call has news. lr_publish lists all of them once
 * per loop pass, under one lock and with at most one notifier write per
 * channel, in the order they had news (a host sees calls finish in the
 * order they did). The pending list holds a reference. */
void lr_notify(llmretry_call *c)
{
    if (!c->ready_to || c->pend_notify)
        return;
    llmretry_engine *e = c->engine;
    c->pend_notify = 1;
    lr_call_ref(c);
    c->pend_next = NULL;
    if (e->pend_tail)
        e->pend_tail->pend_next = c;
    else
        e->pend_head = c;
    e->pend_tail = c;
}

void lr_publish(llmretry_engine *e)
{
    llmretry_call *pend = e->pend_head;
    if (!pend)
        return;
    e->pend_head = e->pend_tail = NULL;
    pthread_mutex_lock(&e->mu);
    for (llmretry_call *c = pend; c; c = c->pend_next) {
        c->pend_notify = 0;
        lr_channel_add(c->ready_to, c);
    }
    pthread_mutex_unlock(&e->mu);
    while (pend) {
        llmretry_call *next = pend->pend_next;
        lr_call_unref(pend);
        pend = next;
    }
}

void lr_mail_event(llmretry_call *c, llmretry_event *ev)
{
    pthread_mutex_lock(&c->mu);
    if (c->host_freed) {
        /* Nobody will read it; dropping it also drops its call reference. */
        pthread_mutex_unlock(&c->mu);
        llmretry_event_free(ev);
        return;
    }
    if (ev->type == LLMRETRY_EV_CHUNK)
        c->st->unread_bytes += (int64_t)ev->chunk_len;  /* backpressure (stream.c) */
    if (c->ev_tail)
        c->ev_tail->next = ev;
    else
        c->ev_head = ev;
    c->ev_tail = ev;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    lr_notify(c);
}

llmretry_event *lr_event(llmretry_call *c, llmretry_event_type t)
{
    return c->o.events & (1u << t) ? lr_event_new(c, t) : NULL;
}

void lr_post(llmretry_call *c, llmretry_event *ev)
{
    if (ev)
        lr_mail_event(c, ev);
}

void lr_mail_done(llmretry_call *c)
{
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    /* A verdict nobody asked for any more: a call cancelled while its body
     * waited for the host must not run the host's validator. */
    c->validate_pending = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    lr_notify(c);
}

void lr_mail_validate(llmretry_call *c)
{
    pthread_mutex_lock(&c->mu);
    c->validate_pending = 1;
    c->validate_seen = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    lr_notify(c);
}

/* ---- public: the host's side --------------------------------------------- */

void llmretry_call_cancel(llmretry_call *c)
{
    if (c)
        lr_queue_op(c, LR_OP_CANCEL);
}

void llmretry_call_free(llmretry_call *c)
{
    if (!c || lr_forked(c->engine))
        return;     /* in a forked child the call is the parent's: left alone */
    llmretry_engine *e = c->engine;
    pthread_mutex_lock(&e->mu);
    c->host_freed = 1;
    if (c->ready_to)
        lr_channel_remove(c->ready_to, c);
    pthread_mutex_unlock(&e->mu);
    /* Unread events hold references to the call: free them now, and have
     * the engine drop any it posts from here on. host_freed is written
     * under both locks so either lock may read it. */
    pthread_mutex_lock(&c->mu);
    c->host_freed = 1;
    int done = c->done;
    llmretry_event *ev = c->ev_head;
    c->ev_head = c->ev_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    while (ev) {
        llmretry_event *next = ev->next;
        llmretry_event_free(ev);
        ev = next;
    }
    if (!done)
        lr_queue_op(c, LR_OP_CANCEL);
    lr_call_unref(c);
}

const char *llmretry_call_request_id(const llmretry_call *c)
{
    return c->request_id;
}

void *llmretry_call_user_data(const llmretry_call *c)
{
    return c->o.user_data;
}

static int has_mail(const llmretry_call *c)
{
    return c->ev_head || (c->validate_pending && !c->validate_seen) || c->done;
}

llmretry_mail llmretry_call_next(llmretry_call *c, llmretry_event **ev)
{
    llmretry_mail m = LLMRETRY_MAIL_EMPTY;
    int resume = 0;
    *ev = NULL;
    if (lr_forked(c->engine))
        return m;
    pthread_mutex_lock(&c->mu);
    if (c->ev_head) {
        *ev = c->ev_head;
        c->ev_head = (*ev)->next;
        if (!c->ev_head)
            c->ev_tail = NULL;
        (*ev)->next = NULL;
        m = LLMRETRY_MAIL_EVENT;
        if ((*ev)->type == LLMRETRY_EV_CHUNK) {
            /* Delivered: the commit point (stream.h). */
            m = LLMRETRY_MAIL_CHUNK;
            resume = lr_stream_delivered(c, (*ev)->chunk_len);
        }
    } else if (c->validate_pending && !c->validate_seen) {
        c->validate_seen = 1;
        m = LLMRETRY_MAIL_VALIDATE;
    } else if (c->done) {
        m = LLMRETRY_MAIL_DONE;
        atomic_store(&c->done_read, 1);
    }
    pthread_mutex_unlock(&c->mu);
    if (resume)
        lr_queue_op(c, LR_OP_RESUME);   /* the transfer paused on a full mailbox */
    return m;
}

llmretry_status llmretry_call_wait(llmretry_call *c, int64_t timeout_ms)
{
    if (lr_forked(c->engine))
        return LLMRETRY_ESTATE;
    int64_t until = timeout_ms >= 0 ? lr_time_add(lr_cond_now_ms(), timeout_ms) : -1;
    llmretry_status st = LLMRETRY_OK;
    pthread_mutex_lock(&c->mu);
    while (!has_mail(c)) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&c->cv, &c->mu);
        } else if (lr_cond_wait_until(&c->cv, &c->mu, until) == ETIMEDOUT) {
            st = has_mail(c) ? LLMRETRY_OK : LLMRETRY_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

llmretry_status llmretry_call_pending_body(llmretry_call *c, const char **body, size_t *len)
{
    if (lr_forked(c->engine))
        return LLMRETRY_ESTATE;
    pthread_mutex_lock(&c->mu);
    int pending = c->validate_pending;
    pthread_mutex_unlock(&c->mu);
    if (!pending)
        return LLMRETRY_ESTATE;
    /* The engine leaves the buffer alone while the call is validating, and
     * after it ends (a cancel): it is freed with the call. */
    *body = c->resp.data;
    *len = c->resp.len;
    return LLMRETRY_OK;
}

llmretry_status llmretry_call_validated(llmretry_call *c, int ok, const char *message)
{
    if (lr_forked(c->engine))
        return LLMRETRY_ESTATE;
    pthread_mutex_lock(&c->mu);
    if (!c->validate_pending) {
        pthread_mutex_unlock(&c->mu);
        return LLMRETRY_ESTATE;
    }
    c->validate_pending = 0;
    c->validate_seen = 0;
    c->validate_ok = ok != 0;
    free(c->validate_msg);
    c->validate_msg = ok ? NULL : lr_strdup(message ? message : "rejected");
    pthread_mutex_unlock(&c->mu);
    return lr_queue_op(c, LR_OP_VALIDATED) == 0 ? LLMRETRY_OK : LLMRETRY_ESTATE;
}

const llmretry_result *llmretry_call_result(const llmretry_call *c)
{
    llmretry_call *m = (llmretry_call *)c;
    if (lr_forked(c->engine))
        return NULL;
    pthread_mutex_lock(&m->mu);
    int done = m->done;
    pthread_mutex_unlock(&m->mu);
    return done ? &c->result : NULL;
}

const char *llmretry_call_response_head(llmretry_call *c, size_t *len)
{
    *len = 0;
    if (lr_forked(c->engine) || !c->o.keep_response)
        return NULL;
    /* Once a chunk was taken (under c->mu, after the engine wrote the head
     * and posted the chunk) the attempt is committed: no other attempt
     * follows and its head is complete (transfer.c keeps no trailer). */
    pthread_mutex_lock(&c->mu);
    int readable = c->done || c->result.chunks_delivered > 0;
    pthread_mutex_unlock(&c->mu);
    if (!readable || c->resp_head.len == 0)
        return NULL;
    *len = c->resp_head.len;
    return c->resp_head.data;
}

llmretry_status llmretry_call_blocking(llmretry_engine *e, const llmretry_options *opts,
                                       llmretry_event_fn on_event, void *ud,
                                       llmretry_call **out, char *err, size_t errlen)
{
    if (opts && opts->validate) {
        lr_errf(err, errlen, "validate needs the mailbox: use llmretry_engine_submit");
        return LLMRETRY_EINVAL;
    }
    llmretry_status st = llmretry_engine_submit(e, opts, 0, out, err, errlen);
    if (st != LLMRETRY_OK)
        return st;
    for (;;) {
        llmretry_event *ev;
        llmretry_mail m = llmretry_call_next(*out, &ev);
        if (m == LLMRETRY_MAIL_DONE)
            return LLMRETRY_OK;
        if (m == LLMRETRY_MAIL_EVENT || m == LLMRETRY_MAIL_CHUNK) {
            if (on_event && m == LLMRETRY_MAIL_EVENT)
                on_event(ev, ud);
            llmretry_event_free(ev);
        } else {
            llmretry_call_wait(*out, -1);
        }
    }
}
