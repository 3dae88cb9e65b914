/* An endpoint's health (docs/reliability.md): its retry budget and its circuit
 * breaker, asked by admission before each attempt and told by attempt.c
 * what each attempt came to. Both are per endpoint (endpoint.h), shared by
 * every call, thread, batch and pool of the engine. I/O thread only.
 *
 * Retry budget (as Finagle's and Envoy's): over a rolling 10 s, retries
 * may be at most ratio x first attempts + min. A dead endpoint with many
 * calls in flight then sees about (1 + ratio) requests per call instead
 * of 1 + max_retries each; past it a call gives up at once. Retries the
 * server timed (Retry-After, x-ratelimit-reset) are not counted: it asked
 * for them, and the rate budget paces them; nor is any retry after a 429
 * (attempt.c): the server asked to slow down, and the rate budget does.
 *
 * Circuit breaker (off unless breaker_failures > 0): that many transient
 * failures in a row open it; for breaker_cooldown_ms attempts fail at once
 * as circuit_open, no request sent (a call with a fallback moves on to
 * it); then one probe goes through, the others still fail at once; its
 * success closes the breaker, its failure opens it for another cooldown,
 * and a probe that ends without a verdict (cancelled) lets the next call
 * probe. Any other answer (a 400, a 401) shows the endpoint up: it resets
 * the count and closes a half-open breaker.
 *
 * The numbers live in the endpoint's lr_shared_ep (shared.c): its own, or,
 * with the engine option `shared`, a slot every process on the key uses,
 * so the budget counts their retries together and one probe goes at a time
 * across all of them (a lease, which lapses if its process dies). With a
 * Redis store, every change goes through lr_redis_* (shared_redis.c), which
 * apply the same rules to the endpoint's mirror and queue them for Redis;
 * the half-open probe waits for Redis to name its holder (50 ms at most). */
#include "endpoint.h"

#include <stdio.h>
#include <string.h>

/* How long a probe may hold the breaker's lease: its attempt's timeout (at
 * least a second). A probe still running after it lets another process
 * probe too; a process that died while probing blocks nobody past it. */
static int64_t probe_lease_ms(const llmretry_call *c)
{
    return c->o.timeout_ms > 1000 ? c->o.timeout_ms : 1000;
}

int lr_health_admits(llmretry_engine *e, llmretry_call *c, int64_t now, char *why, size_t len)
{
    lr_endpoint *ep = lr_endpoint_of(e, c);
    if (!ep || ep->health.threshold <= 0 || c->breaker_probe)
        return 1;
    int probe = 0;
    int ok = ep->rd ? lr_redis_breaker_admits(ep->rd, now, probe_lease_ms(c), &probe)
                    : lr_shared_breaker_admits(ep->sh, now, probe_lease_ms(c), &probe);
    if (ok < 0)
        return -1;                              /* Redis has not said who probes yet */
    if (ok) {
        if (probe) {
            c->breaker_probe = 1;               /* the one probe */
            lr_endpoint_publish(e, ep);
        }
        return 1;
    }
    long long failures = (long long)atomic_load(&ep->sh->breaker_failures);
    if (lr_shared_breaker_state(ep->sh, now) == LR_SHARED_OPEN)
        snprintf(why, len, "circuit open after %lld consecutive failures (a probe may go in %lld ms)",
                 failures, (long long)(atomic_load(&ep->sh->breaker_open_until) - now));
    else
        snprintf(why, len, "circuit open after %lld consecutive failures (a probe is in flight)",
                 failures);
    ep->short_circuited++;
    lr_endpoint_publish(e, ep);
    return 0;
}

void lr_health_attempt_started(llmretry_engine *e, llmretry_call *c)
{
    lr_endpoint *ep = lr_endpoint_of(e, c);
    if (!ep)
        return;
    if (c->attempt == c->target_first_attempt) {
        if (ep->rd)
            lr_redis_budget_request(ep->rd, lr_mono_ms());
        else
            lr_shared_budget_request(ep->sh, lr_mono_ms());
        ep->requests++;
    } else {
        ep->retries++;
    }
    lr_endpoint_publish(e, ep);
}

int lr_health_retry_allowed(llmretry_engine *e, llmretry_call *c, int64_t now)
{
    lr_endpoint *ep = c->endpoint;
    if (!ep || (ep->rd ? lr_redis_budget_take(ep->rd, now, ep->health.budget_ratio,
                                              ep->health.budget_min)
                       : lr_shared_budget_take(ep->sh, now, ep->health.budget_ratio,
                                               ep->health.budget_min)))
        return 1;
    ep->retries_refused++;
    lr_endpoint_publish(e, ep);
    return 0;
}

/* Timeouts, network failures, 408, 429 and 5xx: what says the endpoint
 * itself is in trouble. An attempt the call's own deadline cut short says
 * nothing of it. */
static int transient(const llmretry_call *c, const llmretry_failure *f)
{
    switch (f->kind) {
    case LLMRETRY_ERR_TIMEOUT: return !c->cut_by_deadline;
    case LLMRETRY_ERR_NETWORK: return !f->fatal;
    case LLMRETRY_ERR_HTTP_STATUS:
        return f->status == 408 || f->status == 429 || f->status >= 500;
    default: return 0;
    }
}

/* A probe that ends without a verdict gives its lease back: the next call
 * may probe. */
static void release_probe(lr_endpoint *ep, llmretry_call *c)
{
    if (c->breaker_probe) {
        c->breaker_probe = 0;
        if (ep->rd)
            lr_redis_probe_release(ep->rd);
        else
            atomic_store(&ep->sh->breaker_probe_until, 0);
    }
}

static void breaker_succeeded(lr_endpoint *ep)
{
    if (ep->rd)
        lr_redis_breaker_succeeded(ep->rd);
    else
        lr_shared_breaker_succeeded(ep->sh);
}

void lr_health_attempt_ended(llmretry_engine *e, llmretry_call *c, const llmretry_failure *f)
{
    lr_endpoint *ep = c->endpoint;
    if (!ep)
        return;
    int was_probe = c->breaker_probe;
    if (!f) {
        breaker_succeeded(ep);                  /* a response: the endpoint is up */
    } else if (f->kind == LLMRETRY_ERR_CANCELLED) {
        release_probe(ep, c);
    } else if (transient(c, f)) {
        int64_t now = lr_mono_ms();
        if (ep->rd ? lr_redis_breaker_failed(ep->rd, now, ep->health.threshold,
                                             ep->health.cooldown_ms, was_probe)
                   : lr_shared_breaker_failed(ep->sh, now, ep->health.threshold,
                                              ep->health.cooldown_ms, was_probe))
            ep->breaker_opened++;
    } else if (f->kind == LLMRETRY_ERR_HTTP_STATUS) {
        breaker_succeeded(ep);                  /* a 4xx: the endpoint answers */
    } else {
        release_probe(ep, c);
    }
    c->breaker_probe = 0;
    lr_endpoint_publish(e, ep);
}

void lr_health_detached(llmretry_call *c)
{
    if (c->endpoint)
        release_probe(c->endpoint, c);
}
