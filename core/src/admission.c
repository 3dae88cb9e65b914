/* The admission stage: what every attempt passes before it starts, in
 * order (docs/design.md):
 *
 *   1. its batch's pacer, for a call in a group (new items only: an item
 *      counts against its batch's window from its first attempt to its
 *      end, so its retries are not paced again); an item whose endpoint
 *      is paused waits in a hold of its batch, outside the window;
 *   2. its endpoint's rate budget (ratelimit.c: rpm, tpm, what the
 *      server's rate-limit headers say, a 429's pause, the slow-down 429s
 *      naming no wait teach), for every attempt (a retry first, unless
 *      it follows a 429: then behind the calls already waiting);
 *   3. the engine's max_in_flight (retries go before fresh calls);
 *   4. for an HTTPS origin that may multiplex, its connection gate: one
 *      attempt at a time waits for a new connection (origins.c).
 * Stage 2 first asks the endpoint's circuit breaker (health.c): while it
 * is open, attempts fail at once as circuit_open. (The retry budget is
 * asked earlier, when a failed attempt decides to retry: attempt.c.)
 *
 * A call that cannot start waits in the queue of the stage that holds it,
 * with its deadline as its timer (timers.c), so it fails at its deadline
 * wherever it waits. Nothing here blocks: the loop calls
 * lr_admission_pump once per pass and after every finished transfer. */
#include "engine.h"

#include <stdlib.h>

#define MAX_DUE_MS 1000

/* ---- the intrusive FIFO of waiting calls ------------------------------- */

void lr_queue_push(lr_queue *q, llmretry_call *c, int front)
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

/* Put all of `front` (emptied) before the calls of `q`, in its order. */
static void queue_prepend(lr_queue *q, lr_queue *front)
{
    if (!front->head)
        return;
    front->tail->wait_next = q->head;
    if (q->head)
        q->head->wait_prev = front->tail;
    else
        q->tail = front->tail;
    q->head = front->head;
    front->head = front->tail = NULL;
}

void lr_queue_unlink(lr_queue *q, llmretry_call *c)
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

/* Park the call in `q` in `state`, its deadline armed. */
static void wait_in(llmretry_engine *e, llmretry_call *c, lr_queue *q, lr_state state, int front)
{
    c->state = state;
    lr_queue_push(q, c, front);
    if (lr_timer_update(e, c) != 0) {
        lr_queue_unlink(q, c);
        free(c->last_message);
        c->last_message = lr_strdup("out of memory queueing the call");
        c->last_kind = LLMRETRY_ERR_NETWORK;
        c->last_no_connect = 0;
        lr_give_up(e, c, LLMRETRY_REASON_NOT_RETRYABLE);
    }
}

/* ---- stage 3: a slot --------------------------------------------------- */

/* A call with a slot: its origin's gate, then the wire. */
static void admit_origin(llmretry_engine *e, llmretry_call *c, int front)
{
    if (lr_origin_admits(e, c))
        lr_attempt_start(e, c);
    else
        wait_in(e, c, lr_origin_queue(c), LR_HELD, front);
}

static void admit_slot(llmretry_engine *e, llmretry_call *c, int front)
{
    if (e->in_flight < e->max_in_flight)
        admit_origin(e, c, front);
    else
        wait_in(e, c, &e->waiting, LR_QUEUED, front);
}

/* ---- stage 2: the endpoint's rate budget ----------------------------------- */

static void admit_budget(llmretry_engine *e, llmretry_call *c, int front)
{
    int64_t now = lr_mono_ms();
    char why[160];
    if (!lr_health_admits(e, c, now, why, sizeof why)) {
        /* The endpoint's breaker is open: fail at once, nothing sent (a
         * call with a fallback moves on to it, attempt.c). */
        free(c->last_message);
        c->last_message = lr_strdup(why);
        c->last_kind = LLMRETRY_ERR_CIRCUIT_OPEN;
        lr_give_up(e, c, LLMRETRY_REASON_CIRCUIT_OPEN);
        return;
    }
    if (lr_budget_admits(e, c, now) == 0)
        admit_slot(e, c, front);
    else
        wait_in(e, c, lr_budget_queue(c), LR_BUDGET, front);
}

static void admit_slot_next(llmretry_engine *e, llmretry_call *c)
{
    admit_slot(e, c, 0);
}

static void start_queued(llmretry_engine *e)
{
    while (e->waiting.head && e->in_flight < e->max_in_flight) {
        llmretry_call *c = e->waiting.head;
        lr_queue_unlink(&e->waiting, c);
        lr_timer_remove(e, c);
        admit_origin(e, c, 0);
    }
}

/* ---- stage 1: the batch's pacer ---------------------------------------- */

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

static void group_enqueue(llmretry_engine *e, llmretry_call *c)
{
    llmretry_group *g = c->group;
    g->queued++;
    c->group_queue = &g->queue;
    if (!g->listed) {
        /* The list holds a reference: cancelled items may leave the group
         * with no other owner while it is still listed. */
        atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
        g->listed = 1;
        g->next_listed = e->groups;
        e->groups = g;
    }
    wait_in(e, c, &g->queue, LR_GROUP_QUEUED, 0);
}

/* A 429's named wait pauses its endpoint, which is a model (endpoint.h),
 * for every call. A batch's items bound for a paused endpoint wait in one
 * of the batch's holds, outside its window, so that the batch's items of
 * other models go on; when the batch itself paused, one model's wait held
 * all of them. The hold for `ep`, or NULL when every hold keeps items of
 * other endpoints: the item then starts, and waits for its endpoint's
 * budget inside the window, as a batch of many paused models must. */
static lr_queue *hold_for(llmretry_group *g, lr_endpoint *ep)
{
    lr_group_hold *free_hold = NULL;
    for (int i = 0; i < LR_GROUP_HOLDS; i++) {
        lr_group_hold *h = &g->holds[i];
        if (h->endpoint == ep)
            return &h->parked;
        if (!h->parked.head && !free_hold)
            free_hold = h;
    }
    if (!free_hold)
        return NULL;
    free_hold->endpoint = ep;
    return &free_hold->parked;
}

/* Items whose endpoint's pause is over go back to the front of their
 * batch's queue: they came before the items still in it. */
static void release_holds(llmretry_group *g, int64_t now)
{
    for (int i = LR_GROUP_HOLDS - 1; i >= 0 && g->parked > 0; i--) {
        lr_group_hold *h = &g->holds[i];
        if (!h->parked.head || lr_budget_paused_ms(h->endpoint, now) > 0)
            continue;
        for (llmretry_call *c = h->parked.head; c; c = c->wait_next) {
            c->group_queue = &g->queue;
            g->parked--;
        }
        queue_prepend(&g->queue, &h->parked);
    }
}

/* When a hold's items may go: 0 now, else the soonest end of a pause
 * (`due` if none is sooner). */
static int64_t holds_due_in(const llmretry_group *g, int64_t now, int64_t due)
{
    for (int i = 0; i < LR_GROUP_HOLDS && g->parked > 0; i++) {
        const lr_group_hold *h = &g->holds[i];
        if (!h->parked.head)
            continue;
        int64_t t = lr_budget_paused_ms(h->endpoint, now);
        if (t < due)
            due = t;
    }
    return due;
}

/* Start what the group's window allows now. The pacer's own pause is not
 * asked: a 429's wait holds only its endpoint's items (the holds); the
 * pacer keeps the window and counts the pauses. */
static void pump_group(llmretry_engine *e, llmretry_group *g, int64_t now)
{
    if (g->parked > 0)
        release_holds(g, now);
    while (g->queue.head && g->active < g->pacer.window) {
        llmretry_call *c = g->queue.head;
        lr_queue_unlink(&g->queue, c);
        lr_endpoint *ep = lr_endpoint_of(e, c);
        lr_queue *hold = ep && lr_budget_paused_ms(ep, now) > 0 ? hold_for(g, ep) : NULL;
        if (hold) {
            lr_queue_push(hold, c, 0);      /* still LR_GROUP_QUEUED, its deadline armed */
            c->group_queue = hold;
            g->parked++;
            continue;
        }
        lr_timer_remove(e, c);
        g->queued--;
        g->active++;
        c->group_active = 1;
        admit_budget(e, c, 0);
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
        if (!g->queue.head && g->parked == 0) {
            *pp = g->next_listed;
            g->listed = 0;
            lr_group_unref(g);
        } else {
            pp = &g->next_listed;
        }
    }
}

/* ---- the stage as a whole ---------------------------------------------- */

void lr_admit_new(llmretry_engine *e, llmretry_call *c)
{
    if (c->group)
        group_enqueue(e, c);
    else
        admit_budget(e, c, 0);
}

void lr_admit_retry(llmretry_engine *e, llmretry_call *c)
{
    /* A retry goes before the calls waiting for its endpoint's budget,
     * unless the endpoint refused it (a 429: its load, not this call):
     * then it waits its turn behind them. While a server refuses every
     * request for a while (its window full), each probe is then another
     * waiting call's attempt; at the front, the one refused call was every
     * probe and spent all its attempts in seconds, while the calls behind
     * it had spent none. */
    admit_budget(e, c, c->last_status != 429);
}

void lr_admission_pump(llmretry_engine *e)
{
    pump_groups(e);
    lr_budget_pump(e, admit_slot_next);
    lr_origins_pump(e);             /* held calls go before newly admitted ones */
    start_queued(e);
}

void lr_admission_leave(llmretry_engine *e, llmretry_call *c)
{
    switch (c->state) {
    case LR_QUEUED:
        lr_queue_unlink(&e->waiting, c);
        break;
    case LR_HELD:
        lr_queue_unlink(lr_origin_queue(c), c);
        break;
    case LR_BUDGET:
        lr_queue_unlink(lr_budget_queue(c), c);
        break;
    case LR_GROUP_QUEUED:
        lr_queue_unlink(c->group_queue, c);
        if (c->group_queue != &c->group->queue)
            c->group->parked--;
        c->group->queued--;
        group_snapshot(e, c->group);
        break;
    default:
        break;
    }
    lr_budget_detached(c);          /* admitted by the budget, never sent */
    lr_timer_remove(e, c);
}

void lr_admission_finished(llmretry_engine *e, llmretry_call *c)
{
    if (!c->group_active)
        return;
    c->group_active = 0;
    c->group->active--;
    group_snapshot(e, c->group);
}

int64_t lr_admission_due_in(const llmretry_engine *e, int64_t now, int64_t cap)
{
    if (e->waiting.head && e->in_flight < e->max_in_flight)
        return 0;
    int64_t due = lr_origins_due_in(e, now, cap);
    due = lr_budget_due_in(e, now, due);
    for (const llmretry_group *g = e->groups; g; g = g->next_listed) {
        if (g->active >= g->pacer.window)
            continue;   /* full groups need no wake-up: a finishing item is one */
        if (g->queue.head)
            return 0;
        due = holds_due_in(g, now, due);
        if (due == 0)
            return 0;
    }
    return due;
}

void lr_admission_unlist_all(llmretry_engine *e)
{
    while (e->groups) {
        llmretry_group *g = e->groups;
        e->groups = g->next_listed;
        g->listed = 0;
        lr_group_unref(g);
    }
}
