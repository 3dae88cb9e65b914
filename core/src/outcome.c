/* What a finished attempt means: a transport failure classified (what
 * may be retried, what provably never reached the server), an HTTP status
 * with the provider's code, or a 2xx whose body must be UTF-8 JSON; and
 * the preview of a response body for events and errors. Engine thread. */
#include "engine.h"
#include "stream.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define PREVIEW_BYTES 500

/* ---- reading an outcome ------------------------------------------------ */

static char *preview_of(const char *data, size_t len)
{
    if (!data || len == 0)
        return NULL;
    if (len > PREVIEW_BYTES) {
        len = PREVIEW_BYTES;
        /* Cut on a UTF-8 boundary so hosts can decode the preview. */
        while (len > 0 && ((unsigned char)data[len] & 0xC0) == 0x80)
            len--;
    }
    return lr_strndup(data, len);
}

static void classify_transport(llmretry_call *c, CURLcode rc, lr_outcome *out)
{
    llmretry_failure *f = &out->f;
    const char *detail = c->curl_err[0] ? c->curl_err : curl_easy_strerror(rc);
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        f->kind = c->cut_by_deadline ? LLMRETRY_ERR_DEADLINE_EXCEEDED : LLMRETRY_ERR_TIMEOUT;
        out->message = lr_printf_alloc("%s: %s",
                                       c->cut_by_deadline ? "deadline reached during the attempt"
                                                          : "attempt timed out", detail);
        break;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
        f->kind = LLMRETRY_ERR_NETWORK;
        f->never_connected = 1;
        /* The server's own name or port (a proxy's is not base_url's fault). */
        out->connect_failed = rc != CURLE_COULDNT_RESOLVE_PROXY;
        out->message = lr_printf_alloc("could not connect: %s", detail);
        break;
    case CURLE_SSL_CONNECT_ERROR:
        if (strstr(detail, "wrong version number")) {
            /* TLS to a port that answers in plain text: retrying cannot help. */
            f->kind = LLMRETRY_ERR_NETWORK;
            f->fatal = 1;
            out->message = lr_printf_alloc("TLS handshake failed (not retried): the server does "
                                           "not speak TLS on this port (an http:// URL?): %s",
                                           detail);
        } else {
            f->kind = LLMRETRY_ERR_NETWORK;
            out->message = lr_printf_alloc("network error: %s", detail);
        }
        break;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_ISSUER_ERROR:
        f->kind = LLMRETRY_ERR_NETWORK;
        f->fatal = 1;
        out->message = lr_printf_alloc("TLS verification failed (not retried): %s", detail);
        break;
    case CURLE_URL_MALFORMAT:
        f->kind = LLMRETRY_ERR_NETWORK;
        f->fatal = 1;
        f->never_connected = 1;
        out->message = lr_printf_alloc("bad URL (not retried): %s", detail);
        break;
    case CURLE_ABORTED_BY_CALLBACK:
        /* Only on_prereq aborts, before a re-send lr_resend_allowed refused:
         * a written request (never free) or a free one past the bound. */
        f->kind = LLMRETRY_ERR_NETWORK;
        if (c->resend_refused == LR_RESEND_REUSED_DIED && c->o.retry_mode == LLMRETRY_RETRY_UNSAFE)
            out->message = lr_printf_alloc("connection closed before a response (the server may "
                                           "have read the request: retry_mode=unsafe does not "
                                           "send it again)");
        else if (c->resend_refused == LR_RESEND_REUSED_DIED)
            out->message = lr_printf_alloc("connection lost before a response (the request may "
                                           "have reached the server)");
        else {
            /* Refused streams, stale or dead connections, past
             * LR_MAX_RESENDS: the request never reached the server. */
            f->never_connected = 1;
            out->message = lr_printf_alloc(c->resend_refused == LR_RESEND_STALE
                                           ? "every idle connection had unread bytes (%d tries); "
                                             "the request was not sent"
                                           : c->resend_refused == LR_RESEND_UNSENT
                                           ? "every connection was dead before the request was "
                                             "written (%d tries); the request was not sent"
                                           : "the server refused the request %d times without "
                                             "processing it", LR_MAX_RESENDS + 1);
        }
        break;
    case CURLE_WRITE_ERROR:
        if (c->too_large) {
            f->kind = LLMRETRY_ERR_RESPONSE_TOO_LARGE;
            out->message = lr_printf_alloc("response larger than max_response_bytes (%lld)",
                                           (long long)c->o.max_response_bytes);
            break;
        }
        /* out of memory while reading: a network-ish failure */
        __attribute__((fallthrough));
    case CURLE_OUT_OF_MEMORY:
#if LIBCURL_VERSION_NUM >= 0x080600
    case CURLE_TOO_LARGE:
#endif
        if (lr_call_status(c) > 0 && !c->body_begun) {
            /* Between the status line and the body: libcurl refusing a
             * header line over its 100 KB (CURL_MAX_HTTP_HEADER), which
             * before 8.6 it reports as "Out of memory". */
            f->kind = LLMRETRY_ERR_NETWORK;
            out->message = lr_printf_alloc("the response's head is larger than libcurl takes (a "
                                           "header line over 100 KB?): %s", detail);
            break;
        }
        __attribute__((fallthrough));
    default:
        f->kind = LLMRETRY_ERR_NETWORK;
        out->message = lr_printf_alloc("network error: %s", detail);
        break;
    }
}

void lr_call_read_outcome(llmretry_call *c, CURLcode rc, lr_outcome *out)
{
    memset(out, 0, sizeof *out);
    out->duration_ms = lr_mono_ms() - c->attempt_started_at;
    long status = lr_call_status(c);
    out->f.status = (int)status;
    /* A stream begins at its first body bytes (transfer.c): a 2xx event
     * stream with an empty body never began. It is still a stream, one that
     * ended before any event (truncated), not a JSON body that is not JSON:
     * llama-cpp-python's server answers so when generation fails before
     * the first token. */
    int empty_stream = rc == CURLE_OK && c->sse && status >= 200 && status < 300 &&
                       !lr_stream_owns_outcome(c);
    if (empty_stream && lr_stream_begin(c) != 0) {
        out->f.kind = LLMRETRY_ERR_NETWORK;
        out->message = lr_strdup("out of memory reading the stream");
    } else if (lr_stream_owns_outcome(c)) {
        lr_stream_outcome(c, rc, out);
        lr_answer_check(c, NULL, out);      /* the assembled answer */
        if (out->f.kind == LLMRETRY_ERR_NONE && !out->success)
            classify_transport(c, rc, out);
        /* An error event's code, as an HTTP error body's is checked. */
        out->error_code = lr_error_code_checked(c, out->error_code);
        out->f.error_code = out->error_code;
    } else if (rc != CURLE_OK) {
        classify_transport(c, rc, out);
    } else if (status >= 200 && status < 300 && c->o.raw_response) {
        out->success = 1;           /* the bytes as they came: no JSON, no usage */
    } else if (status >= 200 && status < 300) {
        /* The body must be UTF-8 JSON, as every host decodes it. */
        /* Read in place, no tree: the hosts parse the body themselves, and a
         * tree built here only to be freed was a fifth of the I/O thread's
         * work per call. A schema check builds its own (lr_answer_check). */
        const char *why = NULL;
        const char *text = c->resp.data ? c->resp.data : "";
        lr_body_tops tops;
        if (lr_read_body(text, c->resp.len, &why, &out->usage, &out->response_model,
                         &out->fingerprint, &tops) == 0) {
            /* A body that is an error, or no answer, is a failed attempt
             * (answer_error.c); its usage still counts. */
            if (!lr_answer_error(c, text, c->resp.len, &tops, out)) {
                out->success = 1;
                lr_answer_check(c, NULL, out);
            }
        } else {
            out->f.kind = LLMRETRY_ERR_INVALID_RESPONSE;
            out->message = lr_printf_alloc("HTTP %ld with a body that %s (a body must be a UTF-8 "
                                           "JSON object)", status, why);
        }
    } else {
        out->f.kind = LLMRETRY_ERR_HTTP_STATUS;
        out->message = lr_http_error(c, status, &out->error_code);
        out->f.error_code = out->error_code;
    }
    const char **slots[LR_H_POLICY_COUNT] = {
        &out->f.retry_after, &out->f.retry_after_ms, &out->f.should_retry,
        &out->f.ratelimit_reset_requests, &out->f.ratelimit_reset_tokens,
    };
    for (int i = 0; i < LR_H_POLICY_COUNT; i++)
        *slots[i] = c->hdr_set[i] ? lr_call_header(c, i) : NULL;
}

void lr_outcome_clear(lr_outcome *o)
{
    free(o->message);
    free(o->response_model);
    free(o->fingerprint);
    free(o->error_code);
    free(o->validation_errors);
    memset(o, 0, sizeof *o);
}

char *lr_call_preview(const llmretry_call *c)
{
    return preview_of(c->resp.data, c->resp.len);
}
