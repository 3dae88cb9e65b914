/* Shared budgets (docs/shared.md): an endpoint's rate buckets, holds,
 * pause, retry-budget window and breaker, kept where every process using
 * the same key can reach them instead of in one process's memory.
 *
 *   shared.c       the numbers of one endpoint and the rules that change
 *                  them (GCRA buckets, counters, the breaker's probe lease):
 *                  lock-free, the same code for a private and a shared copy;
 *                  and the `shared` option's stores, by scheme
 *   shared_shm.c   "shm:NAME": a store of such endpoints in a file in
 *                  /dev/shm, mapped by every process on the host naming it
 *   shared_redis*.c "redis://...": the numbers kept in Redis for every process
 *                  on every machine using it. The I/O thread never waits on
 *                  Redis: it works on a local copy of each endpoint (the
 *                  mirror) and on leased slices of the buckets, which a
 *                  thread of the store keeps in step with Redis
 *
 * Every field is an atomic int64: a process that dies mid-call holds no
 * lock, and what it leased (a breaker probe) expires. Times are on
 * CLOCK_MONOTONIC, in milliseconds, which every process on a host shares
 * (Redis keeps its own clock's; the store converts). */
#ifndef LR_SHARED_H
#define LR_SHARED_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#pragma GCC visibility push(hidden)

/* The retry budget's window: this many one-second slots. */
#define LR_SHARED_BUDGET_SLOTS 10

typedef struct lr_shared_ep {
    _Atomic uint64_t id;                 /* which endpoint (0: a free slot) */
    /* GCRA: the theoretical arrival time of the next request / token, in
     * microseconds; a bucket admits when now >= tat - tolerance. */
    _Atomic int64_t req_tat_us, tok_tat_us;
    /* What one process states of the endpoint's limits, for all of them,
     * each packed with the second it was said ((second << 32) | value, 0:
     * nothing), indexed by LR_SAID_*: the configured rpm and tpm (the
     * smallest any process claimed lately wins: lr_shared_claim), the
     * limits learned from x-ratelimit-limit-* and the slow-down's request
     * rate in thousandths a minute (the latest wins: lr_shared_say). */
    _Atomic int64_t said[5];
    /* The slow start: requests sent before anything was known of the
     * limit, packed with the second their wave began; and 1 once a
     * response said more (or a limit was configured). */
    _Atomic int64_t start_wave, start_over;
    /* Layout 1 had 8 fields here that nothing wrote (always 0, which the
     * 7 above read as nothing said): files made before stay valid. */
    int64_t unused;
    /* A server-named wait: a 429's, or a hold from what a response said
     * remains (x-ratelimit-remaining-* / -reset-*): the latest end wins. */
    _Atomic int64_t paused_until;
    /* The retry budget: per one-second slot, its first attempts and its
     * retries, each packed with the second it counts ((second << 32) |
     * count) so that moving a slot to a new second and counting in it is
     * one compare-and-swap. */
    _Atomic int64_t budget_requests[LR_SHARED_BUDGET_SLOTS];
    _Atomic int64_t budget_retries[LR_SHARED_BUDGET_SLOTS];
    /* The breaker: consecutive transient failures, open until, and the
     * half-open probe's lease (0: none; else when it lapses). */
    _Atomic int64_t breaker_failures, breaker_open_until, breaker_probe_until;
} lr_shared_ep;

enum { LR_SAID_CFG_RPM, LR_SAID_CFG_TPM, LR_SAID_LEARNED_RPM, LR_SAID_LEARNED_TPM,
       LR_SAID_SLOW_RPM, LR_SAID_COUNT };

/* How long a said value holds unless said again (s): a claim of the
 * configured limits is made again at every admission of its process, a
 * learned limit at every response, the slow-down at every 429 and every
 * success that grows it back. */
#define LR_SHARED_CLAIM_S 10
#define LR_SHARED_LEARNED_S 60
/* The slow start: at most this many requests before the first answer says
 * more, a new wave after LR_SHARED_WAVE_S without one (the processes that
 * sent the first may have died). */
#define LR_SHARED_START_CAP 16
#define LR_SHARED_WAVE_S 10

/* Nothing known: all zeros, and the id. */
void lr_shared_ep_init(lr_shared_ep *ep, uint64_t id);

/* GCRA admission of `cost` units at `interval_us` each, allowing a burst of
 * `tolerance_us`: 0 and the units taken when the bucket admits now, else
 * how many microseconds until it would (nothing taken). One
 * compare-and-swap when uncontended. */
int64_t lr_shared_gcra_take(_Atomic int64_t *tat_us, int64_t now_us, int64_t interval_us,
                            int64_t cost, int64_t tolerance_us);

/* Microseconds until the bucket would admit a call (0: now), taking
 * nothing: what to wait for before trying lr_shared_gcra_take. */
int64_t lr_shared_gcra_wait(_Atomic int64_t *tat_us, int64_t now_us, int64_t tolerance_us);

/* The same on the engine's clock, which counts whole milliseconds: a call
 * may go when less than a millisecond of its wait is left, taking from the
 * bucket's future as the per-process bucket does (ratelimit.c's floor). A
 * wait rounded up to the next millisecond, and the late wake-up it gives,
 * would otherwise be lost at every call: at 50 a second a 20.4 ms interval
 * became 21 ms, 95 % of the pace. The bucket's time still advances by the
 * exact interval, so no second sees more than the rate allows. Results in
 * milliseconds (rounded up). */
int64_t lr_shared_gcra_take_ms(_Atomic int64_t *tat_us, int64_t now_ms, int64_t interval_us,
                               int64_t cost, int64_t tolerance_us);
int64_t lr_shared_gcra_wait_ms(_Atomic int64_t *tat_us, int64_t now_ms, int64_t tolerance_us);

/* Raise *v to at least `to` (a pause's end: the latest wins). */
void lr_shared_raise(_Atomic int64_t *v, int64_t to);

/* Give back (negative) or charge more (positive) microseconds of a bucket:
 * a token estimate corrected by the response's usage. */
void lr_shared_gcra_adjust(_Atomic int64_t *tat_us, int64_t delta_us);

/* Said values (LR_SAID_*). claim: the stricter wins: `value` replaces a
 * larger one, or one not said again for LR_SHARED_CLAIM_S; say: the
 * latest wins. fresh: the value said within max_age_s, else 0. Values are
 * clamped to 1 .. 2^32 - 1. */
void lr_shared_claim(_Atomic int64_t *w, int64_t now_ms, int64_t value);
void lr_shared_say(_Atomic int64_t *w, int64_t now_ms, int64_t value);
int64_t lr_shared_fresh(_Atomic int64_t *w, int64_t now_ms, int64_t max_age_s);
int64_t lr_shared_said_age_s(int index);

/* The slow start: 1 and one request counted in the wave when it has room
 * (or the start is over), 0 when `cap` requests of this wave are out. */
int lr_shared_start_take(lr_shared_ep *ep, int64_t now_ms, int64_t cap);
/* Whether lr_shared_start_take would admit now (taking nothing). */
int lr_shared_start_room(lr_shared_ep *ep, int64_t now_ms, int64_t cap);

/* The retry budget: count a first attempt; take a retry when retries stay
 * <= ratio * requests + min over the window (1 and counted, else 0); the
 * window's sums. */
void lr_shared_budget_request(lr_shared_ep *ep, int64_t now_ms);
int lr_shared_budget_take(lr_shared_ep *ep, int64_t now_ms, double ratio, int64_t min);
void lr_shared_budget_window(lr_shared_ep *ep, int64_t now_ms, int64_t *requests,
                             int64_t *retries);

/* The breaker, across processes. admits: 1 when a call may go (closed, or
 * it won the half-open probe's lease for `lease_ms`), 0 when it must fail
 * fast. A transient failure counts (and opens it at `threshold` for
 * `cooldown_ms`: 1 when this call opened it); any other answer closes it. */
typedef enum lr_shared_breaker { LR_SHARED_CLOSED, LR_SHARED_OPEN, LR_SHARED_HALF_OPEN }
    lr_shared_breaker;
lr_shared_breaker lr_shared_breaker_state(lr_shared_ep *ep, int64_t now_ms);
int lr_shared_breaker_admits(lr_shared_ep *ep, int64_t now_ms, int64_t lease_ms, int *probe);
int lr_shared_breaker_failed(lr_shared_ep *ep, int64_t now_ms, int threshold,
                             int64_t cooldown_ms, int probe);
void lr_shared_breaker_succeeded(lr_shared_ep *ep);

/* A store of endpoints shared between processes: "shm:NAME" or
 * "redis://[[user]:password@]host[:port][/db][?timeout_ms=N]". */
typedef struct lr_shared_store lr_shared_store;

/* Open (creating on first use) the store a `shared` option names. 0, or -1
 * with a message naming the option and the file or the value (never a
 * password) in err. A Redis store connects in the background: opening it
 * never waits for Redis. */
int lr_shared_store_open(const char *spec, lr_shared_store **out, char *err, size_t len);
void lr_shared_store_close(lr_shared_store *s);

/* The endpoint `id` (never 0) in the store, claimed on first use; NULL when
 * every slot holds another endpoint. For a Redis store: the endpoint's
 * mirror, which the I/O thread reads as it would a slot; its changes go
 * through the lr_redis_* calls below (lr_shared_store_redis). */
lr_shared_ep *lr_shared_store_endpoint(lr_shared_store *s, uint64_t id);

/* The file a "shm:NAME" store lives in (NULL for Redis), for messages and
 * tests. */
const char *lr_shared_store_path(const lr_shared_store *s);

/* The option's value as messages and events may show it: a Redis URL's
 * password as "***". */
const char *lr_shared_store_name(const lr_shared_store *s);

/* ---- the shm store (shared_shm.c): "shm:NAME" ------------------------------- */

typedef struct lr_shm lr_shm;
int lr_shm_open(const char *spec, lr_shm **out, char *err, size_t len);
void lr_shm_close(lr_shm *s);
lr_shared_ep *lr_shm_endpoint(lr_shm *s, uint64_t id);
const char *lr_shm_path(const lr_shm *s);

/* ---- the Redis store (shared_redis*.c; shared_redis.h lists its parts) ------ */

typedef struct lr_redis lr_redis;
typedef struct lr_redis_ep lr_redis_ep;

/* Parse a "redis://..." value and start its store thread. */
int lr_redis_open(const char *spec, lr_redis **out, char *err, size_t len);
void lr_redis_close(lr_redis *r);
lr_redis_ep *lr_redis_endpoint(lr_redis *r, uint64_t id);
lr_shared_ep *lr_redis_mirror(lr_redis_ep *x);
void lr_redis_on_news(lr_redis *r, void (*wake)(void *), void *arg);
const char *lr_redis_name(const lr_redis *r);

/* The Redis endpoint of `id` in a store (NULL unless it is a Redis store). */
lr_redis_ep *lr_shared_store_redis(lr_shared_store *s, uint64_t id);

/* Called from the store's thread when news arrives that a waiting call may
 * need (a lease, the first sync, Redis going down): the engine wakes its
 * I/O thread. Set before the I/O thread starts. */
void lr_shared_store_on_news(lr_shared_store *s, void (*wake)(void *), void *arg);

/* What the I/O thread does to a Redis endpoint. Each applies the rule of
 * shared.c to the mirror at once (no round trip) and queues it for Redis;
 * while Redis is unavailable the mirror alone is the budget (this
 * process's own, as without `shared`). */
enum { LR_REDIS_REQ = 0, LR_REDIS_TOK = 1 };

/* GCRA through leases: 0 and one unit of `cost_us` taken from the slices
 * this process holds; else the microseconds to wait (a slice is asked for
 * when none is held; a call waits at most 50 ms for Redis before the
 * process's own bucket admits it). wait: the same, taking nothing. */
int64_t lr_redis_take(lr_redis_ep *x, int bucket, int64_t now_us, int64_t cost_us,
                      int64_t tolerance_us);
int64_t lr_redis_wait(lr_redis_ep *x, int bucket, int64_t now_us, int64_t cost_us,
                      int64_t tolerance_us);
/* Undo the take just made (its call waits for the other bucket). */
void lr_redis_untake(lr_redis_ep *x, int bucket, int64_t cost_us);
/* A bucket's charge corrected (lr_shared_gcra_adjust). */
void lr_redis_adjust(lr_redis_ep *x, int bucket, int64_t delta_us);
void lr_redis_raise_pause(lr_redis_ep *x, int64_t until_ms);
void lr_redis_budget_request(lr_redis_ep *x, int64_t now_ms);
int lr_redis_budget_take(lr_redis_ep *x, int64_t now_ms, double ratio, int64_t min);
/* The breaker: as lr_shared_breaker_admits, or -1 when this process has
 * asked Redis for the half-open probe's lease and has no answer yet (the
 * call waits: lr_redis_hold_ms). */
int lr_redis_breaker_admits(lr_redis_ep *x, int64_t now_ms, int64_t lease_ms, int *probe);
int lr_redis_breaker_failed(lr_redis_ep *x, int64_t now_ms, int threshold,
                            int64_t cooldown_ms, int probe);
void lr_redis_breaker_succeeded(lr_redis_ep *x);
void lr_redis_probe_release(lr_redis_ep *x);
/* How long a call must wait for Redis before admission may decide (ms, 0:
 * it may now): the endpoint's first read of the shared state, or an answer
 * about the probe's lease; never more than 50 ms. */
int64_t lr_redis_hold_ms(lr_redis_ep *x, int64_t now_ms);
/* A change of Redis's availability not yet reported on this engine: 1 it
 * became unavailable (why: the reason), 2 it is back (down_ms: for how
 * long it was not); 0 none. The transition counts as reported. */
int lr_redis_transition(lr_redis_ep *x, char *why, size_t len, int64_t *down_ms);
const char *lr_redis_ep_name(const lr_redis_ep *x);
/* A said value (LR_SAID_*: a claim when `claim`, else the latest), on the
 * mirror at once and to Redis with the next round. */
void lr_redis_say(lr_redis_ep *x, int index, int64_t now_ms, int64_t value, int claim);
/* The slow start through Redis: a request of the first wave is granted by
 * Redis (asked for a few at a time; the call waits the store's timeout at
 * most, then the mirror decides alone). take: 1 and one granted request
 * spent, else 0; room: whether take may admit now or should ask; over: an
 * answer came back, for every process. */
int lr_redis_start_take(lr_redis_ep *x, int64_t now_ms);
int lr_redis_start_room(lr_redis_ep *x, int64_t now_ms);
void lr_redis_start_over(lr_redis_ep *x);

#pragma GCC visibility pop
#endif
