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
 * the count and closes a half-open breaker. */
#include "endpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the retry budget (pure) ------------------------------------------------ */

void lr_retry_budget_init(lr_retry_budget *b)
{
    memset(b, 0, sizeof *b);
    for (int i = 0; i < LR_BUDGET_SLOTS; i++)
        b->second[i] = -1;
}

/* The slot counting second `s`, emptied when it last counted another. */
static int slot(lr_retry_budget *b, int64_t now_ms)
{
    int64_t s = now_ms / 1000;
    int i = (int)(s % LR_BUDGET_SLOTS);
    if (b->second[i] != s) {
        b->second[i] = s;
        b->requests[i] = b->retries[i] = 0;
    }
    return i;
}

void lr_retry_budget_window(const lr_retry_budget *b, int64_t now_ms, int64_t *requests,
                            int64_t *retries)
{
    int64_t s = now_ms / 1000;
    *requests = *retries = 0;
    for (int i = 0; i < LR_BUDGET_SLOTS; i++)
        if (b->second[i] > s - LR_BUDGET_SLOTS && b->second[i] <= s) {
            *requests += b->requests[i];
            *retries += b->retries[i];
        }
}

void lr_retry_budget_request(lr_retry_budget *b, int64_t now_ms)
{
    b->requests[slot(b, now_ms)]++;
}

int lr_retry_budget_take(lr_retry_budget *b, int64_t now_ms)
{
    int64_t requests, retries;
    lr_retry_budget_window(b, now_ms, &requests, &retries);
    if ((double)(retries + 1) > b->ratio * (double)requests + (double)b->min)
        return 0;
    b->retries[slot(b, now_ms)]++;
    return 1;
}

/* ---- the engine's side --------------------------------------------------------- */

static void breaker_open(lr_endpoint *ep, int64_t now)
{
    lr_breaker *br = &ep->breaker;
    br->state = LR_BREAKER_OPEN;
    br->open_until = lr_time_add(now, br->cooldown_ms);
    br->probe = NULL;
    ep->breaker_opened++;
}

int lr_health_admits(llmretry_engine *e, llmretry_call *c, int64_t now, char *why, size_t len)
{
    lr_endpoint *ep = lr_endpoint_of(e, c);
    if (!ep)
        return 1;
    lr_breaker *br = &ep->breaker;
    if (br->threshold <= 0) {
        br->state = LR_BREAKER_CLOSED;      /* turned off: forget it was open */
        br->probe = NULL;
        return 1;
    }
    if (br->state == LR_BREAKER_OPEN && now >= br->open_until)
        br->state = LR_BREAKER_HALF_OPEN;
    if (br->state == LR_BREAKER_CLOSED || br->probe == c)
        return 1;
    if (br->state == LR_BREAKER_HALF_OPEN && !br->probe) {
        br->probe = c;                      /* the one probe */
        lr_endpoint_publish(e, ep);
        return 1;
    }
    if (br->state == LR_BREAKER_OPEN)
        snprintf(why, len, "circuit open after %d consecutive failures (a probe may go in %lld ms)",
                 br->failures, (long long)(br->open_until - now));
    else
        snprintf(why, len, "circuit open after %d consecutive failures (a probe is in flight)",
                 br->failures);
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
        lr_retry_budget_request(&ep->budget, lr_mono_ms());
        ep->requests++;
    } else {
        ep->retries++;
    }
    lr_endpoint_publish(e, ep);
}

int lr_health_retry_allowed(llmretry_engine *e, llmretry_call *c, int64_t now)
{
    lr_endpoint *ep = c->endpoint;
    if (!ep || lr_retry_budget_take(&ep->budget, now))
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

void lr_health_attempt_ended(llmretry_engine *e, llmretry_call *c, const llmretry_failure *f)
{
    lr_endpoint *ep = c->endpoint;
    if (!ep)
        return;
    lr_breaker *br = &ep->breaker;
    int was_probe = br->probe == c;
    if (was_probe)
        br->probe = NULL;
    if (!f) {
        /* A response: the endpoint is up. */
        br->failures = 0;
        br->state = LR_BREAKER_CLOSED;
    } else if (f->kind == LLMRETRY_ERR_CANCELLED) {
        /* No verdict: the next call may probe. */
    } else if (transient(c, f)) {
        br->failures++;
        if (br->threshold > 0 && (was_probe || (br->state == LR_BREAKER_CLOSED &&
                                                br->failures >= br->threshold)))
            breaker_open(ep, lr_mono_ms());
    } else if (f->kind == LLMRETRY_ERR_HTTP_STATUS) {
        br->failures = 0;           /* a 4xx: the endpoint answers */
        br->state = LR_BREAKER_CLOSED;
    }
    lr_endpoint_publish(e, ep);
}

void lr_health_detached(llmretry_call *c)
{
    if (c->endpoint && c->endpoint->breaker.probe == c)
        c->endpoint->breaker.probe = NULL;
}
