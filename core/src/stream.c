/* Streaming calls on the engine: reading an SSE answer as it arrives, the
 * chunks in the mailbox, the commit point, the stream's timers and
 * backpressure. See stream.h for the rules; a streamed request's body is
 * stream_body.c's. */
#include "stream.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- per response ---------------------------------------------------------- */

/* The call's streaming state, made on first use. */
static lr_stream *ensure(llmretry_call *c)
{
    if (!c->st && (c->st = calloc(1, sizeof *c->st)) != NULL) {
        lr_sse_init(&c->st->reader, 0);
        c->st->ttft_ms = -1;
        c->st->first_chunk_at = -1;
    }
    return c->st;
}

int lr_stream_begin(llmretry_call *c)
{
    lr_stream *s = ensure(c);
    if (!s)
        return -1;
    lr_stream_reset(c);
    if (!s->assembler && !(s->assembler = lr_asm_new()))
        return -1;
    s->active = 1;
    s->last_activity_at = lr_mono_ms();
    return 0;
}

void lr_stream_reset(llmretry_call *c)
{
    lr_stream *s = c->st;
    if (!s)
        return;
    lr_sse_reset(&s->reader);
    lr_asm_free(s->assembler);
    s->assembler = NULL;
    lr_sse_payload_clear(&s->payload);
    free(s->final_body);
    s->final_body = NULL;
    free(s->error_data);
    s->error_data = NULL;
    s->error_len = 0;
    s->active = s->chunks = s->done = s->truncated = 0;
    s->done_at = -1;
    s->raw_bytes = 0;
    s->fail = LR_SF_NONE;
    s->first_chunk_at = -1;
    s->activity = 0;
}

void lr_stream_free(llmretry_call *c)
{
    if (!c->st)
        return;
    lr_sse_free(&c->st->reader);
    lr_asm_free(c->st->assembler);
    lr_sse_payload_clear(&c->st->payload);
    free(c->st->final_body);
    free(c->st->error_data);
    free(c->st);
    c->st = NULL;
}

/* ---- chunks into the mailbox ------------------------------------------------ */

static int mail_chunk(llmretry_call *c, const char *data, size_t len, const char *event)
{
    llmretry_event *ev = lr_event_new(c, LLMRETRY_EV_CHUNK);
    int typed = event && strcmp(event, "message") != 0;
    if (!ev || !(ev->chunk = lr_strndup(data, len)) ||
        (typed && !(ev->chunk_event = lr_strdup(event)))) {
        llmretry_event_free(ev);
        return -1;
    }
    ev->chunk_len = len;
    lr_mail_event(c, ev);
    return 0;
}

int lr_stream_mail_chunk(llmretry_call *c, const char *data, size_t len, const char *event)
{
    return ensure(c) ? mail_chunk(c, data, len, event) : -1;
}

/* Under c->mu: take the unread chunks out of the mailbox (events stay). */
static llmretry_event *unlink_chunks(llmretry_call *c)
{
    llmretry_event *dropped = NULL, **link = &c->ev_head, *prev = NULL;
    while (*link) {
        llmretry_event *ev = *link;
        if (ev->type == LLMRETRY_EV_CHUNK) {
            *link = ev->next;
            ev->next = dropped;
            dropped = ev;
        } else {
            prev = ev;
            link = &ev->next;
        }
    }
    c->ev_tail = prev;
    c->st->unread_bytes = 0;
    return dropped;
}

/* ---- reading the stream ------------------------------------------------------ */

/* One dispatched event: a chunk (assembled, maybe mailed), or the reason
 * the attempt stops. 0 to go on, -1 to stop reading. */
static int take_event(llmretry_call *c, const lr_sse_event *ev)
{
    lr_stream *s = c->st;
    cJSON *doc = NULL;
    lr_sse_payload_clear(&s->payload);
    if (lr_sse_classify(ev->event, ev->data, ev->data_len, &s->payload, &doc) != 0) {
        cJSON_Delete(doc);
        s->fail = LR_SF_NOMEM;
        return -1;
    }
    lr_sse_note(&s->reader, &s->payload);
    if (s->payload.kind != LR_SSE_CHUNK) {
        cJSON_Delete(doc);
        s->fail = s->payload.kind == LR_SSE_ERROR ? LR_SF_ERROR_EVENT : LR_SF_INVALID_CHUNK;
        if (s->fail == LR_SF_ERROR_EVENT) {
            /* Its message is read at the attempt's end, screened. */
            free(s->error_data);
            s->error_data = lr_strndup(ev->data, ev->data_len);
            s->error_len = s->error_data ? ev->data_len : 0;
        }
        return -1;
    }
    /* With or without an event: line (LiteLLM sends none); points into
     * doc, deleted last. */
    const char *type = lr_sse_type(ev->event, doc);
    int rc = lr_asm_add(s->assembler, doc) == LLMRETRY_OK ? 0 : -1;
    if (rc == 0 && strcmp(type, "response.completed") == 0) {
        /* The Responses API's last event: its response is the result; no
         * [DONE] follows. Without a response object there is no result:
         * the stream ends truncated (lr_stream_outcome). */
        const cJSON *resp = cJSON_GetObjectItemCaseSensitive(doc, "response");
        free(s->final_body);
        s->final_body = NULL;
        if (cJSON_IsObject(resp) && !(s->final_body = cJSON_PrintUnformatted(resp)))
            rc = -1;
        else if (s->final_body)
            lr_sse_unmask(s->final_body, strlen(s->final_body));   /* its U+0000 back */
        s->done = 1;
        s->done_at = lr_mono_ms();
    }
    if (rc == 0 && s->chunks++ == 0) {
        s->first_chunk_at = lr_mono_ms();
        s->ttft_ms = s->first_chunk_at - c->submitted_at;
        /* The timer now watches gaps, usually sooner than the first chunk's
         * bound: move it. Later activity only moves it later, which the
         * timer finds out when it fires (lr_stream_timer). */
        rc = lr_timer_update(c->engine, c);
    }
    if (rc == 0 && c->o.stream_chunks)
        rc = mail_chunk(c, ev->data, ev->data_len, type);
    cJSON_Delete(doc);
    if (rc != 0)
        s->fail = LR_SF_NOMEM;
    return rc;
}

size_t lr_stream_write(llmretry_call *c, const char *data, size_t n)
{
    lr_stream *s = c->st;
    if (s->done)
        return n;   /* after the end: ignored while the grace runs (lr_stream_due_at) */
    if (c->o.stream_chunks) {
        pthread_mutex_lock(&c->mu);
        int full = s->unread_bytes > c->o.stream_buffer_bytes;
        if (full)
            s->paused = 1;
        pthread_mutex_unlock(&c->mu);
        if (full)
            return CURL_WRITEFUNC_PAUSE;   /* libcurl hands these bytes again on resume */
    }
    s->raw_bytes += (int64_t)n;
    /* A whole result (assembled only) is bounded like any response body; a
     * stream the host reads as it goes keeps only its unread chunks (at most
     * stream_buffer_bytes) and the assembled text, so its length is free. */
    if (!c->o.stream_chunks && s->raw_bytes > c->o.max_response_bytes) {
        s->fail = LR_SF_TOO_LARGE;
        return 0;
    }
    int rc = lr_sse_feed(&s->reader, data, n);
    lr_sse_event ev;
    while (rc >= 0 && !s->done && (rc = lr_sse_next(&s->reader, &ev)) == LR_SSE_EVENT)
        if (take_event(c, &ev) != 0)
            return 0;               /* ends the transfer: CURLE_WRITE_ERROR */
    if (rc == LR_SSE_DONE) {
        s->done = 1;
        s->done_at = lr_mono_ms();
    } else if (rc < 0) {
        s->fail = rc == LR_SSE_TOO_LARGE ? LR_SF_TOO_LARGE : LR_SF_NOMEM;
        return 0;
    }
    if (s->reader.activity != s->activity) {
        s->activity = s->reader.activity;
        s->last_activity_at = lr_mono_ms();
    }
    if (s->done) {
        /* The stream is over whatever the server does next: the timer ends
         * the attempt if the body has not ended within the grace. */
        if (lr_timer_update(c->engine, c) != 0) {
            s->fail = LR_SF_NOMEM;
            return 0;
        }
    }
    return n;
}

/* ---- the end of an attempt --------------------------------------------------- */

static char *text(const char *fmt, long long v)
{
    char buf[200];
    snprintf(buf, sizeof buf, fmt, v);
    return lr_strdup(buf);
}

/* The assembled chat.completion becomes the response body. */
static int take_assembled(llmretry_call *c)
{
    size_t len = 0;
    char *body;
    if (c->st->final_body) {
        body = c->st->final_body;
        c->st->final_body = NULL;
        len = strlen(body);
    } else {
        body = lr_asm_result_text(c->st->assembler, &len);
    }
    if (!body)
        return -1;
    free(c->resp.data);
    c->resp.data = body;
    c->resp.len = len;
    c->resp.cap = len + 1;
    return 0;
}

int lr_stream_owns_outcome(const llmretry_call *c)
{
    return c->st && (c->st->active || c->st->fail != LR_SF_NONE);
}

void lr_stream_outcome(llmretry_call *c, CURLcode rc, lr_outcome *out)
{
    lr_stream *s = c->st;
    llmretry_failure *f = &out->f;
    lr_sse_end end = LR_SSE_END_TRUNCATED;
    switch (s->fail) {
    case LR_SF_ERROR_EVENT:
        lr_sse_payload_failure(&s->payload, f);
        out->error_code = lr_strdup(s->payload.code);
        f->error_code = out->error_code;
        out->message = lr_stream_error_text(c, s->error_data, s->error_len, f->status);
        return;
    case LR_SF_INVALID_CHUNK:
        f->kind = LLMRETRY_ERR_INVALID_RESPONSE;
        out->message = lr_strdup("a stream chunk that is not a UTF-8 JSON object");
        return;
    case LR_SF_TOO_LARGE:
        f->kind = LLMRETRY_ERR_RESPONSE_TOO_LARGE;
        out->message = text("stream larger than max_response_bytes (%lld) or an event above "
                            "the reader's bound", (long long)c->o.max_response_bytes);
        return;
    case LR_SF_NOMEM:
        f->kind = LLMRETRY_ERR_NETWORK;
        out->message = lr_strdup("out of memory reading the stream");
        return;
    case LR_SF_FIRST_CHUNK_TIMEOUT:
        f->kind = LLMRETRY_ERR_TIMEOUT;
        out->message = text("no chunk within timeout_ms (%lld ms)", (long long)c->o.timeout_ms);
        return;
    case LR_SF_IDLE_TIMEOUT:
        f->kind = LLMRETRY_ERR_TIMEOUT;
        out->message = text("the stream stalled: nothing for idle_timeout_ms (%lld ms)",
                            (long long)c->o.idle_timeout_ms);
        return;
    case LR_SF_DEADLINE:
        f->kind = LLMRETRY_ERR_DEADLINE_EXCEEDED;
        out->message = lr_strdup("deadline reached during the stream");
        return;
    case LR_SF_NONE:
        break;
    }
    if (rc != CURLE_OK && !s->done) {
        /* The transport's failure, classified by the caller. A connection
         * the server closed (FIN) inside a chunked body is still the
         * server ending the stream early; a reset or a read error is the
         * connection failing (lr_stream_reason_of). */
        s->truncated = rc == CURLE_PARTIAL_FILE;
        return;
    }
    end = s->done ? LR_SSE_END_DONE : lr_sse_finish(&s->reader);
    /* An end with nothing finished is no answer (DESIGN rule 9): a chat
     * stream needs a finish_reason, a typed one its response.completed.
     * llama-cpp-python ends a request it pre-empts with a role-only chunk
     * and [DONE]; a success there was an empty answer. */
    int no_answer = (end == LR_SSE_END_DONE || end == LR_SSE_END_AFTER_FINISH) &&
                    !s->final_body && !(s->assembler && lr_asm_stats_of(s->assembler)->finished);
    s->truncated = end == LR_SSE_END_TRUNCATED || no_answer;
    if (no_answer) {
        f->kind = LLMRETRY_ERR_NETWORK;
        out->message = text("the stream ended after %lld chunks with no finish_reason "
                            "(truncated: no choice was finished)", s->chunks);
        return;
    }
    if (end == LR_SSE_END_DONE || end == LR_SSE_END_AFTER_FINISH) {
        if (take_assembled(c) != 0) {
            f->kind = LLMRETRY_ERR_NETWORK;
            out->message = lr_strdup("out of memory assembling the stream");
            return;
        }
        const char *why = NULL;
        cJSON *doc = lr_parse_body(c->resp.data, c->resp.len, &why);
        if (doc && !why) {
            out->success = 1;
            lr_read_success(doc, &out->usage, &out->response_model, &out->fingerprint);
        } else {
            f->kind = LLMRETRY_ERR_INVALID_RESPONSE;
            out->message = lr_strdup("the assembled stream is not valid UTF-8 JSON");
        }
        cJSON_Delete(doc);
        return;
    }
    f->kind = end == LR_SSE_END_TOO_LARGE ? LLMRETRY_ERR_RESPONSE_TOO_LARGE : LLMRETRY_ERR_NETWORK;
    out->message = text(end == LR_SSE_END_TRUNCATED
                        ? "the stream ended after %lld chunks without [DONE] or a finish_reason"
                        : "the stream could not be read (%lld chunks)", s->chunks);
}

int lr_stream_attempt_failed(llmretry_call *c)
{
    if (!c->st)
        return 0;
    pthread_mutex_lock(&c->mu);
    int committed = c->st->committed;
    llmretry_event *dropped = committed ? NULL : unlink_chunks(c);
    c->st->paused = 0;
    pthread_mutex_unlock(&c->mu);
    while (dropped) {
        llmretry_event *next = dropped->next;
        llmretry_event_free(dropped);
        dropped = next;
    }
    return committed;
}

llmretry_stream_reason lr_stream_reason_of(const llmretry_call *c, llmretry_error_kind kind)
{
    switch (c->st ? c->st->fail : LR_SF_NONE) {
    case LR_SF_ERROR_EVENT: return LLMRETRY_STREAM_ERROR_EVENT;
    case LR_SF_INVALID_CHUNK: return LLMRETRY_STREAM_INVALID_CHUNK;
    case LR_SF_TOO_LARGE: return LLMRETRY_STREAM_TOO_LARGE;
    case LR_SF_FIRST_CHUNK_TIMEOUT: case LR_SF_IDLE_TIMEOUT: return LLMRETRY_STREAM_IDLE_TIMEOUT;
    case LR_SF_DEADLINE: return LLMRETRY_STREAM_DEADLINE;
    case LR_SF_NOMEM: return LLMRETRY_STREAM_NETWORK;
    case LR_SF_NONE: break;
    }
    switch (kind) {
    case LLMRETRY_ERR_DEADLINE_EXCEEDED: return LLMRETRY_STREAM_DEADLINE;
    case LLMRETRY_ERR_TIMEOUT: return LLMRETRY_STREAM_IDLE_TIMEOUT;
    case LLMRETRY_ERR_RESPONSE_TOO_LARGE: return LLMRETRY_STREAM_TOO_LARGE;
    case LLMRETRY_ERR_CANCELLED: return LLMRETRY_STREAM_CANCELLED;
    case LLMRETRY_ERR_INVALID_RESPONSE: return LLMRETRY_STREAM_INVALID_CHUNK;
    case LLMRETRY_ERR_NETWORK:
        /* A clean end of the connection before [DONE] is a truncation; a
         * reset is not (it read as one while this looked only at whether
         * the stream was active: every transport error was "truncated"). */
        return c->st && c->st->truncated ? LLMRETRY_STREAM_TRUNCATED : LLMRETRY_STREAM_NETWORK;
    default: return LLMRETRY_STREAM_NETWORK;
    }
}

void lr_stream_result(llmretry_call *c, int partial)
{
    llmretry_result *r = &c->result;
    r->stream = c->stream_req || c->st != NULL;
    r->ttft_ms = -1;
    if (!c->st)
        return;
    r->chunks = c->st->chunks;
    r->ttft_ms = c->st->ttft_ms;
    /* chunks_delivered is the host's count, kept as it reads chunks
     * (lr_stream_delivered): the engine never writes it. */
    if (partial && c->st->assembler && take_assembled(c) == 0) {
        c->resp.data[c->resp.len] = '\0';
        r->body = c->resp.data;
        r->body_len = c->resp.len;
    }
}

/* ---- timers ------------------------------------------------------------------ */

int64_t lr_stream_due_at(llmretry_call *c)
{
    lr_stream *s = c->st;
    int64_t at;
    if (s && s->done)
        return lr_time_add(s->done_at, LR_STREAM_END_GRACE_MS);   /* finished: no deadline */
    if (!s || s->first_chunk_at < 0) {
        at = lr_time_add(c->attempt_started_at, c->o.timeout_ms);
    } else {
        /* Paused: the host is slow, not the server; only the deadline runs. */
        pthread_mutex_lock(&c->mu);
        int paused = s->paused;
        pthread_mutex_unlock(&c->mu);
        at = paused ? -1 : lr_time_add(s->last_activity_at, c->o.idle_timeout_ms);
    }
    if (c->deadline_at >= 0 && (at < 0 || c->deadline_at < at))
        at = c->deadline_at;
    return at;
}

void lr_stream_timer(llmretry_engine *e, llmretry_call *c, int64_t now)
{
    int64_t at = lr_stream_due_at(c);
    if (at < 0 || at > now) {
        /* Activity since it was set (the timer is moved lazily, not per
         * chunk), or a pause: set it again, or leave it off. */
        if (lr_timer_update(e, c) == 0)
            return;
    }
    if (!ensure(c)) {
        lr_attempt_finished(e, c, CURLE_OUT_OF_MEMORY);
        return;
    }
    if (c->st->done) {
        /* The body did not end within the grace after the stream's end
         * (held open, junk, a Content-Length never met): the stream is
         * whole, so the attempt succeeds; leaving the transfer unfinished
         * closes its connection. */
        lr_attempt_finished(e, c, CURLE_OK);
        return;
    }
    c->st->fail = c->deadline_at >= 0 && now >= c->deadline_at ? LR_SF_DEADLINE
                : c->st->first_chunk_at < 0 ? LR_SF_FIRST_CHUNK_TIMEOUT : LR_SF_IDLE_TIMEOUT;
    lr_attempt_finished(e, c, CURLE_OPERATION_TIMEDOUT);
}

/* ---- backpressure -------------------------------------------------------------- */

int lr_stream_delivered(llmretry_call *c, size_t len)
{
    lr_stream *s = c->st;
    s->committed = 1;
    s->delivered++;
    /* The host reads the last chunks after the engine has published the
     * result (the result is there before the mailbox's DONE): counting at
     * the finish alone left chunks_delivered short of what the host read,
     * 0 for a host that reads only once the call is over. Only the host
     * writes this field, under c->mu. */
    c->result.chunks_delivered = s->delivered;
    s->unread_bytes -= (int64_t)len;
    if (s->paused && !s->resume_asked && s->unread_bytes <= c->o.stream_buffer_bytes) {
        s->resume_asked = 1;
        return 1;
    }
    return 0;
}

void lr_stream_resume(llmretry_engine *e, llmretry_call *c)
{
    pthread_mutex_lock(&c->mu);
    int paused = c->st && c->st->paused;
    if (c->st) {
        c->st->paused = 0;
        c->st->resume_asked = 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (!paused || c->state != LR_RUNNING || !c->easy)
        return;
    c->st->last_activity_at = lr_mono_ms();
    /* May call the write callback at once, with the bytes it paused on. */
    curl_easy_pause(c->easy, CURLPAUSE_CONT);
    lr_timer_update(e, c);
}
