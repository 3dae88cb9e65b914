/* The rate limiter's shared arithmetic (ratelimit.c admits calls,
 * ratelimit_learn.c learns from responses): the rates in force, what
 * processes sharing an endpoint say, a call's tokens. Private to those two
 * files; static inline so that each has its own copy. */
#ifndef LR_RATELIMIT_H
#define LR_RATELIMIT_H

#include "endpoint.h"

#include <math.h>
#pragma GCC visibility push(hidden)

/* Pace at this share of a limit: at exactly the limit, a call that comes a
 * little early (a timer, the network) lands in the window of the one a
 * limit ago and is refused; 2 % leaves that room. */
#define PACE 0.98

/* How long a call waits for the answers on their way (asking) if none
 * comes back sooner: it is looked at again as each attempt ends. */
#define ASK_WAIT_MS 1000

/* The slow-down (lr_budget_slow_down): a 429 naming no wait cuts the
 * request rate to SLOW_CUT of what the server was serving; each success
 * gives back 1/SLOW_RECOVER of it; it never goes below SLOW_MIN_RPM. */
#define SLOW_CUT 0.5
#define SLOW_RECOVER 32.0
#define SLOW_MIN_RPM 1.0

/* A learned limit as a pace, per minute: read per minute, as OpenAI states
 * it, or for a limit stated per window, per the window's length as far as
 * its resets show it (none until one does: see asking). */
static inline double learned_rate(const lr_stated *s)
{
    if (!s->per_window)
        return (double)s->limit;
    return s->window_ms > 0 ? (double)s->limit * 60000.0 / (double)s->window_ms : 0.0;
}

/* Whether a server that states its window says a call of `need` fits it
 * now: its count, not a pace, then lets the call go. */
static inline int room(const lr_stated *s, double need)
{
    return s->per_window && s->remaining >= 0 && (double)s->remaining >= need;
}

static inline int is_shared(const lr_endpoint *ep)
{
    return ep->sh != &ep->local;
}

/* ---- what processes sharing the endpoint say of its limits (shared.h) ---------- */

/* What another process (or this one) said lately (0: nothing). */
static inline int64_t said(const lr_endpoint *ep, int i, int64_t now)
{
    return is_shared(ep) ? lr_shared_fresh(&ep->sh->said[i], now, lr_shared_said_age_s(i)) : 0;
}

/* Say v for every process: a claim (the stricter wins) or the latest. */
static inline void say(lr_endpoint *ep, int i, int64_t now, int64_t v, int claim)
{
    if (!is_shared(ep) || v <= 0)
        return;
    if (ep->rd)
        lr_redis_say(ep->rd, i, now, v, claim);
    else if (claim)
        lr_shared_claim(&ep->sh->said[i], now, v);
    else
        lr_shared_say(&ep->sh->said[i], now, v);
}

/* A configured limit in force: this engine's, or a stricter one another
 * process on the endpoint configured (docs/shared.md: the stricter wins). */
static inline double configured(const lr_endpoint *ep, int i, int64_t own)
{
    int64_t other = is_shared(ep) ? said(ep, i, lr_mono_ms()) : 0;
    return (double)(other > 0 && (own <= 0 || other < own) ? other : own);
}

/* A learned limit's pace: this engine's, or, when its own responses have
 * said nothing yet, what another process's did. */
static inline double learned(const lr_endpoint *ep, const lr_stated *s, int i)
{
    if (s->limit > 0 || !is_shared(ep))
        return learned_rate(s);
    return (double)said(ep, i, lr_mono_ms());
}

/* The slow-down's rate: the latest any process sharing the endpoint set. */
static inline double slow_rate(const lr_endpoint *ep)
{
    int64_t milli = is_shared(ep) ? said(ep, LR_SAID_SLOW_RPM, lr_mono_ms()) : 0;
    return milli > 0 ? (double)milli / 1000.0 : ep->slow_rpm;
}

/* The request rate in force, per minute (0: none): the configured rpm,
 * else the learned limit unless the server's window has room, and at most
 * the slow-down's. */
static inline double req_rate(const lr_endpoint *ep)
{
    double cfg = configured(ep, LR_SAID_CFG_RPM, ep->rpm);
    double r = cfg > 0 ? cfg : room(&ep->req, 1.0) ? 0.0 : learned(ep, &ep->req, LR_SAID_LEARNED_RPM);
    double slow = slow_rate(ep);
    if (slow > 0 && (r <= 0 || slow < r))
        r = slow;
    return r;
}

/* Likewise for tokens, for a call of `need` (no slow-down: a 429 naming no
 * wait does not say which limit it hit, and requests carry the tokens). */
static inline double tok_rate(const lr_endpoint *ep, double need)
{
    double cfg = configured(ep, LR_SAID_CFG_TPM, ep->tpm);
    return cfg > 0 ? cfg : room(&ep->tok, need) ? 0.0 : learned(ep, &ep->tok, LR_SAID_LEARNED_TPM);
}

/* A per-minute request limit as a paced rate per millisecond. */
static inline double per_ms(double per_minute)
{
    return per_minute * PACE / 60000.0;
}

/* The token rate for calls of `need` tokens: a provider counting a second's
 * worth (tpm / 60) per second admits floor(L / need) such calls in any
 * second, so they go (L - need) / s apart (at least half the rate, for calls
 * near a second's worth): evenly spaced at the full rate, one call more than
 * fits would land in some second (measured: ~1 % refused). */
static inline double tokens_per_ms(double per_minute, double need)
{
    double second = per_minute / 60.0;
    double rate = second - need;
    if (rate < second / 2)
        rate = second / 2;
    return rate / 1000.0;
}

/* A request's and a call's tokens' cost in microseconds of their bucket. */
static inline int64_t req_cost_us(double rpm)
{
    return rpm > 0 ? (int64_t)llround(1000.0 / per_ms(rpm)) : 0;
}

static inline int64_t tok_cost_us(double tpm, double need)
{
    return tpm > 0 && need > 0 ? (int64_t)llround(need * 1000.0 / tokens_per_ms(tpm, need)) : 0;
}

/* ---- a call's tokens ------------------------------------------------------- */

/* The host's estimated_tokens, else the core's rule (estimate.c); parsed
 * only for calls that meet a token limit. */
static inline int64_t estimate(llmretry_call *c)
{
    if (c->est_tokens >= 0)
        return c->est_tokens;
    if (c->o.estimated_tokens > 0)
        return c->est_tokens = c->o.estimated_tokens;
    return c->est_tokens = lr_estimate_tokens(c->url, c->body, c->o.body_len, NULL, NULL,
                                              &c->completion_limit);
}

/* How long until `need` fits what the server said remains (`remaining` as of
 * `at`): with a known rate, the time the rate takes to bring the missing
 * part back, at most until the reset; without one, until the reset (the
 * moment its window is full again: longer than one call needs, but all
 * that is known). 0 when it fits or the reset has passed. */
static inline int64_t hold(double need, int64_t remaining, int64_t at, double rate_per_ms,
                    int64_t reset_at, int64_t now)
{
    if (reset_at <= now)
        return 0;
    double left = (double)remaining + (double)(now - at) * rate_per_ms;
    if (left >= need)
        return 0;
    int64_t until_reset = reset_at - now;
    if (rate_per_ms <= 0)
        return until_reset;
    int64_t w = (int64_t)floor((need - left) / rate_per_ms);
    return w < until_reset ? w : until_reset;
}

/* hold() for what the server said of one limit (0 when it said nothing),
 * refilled at `rate_per_ms` if it gives back evenly what was used (a
 * window's room comes back as what it holds leaves: at its reset). */
static inline int64_t held(const lr_stated *s, double need, double rate_per_ms, int64_t now)
{
    if (s->remaining < 0)
        return 0;
    return hold(need, s->remaining, s->at, s->per_window ? 0.0 : rate_per_ms, s->reset_at, now);
}

/* The tokens c is charged, when any limit counts them (else 0). */
static inline double tokens_of(const lr_endpoint *ep, llmretry_call *c)
{
    int64_t now = is_shared(ep) ? lr_mono_ms() : 0;
    return ep->tpm > 0 || ep->tok.limit > 0 || ep->tok.remaining >= 0 ||
           said(ep, LR_SAID_CFG_TPM, now) > 0 || said(ep, LR_SAID_LEARNED_TPM, now) > 0
           ? (double)estimate(c) : 0.0;
}

#pragma GCC visibility pop
#endif
