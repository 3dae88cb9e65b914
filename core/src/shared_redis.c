/* The Redis store of shared budgets (shared.h; its parts, by file, are
 * listed in shared_redis.h; this one is the I/O thread's side): `shared =
 * "redis://[[user]:password@]host[:port][/db]"`, for processes on several
 * machines.
 *
 * The engine's I/O thread never waits on Redis. It works on local state
 * that a thread of the store keeps in step:
 *
 * - each endpoint has a mirror (an lr_shared_ep in this process's memory)
 *   that the I/O thread reads and changes with the rules of shared.c, as it
 *   would a slot of the shm store; what it changes is also queued
 *   (`pending`: counts as deltas, breaker events, a pause) and the store
 *   thread sends it to Redis, where one script applies it to the shared
 *   numbers and answers with them; the answer becomes the mirror again,
 *   with what the I/O thread did meanwhile applied on top;
 * - the rate buckets are GCRA timestamps in Redis. A process takes slices
 *   of them in advance: the script moves the bucket's timestamp on by k
 *   units and answers when, relative to its clock, the first of them may
 *   go; the I/O thread spends them one call at a time, each no sooner than
 *   its place in the slice. Slices are short (LEASE_US of the bucket's
 *   time), a slice's unused future is given back, and a unit is never spent
 *   later than GRACE after its place: so N processes send what one GCRA
 *   would admit, give or take a unit each. A slice for calls yet to come is
 *   booked no further than HORIZON_US ahead, and asked for while the
 *   current one runs (a call waits for Redis only when it comes with
 *   nothing leased); a call that waits books its place in line however far
 *   the others have booked (WAITING_HORIZON_US at most), so that processes
 *   contending for a busy bucket queue in Redis instead of polling it;
 * - the breaker's half-open probe is a lease in Redis too: a process
 *   probes only once Redis named it the holder.
 *
 * Redis down, slow (no answer within its timeout: 50 ms unless the URL
 * says ?timeout_ms=N) or refusing the
 * password: the mirror alone is the budget (this process's own, as without
 * `shared`), the engine reports the change once (llm_shared_unavailable)
 * and the store thread reconnects in the background, reporting the
 * recovery. A call waits for Redis that timeout at most, ever.
 *
 * Times in Redis are Redis's clock (TIME): the script answers in durations
 * relative to it, which this process maps onto its own monotonic clock at
 * the moment the answer arrives (late by the answer's trip, so a slice
 * starts a little later here than there, never earlier). The password is
 * kept for AUTH alone: messages and events name the store with "***" in
 * its place. */
#include "shared_redis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the I/O thread's side --------------------------------------------------------- */

/* The mirror's probe lease, from what this process knows of the Redis
 * one: free for a local call only when Redis named this process the
 * holder; held by another until when it said; else blocked until asked. */
#define PROBE_BLOCKED (INT64_MAX / 4)
void lr_redis_fix_probe(lr_redis_ep *x, int64_t now_ms)
{
    lr_shared_ep *m = &x->mirror;
    if (x->probe == PROBE_MINE && now_ms >= x->mine_until)
        x->probe = PROBE_NONE;                          /* it lapsed unused */
    if (x->probe == PROBE_USED)
        return;                                         /* a local call probes: its lease */
    if (down(x->st) || atomic_load(&m->breaker_open_until) == 0 || x->probe == PROBE_MINE)
        atomic_store(&m->breaker_probe_until, 0);
    else
        atomic_store(&m->breaker_probe_until, x->other_until > now_ms ? x->other_until
                                                                         : PROBE_BLOCKED);
}

lr_redis_ep *lr_redis_endpoint(lr_redis *st, uint64_t id)
{
    pthread_mutex_lock(&st->mu);
    lr_redis_ep *x = NULL;
    for (size_t i = 0; i < st->n_eps && !x; i++)
        if (st->eps[i]->id == id)
            x = st->eps[i];
    if (!x && st->n_eps == st->cap_eps) {
        size_t cap = st->cap_eps ? 2 * st->cap_eps : 8;
        lr_redis_ep **more = realloc(st->eps, cap * sizeof *more);
        if (more) {
            st->eps = more;
            st->cap_eps = cap;
        }
    }
    if (!x && st->n_eps < st->cap_eps && (x = calloc(1, sizeof *x))) {
        x->st = st;
        x->id = id;
        snprintf(x->key, sizeof x->key, "llmretry:1:%016llx", (unsigned long long)id);
        lr_shared_ep_init(&x->mirror, id);
        x->made_ms = x->active_ms = mono_us() / 1000;
        x->synced = down(st);
        st->eps[st->n_eps++] = x;
        kick(st);                                       /* read its numbers now */
    }
    pthread_mutex_unlock(&st->mu);
    return x;
}

lr_shared_ep *lr_redis_mirror(lr_redis_ep *x)
{
    return &x->mirror;
}

const char *lr_redis_name(const lr_redis *st)
{
    return st->name;
}

const char *lr_redis_ep_name(const lr_redis_ep *x)
{
    return x->st->name;
}

void lr_redis_raise_pause(lr_redis_ep *x, int64_t until_ms)
{
    pthread_mutex_lock(&x->st->mu);
    lr_shared_raise(&x->mirror.paused_until, until_ms);
    if (!down(x->st) && until_ms > x->p.pause_until) {
        x->p.pause_until = until_ms;
        kick(x->st);                                    /* every process waits: tell them now */
    }
    pthread_mutex_unlock(&x->st->mu);
}

void lr_redis_budget_request(lr_redis_ep *x, int64_t now_ms)
{
    pthread_mutex_lock(&x->st->mu);
    lr_shared_budget_request(&x->mirror, now_ms);
    if (!down(x->st))
        x->p.requests++;
    x->active_ms = now_ms;
    pthread_mutex_unlock(&x->st->mu);
}

int lr_redis_budget_take(lr_redis_ep *x, int64_t now_ms, double ratio, int64_t min)
{
    pthread_mutex_lock(&x->st->mu);
    int ok = lr_shared_budget_take(&x->mirror, now_ms, ratio, min);
    if (ok && !down(x->st))
        x->p.retries++;
    pthread_mutex_unlock(&x->st->mu);
    return ok;
}

int lr_redis_breaker_admits(lr_redis_ep *x, int64_t now_ms, int64_t lease_ms, int *probe)
{
    lr_redis *st = x->st;
    pthread_mutex_lock(&st->mu);
    x->active_ms = now_ms;
    x->lease_ms = lease_ms;
    *probe = 0;
    lr_redis_fix_probe(x, now_ms);
    if (!down(st) && lr_shared_breaker_state(&x->mirror, now_ms) == LR_SHARED_HALF_OPEN &&
        x->probe == PROBE_NONE && x->other_until <= now_ms) {
        /* Half open, and nobody is known to probe: ask Redis for the lease
         * (the call waits for the answer), unless it has not answered in
         * time: then this process decides alone. */
        if (!x->probe_asked) {
            x->probe_asked = now_ms;
            x->p.want_probe = 1;
            kick(st);
        }
        if (now_ms - x->probe_asked < st->timeout_ms) {
            pthread_mutex_unlock(&st->mu);
            return -1;
        }
        atomic_store(&x->mirror.breaker_probe_until, 0);
    }
    int ok = lr_shared_breaker_admits(&x->mirror, now_ms, lease_ms, probe);
    if (*probe)
        x->probe = PROBE_USED;
    pthread_mutex_unlock(&st->mu);
    return ok;
}

int lr_redis_breaker_failed(lr_redis_ep *x, int64_t now_ms, int threshold, int64_t cooldown_ms,
                            int probe)
{
    pthread_mutex_lock(&x->st->mu);
    int opened = lr_shared_breaker_failed(&x->mirror, now_ms, threshold, cooldown_ms, probe);
    x->threshold = threshold;
    x->cooldown_ms = cooldown_ms;
    if (probe)
        x->probe = PROBE_NONE;
    if (!down(x->st)) {
        if (probe)
            x->p.reopen = 1;
        else
            x->p.failures++;
        kick(x->st);
    }
    lr_redis_fix_probe(x, now_ms);
    pthread_mutex_unlock(&x->st->mu);
    return opened;
}

void lr_redis_breaker_succeeded(lr_redis_ep *x)
{
    pthread_mutex_lock(&x->st->mu);
    lr_shared_ep *m = &x->mirror;
    /* Only news when the shared breaker counts failures or is open: a
     * success on a closed breaker changes nothing anywhere. */
    int64_t open = atomic_load(&m->breaker_open_until);
    if (!down(x->st) && (open != 0 || atomic_load(&m->breaker_failures) != 0 || x->p.failures)) {
        x->p.success = 1;
        x->p.failures = 0;
        x->p.reopen = 0;
        if (open != 0)
            kick(x->st);
    }
    lr_shared_breaker_succeeded(m);
    x->probe = PROBE_NONE;
    pthread_mutex_unlock(&x->st->mu);
}

void lr_redis_probe_release(lr_redis_ep *x)
{
    pthread_mutex_lock(&x->st->mu);
    if (x->probe == PROBE_USED) {
        x->probe = PROBE_NONE;
        if (!down(x->st)) {
            x->p.release = 1;
            kick(x->st);
        }
    }
    atomic_store(&x->mirror.breaker_probe_until, 0);
    lr_redis_fix_probe(x, mono_us() / 1000);
    pthread_mutex_unlock(&x->st->mu);
}

void lr_redis_say(lr_redis_ep *x, int index, int64_t now_ms, int64_t value, int claim)
{
    pthread_mutex_lock(&x->st->mu);
    _Atomic int64_t *w = &x->mirror.said[index];
    int64_t age = lr_shared_said_age_s(index), before = lr_shared_fresh(w, now_ms, age);
    if (claim)
        lr_shared_claim(w, now_ms, value);
    else
        lr_shared_say(w, now_ms, value);
    if (!down(x->st)) {
        int64_t *p = &x->p.said[index];
        *p = claim && *p > 0 && *p < value ? *p : value;
        /* A value that changes what the others pace by is news for them at
         * once; one said again goes with the next round. */
        if (lr_shared_fresh(w, now_ms, age) != before) {
            x->p.said_news = 1;
            kick(x->st);
        }
    }
    pthread_mutex_unlock(&x->st->mu);
}

int lr_redis_start_take(lr_redis_ep *x, int64_t now_ms)
{
    lr_redis *st = x->st;
    pthread_mutex_lock(&st->mu);
    x->active_ms = now_ms;              /* read back while calls wait on it */
    int ok = 0;
    if (atomic_load(&x->mirror.start_over)) {
        ok = 1;
    } else if (x->start_granted > 0) {
        x->start_granted--;
        ok = 1;
    } else if (down(st) || (x->start_asked && now_ms - x->start_asked >= st->timeout_ms)) {
        /* Redis does not answer: the mirror's wave, this process's own. */
        ok = lr_shared_start_take(&x->mirror, now_ms, LR_SHARED_START_CAP);
    } else if (!x->start_asked) {
        x->start_asked = now_ms;
        x->p.start_want = START_ASK;
        kick(st);
    }
    pthread_mutex_unlock(&st->mu);
    return ok;
}

int lr_redis_start_room(lr_redis_ep *x, int64_t now_ms)
{
    lr_redis *st = x->st;
    pthread_mutex_lock(&st->mu);
    x->active_ms = now_ms;
    /* Room: granted requests in hand, or none asked for and the wave as
     * Redis last told it not full (the call then asks); an answer on its
     * way wakes the I/O thread. */
    int room = atomic_load(&x->mirror.start_over) || x->start_granted > 0 || down(st) ||
               (x->start_asked ? now_ms - x->start_asked >= st->timeout_ms
                               : lr_shared_start_room(&x->mirror, now_ms, LR_SHARED_START_CAP));
    pthread_mutex_unlock(&st->mu);
    return room;
}

void lr_redis_start_over(lr_redis_ep *x)
{
    pthread_mutex_lock(&x->st->mu);
    atomic_store(&x->mirror.start_over, 1);
    if (!down(x->st)) {
        x->p.start_over = 1;
        kick(x->st);
    }
    pthread_mutex_unlock(&x->st->mu);
}

int64_t lr_redis_hold_ms(lr_redis_ep *x, int64_t now_ms)
{
    pthread_mutex_lock(&x->st->mu);
    int64_t w = 0;
    if (!down(x->st)) {
        if (!x->synced)
            w = x->made_ms + x->st->timeout_ms - now_ms;
        if (x->probe_asked)
            w = max64(w, x->probe_asked + x->st->timeout_ms - now_ms);
    }
    pthread_mutex_unlock(&x->st->mu);
    return w > 0 ? w : 0;
}

int lr_redis_transition(lr_redis_ep *x, char *why, size_t len, int64_t *down_ms)
{
    lr_redis *st = x->st;
    int t = 0;
    pthread_mutex_lock(&st->mu);
    if (st->state == ST_DOWN && !st->reported_down) {
        st->reported_down = 1;
        snprintf(why, len, "%s", st->why);
        t = 1;
    } else if (st->state == ST_UP && st->reported_down) {
        st->reported_down = 0;
        *down_ms = st->down_ms;
        t = 2;
    }
    pthread_mutex_unlock(&st->mu);
    return t;
}
