/* The end of a call: its result published (success, giving up,
 * cancelling) and, before giving up, its fallbacks (docs/reliability.md).
 * attempt.c decides when. I/O thread only. */
#include "engine.h"
#include "stream.h"

#include <string.h>

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
    /* on_body keeps room for the NUL. An empty 2xx answer has no buffer at
     * all (a raw_response GET of an empty file): its body is "". */
    if (c->resp.data)
        c->resp.data[c->resp.len] = '\0';
    r->body = c->resp.data ? c->resp.data : "";
    r->body_len = c->resp.len;
    r->raw_response = c->o.raw_response;
    r->usage = usage;
    r->response_model = response_model;
    r->system_fingerprint = fingerprint;
    if (c->stream_req || c->st)
        lr_stream_result(c, 0);
    /* A whole answer to a host reading a stream: mailed as its chunks
     * (stream_whole.c), before the end. Out of memory, the host reads fewer
     * chunks; the result is whole either way. */
    if (c->stream_req && c->o.stream_chunks && !c->o.raw_response && !(c->st && c->st->chunks))
        (void)lr_stream_mail_whole(c, r->body, r->body_len);
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

/* Do the n bytes at s end with suffix? */
static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* What to check when a call's base_url was answered 404 or 405 (a wrong
 * path, most likely the base's), into hint; nothing when the base looks
 * right. Two mistakes are common: the whole URL given as the base (the
 * request has the endpoint's path twice, ".../chat/completions/chat/
 * completions") and a base without a path ("http://localhost:8000", where
 * OpenAI-compatible servers answer under /v1). Target 0 only: a fallback's
 * URL may be its own url. */
static void base_url_hint(const llmretry_call *c, char *hint, size_t size)
{
    if (c->target > 0 || strncmp(c->url_option, "base_url", 8) != 0)
        return;
    const char *s;
    size_t n;
    lr_url_path(c->url, &s, &n);
    const char *mine = lr_api_path(c->o.endpoint);
    if (!ends_with(s, n, mine))
        return;
    n -= strlen(mine);                      /* what the base's path was */
    if (n == 0) {
        snprintf(hint, size, "; check %s: it has no path, and OpenAI-compatible servers "
                 "answer under one, most often /v1 (http://host:port/v1)", c->url_option);
        return;
    }
    for (int api = 0; api <= LLMRETRY_API_RESPONSES; api++) {
        const char *p = lr_api_path((llmretry_api)api);
        if (ends_with(s, n, p)) {
            snprintf(hint, size, "; check %s: it ends with %s, which each call appends (give "
                     "the API's base, such as https://api.openai.com/v1, or the whole URL as "
                     "url)", c->url_option, p);
            return;
        }
    }
}

/* What to give instead of a URL the server redirects from (3xx with a
 * Location): not followed, as a redirect may lead where the key should
 * not go. The target shown without user info or query (the server's
 * text, like any URL in a message); for a base_url whose endpoint moved
 * whole (http:// to https://, a new host), the base to give. */
static void redirect_hint(const llmretry_call *c, char *hint, size_t size)
{
    char *shown = llmretry_url_shown(c->location);
    if (!shown)
        return;
    const char *mine = lr_api_path(c->o.endpoint);
    size_t n = strlen(shown), k = strlen(mine);
    if (c->target == 0 && strncmp(c->url_option, "base_url", 8) == 0 && strstr(shown, "://") &&
        !strpbrk(shown, "?#") && n > k && ends_with(shown, n, mine))
        snprintf(hint, size, "; the server redirects to %.200s: use base_url %.*s (redirects "
                 "are not followed)", shown, (int)(n - k) > 200 ? 200 : (int)(n - k), shown);
    else
        snprintf(hint, size, "; the server redirects to %.200s (redirects are not followed: "
                 "check %s)", shown,
                 c->target > 0 ? "the fallback's base_url or url" : c->url_option);
    llmretry_free(shown);
}

/* Did the call's request carry a credential (an Authorization header, an
 * api-key, ...)? A 401 without one says what is missing. A URL with a
 * query may carry one there (?key=...): not said to have none. */
static int sent_credential(const llmretry_call *c)
{
    if (strchr(c->url, '?'))
        return 1;
    for (const struct curl_slist *h = c->headers; h; h = h->next)
        if (lr_credential_value(h->data))
            return 1;
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
    } else if (c->o.keep_response && r->kind == LLMRETRY_ERR_HTTP_STATUS && c->st &&
               c->st->fail == LR_SF_ERROR_EVENT && c->st->error_data) {
        /* A stream given up on an error event before the host read a
         * chunk: that event's data, for a host handing the stream on (the
         * openai SDK raises the error an event names; an empty 2xx stream
         * would read as an empty answer). */
        r->body = c->st->error_data;
        r->body_len = c->st->error_len;
    }
    int n = c->attempts_started;
    char buf[1024], on[40] = "", hint[400] = "";
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
        snprintf(hint, sizeof hint, "; never reached %s (no connection to it has worked "
                 "yet): check %s", origin,
                 c->target > 0 ? "the fallback's base_url or url" : c->url_option);
    } else if (r->kind == LLMRETRY_ERR_HTTP_STATUS && (r->status == 404 || r->status == 405)) {
        base_url_hint(c, hint, sizeof hint);
    } else if (r->kind == LLMRETRY_ERR_HTTP_STATUS && r->status >= 300 && r->status < 400 &&
               c->location) {
        /* Not followed (a redirect may lead where the key should not go):
         * where it leads is what to give instead, shown without user info
         * or query (the server's text, like any URL in a message). */
        redirect_hint(c, hint, sizeof hint);
    } else if (r->kind == LLMRETRY_ERR_HTTP_STATUS && r->status == 401 && !sent_credential(c)) {
        snprintf(hint, sizeof hint, "; no API key was sent (%s)", c->target > 0
                 ? "give the fallback its api_key" : "give api_key, or set OPENAI_API_KEY");
    }
    if (c->last_message)
        snprintf(buf, sizeof buf, "%s%s; gave up after %d attempt%s%s: %s",
                 c->last_message, hint, n, n == 1 ? "" : "s", on, reason_text(reason));
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
