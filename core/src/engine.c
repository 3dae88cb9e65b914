/* The engine: one I/O thread per engine drives every attempt of every call
 * through one curl multi handle (one connection cache), with a timer heap
 * for backoff waits and a cap on attempts in flight. Host threads talk to
 * it only through two queues: ops (submit, cancel, validated) going in,
 * and each call's mailbox (events, validation requests, the result)
 * coming out. Nothing is called back from the I/O thread. */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_MAX_IN_FLIGHT 256
#define EASY_POOL_MAX 1024
#define MAX_POLL_MS 1000

struct llmretry_engine {
    atomic_int refs;               /* the host's + one per unfreed call */
    pid_t pid;
    int max_in_flight;

    pthread_mutex_t mu;            /* guards everything down to `thread` */
    llmretry_call *ops_head, *ops_tail;
    lr_ready ready;                 /* LLMRETRY_SUBMIT_POLL calls with news */
    int stopping;
    int multi_gone;                /* the I/O thread has released `multi` */
    CURLM *multi;
    pthread_t thread;

    /* I/O thread only. */
    llmretry_call **heap;
    size_t heap_len, heap_cap;
    lr_queue waiting;              /* calls without a free slot */
    llmretry_group *groups;        /* groups with items to start */
    llmretry_call *live_head;
    int in_flight;
    CURL **easy_pool;
    size_t n_easy;
    uint64_t rng;
    llmretry_call *pend_head;      /* calls with news, published once per loop, */
    llmretry_call *pend_tail;      /* in the order they had it */
};

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
    lr_ready_close(&e->ready);
    pthread_mutex_destroy(&e->mu);
    free(e->heap);
    free(e->easy_pool);
    free(e);
}

/* ---- the timer heap (backoff waits), keyed by wake_at ------------------ */

static void heap_swap(llmretry_engine *e, size_t a, size_t b)
{
    llmretry_call *t = e->heap[a];
    e->heap[a] = e->heap[b];
    e->heap[b] = t;
    e->heap[a]->heap_index = a;
    e->heap[b]->heap_index = b;
}

static void heap_up(llmretry_engine *e, size_t i)
{
    while (i > 0 && e->heap[(i - 1) / 2]->wake_at > e->heap[i]->wake_at) {
        heap_swap(e, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(llmretry_engine *e, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < e->heap_len && e->heap[l]->wake_at < e->heap[m]->wake_at)
            m = l;
        if (r < e->heap_len && e->heap[r]->wake_at < e->heap[m]->wake_at)
            m = r;
        if (m == i)
            return;
        heap_swap(e, i, m);
        i = m;
    }
}

static int heap_push(llmretry_engine *e, llmretry_call *c)
{
    if (e->heap_len == e->heap_cap) {
        size_t cap = e->heap_cap ? e->heap_cap * 2 : 64;
        llmretry_call **h = realloc(e->heap, cap * sizeof *h);
        if (!h)
            return -1;
        e->heap = h;
        e->heap_cap = cap;
    }
    c->heap_index = e->heap_len;
    e->heap[e->heap_len++] = c;
    heap_up(e, c->heap_index);
    return 0;
}

static void heap_remove(llmretry_engine *e, llmretry_call *c)
{
    size_t i = c->heap_index;
    e->heap_len--;
    if (i != e->heap_len) {
        heap_swap(e, i, e->heap_len);
        heap_up(e, i);
        heap_down(e, i);
    }
}

/* ---- the waiting queue (calls without a free slot) and live list ------- */

static void queue_push(lr_queue *q, llmretry_call *c, int front)
{
    c->wait_prev = c->wait_next = NULL;
    if (!q->head) {
        q->head = q->tail = c;
    } else if (front) {
        c->wait_next = q->head;
        q->head->wait_prev = c;
        q->head = c;
    } else {
        c->wait_prev = q->tail;
        q->tail->wait_next = c;
        q->tail = c;
    }
}

static void queue_unlink(lr_queue *q, llmretry_call *c)
{
    if (c->wait_prev)
        c->wait_prev->wait_next = c->wait_next;
    else
        q->head = c->wait_next;
    if (c->wait_next)
        c->wait_next->wait_prev = c->wait_prev;
    else
        q->tail = c->wait_prev;
    c->wait_prev = c->wait_next = NULL;
}

/* Publish the group's numbers for llmretry_group_stats_get. */
static void group_snapshot(llmretry_engine *e, llmretry_group *g)
{
    pthread_mutex_lock(&e->mu);
    g->stats.window = g->pacer.window;
    g->stats.active = g->active;
    g->stats.queued = g->queued;
    g->stats.pauses = g->pacer.pauses;
    g->stats.halvings = g->pacer.halvings;
    pthread_mutex_unlock(&e->mu);
}

static void live_link(llmretry_engine *e, llmretry_call *c)
{
    c->live_prev = NULL;
    c->live_next = e->live_head;
    if (e->live_head)
        e->live_head->live_prev = c;
    e->live_head = c;
}

static void live_unlink(llmretry_engine *e, llmretry_call *c)
{
    if (c->live_prev)
        c->live_prev->live_next = c->live_next;
    else
        e->live_head = c->live_next;
    if (c->live_next)
        c->live_next->live_prev = c->live_prev;
}

/* ---- easy handles are pooled: creating one per attempt costs ----------- */

static CURL *easy_get(llmretry_engine *e)
{
    return e->n_easy > 0 ? e->easy_pool[--e->n_easy] : curl_easy_init();
}

static void easy_put(llmretry_engine *e, CURL *easy)
{
    if (e->n_easy < EASY_POOL_MAX) {
        if (!e->easy_pool) {
            e->easy_pool = malloc(EASY_POOL_MAX * sizeof *e->easy_pool);
            if (!e->easy_pool) {
                curl_easy_cleanup(easy);
                return;
            }
        }
        curl_easy_reset(easy);
        e->easy_pool[e->n_easy++] = easy;
    } else {
        curl_easy_cleanup(easy);
    }
}

/* ---- the mailbox, engine side ----------------------------------------- */

/* Engine thread: note that a poll-mode call has news. flush_ready publishes
 * all of them once per loop pass, under one lock and with at most one
 * eventfd write, instead of once per event, in the order they had news (a
 * host sees calls finish in the order they did). The list holds a
 * reference. */
static void notify_ready(llmretry_call *c)
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

static void flush_ready(llmretry_engine *e)
{
    llmretry_call *pend = e->pend_head;
    if (!pend)
        return;
    e->pend_head = e->pend_tail = NULL;
    pthread_mutex_lock(&e->mu);
    for (llmretry_call *c = pend; c; c = c->pend_next) {
        c->pend_notify = 0;
        lr_ready_add(c->ready_to, c);
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
    if (c->ev_tail)
        c->ev_tail->next = ev;
    else
        c->ev_head = ev;
    c->ev_tail = ev;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    notify_ready(c);
}

/* A fresh event of type t, or NULL when the call did not ask for it. */
static llmretry_event *event(llmretry_call *c, llmretry_event_type t)
{
    return c->o.events & (1u << t) ? lr_event_new(c, t) : NULL;
}

static void post(llmretry_call *c, llmretry_event *ev)
{
    if (ev)
        lr_mail_event(c, ev);
}

/* Publish the result; the engine's reference to the call ends here. */
static void finish(llmretry_engine *e, llmretry_call *c)
{
    llmretry_result *r = &c->result;
    r->request_id = c->request_id;
    r->model = c->model;
    r->attempts = c->attempts_started;
    r->attempt = r->attempts > 0 ? r->attempts - 1 : 0;
    r->total_ms = lr_mono_ms() - c->submitted_at;
    c->state = LR_DONE;
    live_unlink(e, c);
    if (c->group_active) {
        c->group_active = 0;
        c->group->active--;
        group_snapshot(e, c->group);
    }
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    notify_ready(c);
    lr_call_unref(c);
}

static void succeed(llmretry_engine *e, llmretry_call *c, int status, int64_t duration_ms,
                    llmretry_usage usage, char *response_model, char *fingerprint)
{
    llmretry_result *r = &c->result;
    if (c->group)
        llmretry_pacer_on_success(&c->group->pacer);
    r->ok = 1;
    r->status = status;
    r->duration_ms = duration_ms;
    r->body = c->resp.data;         /* on_body keeps room for the NUL */
    c->resp.data[c->resp.len] = '\0';
    r->body_len = c->resp.len;
    r->usage = usage;
    r->response_model = response_model;
    r->system_fingerprint = fingerprint;
    llmretry_event *ev = event(c, LLMRETRY_EV_REQUEST_SUCCEEDED);
    if (ev) {
        ev->status = status;
        ev->duration_ms = duration_ms;
        ev->usage = usage;
        ev->response_model = lr_strdup(response_model);
        ev->system_fingerprint = lr_strdup(fingerprint);
        post(c, ev);
    }
    finish(e, c);
}

static const char *reason_text(llmretry_giveup_reason r)
{
    switch (r) {
    case LLMRETRY_REASON_RETRIES_EXHAUSTED: return "retries exhausted";
    case LLMRETRY_REASON_NOT_RETRYABLE: return "not retryable";
    case LLMRETRY_REASON_DEADLINE: return "the deadline would pass before the next attempt";
    case LLMRETRY_REASON_RETRY_AFTER_TOO_LONG: return "the server asked to wait longer than max_retry_after_ms";
    case LLMRETRY_REASON_UNSAFE_MODE: return "retry_mode is unsafe and the request may have reached the server";
    case LLMRETRY_REASON_CANCELLED: return "cancelled";
    default: return "failed";
    }
}

static void give_up(llmretry_engine *e, llmretry_call *c, llmretry_giveup_reason reason)
{
    llmretry_result *r = &c->result;
    r->ok = 0;
    r->reason = reason;
    r->kind = reason == LLMRETRY_REASON_CANCELLED ? LLMRETRY_ERR_CANCELLED
            : reason == LLMRETRY_REASON_DEADLINE ? LLMRETRY_ERR_DEADLINE_EXCEEDED
            : c->last_kind;
    r->status = c->last_status;
    r->duration_ms = c->last_duration_ms;
    r->retry_after_ms = c->last_retry_after_ms;
    r->error_code = c->last_error_code;
    r->body_preview = c->last_body_preview;
    c->last_error_code = c->last_body_preview = NULL;     /* moved */
    int n = c->attempts_started;
    char buf[640];
    if (c->last_message)
        snprintf(buf, sizeof buf, "%s; gave up after %d attempt%s: %s",
                 c->last_message, n, n == 1 ? "" : "s", reason_text(reason));
    else
        snprintf(buf, sizeof buf, "gave up after %d attempt%s: %s", n, n == 1 ? "" : "s",
                 reason_text(reason));
    r->message = lr_strdup(buf);
    llmretry_event *ev = event(c, LLMRETRY_EV_REQUEST_GAVE_UP);
    if (ev) {
        ev->attempt = n > 0 ? n - 1 : 0;
        ev->reason = reason;
        ev->attempts = n;
        ev->total_ms = lr_mono_ms() - c->submitted_at;
        ev->error_kind = r->kind;
        ev->status = r->status;
        post(c, ev);
    }
    finish(e, c);
}

/* ---- attempts ------------------------------------------------------------ */

/* Time left before the call's deadline, never negative: a passed deadline
 * must not read as LLMRETRY_NO_DEADLINE (-1). */
static int64_t deadline_left(const llmretry_call *c, int64_t now)
{
    if (c->deadline_at < 0)
        return LLMRETRY_NO_DEADLINE;
    return c->deadline_at > now ? c->deadline_at - now : 0;
}

static void start_attempt(llmretry_engine *e, llmretry_call *c)
{
    int64_t now = lr_mono_ms();
    int64_t left = deadline_left(c, now);
    if (left == 0) {
        give_up(e, c, LLMRETRY_REASON_DEADLINE);
        return;
    }
    CURL *easy = easy_get(e);
    if (!easy) {
        free(c->last_message);
        c->last_message = lr_strdup("out of memory starting an attempt");
        c->last_kind = LLMRETRY_ERR_NETWORK;
        give_up(e, c, LLMRETRY_REASON_NOT_RETRYABLE);
        return;
    }
    int64_t timeout = llmretry_attempt_timeout_ms(c->o.timeout_ms, left);
    c->cut_by_deadline = left != LLMRETRY_NO_DEADLINE && left < c->o.timeout_ms;
    llmretry_event *ev = event(c, LLMRETRY_EV_REQUEST_STARTED);
    if (ev) {
        ev->timeout_ms = timeout;
        ev->deadline_left_ms = left;
        post(c, ev);
    }
    lr_call_setup_easy(c, easy, timeout);
    c->easy = easy;
    c->attempt_started_at = now;
    c->attempts_started = c->attempt + 1;
    c->state = LR_RUNNING;
    curl_multi_add_handle(e->multi, easy);
    e->in_flight++;
}

static void start_or_queue(llmretry_engine *e, llmretry_call *c, int front)
{
    if (e->in_flight < e->max_in_flight)
        start_attempt(e, c);
    else {
        c->state = LR_QUEUED;
        queue_push(&e->waiting, c, front);
    }
}

/* ---- groups: one batch's calls, paced together ----------------------- */

static void group_enqueue(llmretry_engine *e, llmretry_call *c)
{
    llmretry_group *g = c->group;
    c->state = LR_GROUP_QUEUED;
    queue_push(&g->queue, c, 0);
    g->queued++;
    if (!g->listed) {
        /* The list holds a reference: cancelled items may leave the group
         * with no other owner while it is still listed. */
        atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
        g->listed = 1;
        g->next_listed = e->groups;
        e->groups = g;
    }
}

/* Start what the group's pacer allows now; once the group's deadline has
 * passed, fail every item that has not started. */
static void pump_group(llmretry_engine *e, llmretry_group *g, int64_t now)
{
    int expired = g->deadline_at >= 0 && now >= g->deadline_at;
    while (g->queue.head &&
           (expired || g->active < llmretry_pacer_allowed(&g->pacer, now))) {
        llmretry_call *c = g->queue.head;
        queue_unlink(&g->queue, c);
        g->queued--;
        if (expired) {
            give_up(e, c, LLMRETRY_REASON_DEADLINE);
            continue;
        }
        g->active++;
        c->group_active = 1;
        start_or_queue(e, c, 0);
    }
    group_snapshot(e, g);
}

static void pump_groups(llmretry_engine *e)
{
    int64_t now = lr_mono_ms();
    llmretry_group **pp = &e->groups;
    while (*pp) {
        llmretry_group *g = *pp;
        pump_group(e, g, now);
        if (!g->queue.head) {
            *pp = g->next_listed;
            g->listed = 0;
            lr_group_unref(g);
        } else {
            pp = &g->next_listed;
        }
    }
}

/* How soon a listed group needs the engine again (MAX_POLL_MS = not soon). */
static int64_t groups_due_ms(const llmretry_engine *e, int64_t now)
{
    int64_t due = MAX_POLL_MS;
    for (const llmretry_group *g = e->groups; g; g = g->next_listed) {
        int64_t t = llmretry_pacer_paused_ms(&g->pacer, now);
        if (t == 0 && g->active < llmretry_pacer_allowed(&g->pacer, now))
            return 0;
        if (t == 0)
            t = MAX_POLL_MS;        /* full: a finishing item wakes us */
        if (g->deadline_at >= 0 && g->deadline_at - now < t)
            t = g->deadline_at > now ? g->deadline_at - now : 0;
        if (t < due)
            due = t;
    }
    return due;
}

static void detach_easy(llmretry_engine *e, llmretry_call *c)
{
    curl_multi_remove_handle(e->multi, c->easy);
    easy_put(e, c->easy);
    c->easy = NULL;
    e->in_flight--;
}

/* Record a failed attempt, tell the host, and let the policy decide. */
static void handle_failure(llmretry_engine *e, llmretry_call *c, lr_outcome *out)
{
    const llmretry_failure *f = &out->f;
    int http = f->kind == LLMRETRY_ERR_HTTP_STATUS;
    c->last_kind = f->kind;
    c->last_status = f->status;     /* any status the server did send */
    c->last_duration_ms = out->duration_ms;
    free(c->last_message);
    c->last_message = out->message;
    out->message = NULL;
    free(c->last_error_code);
    c->last_error_code = lr_strdup(f->error_code);
    free(c->last_body_preview);
    c->last_body_preview = http ? lr_call_preview(c) : NULL;

    llmretry_event *ev = event(c, http ? LLMRETRY_EV_REQUEST_FAILED : LLMRETRY_EV_REQUEST_ERROR);
    if (ev) {
        ev->duration_ms = out->duration_ms;
        if (http) {
            ev->status = f->status;
            ev->retry_after = lr_strdup(f->retry_after);
            ev->error_code = lr_strdup(f->error_code);
            ev->body_preview = lr_strdup(c->last_body_preview);
        } else {
            ev->error_kind = f->kind;
            ev->error_message = lr_strdup(c->last_message);
        }
        post(c, ev);
    }

    int64_t now = lr_mono_ms();
    int64_t left = deadline_left(c, now);
    llmretry_decision d = llmretry_decide(&c->o, f, c->attempt, lr_unix_ms(), left,
                                          lr_rng_next01(&e->rng));
    c->last_retry_after_ms = d.retry_after_ms;
    if (c->group && f->status == 429) {
        /* The server's wait holds for the whole batch, not just this item. */
        int64_t wait = d.retry && d.delay_source != LLMRETRY_DELAY_BACKOFF ? d.delay_ms
                                                                          : d.retry_after_ms;
        llmretry_pacer_on_429(&c->group->pacer, now, wait);
    }
    if (!d.retry) {
        give_up(e, c, d.reason);
        return;
    }
    ev = event(c, LLMRETRY_EV_RETRY_SCHEDULED);
    if (ev) {
        ev->delay_ms = d.delay_ms;
        ev->delay_source = d.delay_source;
        ev->next_attempt = c->attempt + 1;
        post(c, ev);
    }
    c->attempt++;
    c->wake_at = now + d.delay_ms;
    c->state = LR_WAITING;
    if (heap_push(e, c) != 0) {
        free(c->last_message);
        c->last_message = lr_strdup("out of memory scheduling a retry");
        give_up(e, c, LLMRETRY_REASON_NOT_RETRYABLE);
    }
}

static void on_transfer_done(llmretry_engine *e, llmretry_call *c, CURLcode rc)
{
    lr_outcome out;
    lr_call_read_outcome(c, rc, &out);
    detach_easy(e, c);
    if (!out.success) {
        handle_failure(e, c, &out);
    } else if (c->o.validate) {
        /* The host judges the body; the engine waits for its verdict. */
        c->state = LR_VALIDATING;
        c->v_usage = out.usage;
        c->v_response_model = out.response_model;
        c->v_fingerprint = out.fingerprint;
        c->last_status = out.f.status;
        c->last_duration_ms = out.duration_ms;
        out.response_model = out.fingerprint = NULL;
        pthread_mutex_lock(&c->mu);
        c->validate_pending = 1;
        c->validate_seen = 0;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        notify_ready(c);
    } else {
        succeed(e, c, out.f.status, out.duration_ms, out.usage, out.response_model, out.fingerprint);
        out.response_model = out.fingerprint = NULL;
    }
    lr_outcome_clear(&out);
}

static void on_validated(llmretry_engine *e, llmretry_call *c)
{
    pthread_mutex_lock(&c->mu);
    int ok = c->validate_ok;
    char *msg = c->validate_msg;
    c->validate_msg = NULL;
    pthread_mutex_unlock(&c->mu);
    if (ok) {
        succeed(e, c, c->last_status, c->last_duration_ms, c->v_usage,
                c->v_response_model, c->v_fingerprint);
        c->v_response_model = c->v_fingerprint = NULL;
    } else {
        lr_outcome out;
        memset(&out, 0, sizeof out);
        out.f.kind = LLMRETRY_ERR_INVALID_RESPONSE;
        out.f.status = c->last_status;
        out.duration_ms = c->last_duration_ms;
        char buf[400];
        snprintf(buf, sizeof buf, "response rejected by validate: %s", msg ? msg : "invalid");
        out.message = lr_strdup(buf);
        free(c->v_response_model);
        free(c->v_fingerprint);
        c->v_response_model = c->v_fingerprint = NULL;
        memset(c->hdr_set, 0, sizeof c->hdr_set);
        handle_failure(e, c, &out);
        lr_outcome_clear(&out);
    }
    free(msg);
}

static void cancel_call(llmretry_engine *e, llmretry_call *c)
{
    switch (c->state) {
    case LR_DONE:
        return;
    case LR_RUNNING:
        detach_easy(e, c);
        break;
    case LR_WAITING:
        heap_remove(e, c);
        break;
    case LR_QUEUED:
        queue_unlink(&e->waiting, c);
        break;
    case LR_GROUP_QUEUED:
        queue_unlink(&c->group->queue, c);
        c->group->queued--;
        break;
    case LR_VALIDATING:
        break;
    }
    give_up(e, c, LLMRETRY_REASON_CANCELLED);
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
            live_link(e, c);
            if (c->group)
                group_enqueue(e, c);
            else
                start_or_queue(e, c, 0);
        }
        if ((ops & LR_OP_VALIDATED) && c->state == LR_VALIDATING)
            on_validated(e, c);
        if (ops & LR_OP_CANCEL)
            cancel_call(e, c);
        lr_call_unref(c);           /* the reference the op queue held */
        c = next;
    }
}

static void fire_timers(llmretry_engine *e)
{
    int64_t now = lr_mono_ms();
    while (e->heap_len > 0 && e->heap[0]->wake_at <= now) {
        llmretry_call *c = e->heap[0];
        heap_remove(e, c);
        start_or_queue(e, c, 1);    /* retries go before fresh calls */
    }
}

static void start_queued(llmretry_engine *e)
{
    while (e->waiting.head && e->in_flight < e->max_in_flight) {
        llmretry_call *c = e->waiting.head;
        queue_unlink(&e->waiting, c);
        start_attempt(e, c);
    }
}

/* Hand every finished transfer to the policy; how many there were. */
static int read_finished(llmretry_engine *e)
{
    CURLMsg *m;
    int left, n = 0;
    while ((m = curl_multi_info_read(e->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        llmretry_call *c = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&c);
        on_transfer_done(e, c, m->data.result);
        n++;
    }
    return n;
}

static int poll_timeout_ms(const llmretry_engine *e)
{
    if (e->waiting.head && e->in_flight < e->max_in_flight)
        return 0;
    int64_t now = lr_mono_ms();
    int64_t t = groups_due_ms(e, now);
    if (e->heap_len > 0 && e->heap[0]->wake_at - now < t)
        t = e->heap[0]->wake_at - now;
    return t <= 0 ? 0 : t > MAX_POLL_MS ? MAX_POLL_MS : (int)t;
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

static void *io_main(void *arg)
{
    llmretry_engine *e = arg;
    int stopping = 0;
    while (!stopping) {
        process_ops(e, take_ops(e, &stopping));
        if (stopping)
            break;
        fire_timers(e);
        /* Refill the slots that finished transfers free, and send, before
         * waking the hosts: with every call of a batch answering at once,
         * the next requests are on the wire before a host thread takes a
         * core to read the results (on 2 cores that thread would delay
         * them by the time it takes). */
        int running = 0, finished;
        do {
            pump_groups(e);
            start_queued(e);
            curl_multi_perform(e->multi, &running);
            finished = read_finished(e);
        } while (finished > 0);
        flush_ready(e);
        curl_multi_poll(e->multi, NULL, 0, poll_timeout_ms(e), NULL);
    }
    while (e->live_head)
        cancel_call(e, e->live_head);
    pump_groups(e);                 /* every queue is empty now: unlists all */
    flush_ready(e);
    pthread_mutex_lock(&e->mu);
    e->multi_gone = 1;
    llmretry_call *late = e->ops_head;
    e->ops_head = e->ops_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    process_ops(e, late);           /* only cancels of finished calls remain */
    flush_ready(e);
    while (e->n_easy > 0)
        curl_easy_cleanup(e->easy_pool[--e->n_easy]);
    curl_multi_cleanup(e->multi);
    e->multi = NULL;
    return NULL;
}

/* ---- public: engines --------------------------------------------------- */

void llmretry_engine_options_defaults(llmretry_engine_options *o)
{
    o->max_in_flight = DEFAULT_MAX_IN_FLIGHT;
    o->max_host_connections = 0;
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
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) {
        lr_errf(err, errlen, "curl_global_init failed: %s", curl_easy_strerror(curl_init_rc));
        return LLMRETRY_EINTERNAL;
    }
    llmretry_engine *e = calloc(1, sizeof *e);
    if (!e)
        return LLMRETRY_ENOMEM;
    atomic_init(&e->refs, 1);
    e->pid = getpid();
    e->max_in_flight = opts->max_in_flight;
    e->rng = lr_rng_seed();
    pthread_mutex_init(&e->mu, NULL);
    e->multi = lr_ready_init(&e->ready) == 0 ? curl_multi_init() : NULL;
    if (!e->multi) {
        lr_errf(err, errlen, "could not create the engine's eventfd or multi handle");
        lr_ready_close(&e->ready);
        pthread_mutex_destroy(&e->mu);
        free(e);
        return LLMRETRY_EINTERNAL;
    }
    /* Keep every connection of a full window: libcurl's default cache is
     * 4x the handles added at the moment and prunes idle connections
     * whenever the host is slow to resubmit. */
    curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS,
                      (long)(opts->max_in_flight > 16 ? opts->max_in_flight : 16));
    if (opts->max_host_connections > 0)
        curl_multi_setopt(e->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)opts->max_host_connections);

    /* The I/O thread takes no signals: Ctrl-C belongs to the host. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&e->thread, NULL, io_main, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        lr_errf(err, errlen, "could not start the engine thread: %s", strerror(rc));
        curl_multi_cleanup(e->multi);
        lr_ready_close(&e->ready);
        pthread_mutex_destroy(&e->mu);
        free(e);
        return LLMRETRY_EINTERNAL;
    }
    *out = e;
    return LLMRETRY_OK;
}

void llmretry_engine_free(llmretry_engine *e)
{
    if (!e)
        return;
    if (getpid() != e->pid)
        return;     /* a forked child: the thread and sockets are the parent's */
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    curl_multi_wakeup(e->multi);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    lr_engine_unref(e);
}

/* Queue an op for the I/O thread; -1 once the engine has shut down. */
static int queue_op(llmretry_call *c, unsigned op)
{
    llmretry_engine *e = c->engine;
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
        curl_multi_wakeup(e->multi);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

llmretry_status llmretry_engine_submit(llmretry_engine *e, const llmretry_options *opts,
                                       unsigned flags, llmretry_call **out,
                                       char *err, size_t errlen)
{
    if (!e || !opts || !out) {
        lr_errf(err, errlen, "%s must not be NULL", !e ? "engine" : !opts ? "options" : "out");
        return LLMRETRY_EINVAL;
    }
    *out = NULL;
    if (getpid() != e->pid) {
        lr_errf(err, errlen, "this engine belongs to another process (used after fork)");
        return LLMRETRY_ESTATE;
    }
    llmretry_call *c;
    llmretry_status st = lr_call_new(e, opts, flags, &c, err, errlen);
    if (st != LLMRETRY_OK)
        return st;
    c->ready_to = c->group ? &c->group->ready : flags & LLMRETRY_SUBMIT_POLL ? &e->ready : NULL;
    lr_engine_ref(e);
    lr_call_ref(c);                 /* the engine's, until finish() */
    if (queue_op(c, LR_OP_SUBMIT) != 0) {
        lr_call_unref(c);
        lr_call_unref(c);
        lr_errf(err, errlen, "the engine has been shut down");
        return LLMRETRY_ESTATE;
    }
    *out = c;
    return LLMRETRY_OK;
}

int llmretry_engine_fd(const llmretry_engine *e)
{
    return e->ready.efd;
}

size_t llmretry_engine_poll(llmretry_engine *e, llmretry_call **calls, size_t max)
{
    pthread_mutex_lock(&e->mu);
    size_t n = lr_ready_take(&e->ready, calls, max);
    pthread_mutex_unlock(&e->mu);
    return n;
}

llmretry_status llmretry_engine_wait(llmretry_engine *e, int64_t timeout_ms)
{
    return lr_ready_wait(&e->ready, timeout_ms);
}

/* ---- public: calls -------------------------------------------------------- */

void llmretry_call_cancel(llmretry_call *c)
{
    if (c)
        queue_op(c, LR_OP_CANCEL);
}

void llmretry_call_free(llmretry_call *c)
{
    if (!c)
        return;
    llmretry_engine *e = c->engine;
    pthread_mutex_lock(&e->mu);
    c->host_freed = 1;
    if (c->ready_to)
        lr_ready_remove(c->ready_to, c);
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
        queue_op(c, LR_OP_CANCEL);
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
    *ev = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->ev_head) {
        *ev = c->ev_head;
        c->ev_head = (*ev)->next;
        if (!c->ev_head)
            c->ev_tail = NULL;
        (*ev)->next = NULL;
        m = LLMRETRY_MAIL_EVENT;
    } else if (c->validate_pending && !c->validate_seen) {
        c->validate_seen = 1;
        m = LLMRETRY_MAIL_VALIDATE;
    } else if (c->done) {
        m = LLMRETRY_MAIL_DONE;
        atomic_store(&c->done_read, 1);
    }
    pthread_mutex_unlock(&c->mu);
    return m;
}

llmretry_status llmretry_call_wait(llmretry_call *c, int64_t timeout_ms)
{
    struct timespec until;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (timeout_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
    }
    llmretry_status st = LLMRETRY_OK;
    pthread_mutex_lock(&c->mu);
    while (!has_mail(c)) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&c->cv, &c->mu);
        } else if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT) {
            st = has_mail(c) ? LLMRETRY_OK : LLMRETRY_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

llmretry_status llmretry_call_pending_body(llmretry_call *c, const char **body, size_t *len)
{
    pthread_mutex_lock(&c->mu);
    int pending = c->validate_pending;
    pthread_mutex_unlock(&c->mu);
    if (!pending)
        return LLMRETRY_ESTATE;
    /* The engine leaves the buffer alone while the call is validating. */
    *body = c->resp.data;
    *len = c->resp.len;
    return LLMRETRY_OK;
}

llmretry_status llmretry_call_validated(llmretry_call *c, int ok, const char *message)
{
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
    return queue_op(c, LR_OP_VALIDATED) == 0 ? LLMRETRY_OK : LLMRETRY_ESTATE;
}

const llmretry_result *llmretry_call_result(const llmretry_call *c)
{
    llmretry_call *m = (llmretry_call *)c;
    pthread_mutex_lock(&m->mu);
    int done = m->done;
    pthread_mutex_unlock(&m->mu);
    return done ? &c->result : NULL;
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
        if (m == LLMRETRY_MAIL_EVENT) {
            if (on_event)
                on_event(ev, ud);
            llmretry_event_free(ev);
        } else {
            llmretry_call_wait(*out, -1);
        }
    }
}
