/* The rate buckets' slices a process leases from Redis (shared_redis.c
 * says how; shared_redis.h): a call takes one unit from what is held, or
 * waits for the store to lease more, or, Redis not answering in time, takes
 * from the mirror's own bucket. */
#include "shared_redis.h"

/* When the store may ask for a slice again: after what Redis said, unless
 * it said it of a slice for calls yet to come and a call now waits (a
 * waiting call books further ahead). */
int64_t lr_redis_ask_after(const lease *L)
{
    return L->want_since && !L->ask_waiting ? 0 : L->ask_at;
}

/* Bucket time this process holds from `now` on. */
int64_t lr_redis_held_us(const lease *L, int64_t now)
{
    int64_t t = 0;
    for (int i = 0; i < 2; i++)
        if (L->s[i].end > max64(L->s[i].pos, now))
            t += L->s[i].end - max64(L->s[i].pos, now);
    return t;
}

/* One unit of `cost` from the slices held: 0 (taken if `take`), or the
 * microseconds to wait. */
static int64_t from_slices(lr_redis_ep *x, int bucket, int64_t now, int64_t cost, int64_t tol,
                           int take)
{
    lr_redis *st = x->st;
    lease *L = &x->b[bucket];
    _Atomic int64_t *tat = bucket == LR_REDIS_REQ ? &x->mirror.req_tat_us : &x->mirror.tok_tat_us;
    L->cost = cost;
    L->tol = tol;
    if (take)
        L->used_at = now;
    x->active_ms = now / 1000;
    /* Redis is down, or has not answered for as long as a call may wait:
     * this process's own bucket, from where the shared one stood when Redis
     * last said (it never holds a call long: Redis books no further ahead
     * than the horizon and a slice). */
    if (down(st) || (L->want_since && now - max64(L->want_since, lr_redis_ask_after(L)) >= st->timeout_ms * 1000)) {
        lr_shared_raise(tat, L->known_end);
        L->local = take;
        return take ? lr_shared_gcra_take(tat, now, cost, 1, tol) : lr_shared_gcra_wait(tat, now, tol);
    }
    if (take)
        L->local = 0;
    int64_t grace = min64(cost, GRACE_MAX_US);
    for (;;) {
        slice *s = &L->s[0];
        if (s->end <= s->pos)
            break;
        int64_t start = max64(s->pos, now - grace);
        if (s->end - start >= cost) {
            if (start - tol > now)
                return start - tol - now;
            if (take) {
                s->pos = start + cost;
                if (lr_redis_held_us(L, now) < LEASE_US / 2 && !L->asking && !L->s[1].end)
                    kick(st);                           /* the next slice, before this runs out */
            }
            return 0;
        }
        /* Too little left for this unit: its future goes back to the others. */
        int64_t left = s->end - max64(s->pos, now);
        if (left > 0)
            L->give_back += left;
        L->s[0] = L->s[1];
        L->s[1] = (slice){ 0, 0 };
    }
    if (!L->want_since) {
        L->want_since = now;
        kick(st);
    }
    /* The store's answer wakes the I/O thread; until then, at most until
     * Redis said it has room, or until the wait is up. */
    int64_t after = lr_redis_ask_after(L);
    int64_t w = after > now ? after - now : max64(L->want_since, after) + st->timeout_ms * 1000 - now;
    return w > 1000 ? w : 1000;
}

int64_t lr_redis_take(lr_redis_ep *x, int bucket, int64_t now_us, int64_t cost_us,
                      int64_t tolerance_us)
{
    pthread_mutex_lock(&x->st->mu);
    int64_t w = from_slices(x, bucket, now_us, cost_us, tolerance_us, 1);
    pthread_mutex_unlock(&x->st->mu);
    return w;
}

int64_t lr_redis_wait(lr_redis_ep *x, int bucket, int64_t now_us, int64_t cost_us,
                      int64_t tolerance_us)
{
    pthread_mutex_lock(&x->st->mu);
    int local = x->b[bucket].local;
    int64_t w = from_slices(x, bucket, now_us, cost_us, tolerance_us, 0);
    x->b[bucket].local = local;
    pthread_mutex_unlock(&x->st->mu);
    return w;
}

void lr_redis_untake(lr_redis_ep *x, int bucket, int64_t cost_us)
{
    pthread_mutex_lock(&x->st->mu);
    lease *L = &x->b[bucket];
    if (L->local)
        lr_shared_gcra_adjust(bucket == LR_REDIS_REQ ? &x->mirror.req_tat_us : &x->mirror.tok_tat_us,
                              -cost_us);
    else
        L->s[0].pos -= cost_us;
    pthread_mutex_unlock(&x->st->mu);
}

void lr_redis_adjust(lr_redis_ep *x, int bucket, int64_t delta_us)
{
    pthread_mutex_lock(&x->st->mu);
    if (down(x->st))
        lr_shared_gcra_adjust(bucket == LR_REDIS_REQ ? &x->mirror.req_tat_us : &x->mirror.tok_tat_us,
                              delta_us);
    else
        x->b[bucket].give_back -= delta_us;
    pthread_mutex_unlock(&x->st->mu);
}
