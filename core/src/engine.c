/* The engine: one I/O thread per engine drives every attempt of every call
 * through one curl multi handle (one connection cache). Host threads talk
 * to it only through two queues: ops (submit, cancel, validated) going in,
 * and each call's mailbox (mailbox.c) coming out. Nothing is called back
 * from the I/O thread. This file holds the loop, the op queue and the
 * engine's life cycle; see engine.h for the other parts. */
#include "engine.h"
#include "shared.h"
#include "stream.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_MAX_IN_FLIGHT 256
#define MAX_POLL_MS 1000

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

void lr_engine_ref(llmretry_engine *e)
{
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
}

pthread_mutex_t *lr_engine_mutex(llmretry_engine *e)
{
    return &e->mu;
}

void lr_engine_unref(llmretry_engine *e)
{
    if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) != 1)
        return;
    lr_channel_close(&e->channel.ch);
    pthread_mutex_destroy(&e->mu);
    lr_call_spares_free(e);
    free(e->heap);
    free(e->easy_pool);
    free(e);
}

/* ---- the engine's unfinished calls (cancelled at shutdown) ------------- */

static void live_link(llmretry_engine *e, llmretry_call *c)
{
    c->live_prev = NULL;
    c->live_next = e->live_head;
    if (e->live_head)
        e->live_head->live_prev = c;
    e->live_head = c;
}

void lr_live_unlink(llmretry_engine *e, llmretry_call *c)
{
    if (c->live_prev)
        c->live_prev->live_next = c->live_next;
    else
        e->live_head = c->live_next;
    if (c->live_next)
        c->live_next->live_prev = c->live_prev;
}

/* ---- the I/O thread ------------------------------------------------------ */

static void process_ops(llmretry_engine *e, llmretry_call *c)
{
    while (c) {
        llmretry_call *next = c->op_next;
        pthread_mutex_lock(&e->mu);
        unsigned ops = c->ops;
        c->ops = 0;
        c->op_queued = 0;
        c->op_next = NULL;
        pthread_mutex_unlock(&e->mu);
        if (ops & LR_OP_SUBMIT) {
            c->heap_index = LR_NO_TIMER;
            live_link(e, c);
            lr_admit_new(e, c);
        }
        if ((ops & LR_OP_VALIDATED) && c->state == LR_VALIDATING)
            lr_attempt_validated(e, c);
        if ((ops & LR_OP_RESUME) && c->state == LR_RUNNING)
            lr_stream_resume(e, c);
        if (ops & LR_OP_CANCEL)
            lr_cancel(e, c);
        lr_call_unref(c);           /* the reference the op queue held */
        c = next;
    }
}

/* What a call's timer means depends on where it waits: a deadline passed
 * (in backoff, or waiting for admission), or the end of a backoff. */
static void fire_timers(llmretry_engine *e)
{
    int64_t now = lr_mono_ms();
    llmretry_call *c;
    while ((c = lr_timer_take_due(e, now))) {
        if (c->state == LR_RUNNING) {
            lr_stream_timer(e, c, now);     /* the only running calls with a timer */
        } else if (c->deadline_at >= 0 && now >= c->deadline_at) {
            if (!c->last_message)
                c->last_message = lr_strdup(
                    c->state == LR_GROUP_QUEUED && c->group_queue != &c->group->queue
                        ? "the deadline passed while the call waited out the pause its "
                          "endpoint's server asked for (a 429's wait)"
                    : c->state == LR_GROUP_QUEUED
                        ? "the deadline passed while the call waited for its batch's window"
                    : c->state == LR_HELD
                        ? "the deadline passed while the call waited for a connection to its server"
                    : c->state == LR_BUDGET
                        ? "the deadline passed while the call waited for its endpoint's rate "
                          "budget (rpm, tpm, or the server's rate-limit headers)"
                        : "the deadline passed while the call waited for a free slot (max_in_flight)");
            lr_admission_leave(e, c);
            lr_give_up(e, c, LLMRETRY_REASON_DEADLINE);
        } else if (c->state == LR_WAITING) {
            lr_admit_retry(e, c);
        }
    }
}

/* Hand every finished transfer to the policy; how many there were.
 *
 * Every end is read before any is handled: libcurl 7.88's
 * curl_multi_remove_handle walks the queue of unread messages looking for
 * its handle's, so removing each handle as its message was read walked
 * the rest of the queue every time (with a thousand transfers, hundreds of
 * ends come out of one curl_multi_perform: issue 36). A call detached
 * while its end waited here (cancelled as another call ended: its easy is
 * gone, lr_detach_easy) is skipped, as libcurl drops the message of a
 * handle removed; a reference keeps the record meanwhile. */
static int read_finished(llmretry_engine *e)
{
    CURLMsg *m;
    int left, handled = 0;
    size_t n = 0;
    while ((m = curl_multi_info_read(e->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        llmretry_call *c = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&c);
        if (n == e->done_cap) {
            size_t cap = e->done_cap ? 2 * e->done_cap : 64;
            struct lr_done *p = realloc(e->done, cap * sizeof *p);
            if (!p) {
                lr_attempt_finished(e, c, m->data.result);   /* the slower way */
                handled++;
                continue;
            }
            e->done = p;
            e->done_cap = cap;
        }
        lr_call_ref(c);
        e->done[n++] = (struct lr_done){ c, m->easy_handle, m->data.result };
    }
    for (size_t i = 0; i < n; i++) {
        llmretry_call *c = e->done[i].call;
        if (c->easy == e->done[i].easy)
            lr_attempt_finished(e, c, e->done[i].result);
        lr_call_unref(c);
    }
    return handled + (int)n;
}

static int poll_timeout_ms(const llmretry_engine *e)
{
    int64_t now = lr_mono_ms();
    int64_t t = lr_admission_due_in(e, now, MAX_POLL_MS);
    t = lr_timer_due_in(e, now, t);
    return (int)t;
}

static llmretry_call *take_ops(llmretry_engine *e, int *stopping)
{
    pthread_mutex_lock(&e->mu);
    llmretry_call *ops = e->ops_head;
    e->ops_head = e->ops_tail = NULL;
    *stopping = e->stopping;
    pthread_mutex_unlock(&e->mu);
    return ops;
}

/* The I/O loop's two steps, per the engine's io_loop (engine.h): run the
 * transfers that have something to do, and wait until some may. */
static void io_drive(llmretry_engine *e)
{
    if (e->events) {
        lr_events_drive(e);
        return;
    }
    int running = 0;
    CURLMcode mrc = curl_multi_perform(e->multi, &running);
    (void)mrc;  /* only CURLM_OUT_OF_MEMORY/INTERNAL: per-transfer
                 * failures arrive through curl_multi_info_read */
}

static void io_wait(llmretry_engine *e, int timeout_ms)
{
    if (e->events) {
        lr_events_wait(e, timeout_ms);
        return;
    }
    if (curl_multi_poll(e->multi, NULL, 0, timeout_ms, NULL) != CURLM_OK) {
        /* Not a reason to spin: wait a little as poll would have. */
        struct timespec ts = { 0, 10 * 1000000 };
        nanosleep(&ts, NULL);
    }
}

/* Wake the I/O loop's wait from another thread. */
static void io_wake(llmretry_engine *e)
{
    if (e->host_io)
        return;                     /* the host runs the engine when it will */
    if (e->events)
        lr_events_wake(e->events);
    else
        curl_multi_wakeup(e->multi);
}

/* One turn of the loop, short of its wait; 1 once the engine is stopping. */
static int io_turn(llmretry_engine *e)
{
    int stopping = 0;
    process_ops(e, take_ops(e, &stopping));
    if (stopping)
        return 1;
    fire_timers(e);
    if (e->host_io) {
        /* The host's exchanges end in its own calls (host_io.c). */
        lr_admission_pump(e);
        lr_publish(e);
        return 0;
    }
    lr_shards_tidy(e, lr_mono_ms());
    /* Refill the slots that finished transfers free, and send, before
     * waking the hosts: with every call of a batch answering at once,
     * the next requests are on the wire before a host thread takes a
     * core to read the results (on 2 cores that thread would delay
     * them by the time it takes). */
    int finished;
    do {
        lr_admission_pump(e);
        io_drive(e);
        finished = read_finished(e);
    } while (finished > 0);
    lr_publish(e);
    return 0;
}

/* The engine's end: every unfinished call cancelled, everything freed. */
static void io_teardown(llmretry_engine *e)
{
    while (e->live_head)
        lr_cancel(e, e->live_head);
    lr_admission_unlist_all(e);
    lr_publish(e);
    pthread_mutex_lock(&e->mu);
    e->multi_gone = 1;
    llmretry_call *late = e->ops_head;
    e->ops_head = e->ops_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    process_ops(e, late);           /* only cancels of finished calls remain */
    lr_publish(e);
    lr_easy_pool_clear(e);
    lr_host_io_free(e);
    lr_origins_free(e);
    lr_endpoints_free(e);
    lr_shared_store_close(e->shared);   /* no endpoint points into it now */
    e->shared = NULL;
    curl_multi_cleanup(e->multi);
    e->multi = NULL;
    lr_shards_free(e);              /* closes their connections: before the events set */
    lr_events_free(e);              /* after: the cleanup told it of closed sockets */
    lr_socktab_free(&e->socks);     /* libcurl closed the last ones through it */
    free(e->done);
    e->done = NULL;
    e->done_cap = 0;
}

static void *io_main(void *arg)
{
    llmretry_engine *e = arg;
#ifdef __linux__
    /* Told apart from the host's threads in top -H, perf and gdb. */
    pthread_setname_np(pthread_self(), "llmretry-io");
#endif
    while (!io_turn(e))
        io_wait(e, poll_timeout_ms(e));
    io_teardown(e);
    return NULL;
}

llmretry_status llmretry_engine_run(llmretry_engine *e, int64_t *next_ms)
{
    if (next_ms)
        *next_ms = MAX_POLL_MS;
    if (!e)
        return LLMRETRY_EINVAL;
    if (!e->host_io || lr_forked(e))
        return LLMRETRY_ESTATE;
    pthread_mutex_lock(&e->mu);
    int gone = e->multi_gone;
    pthread_mutex_unlock(&e->mu);
    if (gone)
        return LLMRETRY_ESTATE;
    io_turn(e);
    if (next_ms)
        *next_ms = poll_timeout_ms(e);
    return LLMRETRY_OK;
}

/* ---- public: engines --------------------------------------------------- */

/* A Redis store's thread has news a waiting call may need. */
static void wake_io(void *arg)
{
    io_wake(arg);
}

void llmretry_engine_options_defaults(llmretry_engine_options *o)
{
    o->max_in_flight = DEFAULT_MAX_IN_FLIGHT;
    o->max_host_connections = 0;
    o->shared = NULL;
    o->io_loop = LLMRETRY_IO_LOOP_PERFORM;
}

static void engine_discard(llmretry_engine *e)
{
    lr_shared_store_close(e->shared);   /* its thread may wake the multi handle */
    if (e->multi)
        curl_multi_cleanup(e->multi);
    lr_events_free(e);
    lr_channel_close(&e->channel.ch);
    pthread_mutex_destroy(&e->mu);
    lr_call_spares_free(e);
    free(e);
}

llmretry_status llmretry_engine_new(const llmretry_engine_options *opts,
                                    llmretry_engine **out, char *err, size_t errlen)
{
    llmretry_engine_options defaults;
    if (!out) {
        lr_errf(err, errlen, "out must not be NULL");
        return LLMRETRY_EINVAL;
    }
    *out = NULL;
    if (!opts) {
        llmretry_engine_options_defaults(&defaults);
        opts = &defaults;
    }
    if (opts->max_in_flight < 1) {
        lr_errf(err, errlen, "max_in_flight must be >= 1 (got %d)", opts->max_in_flight);
        return LLMRETRY_EINVAL;
    }
    if (opts->max_host_connections < 0) {
        lr_errf(err, errlen, "max_host_connections must be >= 0 (got %d)",
                opts->max_host_connections);
        return LLMRETRY_EINVAL;
    }
    if (opts->io_loop != LLMRETRY_IO_LOOP_PERFORM && opts->io_loop != LLMRETRY_IO_LOOP_EVENTS &&
        opts->io_loop != LLMRETRY_IO_LOOP_HOST) {
        lr_errf(err, errlen, "io_loop must be LLMRETRY_IO_LOOP_PERFORM, LLMRETRY_IO_LOOP_EVENTS "
                "or LLMRETRY_IO_LOOP_HOST (got %d)", opts->io_loop);
        return LLMRETRY_EINVAL;
    }
    if (opts->io_loop == LLMRETRY_IO_LOOP_EVENTS && !lr_events_supported()) {
        lr_errf(err, errlen, "io_loop: the events loop needs epoll (Linux)");
        return LLMRETRY_EINVAL;
    }
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) {
        lr_errf(err, errlen, "curl_global_init failed: %s", curl_easy_strerror(curl_init_rc));
        return LLMRETRY_EINTERNAL;
    }
    llmretry_engine *e = calloc(1, sizeof *e);
    if (!e)
        return LLMRETRY_ENOMEM;
    atomic_init(&e->refs, 1);
    e->fork_generation = llmretry_fork_generation();
    e->max_in_flight = opts->max_in_flight;
    e->max_host_connections = opts->max_host_connections;
    e->rng = lr_rng_seed();
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->spare_mu, NULL);
    e->multi = lr_channel_embed(&e->channel, e) == 0 ? curl_multi_init() : NULL;
    if (!e->multi) {
        lr_errf(err, errlen, "could not create the engine's notifier (%s) or multi handle",
                llmretry_notifier_kind());
        engine_discard(e);
        return LLMRETRY_EINTERNAL;
    }
    /* Keep every connection of a full window: libcurl's default cache is
     * 4x the handles added at the moment and prunes idle connections
     * whenever the host is slow to resubmit. */
    CURLMcode mrc = curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS,
                                      (long)(opts->max_in_flight > 16 ? opts->max_in_flight : 16));
    /* Streams per HTTP/2 connection: the server's own limit (nginx: 128),
     * not libcurl's default cap of 100, so fewer connections carry them. */
    if (mrc == CURLM_OK)
        mrc = curl_multi_setopt(e->multi, CURLMOPT_MAX_CONCURRENT_STREAMS, 1000L);
    if (mrc == CURLM_OK && opts->max_host_connections > 0)
        mrc = curl_multi_setopt(e->multi, CURLMOPT_MAX_HOST_CONNECTIONS,
                                (long)opts->max_host_connections);
    if (mrc != CURLM_OK) {
        lr_errf(err, errlen, "could not set up the multi handle: %s", curl_multi_strerror(mrc));
        engine_discard(e);
        return LLMRETRY_EINTERNAL;
    }
    if (opts->io_loop == LLMRETRY_IO_LOOP_EVENTS && !(e->events = lr_events_open(e))) {
        lr_errf(err, errlen, "could not set up the events loop: %s", strerror(errno));
        engine_discard(e);
        return LLMRETRY_EINTERNAL;
    }

    if (opts->shared && *opts->shared &&
        lr_shared_store_open(opts->shared, &e->shared, err, errlen) != 0) {
        engine_discard(e);
        return LLMRETRY_EINVAL;
    }
    if (e->shared)
        lr_shared_store_on_news(e->shared, wake_io, e);
    if (opts->io_loop == LLMRETRY_IO_LOOP_HOST) {
        e->host_io = 1;             /* no thread: the host runs it */
        e->channel.ch.quiet = 1;    /* until a host asks for its fd */
        *out = e;
        return LLMRETRY_OK;
    }

    /* The I/O thread takes no signals: Ctrl-C belongs to the host. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&e->thread, NULL, io_main, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        lr_errf(err, errlen, "could not start the engine thread: %s", strerror(rc));
        engine_discard(e);
        return LLMRETRY_EINTERNAL;
    }
    *out = e;
    return LLMRETRY_OK;
}

void llmretry_engine_free(llmretry_engine *e)
{
    if (!e)
        return;
    if (lr_forked(e))
        return;     /* a forked child: the thread and sockets are the parent's */
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    io_wake(e);
    pthread_mutex_unlock(&e->mu);
    if (e->host_io)
        io_teardown(e);             /* the loop's end, on the host's thread */
    else
        pthread_join(e->thread, NULL);
    lr_engine_unref(e);
}

int lr_queue_op(llmretry_call *c, unsigned op)
{
    llmretry_engine *e = c->engine;
    if (lr_forked(e))
        return -1;
    pthread_mutex_lock(&e->mu);
    if (e->multi_gone || (e->stopping && op == LR_OP_SUBMIT)) {
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    c->ops |= op;
    int was_empty = e->ops_head == NULL;
    if (!c->op_queued) {
        c->op_queued = 1;
        lr_call_ref(c);
        c->op_next = NULL;
        if (e->ops_tail)
            e->ops_tail->op_next = c;
        else
            e->ops_head = c;
        e->ops_tail = c;
    }
    /* The I/O thread takes the whole list at once: one wakeup per batch. */
    if (was_empty)
        io_wake(e);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

llmretry_status llmretry_engine_submit(llmretry_engine *e, const llmretry_options *opts,
                                       unsigned flags, llmretry_call **out,
                                       char *err, size_t errlen)
{
    return lr_engine_submit(e, opts, flags & ~LR_SUBMIT_CHECKED, out, err, errlen);
}

llmretry_status lr_engine_submit(llmretry_engine *e, const llmretry_options *opts,
                                 unsigned flags, llmretry_call **out, char *err, size_t errlen)
{
    if (!e || !opts || !out) {
        lr_errf(err, errlen, "%s must not be NULL", !e ? "engine" : !opts ? "options" : "out");
        return LLMRETRY_EINVAL;
    }
    *out = NULL;
    if (lr_forked(e)) {
        lr_errf(err, errlen, "this engine belongs to another process (used after fork)");
        return LLMRETRY_ESTATE;
    }
    /* A group's own channel hears only the group's calls (its life is the
     * group's); the engine's own is what LLMRETRY_SUBMIT_POLL means. */
    if (opts->channel && opts->channel->owned && opts->channel != &e->channel) {
        lr_errf(err, errlen, "channel: a group's channel takes only its group's calls "
                "(submit with options.group)");
        return LLMRETRY_EINVAL;
    }
    llmretry_call *c;
    llmretry_status st = lr_call_new(e, opts, flags, &c, err, errlen);
    if (st != LLMRETRY_OK)
        return st;
    if (e->host_io && (c->stream_req || opts->ca_file)) {
        int streams = c->stream_req;
        c->engine = NULL;           /* no engine reference was taken yet */
        lr_call_unref(c);
        lr_errf(err, errlen, streams
                ? "stream: an engine whose host performs the attempts (io_loop host) does not "
                  "stream; stream on an engine with an I/O thread"
                : "ca_file: an engine whose host performs the attempts (io_loop host) verifies "
                  "TLS with the host's trust store (nginx: lua_ssl_trusted_certificate)");
        return LLMRETRY_EINVAL;
    }
    if (c->group && c->group->poll) {
        c->ready_to = &c->group->ready.ch;
    } else if (opts->channel && !opts->channel->owned) {
        /* A group without a channel of its own paces its calls; they report
         * where they would without it (a channel, the engine's, or none: the
         * host waits on the call itself). */
        c->channel = opts->channel;     /* released with the call */
        lr_channel_ref(c->channel);
        c->ready_to = &c->channel->ch;
    } else if (opts->channel || (flags & LLMRETRY_SUBMIT_POLL)) {
        c->ready_to = &e->channel.ch;   /* the engine's own (checked above) */
    }
    lr_engine_ref(e);
    lr_call_ref(c);                 /* the engine's, until it finishes */
    if (e->host_io) {
        /* The host's thread is the engine's: the call is admitted now and
         * its first attempt, when admitted, handed out at once, not at the
         * host's next turn (a turn less per call: issue 36). */
        pthread_mutex_lock(&e->mu);
        int gone = e->multi_gone || e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (gone) {
            lr_call_unref(c);
            lr_call_unref(c);
            lr_errf(err, errlen, "the engine has been shut down");
            return LLMRETRY_ESTATE;
        }
        c->heap_index = LR_NO_TIMER;
        live_link(e, c);
        lr_admit_new(e, c);
        *out = c;
        return LLMRETRY_OK;
    }
    if (lr_queue_op(c, LR_OP_SUBMIT) != 0) {
        lr_call_unref(c);
        lr_call_unref(c);
        lr_errf(err, errlen, "the engine has been shut down");
        return LLMRETRY_ESTATE;
    }
    *out = c;
    return LLMRETRY_OK;
}

llmretry_channel *llmretry_engine_channel(llmretry_engine *e)
{
    return &e->channel;
}
