/* The numbers of one endpoint's budgets and the lock-free rules that change
 * them (shared.h). The same code serves an endpoint kept in one process and
 * one kept in a store every process maps: only where the struct lives
 * differs. */
#include "shared.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lr_shared_ep_init(lr_shared_ep *ep, uint64_t id)
{
    memset(ep, 0, sizeof *ep);
    atomic_store(&ep->id, id);
}

/* ---- GCRA buckets ------------------------------------------------------------ */

int64_t lr_shared_gcra_take(_Atomic int64_t *tat_us, int64_t now_us, int64_t interval_us,
                            int64_t cost, int64_t tolerance_us)
{
    int64_t old = atomic_load(tat_us);
    for (;;) {
        /* An idle bucket's tat lies in the past: it starts from now (full),
         * never from a backlog of unused time. */
        int64_t start = old > now_us ? old : now_us;
        if (start - tolerance_us > now_us)
            return start - tolerance_us - now_us;
        /* A call larger than the tolerance still goes once the bucket is
         * full, leaving it in debt: it is never starved. */
        if (atomic_compare_exchange_weak(tat_us, &old, start + interval_us * cost))
            return 0;
    }
}

int64_t lr_shared_gcra_wait(_Atomic int64_t *tat_us, int64_t now_us, int64_t tolerance_us)
{
    int64_t w = atomic_load(tat_us) - tolerance_us - now_us;
    return w > 0 ? w : 0;
}

/* Under a millisecond of the engine's clock (shared.h). */
#define CLOCK_SLACK_US 999

static int64_t ms_up(int64_t us)
{
    return (us + 999) / 1000;
}

int64_t lr_shared_gcra_take_ms(_Atomic int64_t *tat_us, int64_t now_ms, int64_t interval_us,
                               int64_t cost, int64_t tolerance_us)
{
    return ms_up(lr_shared_gcra_take(tat_us, now_ms * 1000, interval_us, cost,
                                     tolerance_us + CLOCK_SLACK_US));
}

int64_t lr_shared_gcra_wait_ms(_Atomic int64_t *tat_us, int64_t now_ms, int64_t tolerance_us)
{
    return ms_up(lr_shared_gcra_wait(tat_us, now_ms * 1000, tolerance_us + CLOCK_SLACK_US));
}

void lr_shared_raise(_Atomic int64_t *v, int64_t to)
{
    int64_t old = atomic_load(v);
    while (old < to && !atomic_compare_exchange_weak(v, &old, to))
        ;
}

void lr_shared_gcra_adjust(_Atomic int64_t *tat_us, int64_t delta_us)
{
    atomic_fetch_add(tat_us, delta_us);
}

/* ---- what processes say of the limits ---------------------------------------- */

#define SAID_SECOND(w) ((w) >> 32)
#define SAID_VALUE(w) ((w) & 0xffffffffLL)

static int64_t pack_said(int64_t now_ms, int64_t value)
{
    if (value < 1)
        value = 1;
    if (value > 0xffffffffLL)
        value = 0xffffffffLL;
    return ((now_ms / 1000) << 32) | value;
}

int64_t lr_shared_said_age_s(int index)
{
    return index == LR_SAID_CFG_RPM || index == LR_SAID_CFG_TPM || index == LR_SAID_SLOW_RPM
         ? LR_SHARED_CLAIM_S : LR_SHARED_LEARNED_S;
}

int64_t lr_shared_fresh(_Atomic int64_t *w, int64_t now_ms, int64_t max_age_s)
{
    int64_t v = atomic_load(w);
    if (v == 0 || now_ms / 1000 - SAID_SECOND(v) >= max_age_s)
        return 0;
    return SAID_VALUE(v);
}

void lr_shared_claim(_Atomic int64_t *w, int64_t now_ms, int64_t value)
{
    int64_t next = pack_said(now_ms, value);
    int64_t old = atomic_load(w);
    for (;;) {
        /* A stricter claim still standing is not replaced: the provider's
         * limit is at most what the strictest process says it is. Said
         * again in the same second, a claim changes nothing (one load). */
        int64_t held = lr_shared_fresh(w, now_ms, LR_SHARED_CLAIM_S);
        if (old == next || (held > 0 && held < SAID_VALUE(next)))
            return;
        if (atomic_compare_exchange_weak(w, &old, next))
            return;
    }
}

void lr_shared_say(_Atomic int64_t *w, int64_t now_ms, int64_t value)
{
    atomic_store(w, pack_said(now_ms, value));
}

/* ---- the slow start ------------------------------------------------------------ */

int lr_shared_start_take(lr_shared_ep *ep, int64_t now_ms, int64_t cap)
{
    if (atomic_load(&ep->start_over))
        return 1;
    int64_t second = now_ms / 1000, old = atomic_load(&ep->start_wave);
    for (;;) {
        /* A wave nobody answered for LR_SHARED_WAVE_S (its senders may have
         * died with its calls) gives way to a new one. */
        int64_t next = old != 0 && second - SAID_SECOND(old) < LR_SHARED_WAVE_S
                     ? old + 1 : (second << 32) | 1;
        if (SAID_VALUE(next) > cap)
            return 0;
        if (atomic_compare_exchange_weak(&ep->start_wave, &old, next))
            return 1;
    }
}

int lr_shared_start_room(lr_shared_ep *ep, int64_t now_ms, int64_t cap)
{
    int64_t w = atomic_load(&ep->start_wave);
    return atomic_load(&ep->start_over) || w == 0 ||
           now_ms / 1000 - SAID_SECOND(w) >= LR_SHARED_WAVE_S || SAID_VALUE(w) < cap;
}


/* ---- the retry budget ------------------------------------------------------- */

#define SECOND_OF(w) ((w) >> 32)
#define COUNT_OF(w) ((w) & 0xffffffffLL)

/* Count one in `word`'s slot for `second`: a slot still counting an older
 * second starts again at 1. */
static void count_in(_Atomic int64_t *word, int64_t second)
{
    int64_t old = atomic_load(word);
    for (;;) {
        int64_t next = SECOND_OF(old) == second ? old + 1 : (second << 32) | 1;
        if (atomic_compare_exchange_weak(word, &old, next))
            return;
    }
}

static int64_t window_sum(_Atomic int64_t *words, int64_t second)
{
    int64_t sum = 0;
    for (int i = 0; i < LR_SHARED_BUDGET_SLOTS; i++) {
        int64_t w = atomic_load(&words[i]);
        if (second - SECOND_OF(w) < LR_SHARED_BUDGET_SLOTS && SECOND_OF(w) <= second)
            sum += COUNT_OF(w);
    }
    return sum;
}

void lr_shared_budget_request(lr_shared_ep *ep, int64_t now_ms)
{
    int64_t second = now_ms / 1000;
    count_in(&ep->budget_requests[second % LR_SHARED_BUDGET_SLOTS], second);
}

void lr_shared_budget_window(lr_shared_ep *ep, int64_t now_ms, int64_t *requests,
                             int64_t *retries)
{
    int64_t second = now_ms / 1000;
    *requests = window_sum(ep->budget_requests, second);
    *retries = window_sum(ep->budget_retries, second);
}

int lr_shared_budget_take(lr_shared_ep *ep, int64_t now_ms, double ratio, int64_t min)
{
    int64_t requests, retries, second = now_ms / 1000;
    lr_shared_budget_window(ep, now_ms, &requests, &retries);
    /* Check, then count: processes racing here may each pass once, an
     * overshoot bounded by how many retry at the same instant. */
    if ((double)(retries + 1) > ratio * (double)requests + (double)min)
        return 0;
    count_in(&ep->budget_retries[second % LR_SHARED_BUDGET_SLOTS], second);
    return 1;
}

/* ---- the breaker -------------------------------------------------------------- */

lr_shared_breaker lr_shared_breaker_state(lr_shared_ep *ep, int64_t now_ms)
{
    int64_t until = atomic_load(&ep->breaker_open_until);
    if (until == 0)
        return LR_SHARED_CLOSED;
    return now_ms < until ? LR_SHARED_OPEN : LR_SHARED_HALF_OPEN;
}

int lr_shared_breaker_admits(lr_shared_ep *ep, int64_t now_ms, int64_t lease_ms, int *probe)
{
    *probe = 0;
    switch (lr_shared_breaker_state(ep, now_ms)) {
    case LR_SHARED_CLOSED:
        return 1;
    case LR_SHARED_OPEN:
        return 0;
    case LR_SHARED_HALF_OPEN:
        break;
    }
    /* One probe at a time across every process: the probe holds a lease,
     * so a process that dies while probing blocks the others only until it
     * lapses. */
    int64_t lease = atomic_load(&ep->breaker_probe_until);
    if (lease > now_ms)
        return 0;
    if (!atomic_compare_exchange_strong(&ep->breaker_probe_until, &lease, now_ms + lease_ms))
        return 0;
    *probe = 1;
    return 1;
}

int lr_shared_breaker_failed(lr_shared_ep *ep, int64_t now_ms, int threshold,
                             int64_t cooldown_ms, int probe)
{
    if (probe) {                        /* the probe failed: open again */
        atomic_store(&ep->breaker_open_until, now_ms + cooldown_ms);
        atomic_store(&ep->breaker_probe_until, 0);
        return 1;
    }
    int64_t n = atomic_fetch_add(&ep->breaker_failures, 1) + 1;
    if (threshold <= 0 || n < threshold)
        return 0;
    int64_t closed = 0;
    return atomic_compare_exchange_strong(&ep->breaker_open_until, &closed,
                                          now_ms + cooldown_ms);
}

void lr_shared_breaker_succeeded(lr_shared_ep *ep)
{
    atomic_store(&ep->breaker_failures, 0);
    atomic_store(&ep->breaker_open_until, 0);
    atomic_store(&ep->breaker_probe_until, 0);
}

/* ---- the stores, by scheme ------------------------------------------------------ */

struct lr_shared_store {
    lr_shm *shm;                        /* one of the two */
    lr_redis *redis;
    char name[64];                      /* "shm:NAME" */
};

int lr_shared_store_open(const char *spec, lr_shared_store **out, char *err, size_t len)
{
    *out = NULL;
    lr_shared_store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, len, "shared: out of memory");
        return -1;
    }
    int rc;
    if (strncmp(spec, "shm:", 4) == 0) {
        rc = lr_shm_open(spec, &s->shm, err, len);
        snprintf(s->name, sizeof s->name, "%s", spec);
    } else if (strncmp(spec, "redis://", 8) == 0 || strncmp(spec, "rediss://", 9) == 0) {
        rc = lr_redis_open(spec, &s->redis, err, len);
    } else {
        /* Only the scheme is repeated: the rest may hold a password. */
        size_t n = strcspn(spec, ":/@");
        snprintf(err, len, "shared must be \"shm:NAME\" or "
                 "\"redis://[:password@]host:port[/db]\" (got a value starting \"%.*s\")",
                 (int)(n > 16 ? 16 : n), spec);
        rc = -1;
    }
    if (rc != 0) {
        free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void lr_shared_store_close(lr_shared_store *s)
{
    if (!s)
        return;
    if (s->shm)
        lr_shm_close(s->shm);
    if (s->redis)
        lr_redis_close(s->redis);
    free(s);
}

lr_shared_ep *lr_shared_store_endpoint(lr_shared_store *s, uint64_t id)
{
    if (s->shm)
        return lr_shm_endpoint(s->shm, id);
    lr_redis_ep *x = lr_redis_endpoint(s->redis, id);
    return x ? lr_redis_mirror(x) : NULL;
}

lr_redis_ep *lr_shared_store_redis(lr_shared_store *s, uint64_t id)
{
    return s->redis ? lr_redis_endpoint(s->redis, id) : NULL;
}

const char *lr_shared_store_path(const lr_shared_store *s)
{
    return s->shm ? lr_shm_path(s->shm) : NULL;
}

const char *lr_shared_store_name(const lr_shared_store *s)
{
    return s->redis ? lr_redis_name(s->redis) : s->name;
}

void lr_shared_store_on_news(lr_shared_store *s, void (*wake)(void *), void *arg)
{
    if (s->redis)
        lr_redis_on_news(s->redis, wake, arg);
}
