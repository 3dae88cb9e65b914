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
    curl_multi_remove_handle(e->multi, c->easy);
    easy_put(e, c->easy);
    c->easy = NULL;
    e->in_flight--;
    lr_timer_remove(e, c);          /* a stream's: the attempt is over */
}

/* What succeeded / gave_up events say of a streaming call. */
static void stream_fields(const llmretry_call *c, llmretry_event *ev)
{
    const llmretry_result *r = &c->result;
    ev->stream = r->stream;
    ev->chunks = r->chunks;
    ev->ttft_ms = r->ttft_ms;
    ev->stream_reason = r->stream_reason;
}

/* ---- the end of a call --------------------------------------------------- */

/* Publish the result; the engine's reference to the call ends here. */
static void finish(llmretry_engine *e, llmretry_call *c)
{
    llmretry_result *r = &c->result;
    r->request_id = c->request_id;
    r->model = c->model;
    r->attempts = c->attempts_started;
    r->attempt = r->attempts > 0 ? r->attempts - 1 : 0;
    r->total_ms = lr_mono_ms() - c->submitted_at;
    if (!r->stream)
        r->ttft_ms = -1;
    r->target = c->target;
    r->n_targets = c->n_targets;
    if (c->o.keep_response && c->resp_head.len) {
        r->headers = c->resp_head.data;
        r->headers_len = c->resp_head.len;
    }
    lr_target *t = &c->targets[c->target];
    t->attempts = c->attempts_started - c->target_first_attempt;
    t->status = r->status;
    t->kind = r->ok ? LLMRETRY_ERR_NONE : r->kind;
    t->reason = r->ok ? LLMRETRY_REASON_NONE : r->reason;
    lr_targets_report(c);
    c->state = LR_DONE;
    lr_timer_remove(e, c);
    lr_live_unlink(e, c);
    lr_admission_finished(e, c);
    lr_mail_done(c);
    lr_call_unref(c);
}

void lr_succeed(llmretry_engine *e, llmretry_call *c, int status, int64_t duration_ms,
                llmretry_usage usage, char *response_model, char *fingerprint)
{
    llmretry_result *r = &c->result;
    if (c->group)
        llmretry_pacer_on_success(&c->group->pacer);
    r->ok = 1;
    r->status = status;
    r->duration_ms = duration_ms;
    r->body = c->resp.data;         /* on_body keeps room for the NUL */
    c->resp.data[c->resp.len] = '\0';
    r->body_len = c->resp.len;
    r->raw_response = c->o.raw_response;
    r->usage = usage;
    r->response_model = response_model;
    r->system_fingerprint = fingerprint;
    if (c->stream_req || c->st)
        lr_stream_result(c, 0);
    llmretry_event *ev = lr_event(c, LLMRETRY_EV_REQUEST_SUCCEEDED);
    if (ev) {
        stream_fields(c, ev);
        ev->status = status;
        ev->duration_ms = duration_ms;
        ev->usage = usage;
        ev->response_model = lr_strdup(response_model);
        ev->system_fingerprint = lr_strdup(fingerprint);
        lr_post(c, ev);
    }
    finish(e, c);
}

static const char *reason_text(llmretry_giveup_reason r)
{
    switch (r) {
    case LLMRETRY_REASON_RETRIES_EXHAUSTED: return "retries exhausted";
    case LLMRETRY_REASON_NOT_RETRYABLE: return "not retryable";
    case LLMRETRY_REASON_DEADLINE: return "the deadline would pass before the next attempt";
    case LLMRETRY_REASON_RETRY_AFTER_TOO_LONG: return "the server asked to wait longer than max_retry_after_ms";
    case LLMRETRY_REASON_UNSAFE_MODE: return "retry_mode is unsafe and the request may have reached the server";
    case LLMRETRY_REASON_CANCELLED: return "cancelled";
    case LLMRETRY_REASON_STREAM_INTERRUPTED: return "the stream broke after chunks were delivered (not retried: they would repeat)";
    case LLMRETRY_REASON_RETRY_BUDGET_EXHAUSTED: return "the endpoint's retry budget is spent (retry_budget_ratio, retry_budget_min)";
    case LLMRETRY_REASON_CIRCUIT_OPEN: return "the endpoint's circuit breaker is open";
    default: return "failed";
    }
}

/* ---- fallbacks (docs/reliability.md) ---------------------------------------------- */

/* Does this give-up move the call on to its next target? Not after a
 * cancel, a passed deadline, an unsafe-mode stop (the request may have
 * acted), a stream the host has read, or a 400/422: the request itself is
 * wrong, and would be everywhere. */
static int falls_back(const llmretry_call *c, llmretry_giveup_reason reason)
{
    if (c->target + 1 >= c->n_targets)
        return 0;
    switch (reason) {
    case LLMRETRY_REASON_CANCELLED:
    case LLMRETRY_REASON_DEADLINE:
    case LLMRETRY_REASON_UNSAFE_MODE:
    case LLMRETRY_REASON_STREAM_INTERRUPTED:
        return 0;
    default:
        break;
    }
    if (c->last_kind == LLMRETRY_ERR_HTTP_STATUS &&
        (c->last_status == 400 || c->last_status == 422))
        return 0;
    if (c->last_kind == LLMRETRY_ERR_REFUSAL)
        return 0;                   /* what was asked is refused, not the endpoint */
    return c->deadline_at < 0 || lr_mono_ms() < c->deadline_at;
}

/* Record what the current target came to, switch to the next and admit
 * its first attempt (at once: another endpoint owes no backoff). 0, or -1
 * when the switch failed (out of memory): the call then gives up. */
static int fall_back(llmretry_engine *e, llmretry_call *c, llmretry_giveup_reason reason)
{
    lr_target *t = &c->targets[c->target];
    t->attempts = c->attempts_started - c->target_first_attempt;
    t->status = c->last_status;
    t->kind = c->last_kind;
    t->reason = reason;
    if (lr_target_next(c) != 0)
        return -1;
    lr_timer_remove(e, c);
    c->endpoint = NULL;             /* the new target's are looked up afresh */
    c->origin = NULL;
    c->origin_known = 0;
    c->est_tokens = c->completion_limit = -1;
    c->last_status = 0;
    c->attempt = c->attempts_started;
    c->target_first_attempt = c->attempt;
    llmretry_event *ev = lr_event(c, LLMRETRY_EV_RETRY_SCHEDULED);
    if (ev) {
        ev->attempt = c->attempts_started > 0 ? c->attempts_started - 1 : 0;
        ev->delay_ms = 0;
        ev->delay_source = LLMRETRY_DELAY_FALLBACK;
        ev->next_attempt = c->attempt;
        lr_post(c, ev);
    }
    c->state = LR_WAITING;
    lr_admit_retry(e, c);
    return 0;
}

void lr_give_up(llmretry_engine *e, llmretry_call *c, llmretry_giveup_reason reason)
{
    if (falls_back(c, reason) && fall_back(e, c, reason) == 0)
        return;
    llmretry_result *r = &c->result;
    r->ok = 0;
    r->reason = reason;
    r->kind = reason == LLMRETRY_REASON_CANCELLED ? LLMRETRY_ERR_CANCELLED
            : reason == LLMRETRY_REASON_STREAM_INTERRUPTED ? LLMRETRY_ERR_STREAM_INTERRUPTED
            : reason == LLMRETRY_REASON_DEADLINE ? LLMRETRY_ERR_DEADLINE_EXCEEDED
            : c->last_kind;
    if (reason == LLMRETRY_REASON_CANCELLED && c->st) {
        /* A stream the host was reading, stopped by the host. */
        pthread_mutex_lock(&c->mu);
        if (c->st->committed)
            r->stream_reason = LLMRETRY_STREAM_CANCELLED;
        pthread_mutex_unlock(&c->mu);
    }
    r->status = c->last_status;
    r->duration_ms = c->last_duration_ms;
    r->retry_after_ms = c->last_retry_after_ms;
    r->error_code = c->last_error_code;
    r->body_preview = c->last_body_preview;
    r->validation_errors = c->last_validation_errors;
    c->last_error_code = c->last_body_preview = c->last_validation_errors = NULL;   /* moved */
    if (c->o.keep_response && c->resp.data && !lr_stream_owns_outcome(c) &&
        (r->kind == LLMRETRY_ERR_HTTP_STATUS || r->kind == LLMRETRY_ERR_INVALID_RESPONSE ||
         r->kind == LLMRETRY_ERR_REFUSAL)) {
        /* The response given up on, for a host that hands it on whole (an
         * HTTP transport): its body as it came (on_body keeps room for the NUL). */
        c->resp.data[c->resp.len] = '\0';
        r->body = c->resp.data;
        r->body_len = c->resp.len;
    }
    int n = c->attempts_started;
    char buf[1024], on[40] = "", never[400] = "";
    if (c->target > 0)
        snprintf(on, sizeof on, " on %d targets", c->target + 1);
    if (r->kind == LLMRETRY_ERR_NETWORK && c->last_no_connect &&
        lr_origin_never_reached(e, c->url)) {
        /* Nothing at that address has ever answered this engine: most
         * likely a wrong base_url (or a server not started), not an outage.
         * The retries stay (a local server may be starting); the message
         * says where to look. Only the origin: no path, no user info. */
        char origin[256];
        lr_origin_text(c->url, origin, sizeof origin);
        snprintf(never, sizeof never, "; never reached %s (no connection to it has worked "
                 "yet): check %s", origin,
                 c->target > 0 ? "the fallback's base_url or url" : c->url_option);
    }
    if (c->last_message)
        snprintf(buf, sizeof buf, "%s%s; gave up after %d attempt%s%s: %s",
                 c->last_message, never, n, n == 1 ? "" : "s", on, reason_text(reason));
    else
        snprintf(buf, sizeof buf, "gave up after %d attempt%s%s: %s", n, n == 1 ? "" : "s",
                 on, reason_text(reason));
    r->message = lr_strdup(buf);
    if (c->stream_req || c->st)
        lr_stream_result(c, r->stream_reason != LLMRETRY_STREAM_NONE);
    llmretry_event *ev = lr_event(c, LLMRETRY_EV_REQUEST_GAVE_UP);
    if (ev) {
        stream_fields(c, ev);
        ev->attempt = n > 0 ? n - 1 : 0;
        ev->reason = reason;
        ev->attempts = n;
        ev->total_ms = lr_mono_ms() - c->submitted_at;
        ev->error_kind = r->kind;
        ev->status = r->status;
        lr_post(c, ev);
    }
    finish(e, c);
}

void lr_cancel(llmretry_engine *e, llmretry_call *c)
{
    switch (c->state) {
    case LR_DONE:
        return;
    case LR_RUNNING:
        lr_detach_easy(e, c);
        break;
    case LR_VALIDATING:
        /* The host may not have taken the body yet: it must not run the
         * validator of a call that is over (lr_mail_done withdraws it). */
        break;
    default:
        lr_admission_leave(e, c);
        break;
    }
    lr_give_up(e, c, LLMRETRY_REASON_CANCELLED);
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

void lr_attempt_start(llmretry_engine *e, llmretry_call *c)
{
    int64_t now = lr_mono_ms();
    int64_t left = deadline_left(c, now);
    if (left == 0) {
        lr_give_up(e, c, LLMRETRY_REASON_DEADLINE);
        return;
    }
    CURL *easy = easy_get(e);
    if (!easy) {
        fail_to_start(e, c, "out of memory starting an attempt");
        return;
    }
    int64_t timeout = llmretry_attempt_timeout_ms(c->o.timeout_ms, left);
    c->cut_by_deadline = left != LLMRETRY_NO_DEADLINE && left < c->o.timeout_ms;
    int64_t curl_timeout = timeout;
    if (c->stream_req) {
        /* timeout_ms bounds a stream up to its first chunk (the engine's
         * timer, stream.c); libcurl's bound is the deadline, or none. */
        curl_timeout = left == LLMRETRY_NO_DEADLINE ? 0 : left;
        c->cut_by_deadline = left != LLMRETRY_NO_DEADLINE;
    }
    lr_call_setup_easy(c, easy, curl_timeout);
    CURLMcode mrc = curl_multi_add_handle(e->multi, easy);
    if (mrc != CURLM_OK) {
        easy_put(e, easy);
        char why[160];
        snprintf(why, sizeof why, "could not start an attempt: %s", curl_multi_strerror(mrc));
        fail_to_start(e, c, why);
        return;
    }
    llmretry_event *ev = lr_event(c, LLMRETRY_EV_REQUEST_STARTED);
    if (ev) {
        ev->timeout_ms = timeout;
        ev->deadline_left_ms = left;
        lr_post(c, ev);
    }
    c->easy = easy;
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
        /* The server's wait holds for the whole batch and every call to the
         * endpoint, not just this item; but a wait the call itself refused
         * as too long pauses nothing (it could stall them for years). */
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
