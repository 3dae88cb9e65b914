/* Attempts: putting a call's request on the wire, reading what came back,
 * and letting the policy (policy.c) decide what happens next: success,
 * a retry after a wait (a timer, timers.c), or the end of the call. */
#include "engine.h"
#include "stream.h"

#include <stdlib.h>
#include <string.h>

#define EASY_POOL_MAX 1024

/* ---- easy handles are pooled: creating one per attempt costs ----------- */

static CURL *easy_get(llmretry_engine *e)
{
    return e->n_easy > 0 ? e->easy_pool[--e->n_easy] : curl_easy_init();
}

static void easy_put(llmretry_engine *e, CURL *easy)
{
    if (e->n_easy < EASY_POOL_MAX) {
        if (!e->easy_pool) {
            e->easy_pool = malloc(EASY_POOL_MAX * sizeof *e->easy_pool);
            if (!e->easy_pool) {
                curl_easy_cleanup(easy);
                return;
            }
        }
        curl_easy_reset(easy);
        e->easy_pool[e->n_easy++] = easy;
    } else {
        curl_easy_cleanup(easy);
    }
}

void lr_easy_pool_clear(llmretry_engine *e)
{
    while (e->n_easy > 0)
        curl_easy_cleanup(e->easy_pool[--e->n_easy]);
}

void lr_detach_easy(llmretry_engine *e, llmretry_call *c)
{
    lr_origin_connected(c);         /* a connect that failed frees the gate too */
    lr_budget_detached(c);          /* no response (cancelled): nothing learned */
    lr_health_detached(c);
    e->in_flight--;
    lr_timer_remove(e, c);          /* a stream's: the attempt is over */
    if (e->host_io) {
        lr_host_attempt_detach(c);
        return;
    }
    curl_multi_remove_handle(e->multi, c->easy);
    lr_shard_detach(e, c, c->easy);
    easy_put(e, c->easy);
    c->easy = NULL;
}

/* ---- attempts ------------------------------------------------------------ */

/* Time left before the call's deadline, never negative: a passed deadline
 * must not read as LLMRETRY_NO_DEADLINE (-1). */
static int64_t deadline_left(const llmretry_call *c, int64_t now)
{
    if (c->deadline_at < 0)
        return LLMRETRY_NO_DEADLINE;
    return c->deadline_at > now ? c->deadline_at - now : 0;
}

static void fail_to_start(llmretry_engine *e, llmretry_call *c, const char *why)
{
    free(c->last_message);
    c->last_message = lr_strdup(why);
    c->last_kind = LLMRETRY_ERR_NETWORK;
    c->last_no_connect = 0;
    lr_give_up(e, c, LLMRETRY_REASON_NOT_RETRYABLE);
}

/* The attempt on its way through libcurl: 0, or -1 when the call failed. */
static int curl_attempt_start(llmretry_engine *e, llmretry_call *c, int64_t timeout, int64_t left)
{
    CURL *easy = easy_get(e);
    if (!easy) {
        fail_to_start(e, c, "out of memory starting an attempt");
        return -1;
    }
    int64_t curl_timeout = timeout;
    if (c->stream_req) {
        /* timeout_ms bounds a stream up to its first chunk (the engine's
         * timer, stream.c); libcurl's bound is the deadline, or none. */
        curl_timeout = left == LLMRETRY_NO_DEADLINE ? 0 : left;
        c->cut_by_deadline = left != LLMRETRY_NO_DEADLINE;
    }
    lr_call_setup_easy(c, easy, curl_timeout);
    lr_shard_attach(e, c, easy);
    CURLMcode mrc = curl_multi_add_handle(e->multi, easy);
    if (mrc != CURLM_OK) {
        lr_shard_detach(e, c, easy);
        easy_put(e, easy);
        char why[160];
        snprintf(why, sizeof why, "could not start an attempt: %s", curl_multi_strerror(mrc));
        fail_to_start(e, c, why);
        return -1;
    }
    c->easy = easy;
    return 0;
}

/* io_loop host: the attempt goes to the host (host_io.c), which enforces
 * its timeout; streams are not taken by such engines (submit refuses). */
static int host_attempt_start(llmretry_engine *e, llmretry_call *c, int64_t timeout)
{
    const char *why = NULL;
    if (lr_host_attempt_start(c, timeout, &why) != 0) {
        fail_to_start(e, c, why);
        return -1;
    }
    return 0;
}

void lr_attempt_start(llmretry_engine *e, llmretry_call *c)
{
    int64_t now = lr_mono_ms();
    int64_t left = deadline_left(c, now);
    if (left == 0) {
        lr_give_up(e, c, LLMRETRY_REASON_DEADLINE);
        return;
    }
    int64_t timeout = llmretry_attempt_timeout_ms(c->o.timeout_ms, left);
    c->cut_by_deadline = left != LLMRETRY_NO_DEADLINE && left < c->o.timeout_ms;
    if (e->host_io ? host_attempt_start(e, c, timeout) : curl_attempt_start(e, c, timeout, left))
        return;
    llmretry_event *ev = lr_event(c, LLMRETRY_EV_REQUEST_STARTED);
    if (ev) {
        ev->timeout_ms = timeout;
        ev->deadline_left_ms = left;
        lr_post(c, ev);
    }
    lr_origin_connecting(e, c);
    c->attempt_started_at = now;
    c->attempt_resends = 0;
    c->attempts_started = c->attempt + 1;
    c->state = LR_RUNNING;
    e->in_flight++;
    lr_health_attempt_started(e, c);
    if (c->stream_req && lr_timer_update(e, c) != 0) {
        lr_attempt_finished(e, c, CURLE_OUT_OF_MEMORY);   /* no timer: it could hang */
        return;
    }
}

/* Record a failed attempt, tell the host, and let the policy decide.
 * at_once: the request was lost with its reused connection after it was
 * written, so a retry goes at once (docs/reliability.md, Re-sends): the
 * server's closing an idle connection as the request went out looks just
 * the same, and that wants no backoff. */
static void handle_failure(llmretry_engine *e, llmretry_call *c, lr_outcome *out, int at_once)
{
    const llmretry_failure *f = &out->f;
    int http = f->kind == LLMRETRY_ERR_HTTP_STATUS;
    c->last_kind = f->kind;
    c->last_no_connect = out->connect_failed;
    c->last_status = f->status;     /* any status the server did send */
    c->last_duration_ms = out->duration_ms;
    free(c->last_message);
    c->last_message = out->message;
    out->message = NULL;
    free(c->last_error_code);
    c->last_error_code = lr_strdup(f->error_code);
    free(c->last_body_preview);
    c->last_body_preview = http || f->kind == LLMRETRY_ERR_REFUSAL ? lr_call_preview(c) : NULL;
    free(c->last_validation_errors);
    c->last_validation_errors = out->validation_errors;     /* moved: the schema's verdict */
    out->validation_errors = NULL;

    llmretry_event *ev = lr_event(c, http ? LLMRETRY_EV_REQUEST_FAILED : LLMRETRY_EV_REQUEST_ERROR);
    if (ev) {
        ev->duration_ms = out->duration_ms;
        if (http) {
            ev->status = f->status;
            ev->retry_after = lr_strdup(f->retry_after);
            ev->error_code = lr_strdup(f->error_code);
            ev->body_preview = lr_strdup(c->last_body_preview);
        } else {
            ev->error_kind = f->kind;
            ev->error_message = lr_strdup(c->last_message);
            if (c->last_validation_errors)
                ev->validation_path = lr_strdup(out->validation_path);
        }
        lr_post(c, ev);
    }

    if (lr_stream_attempt_failed(c)) {
        /* The host has read chunks of this attempt: another would repeat
         * them. The call ends, with what was assembled so far; a whole
         * answer that the schema refused (or a refusal) ends it as such. */
        if (c->last_validation_errors || f->kind == LLMRETRY_ERR_REFUSAL) {
            lr_give_up(e, c, LLMRETRY_REASON_NOT_RETRYABLE);
            return;
        }
        c->result.stream_reason = lr_stream_reason_of(c, f->kind);
        lr_give_up(e, c, LLMRETRY_REASON_STREAM_INTERRUPTED);
        return;
    }
    int64_t now = lr_mono_ms();
    int64_t left = deadline_left(c, now);
    /* A 429 naming no wait slows the endpoint down for every call. Its
     * retry still counts against max_retries: a server never sees more
     * requests for a call than its attempts allow (docs/reliability.md). */
    lr_budget_slow_down(e, c, f, now);
    /* Each target has its own max_retries and backoff: count from its first.
     * A backoff based on 0 ms is none, whatever the jitter; every other
     * rule (attempts left, unsafe mode, the deadline) holds as ever. */
    llmretry_options no_backoff;
    const llmretry_options *o = &c->o;
    if (at_once) {
        no_backoff = c->o;
        no_backoff.base_delay_ms = 0;
        o = &no_backoff;
    }
    llmretry_decision d = llmretry_decide(o, f, c->attempt - c->target_first_attempt,
                                          lr_unix_ms(), left, lr_rng_next01(&e->rng));
    c->last_retry_after_ms = d.retry_after_ms;
    if (f->status == 429 && d.reason != LLMRETRY_REASON_RETRY_AFTER_TOO_LONG) {
        /* The server's wait holds for every call to the endpoint (the
         * model), not just this item: its batch's items of that model wait
         * in a hold (admission.c), and the batch's pacer counts the pause
         * and, adaptive, halves its window. But a wait the call itself
         * refused as too long pauses nothing (it could stall them for years). */
        int64_t wait = d.retry && d.delay_source != LLMRETRY_DELAY_BACKOFF ? d.delay_ms
                                                                          : d.retry_after_ms;
        if (wait > c->o.max_retry_after_ms)
            wait = 0;
        if (c->group)
            llmretry_pacer_on_429(&c->group->pacer, now, wait);
        /* Only a wait the server named pauses the endpoint (a backoff of
         * ours is this call's own business). */
        int named = d.retry ? d.delay_source != LLMRETRY_DELAY_BACKOFF : d.retry_after_ms > 0;
        if (named && wait > 0)
            lr_budget_pause(e, c, lr_time_add(now, wait));
    }
    if (!d.retry) {
        lr_give_up(e, c, d.reason);
        return;
    }
    /* A retry of our own timing spends the endpoint's retry budget; one
     * the server timed does not (it asked for it), nor one after any 429
     * (the server asked to slow down, and the endpoint's pace does). */
    if (d.delay_source == LLMRETRY_DELAY_BACKOFF && f->status != 429 &&
        !lr_health_retry_allowed(e, c, now)) {
        lr_give_up(e, c, LLMRETRY_REASON_RETRY_BUDGET_EXHAUSTED);
        return;
    }
    int repaired = lr_repair_body(c);       /* option repair: the answer and its errors */
    ev = lr_event(c, LLMRETRY_EV_RETRY_SCHEDULED);
    if (ev) {
        ev->repair = repaired;
        ev->delay_ms = d.delay_ms;
        ev->delay_source = d.delay_source;
        ev->next_attempt = c->attempt + 1;
        lr_post(c, ev);
    }
    c->attempt++;
    c->retry_at = lr_time_add(now, d.delay_ms);
    c->state = LR_WAITING;
    if (lr_timer_update(e, c) != 0) {
        free(c->last_message);
        c->last_message = lr_strdup("out of memory scheduling a retry");
        lr_give_up(e, c, LLMRETRY_REASON_NOT_RETRYABLE);
    }
}

/* ---- free re-sends --------------------------------------------------------
 * A request that provably never reached the server (docs/reliability.md,
 * Re-sends: a refused HTTP/2 stream, a kept-alive connection found dead or
 * holding stray bytes before the request was written) is sent again at
 * once, in the same attempt: no event, no backoff, no attempt counted (the
 * result's `resends` counts them). A request written on a reused
 * connection that then died without a byte of a response is not free,
 * though libcurl would re-send it: the server may have read it (and billed
 * a generation). That attempt fails; safe mode retries it at once
 * (handle_failure), unsafe mode stops. So the server sees at most
 * 1 + max_retries requests it may have read. At most LR_MAX_RESENDS free
 * re-sends per attempt, so a server that refuses every stream fails the
 * attempt instead of looping. */

int lr_resend_allowed(llmretry_call *c, lr_resend_why why)
{
    if (why == LR_RESEND_REUSED_DIED)
        return 0;
    if (c->attempt_resends >= LR_MAX_RESENDS)
        return 0;
    c->attempt_resends++;
    c->result.resends++;
    return 1;
}

/* on_prereq aborted the transfer before sending (a stale connection):
 * send the request again on a fresh connection, within what is left of
 * the attempt's timeout. 0 when it is on its way. */
static int resend(llmretry_engine *e, llmretry_call *c)
{
    int64_t now = lr_mono_ms();
    int64_t left = deadline_left(c, now);
    int64_t timeout = llmretry_attempt_timeout_ms(c->o.timeout_ms, left);
    int64_t spent = now - c->attempt_started_at;
    timeout = timeout - spent > 0 ? timeout - spent : 1;
    if (c->stream_req)
        timeout = left == LLMRETRY_NO_DEADLINE ? 0 : left > 0 ? left : 1;   /* as at the start */
    curl_multi_remove_handle(e->multi, c->easy);
    lr_call_setup_resend(c, timeout);
    if (curl_multi_add_handle(e->multi, c->easy) != CURLM_OK) {
        lr_shard_detach(e, c, c->easy);
        easy_put(e, c->easy);
        c->easy = NULL;
        e->in_flight--;
        return -1;
    }
    return 0;
}

void lr_attempt_finished(llmretry_engine *e, llmretry_call *c, CURLcode rc)
{
    if (rc == CURLE_ABORTED_BY_CALLBACK && c->resend_pending) {
        lr_resend_why why = (lr_resend_why)c->resend_pending;
        c->resend_pending = LR_RESEND_NONE;
        if (lr_resend_allowed(c, why)) {
            if (resend(e, c) == 0)
                return;
            fail_to_start(e, c, "could not re-send the request on a new connection");
            return;
        }
        c->resend_refused = why;    /* past the bound: a failed attempt */
    }
    /* The request was written, then its reused connection died (on_prereq
     * stopped libcurl's re-send; an older libcurl fails to rewind it). */
    int at_once = (rc == CURLE_ABORTED_BY_CALLBACK && c->resend_refused == LR_RESEND_REUSED_DIED)
                  || rc == CURLE_SEND_FAIL_REWIND;
    lr_outcome out;
    lr_call_read_outcome(c, rc, &out);
    lr_usage_add(&c->result.usage_total, &out.usage);   /* billed, whatever comes of it */
    lr_budget_attempt_ended(c, out.success, &out.usage);  /* its headers and usage teach the budget */
    lr_health_attempt_ended(e, c, out.success ? NULL : &out.f);
    lr_detach_easy(e, c);
    if (!out.success) {
        handle_failure(e, c, &out, at_once);
    } else if (c->o.validate) {
        /* The host judges the body; the engine waits for its verdict. */
        c->state = LR_VALIDATING;
        c->v_usage = out.usage;
        c->v_response_model = out.response_model;
        c->v_fingerprint = out.fingerprint;
        c->last_status = out.f.status;
        c->last_duration_ms = out.duration_ms;
        out.response_model = out.fingerprint = NULL;
        lr_mail_validate(c);
    } else {
        lr_succeed(e, c, out.f.status, out.duration_ms, out.usage, out.response_model,
                   out.fingerprint);
        out.response_model = out.fingerprint = NULL;
    }
    lr_outcome_clear(&out);
}

void lr_attempt_validated(llmretry_engine *e, llmretry_call *c)
{
    pthread_mutex_lock(&c->mu);
    int ok = c->validate_ok;
    char *msg = c->validate_msg;
    c->validate_msg = NULL;
    pthread_mutex_unlock(&c->mu);
    if (ok) {
        lr_succeed(e, c, c->last_status, c->last_duration_ms, c->v_usage,
                c->v_response_model, c->v_fingerprint);
        c->v_response_model = c->v_fingerprint = NULL;
    } else {
        lr_outcome out;
        memset(&out, 0, sizeof out);
        out.f.kind = LLMRETRY_ERR_INVALID_RESPONSE;
        out.f.status = c->last_status;
        out.duration_ms = c->last_duration_ms;
        char buf[400];
        snprintf(buf, sizeof buf, "response rejected by validate: %s", msg ? msg : "invalid");
        out.message = lr_strdup(buf);
        free(c->v_response_model);
        free(c->v_fingerprint);
        c->v_response_model = c->v_fingerprint = NULL;
        memset(c->hdr_set, 0, sizeof c->hdr_set);
        handle_failure(e, c, &out, 0);
        lr_outcome_clear(&out);
    }
    free(msg);
}
