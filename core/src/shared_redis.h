/* The Redis store of shared budgets, its parts (shared.h; how it works:
 * shared_redis.c):
 *
 *   shared_redis.c         the I/O thread's side: each endpoint's mirror and
 *                          what a call does to it, queued for Redis
 *   shared_redis_lease.c   the rate buckets' slices this process leases
 *   shared_redis_script.c  the script, and a round: what an endpoint tells
 *                          Redis, and Redis's answer made the mirror again
 *   shared_redis_conn.c    the URL, connecting, and sending a round
 *   shared_redis_store.c   the store's thread: rounds, falling back to the
 *                          local budget when Redis is out of reach and
 *                          coming back; opening and closing the store
 *
 * The state below is the store's: its mutex (lr_redis.mu) guards it, but for
 * what the store thread alone touches. */
#ifndef LR_SHARED_REDIS_H
#define LR_SHARED_REDIS_H

#include "shared.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <time.h>
#pragma GCC visibility push(hidden)

#define FAIL_OPEN_MS 50                 /* the longest a call waits for Redis (default) */
#define SYNC_MS 50                      /* an active endpoint's numbers are read this often */
#define ACTIVE_MS 2000                  /* ... while it was used this recently */
#define LEASE_US 20000                  /* a slice: this much of a bucket's time */
#define HORIZON_US 50000                /* booked ahead of now for no call yet, at most */
#define WAITING_HORIZON_US 1000000      /* ... and for a call that waits (its place in line) */
#define GRACE_MAX_US 10000              /* a unit may go this late after its place */
#define PREFETCH_MS 100                 /* a bucket used this recently gets its next slice early */
#define RETRY_MIN_MS 50                 /* reconnecting: first after this, */
#define RETRY_MAX_MS 500                /* doubling up to this */
#define START_ASK 4                     /* slow start: requests of the first wave asked at once */

enum { ST_CONNECTING, ST_UP, ST_DOWN };
enum { PROBE_NONE, PROBE_MINE, PROBE_USED };

/* The script's answer (shared_redis_script.c), by index. */
enum { R_WQ, R_WR, R_BF, R_BSET, R_BOPEN, R_PROBE, R_PROBE_REL, R_PAUSE, R_REQ_N, R_REQ_REL,
       R_TOK_N, R_TOK_REL, R_SAID, R_START_GRANTED = R_SAID + 2 * LR_SAID_COUNT, R_START_WAVE,
       R_START_OVER, R_COUNT };

/* ---- the state ---------------------------------------------------------------- */

/* A slice of a bucket this process holds: [pos, end) on this process's
 * monotonic clock in microseconds; empty when pos >= end. */
typedef struct slice {
    int64_t pos, end;
} slice;

typedef struct lease {
    slice s[2];                         /* the current one, and the next */
    int64_t cost, tol;                  /* the latest call's unit and tolerance */
    int64_t want_since;                 /* a call waits for a slice, unanswered since (0: none) */
    int64_t ask_at;                     /* Redis said the bucket has no room before then */
    int ask_waiting;                    /* ... for a waiting call's booking */
    int64_t used_at;                    /* the last take (0: never) */
    int local;                          /* the last take was from the mirror's own bucket */
    int64_t give_back;                  /* bucket time (us) to give back at the next round */
    int64_t known_end;                  /* where the shared bucket stood at the last answer */
    int asking;                         /* a request is on its way */
} lease;

/* What the I/O thread did since the last round, for Redis. */
typedef struct pending {
    int64_t requests, retries;
    int success, reopen, release, want_probe;
    int64_t failures;
    int64_t pause_until;                /* ms, this process's clock; 0: none */
    int64_t said[LR_SAID_COUNT];        /* values said (0: none) */
    int said_news;                      /* a said value changed: send it now */
    int start_want, start_over;         /* the slow start: requests asked, an answer came */
} pending;

struct lr_redis_ep {
    lr_redis *st;
    uint64_t id;
    char key[40];
    lr_shared_ep mirror;                /* what the I/O thread reads */
    pending p;                          /* the store's mutex guards the rest */
    int threshold;                      /* the breaker's options in force */
    int64_t cooldown_ms, lease_ms;
    lease b[2];                         /* LR_REDIS_REQ, LR_REDIS_TOK */
    int synced;                         /* read from Redis once (or Redis is down) */
    int64_t made_ms, active_ms, synced_ms;
    int probe;                          /* PROBE_*: the half-open probe's lease */
    int64_t mine_until;                 /* PROBE_MINE: when it lapses */
    int64_t other_until;                /* another process holds it until then */
    int64_t probe_asked;                /* asked Redis for it, no answer yet (0: not) */
    int start_granted;                  /* slow start: requests Redis granted, not yet sent */
    int64_t start_asked;                /* ... asked for more, no answer yet (0: not) */
};

struct lr_redis {
    char host[256];
    int port, db;
    int timeout_ms;                     /* slower than this is unavailable */
    char *user, *password;              /* NULL: none; the password goes to AUTH only */
    char name[320];                     /* the URL, "***" for the password */
    char owner[40];                     /* this store in Redis (the probe's holder) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int stop, kick;
    void (*wake)(void *);
    void *wake_arg;
    lr_redis_ep **eps;
    size_t n_eps, cap_eps;
    int state;                          /* ST_* */
    char why[512];                      /* why it is down */
    int64_t down_at, down_ms;           /* since when; how long the last outage was */
    int reported_down;                  /* I/O thread: the engine said it is down */
    /* The store thread's own. */
    redisContext *ctx;
    char sha[48];
    int64_t retry_at;
    int64_t backoff_ms;
    int redial_now;                     /* the last round went well: redial a failed one at once */
};

static inline int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static inline int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* One endpoint's request in a round: the script's ARGV, and what was asked. */
#define N_ARGS 30
typedef struct ask {
    lr_redis_ep *x;
    char args[N_ARGS][48];
    pending p;                          /* what this round tells Redis */
    int64_t units[2], cost[2], horizon[2]; /* slices asked for */
    int64_t at_us;                      /* when Redis answered, on this process's clock */
} ask;

static inline void kick(lr_redis *st)
{
    st->kick = 1;
    pthread_cond_signal(&st->cv);
}

static inline int down(const lr_redis *st)
{
    return st->state == ST_DOWN;
}

/* shared_redis.c: the mirror's probe lease from what this process knows of
 * Redis's. */
void lr_redis_fix_probe(lr_redis_ep *x, int64_t now_ms);

/* shared_redis_lease.c: when the store may ask for a slice again; bucket
 * time held from `now` on. */
int64_t lr_redis_ask_after(const lease *L);
int64_t lr_redis_held_us(const lease *L, int64_t now);

/* shared_redis_script.c: the script; whether x has news for Redis; when it
 * needs a round (us; <= now: now); a round's request for x; Redis's answer
 * made x's mirror. */
extern const char lr_redis_script[];
int lr_redis_has_news(const lr_redis_ep *x);
int64_t lr_redis_due_at(const lr_redis_ep *x, int64_t now);
void lr_redis_prepare(lr_redis *st, lr_redis_ep *x, ask *a, int64_t now);
void lr_redis_install(lr_redis_ep *x, const ask *a, const redisReply *r);

/* shared_redis_conn.c: a "redis://..." value into st (0, or -1 and err);
 * connect, log in, select, load the script (0, or -1 and why); a round's
 * asks sent at once and their answers read (0, or -1 and why), each within
 * the store's timeout in all, however the server sends. */
int lr_redis_parse(const char *spec, lr_redis *st, char *err, size_t len);
int lr_redis_dial(lr_redis *st, char *why, size_t len);
int lr_redis_exchange(lr_redis *st, ask *asks, size_t n, redisReply **out, char *why, size_t len);

#pragma GCC visibility pop
#endif
