/* The Redis store's thread and its life (shared_redis.h): rounds for the
 * endpoints due, falling back to the local budget when Redis is out of
 * reach (down, slower than its timeout, refusing the password or writes)
 * and reconnecting in the background; opening and closing the store. */
#include "shared_redis.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "condvar.h"

/* Redis is out of reach: each mirror is this process's own budget from now
 * on, starting where its slices end (what it was granted, it has). */
static void went_down(lr_redis *st, const char *why, int64_t now)
{
    if (st->state != ST_DOWN) {
        st->state = ST_DOWN;
        st->down_at = now;
        snprintf(st->why, sizeof st->why, "%s", why);
    }
    for (size_t i = 0; i < st->n_eps; i++) {
        lr_redis_ep *x = st->eps[i];
        for (int b = 0; b < 2; b++) {
            lease *L = &x->b[b];
            _Atomic int64_t *tat = b == LR_REDIS_REQ ? &x->mirror.req_tat_us : &x->mirror.tok_tat_us;
            lr_shared_raise(tat, L->known_end);
            memset(L, 0, sizeof *L);
        }
        memset(&x->p, 0, sizeof x->p);
        x->synced = 1;
        x->probe_asked = 0;
        x->start_asked = 0;
        x->other_until = 0;
        if (x->probe == PROBE_MINE)
            x->probe = PROBE_NONE;
        lr_redis_fix_probe(x, now / 1000);
    }
}

static void went_up(lr_redis *st, int64_t now)
{
    if (st->state == ST_DOWN)
        st->down_ms = (now - st->down_at) / 1000;
    st->state = ST_UP;
}

static void news(lr_redis *st)
{
    if (st->wake)
        st->wake(st->wake_arg);
}

static void *store_main(void *arg)
{
    lr_redis *st = arg;
    ask *asks = NULL;
    redisReply **replies = NULL;
    size_t cap = 0;
    char why[sizeof st->why];
    pthread_mutex_lock(&st->mu);
    while (!st->stop) {
        int64_t now = mono_us();
        if (!st->ctx) {
            if (now < st->retry_at) {
                st->kick = 0;
                lr_cond_wait_until(&st->cv, &st->mu, (st->retry_at + 999) / 1000);
                continue;
            }
            pthread_mutex_unlock(&st->mu);
            int rc = lr_redis_dial(st, why, sizeof why);
            pthread_mutex_lock(&st->mu);
            now = mono_us();
            if (rc != 0) {
                went_down(st, why, now);
                st->retry_at = now + st->backoff_ms * 1000;
                st->backoff_ms = min64(2 * st->backoff_ms, RETRY_MAX_MS);
                news(st);
                continue;
            }
            /* Up once a round goes through (a Redis that takes the
             * connection and refuses the script's writes, out of memory, is
             * not up); with no endpoint yet there is nothing more to try. */
            if (st->n_eps == 0) {
                went_up(st, now);
                news(st);
            }
        }
        /* The endpoints due now, and when the next one is. */
        if (cap < st->n_eps) {
            size_t c = st->n_eps + 8;
            ask *a = realloc(asks, c * sizeof *a);
            redisReply **r = a ? realloc(replies, c * sizeof *r) : NULL;
            if (a)
                asks = a;
            if (r)
                replies = r;
            if (a && r)
                cap = c;
        }
        size_t n = 0;
        int64_t next = now + 1000000;
        for (size_t i = 0; i < st->n_eps; i++) {
            int64_t d = lr_redis_due_at(st->eps[i], now);
            if (d <= now && n < cap)
                lr_redis_prepare(st, st->eps[i], &asks[n++], now);
            else
                next = min64(next, d);
        }
        if (n == 0) {
            if (!st->kick)
                lr_cond_wait_until(&st->cv, &st->mu, (next + 999) / 1000);
            st->kick = 0;
            continue;
        }
        st->kick = 0;
        pthread_mutex_unlock(&st->mu);
        int rc = lr_redis_exchange(st, asks, n, replies, why, sizeof why);
        pthread_mutex_lock(&st->mu);
        now = mono_us();
        if (rc == 0) {
            for (size_t i = 0; i < n; i++) {
                lr_redis_install(asks[i].x, &asks[i], replies[i]);
                freeReplyObject(replies[i]);
            }
            if (st->state != ST_UP)
                went_up(st, now);
            st->redial_now = 1;
            st->backoff_ms = RETRY_MIN_MS;
        } else {
            /* What this round carried is lost: Redis may or may not have
             * applied it, and this process goes on alone. */
            redisFree(st->ctx);
            st->ctx = NULL;
            went_down(st, why, now);
            /* Redialled at once after a round that went well (a Redis slow
             * for a moment is back within a round trip), else backing off
             * (one that keeps failing rounds is not hammered). */
            st->retry_at = st->redial_now ? now : now + st->backoff_ms * 1000;
            if (!st->redial_now)
                st->backoff_ms = min64(2 * st->backoff_ms, RETRY_MAX_MS);
            st->redial_now = 0;
        }
        news(st);
    }
    /* Closing: what this process did last still reaches the others (its
     * last failures may be the ones that open the breaker for them). */
    size_t n = 0;
    for (size_t i = 0; st->ctx && i < st->n_eps && i < cap; i++)
        if (lr_redis_has_news(st->eps[i]))
            lr_redis_prepare(st, st->eps[i], &asks[n++], mono_us());
    pthread_mutex_unlock(&st->mu);
    if (n > 0 && lr_redis_exchange(st, asks, n, replies, why, sizeof why) == 0)
        for (size_t i = 0; i < n; i++)
            freeReplyObject(replies[i]);
    if (st->ctx)
        redisFree(st->ctx);
    st->ctx = NULL;
    free(asks);
    free(replies);
    return NULL;
}

/* ---- the store ---------------------------------------------------------------------- */

static void discard(lr_redis *st)
{
    if (st->password) {
        /* Gone from this process's memory, not only freed. */
        volatile char *p = st->password;
        while (*p)
            *p++ = '\0';
    }
    free(st->password);
    free(st->user);
    for (size_t i = 0; i < st->n_eps; i++)
        free(st->eps[i]);
    free(st->eps);
    free(st);
}

int lr_redis_open(const char *spec, lr_redis **out, char *err, size_t len)
{
    *out = NULL;
    lr_redis *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, len, "shared: out of memory");
        return -1;
    }
    if (lr_redis_parse(spec, st, err, len) != 0) {
        discard(st);
        return -1;
    }
    /* This store's name in Redis: unique enough among every process that
     * may hold the probe's lease. */
    uint64_t z = (uint64_t)mono_us() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)st;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    snprintf(st->owner, sizeof st->owner, "%d-%016llx", (int)getpid(),
             (unsigned long long)(z ^ (z >> 31)));
    st->state = ST_CONNECTING;
    st->backoff_ms = RETRY_MIN_MS;
    pthread_mutex_init(&st->mu, NULL);
    if (lr_cond_init(&st->cv) != 0) {
        pthread_mutex_destroy(&st->mu);
        discard(st);
        snprintf(err, len, "shared: cannot make a condition variable");
        return -1;
    }
    /* The store's thread takes no signals: they are the host's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&st->thread, NULL, store_main, st);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&st->cv);
        pthread_mutex_destroy(&st->mu);
        discard(st);
        snprintf(err, len, "shared: cannot start the Redis store's thread: %s", strerror(rc));
        return -1;
    }
    *out = st;
    return 0;
}

void lr_redis_on_news(lr_redis *st, void (*wake)(void *), void *arg)
{
    pthread_mutex_lock(&st->mu);
    st->wake = wake;
    st->wake_arg = arg;
    pthread_mutex_unlock(&st->mu);
}

void lr_redis_close(lr_redis *st)
{
    if (!st)
        return;
    pthread_mutex_lock(&st->mu);
    st->stop = 1;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->thread, NULL);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    discard(st);
}
