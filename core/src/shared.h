/* Shared budgets (docs/shared.md): an endpoint's rate buckets, holds,
 * pause, retry-budget window and breaker, kept where every process using
 * the same key can reach them instead of in one process's memory.
 *
 *   shared.c       the numbers of one endpoint and the rules that change
 *                  them (GCRA buckets, counters, the breaker's probe lease):
 *                  lock-free, the same code for a private and a shared copy
 *   shared_shm.c   a store of such endpoints in a file in /dev/shm, mapped
 *                  by every process on the host that names it
 *
 * Every field is an atomic int64: a process that dies mid-call holds no
 * lock, and what it leased (a breaker probe) expires. Times are on
 * CLOCK_MONOTONIC, in milliseconds, which every process on a host shares. */
#ifndef LR_SHARED_H
#define LR_SHARED_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* The retry budget's window: this many one-second slots. */
#define LR_SHARED_BUDGET_SLOTS 10

typedef struct lr_shared_ep {
    _Atomic uint64_t id;                 /* which endpoint (0: a free slot) */
    /* GCRA: the theoretical arrival time of the next request / token, in
     * microseconds; a bucket admits when now >= tat - tolerance. */
    _Atomic int64_t req_tat_us, tok_tat_us;
    _Atomic int64_t learned_rpm, learned_tpm;
    /* What the server last said is left, as of *_at (0: not known), and
     * when its window is full again (0: not known). All zeros is an
     * endpoint nothing is known of, so a fresh slot needs no set-up. */
    _Atomic int64_t remaining_req, remaining_req_at, reset_req_at;
    _Atomic int64_t remaining_tok, remaining_tok_at, reset_tok_at;
    _Atomic int64_t paused_until;        /* a server-named wait */
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

/* Raise *v to at least `to` (a pause's end: the latest wins). */
void lr_shared_raise(_Atomic int64_t *v, int64_t to);

/* Give back (negative) or charge more (positive) microseconds of a bucket:
 * a token estimate corrected by the response's usage. */
void lr_shared_gcra_adjust(_Atomic int64_t *tat_us, int64_t delta_us);

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

/* A store of endpoints shared between processes. */
typedef struct lr_shared_store lr_shared_store;

/* Open (creating on first use) the store a `shared` option names:
 * "shm:NAME". 0, or -1 with a message naming the file or the value (never
 * a password) in err. */
int lr_shared_store_open(const char *spec, lr_shared_store **out, char *err, size_t len);
void lr_shared_store_close(lr_shared_store *s);

/* The endpoint `id` (never 0) in the store, claimed on first use; NULL when
 * every slot holds another endpoint. */
lr_shared_ep *lr_shared_store_endpoint(lr_shared_store *s, uint64_t id);

/* The file a "shm:NAME" store lives in, for messages and tests. */
const char *lr_shared_store_path(const lr_shared_store *s);

#endif
