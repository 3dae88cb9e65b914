/* Client-side rate limits, the other half of ratelimit.c (whose comment
 * says the rules): what each response teaches an endpoint's budget (its
 * x-ratelimit-* headers, its usage), pauses, and the slow-down after a 429
 * that names no wait. I/O thread only. */
#include "ratelimit.h"

#include <stdlib.h>
#include <string.h>

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
 * rounded to the second would mislead.
 * The more was used, the more an answer tells: of 10 a 6 s window, one
 * used and room again in 5 s is what a minute's 10 would say too (one back
 * in 6 s), while 8 used and room in 5 s is no minute's (8 back in 48 s).
 * So an answer that used less than the one the verdict stands on leaves
 * it: a window's first answer turned a window read from a fuller one into
 * 10 a minute, and paced one a window, every answer then said the same.
 * An answer these rules leave out leaves the verdict as it was. */
static void classify(lr_stated *s, int64_t left, int64_t reset)
{
    if (s->limit <= 0 || left > s->limit)
        return;
    double limit = (double)s->limit;
    int64_t used = s->limit - left;
    double refill = (double)used * 60000.0 / limit;
    if ((double)left <= limit / 60.0 + 1.0 || refill < 2000.0 || used < s->verdict_used)
        return;
    s->per_window = (double)reset < refill / 2.0;
    s->verdict_used = used;
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
    if (v > 0 && v != s->limit) {
        s->limit = v;
        s->verdict_used = 0;        /* a new limit: what the old one's answers told is moot */
    }
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
        if (!ok && !atomic_load(&ep->sh->start_over))
            status = lr_call_status(c);
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
             * serving at, or the rate in force if that was less (a
             * learned limit, a slow-down set here or by another process
             * sharing the endpoint): the rate served, read from a few
             * successes within 250 ms, can be well above the pace they
             * went at, and half of it would not slow that pace at all. */
            double rate = served > 0 ? served : slow, in_force = req_rate(ep);
            if (in_force > 0 && in_force < rate)
                rate = in_force;
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
