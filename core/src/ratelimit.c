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
#include "ratelimit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the rates in force (the rest: ratelimit.h) ------------------------------- */

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


/* ---- buckets shared between processes (engine option `shared`) ------------------ */

/* With a shared store the buckets are GCRA timestamps every process on the
 * key takes from (shared.c), in place of this engine's levels: the same
 * pace (PACE, the request bucket's slack, a call in debt for its tokens),
 * kept where all of them see it. A Redis store's are taken from the slices
 * this process leased of them (lr_redis_take: no round trip here). */


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
    if (!ep->rd) {
        if (rpm > 0)
            w = lr_shared_gcra_wait_ms(&ep->sh->req_tat_us, now, req_tolerance_us(rpm));
        int64_t t = tpm > 0 ? lr_shared_gcra_wait_ms(&ep->sh->tok_tat_us, now, 0) : 0;
        return t > w ? t : w;
    }
    if (rpm > 0)
        w = lr_redis_wait(ep->rd, LR_REDIS_REQ, now_us, req_cost_us(rpm), req_tolerance_us(rpm));
    if (tpm > 0 && need > 0) {
        int64_t t = lr_redis_wait(ep->rd, LR_REDIS_TOK, now_us, tok_cost_us(tpm, need), 0);
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
    if (rpm > 0 && (w = lr_shared_gcra_take_ms(&ep->sh->req_tat_us, now, req_cost_us(rpm), 1,
                                               req_tolerance_us(rpm))) > 0)
        return w;
    if (tpm > 0 && need > 0 &&
        (w = lr_shared_gcra_take_ms(&ep->sh->tok_tat_us, now, tok_cost_us(tpm, need), 1, 0)) > 0) {
        if (rpm > 0)
            lr_shared_gcra_adjust(&ep->sh->req_tat_us, -req_cost_us(rpm));
        return w;
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

/* ---- admission ----------------------------------------------------------------- */

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

int64_t lr_budget_paused_ms(const lr_endpoint *ep, int64_t now)
{
    int64_t paused = ep->paused_until;
    int64_t theirs = atomic_load(&ep->sh->paused_until);   /* another process's 429 */
    if (theirs > paused)
        paused = theirs;
    return paused > now ? paused - now : 0;
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
    int64_t wait = lr_budget_paused_ms(ep, now);
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
