/* Client-side rate limits (docs/policies.md): one budget per endpoint (its URL
 * and API key), shared by every call of the engine, that admission asks
 * before each attempt starts.
 *
 * - Configured limits (options rpm, tpm) are buckets paced evenly that
 *   hold one call's worth: a request each 60000 / rpm ms (at 98 %: PACE),
 *   and a call of T tokens T / (L - T) s after the tokens before it, L
 *   being a second's worth (tpm / 60). Providers enforce a per-minute
 *   limit in shorter slices (a 600/min limit may refuse the 11th request
 *   of a second): a bucket of one second's worth (docs/policies.md) would send
 *   two seconds' worth in the first second and have them refused, and
 *   even spacing at exactly the limit lets one call more than fits land in
 *   some second. No call is starved: it waits for its own tokens only.
 * - Learned limits: every response's x-ratelimit-limit-* stand in for rpm /
 *   tpm when none is configured, and x-ratelimit-remaining-* hold a call
 *   that does not fit what is left for as long as the rate takes to bring
 *   the rest back, at most until -reset-* (when the window has room again).
 *   A limit is read per minute, as OpenAI states it, unless the server's
 *   own remaining and reset show a shorter window (10 a second stated as
 *   10; classify): then what it says remains lets calls go at once, none
 *   goes before its reset once that is used, and the limit paces per the
 *   window's length as its resets show it. Learned pacing is never slower
 *   than what the server says it allows.
 * - A 429 naming a wait pauses the endpoint for every call of the engine.
 * - A 429 naming none slows the endpoint down (lr_budget_slow_down): a
 *   request rate learned as TCP learns a window, halved from the rate the
 *   server was serving at, grown back by each success; refusals in a row
 *   pause the endpoint, for longer each time.
 * - A call is charged its estimated tokens (prompt characters / 4, plus
 *   max_tokens or max_completion_tokens, else 256 (estimate.c),
 *   none for an embeddings call; or the host's estimated_tokens) and the
 *   charge is corrected by the response's usage the way providers count:
 *   the prompt's real tokens plus the completion's limit when the body set
 *   one, else its real tokens.
 *
 * An endpoint with none of these costs one lookup per call. Calls waiting
 * for budget wait in the endpoint's queue, first come first served, with
 * their deadline armed (they fail at it). I/O thread only. */
#include "endpoint.h"

#include <curl/curl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
static double learned_rate(const lr_stated *s)
{
    if (!s->per_window)
        return (double)s->limit;
    return s->window_ms > 0 ? (double)s->limit * 60000.0 / (double)s->window_ms : 0.0;
}

/* Whether a server that states its window says a call of `need` fits it
 * now: its count, not a pace, then lets the call go. */
static int room(const lr_stated *s, double need)
{
    return s->per_window && s->remaining >= 0 && (double)s->remaining >= need;
}

static int is_shared(const lr_endpoint *ep)
{
    return ep->sh != &ep->local;
}

/* ---- what processes sharing the endpoint say of its limits (shared.h) ---------- */

/* What another process (or this one) said lately (0: nothing). */
static int64_t said(const lr_endpoint *ep, int i, int64_t now)
{
    return is_shared(ep) ? lr_shared_fresh(&ep->sh->said[i], now, lr_shared_said_age_s(i)) : 0;
}

/* Say v for every process: a claim (the stricter wins) or the latest. */
static void say(lr_endpoint *ep, int i, int64_t now, int64_t v, int claim)
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
static double configured(const lr_endpoint *ep, int i, int64_t own)
{
    int64_t other = is_shared(ep) ? said(ep, i, lr_mono_ms()) : 0;
    return (double)(other > 0 && (own <= 0 || other < own) ? other : own);
}

/* A learned limit's pace: this engine's, or, when its own responses have
 * said nothing yet, what another process's did. */
static double learned(const lr_endpoint *ep, const lr_stated *s, int i)
{
    if (s->limit > 0 || !is_shared(ep))
        return learned_rate(s);
    return (double)said(ep, i, lr_mono_ms());
}

/* The slow-down's rate: the latest any process sharing the endpoint set. */
static double slow_rate(const lr_endpoint *ep)
{
    int64_t milli = is_shared(ep) ? said(ep, LR_SAID_SLOW_RPM, lr_mono_ms()) : 0;
    return milli > 0 ? (double)milli / 1000.0 : ep->slow_rpm;
}

/* The request rate in force, per minute (0: none): the configured rpm,
 * else the learned limit unless the server's window has room, and at most
 * the slow-down's. */
static double req_rate(const lr_endpoint *ep)
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
static double tok_rate(const lr_endpoint *ep, double need)
{
    double cfg = configured(ep, LR_SAID_CFG_TPM, ep->tpm);
    return cfg > 0 ? cfg : room(&ep->tok, need) ? 0.0 : learned(ep, &ep->tok, LR_SAID_LEARNED_TPM);
}

/* The shared slow start applies: nothing is known of the limit (no rpm or
 * tpm configured here or by another process, nothing learned) and no
 * response has said more yet. */
static int starting(const lr_endpoint *ep, int64_t now)
{
    return is_shared(ep) && !atomic_load(&ep->sh->start_over) && ep->rpm == 0 && ep->tpm == 0 &&
           ep->req.limit == 0 && ep->tok.limit == 0 && said(ep, LR_SAID_CFG_RPM, now) == 0 &&
           said(ep, LR_SAID_CFG_TPM, now) == 0 && said(ep, LR_SAID_LEARNED_RPM, now) == 0 &&
           said(ep, LR_SAID_LEARNED_TPM, now) == 0;
}

int64_t lr_budget_rpm(const lr_endpoint *ep)
{
    return (int64_t)ceil(req_rate(ep));
}

/* Nothing to pace by: no limit configured, learned or slowed to, no pause,
 * nothing the server said remains. */
static int unlimited(const lr_endpoint *ep, int64_t now)
{
    if (is_shared(ep) && (starting(ep, now) || req_rate(ep) + tok_rate(ep, 0.0) > 0))
        return 0;                       /* the slow start, another process's limits */
    return ep->rpm == 0 && ep->tpm == 0 && ep->req.limit == 0 && ep->tok.limit == 0 &&
           ep->slow_rpm == 0 && now >= ep->paused_until && ep->req.remaining < 0 &&
           ep->tok.remaining < 0 && now >= atomic_load(&ep->sh->paused_until);
}

/* A per-minute request limit as a paced rate per millisecond. */
static double per_ms(double per_minute)
{
    return per_minute * PACE / 60000.0;
}

/* The token rate for calls of `need` tokens: a provider counting a second's
 * worth (tpm / 60) per second admits floor(L / need) such calls in any
 * second, so they go (L - need) / s apart (at least half the rate, for calls
 * near a second's worth): evenly spaced at the full rate, one call more than
 * fits would land in some second (measured: ~1 % refused). */
static double tokens_per_ms(double per_minute, double need)
{
    double second = per_minute / 60.0;
    double rate = second - need;
    if (rate < second / 2)
        rate = second / 2;
    return rate / 1000.0;
}

/* ---- buckets shared between processes (engine option `shared`) ------------------ */

/* With a shared store the buckets are GCRA timestamps every process on the
 * key takes from (shared.c), in place of this engine's levels: the same
 * pace (PACE, the request bucket's slack, a call in debt for its tokens),
 * kept where all of them see it. A Redis store's are taken from the slices
 * this process leased of them (lr_redis_take: no round trip here). */
static double tokens_of(const lr_endpoint *ep, llmretry_call *c);

/* A request's and a call's tokens' cost in microseconds of their bucket. */
static int64_t req_cost_us(double rpm)
{
    return rpm > 0 ? (int64_t)llround(1000.0 / per_ms(rpm)) : 0;
}

static int64_t tok_cost_us(double tpm, double need)
{
    return tpm > 0 && need > 0 ? (int64_t)llround(need * 1000.0 / tokens_per_ms(tpm, need)) : 0;
}

/* The request bucket's slack (see refill), as a GCRA tolerance. */
static int64_t req_tolerance_us(double rpm)
{
    return (int64_t)((fmax(1.0, (1.0 - PACE) * rpm / 60.0) - 1.0) * (double)req_cost_us(rpm));
}

static int64_t ms_of(int64_t us)
{
    return (us + 999) / 1000;
}

/* A call the slow start holds looks again this often (ms): what ends it
 * may come from another process, which does not wake this one. */
#define START_POLL_MS 20

/* How long the shared buckets would hold a call of `need` tokens (ms),
 * taking nothing. */
static int64_t shared_wait(const lr_endpoint *ep, double rpm, double tpm, double need, int64_t now)
{
    int64_t now_us = now * 1000, w = 0;
    if (rpm > 0)
        w = ep->rd ? lr_redis_wait(ep->rd, LR_REDIS_REQ, now_us, req_cost_us(rpm),
                                   req_tolerance_us(rpm))
                   : lr_shared_gcra_wait(&ep->sh->req_tat_us, now_us, req_tolerance_us(rpm));
    if (tpm > 0) {
        int64_t t = !ep->rd ? lr_shared_gcra_wait(&ep->sh->tok_tat_us, now_us, 0)
                  : need > 0 ? lr_redis_wait(ep->rd, LR_REDIS_TOK, now_us, tok_cost_us(tpm, need), 0)
                  : 0;
        if (t > w)
            w = t;
    }
    return ms_of(w);
}

/* Take c's request and tokens from the shared buckets: 0, or how long to
 * wait when another process took them first (nothing taken then). */
static int64_t shared_take(lr_endpoint *ep, llmretry_call *c, int64_t now)
{
    if (!is_shared(ep))
        return 0;
    if (starting(ep, now))              /* no bucket to take from yet: the first wave's room */
        return (ep->rd ? lr_redis_start_take(ep->rd, now) : lr_shared_start_take(ep->sh, now,
                                                                   LR_SHARED_START_CAP))
               ? 0 : START_POLL_MS;
    double need = tokens_of(ep, c), rpm = req_rate(ep), tpm = tok_rate(ep, need);
    int64_t now_us = now * 1000, w;
    if (ep->rd) {
        if (rpm > 0 && (w = lr_redis_take(ep->rd, LR_REDIS_REQ, now_us, req_cost_us(rpm),
                                          req_tolerance_us(rpm))) > 0)
            return ms_of(w);
        if (tpm > 0 && need > 0 &&
            (w = lr_redis_take(ep->rd, LR_REDIS_TOK, now_us, tok_cost_us(tpm, need), 0)) > 0) {
            if (rpm > 0)
                lr_redis_untake(ep->rd, LR_REDIS_REQ, req_cost_us(rpm));
            return ms_of(w);
        }
        return 0;
    }
    if (rpm > 0 && (w = lr_shared_gcra_take(&ep->sh->req_tat_us, now_us, req_cost_us(rpm), 1,
                                            req_tolerance_us(rpm))) > 0)
        return ms_of(w);
    if (tpm > 0 && need > 0 &&
        (w = lr_shared_gcra_take(&ep->sh->tok_tat_us, now_us, tok_cost_us(tpm, need), 1, 0)) > 0) {
        if (rpm > 0)
            lr_shared_gcra_adjust(&ep->sh->req_tat_us, -req_cost_us(rpm));
        return ms_of(w);
    }
    return 0;
}

/* Refill both buckets up to now at these rates; the token bucket holds
 * `tok_cap` (the tokens of the call that is next), the request bucket one
 * request. */
static void refill(lr_endpoint *ep, int64_t now, double tok_cap, double rpm, double tpm)
{
    ep->tok_cap = tok_cap < 1.0 ? 1.0 : tok_cap;
    /* The request bucket may hold the slack PACE leaves in a second
     * ((1 - PACE) x a second's requests, at least one): a wake-up that comes
     * late is made up by the next call instead of lost, and a second still
     * never sees more than the limit. */
    double req_cap = fmax(1.0, (1.0 - PACE) * rpm / 60.0);
    if (ep->refilled_at < 0) {
        ep->req_level = 1.0;
        ep->tok_level = ep->tok_cap;
    } else if (now > ep->refilled_at) {
        double dt = (double)(now - ep->refilled_at);
        ep->req_level = fmin(req_cap, ep->req_level + dt * per_ms(rpm));
        ep->tok_level = fmin(ep->tok_cap, ep->tok_level + dt * tokens_per_ms(tpm, tok_cap));
    }
    ep->refilled_at = now;
}

/* ---- a call's tokens ------------------------------------------------------- */

/* The host's estimated_tokens, else the core's rule (estimate.c); parsed
 * only for calls that meet a token limit. */
static int64_t estimate(llmretry_call *c)
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
static int64_t hold(double need, int64_t remaining, int64_t at, double rate_per_ms,
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
static int64_t held(const lr_stated *s, double need, double rate_per_ms, int64_t now)
{
    if (s->remaining < 0)
        return 0;
    return hold(need, s->remaining, s->at, s->per_window ? 0.0 : rate_per_ms, s->reset_at, now);
}

/* A limit stated per window whose length no reset has shown yet, its room
 * used up and no reset said: the answers on their way will say what is
 * left, so c waits for them (the pump runs as each attempt ends); with none
 * on its way, c goes and asks. 0 when this does not hold c. */
static int64_t asking(const lr_endpoint *ep, const lr_stated *s, double need, int64_t configured)
{
    if (configured > 0 || !s->per_window || s->window_ms > 0 || s->remaining < 0 || room(s, need))
        return 0;
    return ep->in_flight > 0 ? ASK_WAIT_MS : 0;
}

/* The tokens c is charged, when any limit counts them (else 0). */
static double tokens_of(const lr_endpoint *ep, llmretry_call *c)
{
    int64_t now = is_shared(ep) ? lr_mono_ms() : 0;
    return ep->tpm > 0 || ep->tok.limit > 0 || ep->tok.remaining >= 0 ||
           said(ep, LR_SAID_CFG_TPM, now) > 0 || said(ep, LR_SAID_LEARNED_TPM, now) > 0
           ? (double)estimate(c) : 0.0;
}

/* Milliseconds until the endpoint admits c (0: now). Waits round down: a
 * call let through less than a millisecond early leaves its bucket that
 * little in debt, which the next one waits for, so the rate holds exactly
 * where rounding up would lose up to a millisecond a call (5 % at 100 a
 * second). */
static int64_t wait_for(lr_endpoint *ep, llmretry_call *c, int64_t now)
{
    /* A Redis store not heard from yet about this endpoint (its first
     * read, who probes): a moment, its timeout (50 ms) at most. */
    int64_t w = ep->rd ? lr_redis_hold_ms(ep->rd, now) : 0;
    if (w > 0)
        return w;
    if (unlimited(ep, now))
        return 0;
    int64_t paused = ep->paused_until;
    if (atomic_load(&ep->sh->paused_until) > paused)
        paused = atomic_load(&ep->sh->paused_until);   /* another process's 429 */
    int64_t wait = paused > now ? paused - now : 0;
    double need = tokens_of(ep, c);
    double rpm = req_rate(ep), tpm = tok_rate(ep, need);
    /* The server says too little is left: one more request, this call's
     * tokens. */
    w = held(&ep->req, 1.0, per_ms(rpm), now);
    if (w > wait)
        wait = w;
    w = held(&ep->tok, need, tpm > 0 ? tokens_per_ms(tpm, need) : 0.0, now);
    if (w > wait)
        wait = w;
    w = asking(ep, &ep->req, 1.0, ep->rpm);
    if (w > wait)
        wait = w;
    w = asking(ep, &ep->tok, need, ep->tpm);
    if (w > wait)
        wait = w;
    if (is_shared(ep) && starting(ep, now) &&
        !(ep->rd ? lr_redis_start_room(ep->rd, now)
                 : lr_shared_start_room(ep->sh, now, LR_SHARED_START_CAP)))
        return wait > START_POLL_MS ? wait : START_POLL_MS;
    if (is_shared(ep)) {
        if (ep->rd && wait > 0)
            return wait;                /* no slice leased for a call that cannot go yet */
        w = shared_wait(ep, rpm, tpm, need, now);
        return w > wait ? w : wait;
    }
    refill(ep, now, need, rpm, tpm);
    if (rpm > 0 && ep->req_level < 1.0) {
        w = (int64_t)floor((1.0 - ep->req_level) / per_ms(rpm));
        if (w > wait)
            wait = w;
    }
    if (tpm > 0 && ep->tok_level < need) {
        w = (int64_t)floor((need - ep->tok_level) / tokens_per_ms(tpm, need));
        if (w > wait)
            wait = w;
    }
    return wait;
}

/* Take `n` from what the server said remains. A reset already passed says
 * nothing of when more comes once that is used: it is forgotten. */
static void spend(lr_stated *s, int64_t n, int64_t now)
{
    if (s->remaining < 0)
        return;
    s->remaining = s->remaining > n ? s->remaining - n : 0;
    if (s->reset_at >= 0 && s->reset_at <= now)
        s->reset_at = -1;
}

/* Take `n` from a bucket: in debt when it paces, else (the server's room
 * let the call go) down to empty at most, so that the pace it falls back
 * on once the room is used up does not start with a burst. */
static void charge(double *level, double n, double rate)
{
    if (rate > 0)
        *level -= n;
    else if (*level > 0)
        *level = fmax(0.0, *level - n);
}

/* c goes: its request and tokens are taken from the buckets and from what
 * the server said remains. */
static void take(lr_endpoint *ep, llmretry_call *c, int64_t now)
{
    ep->in_flight++;
    c->on_budget = 1;
    double need = tokens_of(ep, c);
    double rpm = req_rate(ep), tpm = tok_rate(ep, need);
    if (!is_shared(ep)) {               /* else shared_take took them */
        refill(ep, now, need, rpm, tpm);    /* buckets start full once, not at each limit learned */
        charge(&ep->req_level, 1.0, rpm);
        charge(&ep->tok_level, need, tpm);
    }
    spend(&ep->req, 1, now);
    spend(&ep->tok, (int64_t)need, now);
    c->charged_tok = (int64_t)need;
    c->flight_mark[0] = ep->in_flight - 1;
    c->flight_mark[1] = ep->in_flight_tok;
    ep->in_flight_tok += c->charged_tok;
    c->sent_mark[0] = ++ep->sent_req;
    c->sent_mark[1] = ep->sent_tok += c->charged_tok;
}

/* A Redis store that became unreachable, or is back, since this engine
 * last said so: the event, on c (once per change; a call that does not
 * ask for it leaves it to the next). */
static void report_store(lr_endpoint *ep, llmretry_call *c)
{
    if (!ep->rd || !(c->o.events & ((1u << LLMRETRY_EV_SHARED_UNAVAILABLE) |
                                    (1u << LLMRETRY_EV_SHARED_RECOVERED))))
        return;
    char why[512] = "";
    int64_t down_ms = 0;
    int t = lr_redis_transition(ep->rd, why, sizeof why, &down_ms);
    if (!t)
        return;
    llmretry_event *ev = lr_event(c, t == 1 ? LLMRETRY_EV_SHARED_UNAVAILABLE
                                            : LLMRETRY_EV_SHARED_RECOVERED);
    if (!ev)
        return;
    ev->shared = lr_strdup(lr_redis_ep_name(ep->rd));
    if (t == 1)
        ev->error_message = lr_strdup(why);
    ev->down_ms = down_ms;
    lr_post(c, ev);
}

/* A call that waited on a Redis store asks its breaker again: what Redis
 * said meanwhile (another process opened it; who probes) holds for it too.
 * 1: it may go on; 0: refused (given up as circuit_open); -1: it waits on. */
static int breaker_again(llmretry_engine *e, llmretry_call *c, int64_t now)
{
    char why[160];
    int h = lr_health_admits(e, c, now, why, sizeof why);
    if (h != 0)
        return h;
    lr_admission_leave(e, c);
    free(c->last_message);
    c->last_message = lr_strdup(why);
    c->last_kind = LLMRETRY_ERR_CIRCUIT_OPEN;
    lr_give_up(e, c, LLMRETRY_REASON_CIRCUIT_OPEN);
    return 0;
}

int64_t lr_budget_admits(llmretry_engine *e, llmretry_call *c, int64_t now)
{
    lr_endpoint *ep = lr_endpoint_of(e, c);
    if (!ep)
        return 0;
    report_store(ep, c);
    /* This engine's configured limits, for every process on the endpoint
     * (the strictest wins); said again at each admission so that a claim
     * lapses once its process is gone. */
    say(ep, LR_SAID_CFG_RPM, now, ep->rpm, 1);
    say(ep, LR_SAID_CFG_TPM, now, ep->tpm, 1);
    /* First come, first served: nobody passes a call already waiting. */
    int64_t wait = ep->queue.head && ep->queue.head != c ? 1 : wait_for(ep, c, now);
    if (wait == 0)
        wait = shared_take(ep, c, now);
    if (wait == 0)
        take(ep, c, now);
    return wait;
}

lr_queue *lr_budget_queue(llmretry_call *c)
{
    return &c->endpoint->queue;
}

void lr_budget_pump(llmretry_engine *e, void (*admit)(llmretry_engine *, llmretry_call *))
{
    int64_t now = lr_mono_ms();
    for (size_t i = 0; i < e->n_endpoints; i++) {
        lr_endpoint *ep = e->endpoints[i];
        llmretry_call *c;
        while ((c = ep->queue.head) && wait_for(ep, c, now) == 0) {
            if (ep->rd) {
                report_store(ep, c);
                int h = breaker_again(e, c, now);
                if (h == 0)
                    continue;
                if (h < 0)
                    break;
            }
            if (shared_take(ep, c, now) != 0)
                break;
            lr_queue_unlink(&ep->queue, c);
            lr_timer_remove(e, c);
            take(ep, c, now);
            admit(e, c);
        }
    }
}

int64_t lr_budget_due_in(const llmretry_engine *e, int64_t now, int64_t cap)
{
    int64_t due = cap;
    for (size_t i = 0; i < e->n_endpoints; i++) {
        lr_endpoint *ep = e->endpoints[i];
        if (!ep->queue.head)
            continue;
        int64_t w = wait_for(ep, ep->queue.head, now);
        if (w < due)
            due = w;
    }
    return due;
}

/* ---- what responses teach ------------------------------------------------------ */

static int64_t header_int(const llmretry_call *c, int h)
{
    if (!c->hdr_set[h])
        return -1;
    const char *v = lr_call_header(c, h);
    char *end;
    long long n = strtoll(v, &end, 10);
    return end != v && n >= 0 ? (int64_t)n : -1;
}

/* A -reset-* header in ms: -1 when absent or not a duration, 0 for a zero
 * one ("0s": the window has room now), which llmretry_parse_reset_duration
 * does not tell from garbage (a 429's wait of "0s" is none). */
static int64_t reset_ms(const llmretry_call *c, int h)
{
    if (!c->hdr_set[h])
        return -1;
    const char *v = lr_call_header(c, h);
    int64_t ms = llmretry_parse_reset_duration(v);
    if (ms < 0 && strchr(v, '0') && strspn(v, "0.hmsun \t") == strlen(v))
        ms = 0;
    return ms;
}

/* Whether the server's limit is its window's, shorter than a minute. A
 * per-minute limit L gives back what was used at L a minute, L - R used
 * in (L - R) x 60000 / L ms, and OpenAI's reset says just that; a reset
 * far sooner is a shorter window's (10 a second stated as 10, remaining 9,
 * reset 0s: read per minute, one call each 6 s). Only a statement of more
 * room than a second of a per-minute L tells: with less, a per-minute
 * limit counted per second (as providers slice theirs, and the mock)
 * says the same. Nor one before two seconds' worth is used: a reset
 * rounded to the second would mislead. Otherwise the last verdict holds. */
static void classify(lr_stated *s, int64_t left, int64_t reset)
{
    if (s->limit <= 0 || left > s->limit)
        return;
    double limit = (double)s->limit;
    double refill = (double)(s->limit - left) * 60000.0 / limit;
    if ((double)left <= limit / 60.0 + 1.0 || refill < 2000.0)
        return;
    s->per_window = (double)reset < refill / 2.0;
}

/* What one response says of one limit. The server's count leaves out
 * some of what we sent: `unseen` is taken off what it says remains, for a
 * limit paced evenly what is still on its way (requests only: the rate
 * paces tokens); for one stated per window, whose remaining alone lets
 * calls go, whatever it may not have counted yet when it admitted this
 * request, in whatever order it admits them: what went after it, and
 * what was on its way when it went. A zero reset says there is room now,
 * not when more comes: a reset known from an earlier answer stands. */
static void learn(lr_stated *s, const llmretry_call *c, int h_limit, int h_remaining,
                  int h_reset, const int64_t unseen[2], int64_t now)
{
    int64_t v = header_int(c, h_limit);
    if (v > 0)
        s->limit = v;
    if ((v = header_int(c, h_remaining)) < 0)
        return;
    int64_t reset = reset_ms(c, h_reset);
    if (reset < 0) {
        s->remaining = s->reset_at = -1;        /* no reset time: nothing to wait for */
        return;
    }
    classify(s, v, reset);
    if (s->per_window && reset > s->window_ms && reset <= 60000)
        s->window_ms = reset;
    int64_t off = unseen[s->per_window];
    s->remaining = v > off ? v - off : 0;
    s->at = now;
    s->reset_at = reset > 0 ? lr_time_add(now, reset) : s->reset_at > now ? s->reset_at : -1;
}

/* What the server just said remains holds every process on the endpoint,
 * not only the one it told: "0 left, resets in 2 s" to one process means
 * no process may send for 2 s. The hold this call's answer sets for a call
 * like it (one request, its tokens; as wait_for reads it) is raised into
 * the shared pause, whose latest end wins (a hold is a wait the server
 * named); the other processes know nothing of the remaining count. */
static void share_hold(lr_endpoint *ep, llmretry_call *c, int64_t now)
{
    int64_t h = 0;
    if (c->hdr_set[LR_H_REMAINING_REQUESTS])
        h = held(&ep->req, 1.0, per_ms(req_rate(ep)), now);
    if (c->hdr_set[LR_H_REMAINING_TOKENS]) {
        double need = tokens_of(ep, c), tpm = tok_rate(ep, need);
        int64_t t = held(&ep->tok, need, tpm > 0 ? tokens_per_ms(tpm, need) : 0.0, now);
        if (t > h)
            h = t;
    }
    if (h <= 0)
        return;
    if (ep->rd)
        lr_redis_raise_pause(ep->rd, now + h);
    else
        lr_shared_raise(&ep->sh->paused_until, now + h);
}

/* Successes per 100 ms slot, over the last second: the rate the server
 * was serving at when a 429 comes (ok_rpm). */
static void count_ok(lr_endpoint *ep, int64_t now)
{
    int64_t tenth = now / 100;
    int i = (int)(tenth % LR_OK_SLOTS);
    if (ep->ok_tenth[i] != tenth) {
        ep->ok_tenth[i] = tenth;
        ep->ok_count[i] = 0;
    }
    ep->ok_count[i]++;
}

/* Per minute, over the last second, or since the first of its successes
 * in it but at least a quarter second (10 served in the first 50 ms of a
 * window of 10 per 250 ms are 40 a second, not 10, and not 200); 0: none. */
static double ok_rpm(const lr_endpoint *ep, int64_t now)
{
    int64_t tenth = now / 100, n = 0, first = tenth;
    for (int i = 0; i < LR_OK_SLOTS; i++)
        if (ep->ok_tenth[i] > tenth - LR_OK_SLOTS && ep->ok_tenth[i] <= tenth) {
            n += ep->ok_count[i];
            if (ep->ok_tenth[i] < first)
                first = ep->ok_tenth[i];
        }
    int64_t span = (tenth - first + 1) * 100;
    return (double)n * 60000.0 / (double)(span < 250 ? 250 : span);
}

void lr_budget_attempt_ended(llmretry_call *c, int ok, const llmretry_usage *usage)
{
    lr_endpoint *ep = c->endpoint;
    if (!ep || !c->on_budget)
        return;
    c->on_budget = 0;
    ep->in_flight--;
    ep->in_flight_tok -= c->charged_tok;
    int64_t now = lr_mono_ms();
    const int64_t req[2] = { ep->in_flight, ep->sent_req - c->sent_mark[0] + c->flight_mark[0] };
    int64_t tok[2] = { 0, ep->sent_tok - c->sent_mark[1] + c->flight_mark[1] };
    /* Calls sent before any token limit was known were not counted in
     * tokens: count those requests at this call's tokens. */
    if (c->hdr_set[LR_H_REMAINING_TOKENS] && req[1] * estimate(c) > tok[1])
        tok[1] = req[1] * estimate(c);
    learn(&ep->req, c, LR_H_LIMIT_REQUESTS, LR_H_REMAINING_REQUESTS, LR_H_RESET_REQUESTS, req, now);
    learn(&ep->tok, c, LR_H_LIMIT_TOKENS, LR_H_REMAINING_TOKENS, LR_H_RESET_TOKENS, tok, now);
    if (is_shared(ep)) {
        /* What the server said of its limits is every process's: a process
         * that has no answer of its own yet paces by it; and the slow start
         * is over once the server answered anything (what it says of its
         * limits, or that it states none, is known). */
        if (ep->req.limit > 0 && c->hdr_set[LR_H_LIMIT_REQUESTS])
            say(ep, LR_SAID_LEARNED_RPM, now, (int64_t)ceil(learned_rate(&ep->req)), 0);
        if (ep->tok.limit > 0 && c->hdr_set[LR_H_LIMIT_TOKENS])
            say(ep, LR_SAID_LEARNED_TPM, now, (int64_t)ceil(learned_rate(&ep->tok)), 0);
        share_hold(ep, c, now);
        long status = 0;
        if (!ok && !atomic_load(&ep->sh->start_over) && c->easy)
            curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &status);
        if ((ok || status > 0) && !atomic_load(&ep->sh->start_over)) {
            if (ep->rd)
                lr_redis_start_over(ep->rd);
            else
                atomic_store(&ep->sh->start_over, 1);
        }
    }
    if (ok) {
        /* Served: the slow-down grows back, and refusals are no longer in
         * a row. */
        count_ok(ep, now);
        ep->slow_refusals = 0;
        double slow = slow_rate(ep);    /* the latest any process set */
        if (slow > 0) {
            ep->slow_rpm = slow + slow / SLOW_RECOVER;
            say(ep, LR_SAID_SLOW_RPM, now, (int64_t)llround(ep->slow_rpm * 1000.0), 0);
        }
    }
    /* The charge, as a provider counts it: the prompt's real tokens, plus
     * the completion's bound when the body set one, else its real tokens. */
    if (usage && usage->present && c->charged_tok > 0 &&
        (ep->tpm > 0 || ep->tok.limit > 0 || tok_rate(ep, (double)c->est_tokens) > 0) &&
        c->o.estimated_tokens <= 0) {
        int64_t real = usage->prompt_tokens +
                       (c->completion_limit >= 0 ? c->completion_limit : usage->completion_tokens);
        if (is_shared(ep)) {
            double est = (double)c->est_tokens, tpm = tok_rate(ep, est);
            int64_t delta = tpm > 0 && est > 0      /* give back (or charge) the difference, in time */
                ? (int64_t)((double)(real - c->est_tokens) * (double)tok_cost_us(tpm, est) / est) : 0;
            if (delta && ep->rd)
                lr_redis_adjust(ep->rd, LR_REDIS_TOK, delta);
            else if (delta)
                lr_shared_gcra_adjust(&ep->sh->tok_tat_us, delta);
        } else {
            ep->tok_level = fmin(ep->tok_cap, ep->tok_level + (double)(c->est_tokens - real));
        }
        c->est_tokens = real;       /* its retries are charged what it really costs */
    }
}

void lr_budget_detached(llmretry_call *c)
{
    if (c->endpoint && c->on_budget) {
        c->on_budget = 0;
        c->endpoint->in_flight--;
        c->endpoint->in_flight_tok -= c->charged_tok;
    }
}

void lr_budget_pause(llmretry_engine *e, llmretry_call *c, int64_t until)
{
    lr_endpoint *ep = lr_endpoint_of(e, c);
    if (ep && until > ep->paused_until)
        ep->paused_until = until;
    if (ep && ep->rd)
        lr_redis_raise_pause(ep->rd, until);            /* every process waits */
    else if (ep && is_shared(ep))
        lr_shared_raise(&ep->sh->paused_until, until);
}

/* ---- 429s that name no wait ------------------------------------------------------ */

/* A wait the 429 names (what llmretry_decide's rule 6 would wait for). */
static int names_wait(const llmretry_failure *f)
{
    return llmretry_parse_retry_after_ms(f->retry_after_ms) > 0 ||
           llmretry_parse_retry_after(f->retry_after, lr_unix_ms()) > 0 ||
           llmretry_parse_reset_duration(f->ratelimit_reset_requests) > 0 ||
           llmretry_parse_reset_duration(f->ratelimit_reset_tokens) > 0;
}

void lr_budget_slow_down(llmretry_engine *e, llmretry_call *c, const llmretry_failure *f,
                         int64_t now)
{
    lr_endpoint *ep = c->endpoint;
    if (!ep || f->kind != LLMRETRY_ERR_HTTP_STATUS || f->status != 429 || names_wait(f) ||
        (f->error_code && strcmp(f->error_code, "insufficient_quota") == 0))
        return;
    /* Requests sent before the endpoint last reacted were sent too fast
     * for what it knew then: their 429s say nothing new (a burst's are
     * one signal, not one each). */
    if (c->attempt_started_at >= ep->slow_mark) {
        double served = ok_rpm(ep, now), slow = slow_rate(ep);
        if (ep->slow_refusals == 0 && (served > 0 || slow > 0)) {
            /* Refused after a success: too fast. Half the rate it was
             * serving at (or was slowed to, here or by another process
             * sharing the endpoint, if that was less). */
            double rate = served > 0 ? served : slow;
            if (slow > 0 && slow < rate)
                rate = slow;
            ep->slow_rpm = fmax(SLOW_MIN_RPM, rate * SLOW_CUT);
            say(ep, LR_SAID_SLOW_RPM, now, (int64_t)llround(ep->slow_rpm * 1000.0), 0);
        } else {
            /* Refused again before any success (its window is full), or
             * with no rate to cut: the whole endpoint waits, longer each
             * time, the refused call's backoff. */
            int n = ep->slow_refusals > 0 ? ep->slow_refusals - 1 : 0;
            int64_t pause = llmretry_backoff_ms(LLMRETRY_JITTER_NONE, c->o.base_delay_ms,
                                                c->o.max_delay_ms, n, 0.0);
            lr_budget_pause(e, c, lr_time_add(now, pause));
        }
        ep->slow_refusals++;
        ep->slow_mark = now;
        lr_endpoint_publish(e, ep);
    }
}
