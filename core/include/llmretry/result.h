/* llmretry/result.h — error kinds, give-up reasons, token usage and a call's result
 * (docs/python.md).
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_RESULT_H
#define LLMRETRY_RESULT_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Errors, usage and results (docs/python.md).                              */
/* ------------------------------------------------------------------ */
typedef enum llmretry_error_kind {
    LLMRETRY_ERR_NONE = 0,
    LLMRETRY_ERR_HTTP_STATUS,
    LLMRETRY_ERR_TIMEOUT,
    LLMRETRY_ERR_NETWORK,
    LLMRETRY_ERR_INVALID_RESPONSE,
    LLMRETRY_ERR_DEADLINE_EXCEEDED,
    LLMRETRY_ERR_CANCELLED,
    LLMRETRY_ERR_RESPONSE_TOO_LARGE,
    /* A stream failed after the host had read a chunk: not retried (its
     * output would repeat); result.stream_reason says how. */
    LLMRETRY_ERR_STREAM_INTERRUPTED,
    /* The endpoint's circuit breaker is open: no request was sent. */
    LLMRETRY_ERR_CIRCUIT_OPEN,
    /* The model refused (message.refusal) a call with a schema: not
     * retried; body_preview shows the start of the response. */
    LLMRETRY_ERR_REFUSAL
} llmretry_error_kind;

/* "http_status", "timeout", ... ; NULL for NONE and past the last, so that
 * k = 1, 2, ... until NULL enumerates every kind (the bindings' lists of
 * kinds, reasons and stream reasons are made so, never typed in). */
const char *llmretry_error_kind_name(llmretry_error_kind k);

typedef enum llmretry_giveup_reason {
    LLMRETRY_REASON_NONE = 0,
    LLMRETRY_REASON_RETRIES_EXHAUSTED,
    LLMRETRY_REASON_NOT_RETRYABLE,
    LLMRETRY_REASON_DEADLINE,
    LLMRETRY_REASON_RETRY_AFTER_TOO_LONG,
    LLMRETRY_REASON_UNSAFE_MODE,
    LLMRETRY_REASON_CANCELLED,
    LLMRETRY_REASON_STREAM_INTERRUPTED,
    /* The endpoint's retry budget is spent (docs/reliability.md). */
    LLMRETRY_REASON_RETRY_BUDGET_EXHAUSTED,
    /* The endpoint's circuit breaker is open. */
    LLMRETRY_REASON_CIRCUIT_OPEN
} llmretry_giveup_reason;

/* "retries_exhausted", ...; NULL for NONE and past the last (enumerable). */
const char *llmretry_reason_name(llmretry_giveup_reason r);

/* How a stream failed (result.stream_reason; NONE when it did not). */
typedef enum llmretry_stream_reason {
    LLMRETRY_STREAM_NONE = 0,
    LLMRETRY_STREAM_NETWORK,       /* the connection failed */
    LLMRETRY_STREAM_IDLE_TIMEOUT,  /* no chunk within timeout_ms / idle_timeout_ms */
    LLMRETRY_STREAM_ERROR_EVENT,   /* the server sent an error inside the stream */
    LLMRETRY_STREAM_TRUNCATED,     /* it ended without [DONE] or a finish_reason */
    LLMRETRY_STREAM_DEADLINE,      /* deadline_ms passed */
    LLMRETRY_STREAM_CANCELLED,     /* the host cancelled it */
    LLMRETRY_STREAM_INVALID_CHUNK, /* a chunk that is not a JSON object */
    LLMRETRY_STREAM_TOO_LARGE      /* above max_response_bytes */
} llmretry_stream_reason;

/* "network", "idle_timeout", ...; NULL for NONE and past the last (enumerable). */
const char *llmretry_stream_reason_name(llmretry_stream_reason r);

typedef enum llmretry_delay_source {
    LLMRETRY_DELAY_BACKOFF = 0,
    LLMRETRY_DELAY_RETRY_AFTER,
    LLMRETRY_DELAY_RATELIMIT_RESET,
    /* Not a wait: the next attempt goes to the next fallback target. */
    LLMRETRY_DELAY_FALLBACK
} llmretry_delay_source;

const char *llmretry_delay_source_name(llmretry_delay_source s);

typedef struct llmretry_usage {
    int present;                   /* 0 = the response had no usage */
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t total_tokens;
} llmretry_usage;

/* What one target of a call came to (fallbacks, docs/reliability.md): target 0 is
 * the caller's request. kind is NONE for the target that succeeded and
 * for targets never tried. Strings are the call's (valid until freed). */
typedef struct llmretry_target_report {
    const char *model;
    int attempts;                  /* 0 = never tried */
    int status;                    /* its last HTTP status, 0 = none */
    llmretry_error_kind kind;
    llmretry_giveup_reason reason;
} llmretry_target_report;

/* The final outcome of a call. Owned by the call; valid until
 * llmretry_call_free. Strings are NUL-terminated or NULL. */
typedef struct llmretry_result {
    int ok;
    const char *request_id;
    const char *model;             /* from the request */
    int status;                    /* last HTTP status, 0 = none */
    int attempt;                   /* 0-based index of the last attempt */
    int attempts;                  /* attempts made */
    /* Requests sent again at once, within an attempt, because they provably
     * never reached the server (a refused HTTP/2 stream, a keep-alive
     * connection with unread bytes) or, in safe mode, a reused connection
     * closed before any byte of a response. Not attempts: no backoff. */
    int resends;
    int64_t duration_ms;           /* of the last attempt */
    int64_t total_ms;              /* of the whole call */
    /* Fallbacks: the target of the last attempt (0 = the caller's) and how
     * many the call had (1 = none); llmretry_call_target_report says what
     * each came to. */
    int target;
    int n_targets;
    const llmretry_target_report *targets;   /* n_targets of them; NULL when 1 */

    /* Streams: stream is 1 when the request asked to stream or the answer
     * was SSE; chunks the last attempt received, chunks_delivered those the
     * host read (LLMRETRY_MAIL_CHUNK), ttft_ms from the call's submit to the
     * last attempt's first chunk (-1 = none). A stream_interrupted failure
     * keeps the partial assembled chat.completion in body/body_len. */
    int stream;
    int chunks;
    int chunks_delivered;
    int64_t ttft_ms;
    llmretry_stream_reason stream_reason;

    /* The tokens of every attempt that returned usage, summed: answers that
     * failed validation are billed too (usage below is the successful
     * attempt's alone). present == 0 when no attempt returned usage. */
    llmretry_usage usage_total;

    /* ok == 1 */
    /* The raw response body. A 2xx body counts as a success only when it
     * is a JSON object in valid UTF-8 with no raw control characters in
     * its strings, nested at most LLMRETRY_MAX_BODY_DEPTH deep (what every
     * host's decoder accepts); anything else is an invalid_response,
     * retried like one. Escapes such as \u0000 are
     * fine. Token counts in usage below are whole numbers 0..2^53 (others
     * read as 0); the raw usage stays here. */
    const char *body;
    size_t body_len;
    /* 1 = the call asked for raw_response: body is the answer's bytes as
     * they came, not a JSON object (hosts hand it on as text). */
    int raw_response;
    llmretry_usage usage;
    const char *response_model;
    const char *system_fingerprint;

    /* ok == 0 */
    llmretry_error_kind kind;
    llmretry_giveup_reason reason;
    /* One line for people and logs. For an HTTP error: "HTTP 404 from
     * /v1/chat/completions (code); gave up after ...": the URL's path only
     * (no host, query or credentials) and the provider's code with control
     * characters escaped (\n, \xNN), then the provider's message, quoted
     * and cut to 300 bytes, or "(the server's message is withheld because
     * it echoes the request)" when it quotes the request or a credential
     * (llmretry_text_quotes; docs/security.md). The raw body: body_preview. */
    const char *message;
    int64_t retry_after_ms;        /* server-requested wait, -1 = none */
    const char *error_code;        /* the provider's error code */
    const char *body_preview;      /* first 500 bytes of the response body */
    /* An answer that did not match the call's schema (the last attempt's):
     * JSON text of [{"path": "$.items[2].price", "message": "expected
     * number"}, ...], at most 20; NULL otherwise. Paths come from the
     * answer, messages from the schema: never the answer's values. */
    const char *validation_errors;
    /* With keep_response, a call that gave up on an HTTP status, or on a 2xx
     * body that is not JSON, has that response's whole body in body/body_len;
     * a stream that gave up on an error event before the host read a chunk,
     * that event's data. */

    /* keep_response calls: the head of the last attempt's response as
     * received, at most LLMRETRY_MAX_RESPONSE_HEAD bytes: its status line
     * ("HTTP/1.1 429 Too Many Requests\r\n") then one "Name: value\r\n"
     * line per header, in order, without the blank line ending it (NULL
     * when that attempt got no response). Credentials are the request's,
     * never in here. */
    const char *headers;
    size_t headers_len;
} llmretry_result;

/* Does `text` (its first 512 bytes) quote the request `body`, or one of
 * `secrets`? The screen a server's text passes before an error shows it
 * (docs/security.md, "What an error shows of the server's text"): 16 bytes
 * in a row of the body's message contents (the strings under messages,
 * input, instructions, prompt or system; all of a body that is not JSON),
 * or a secret (a key: any 16 bytes of it, or the whole of one of 8 to 15
 * bytes). 1 when it quotes (also when out of memory: withholding is the
 * safe side), else 0. For text the engine did not read itself (a Batch API
 * batch's error messages). */
int llmretry_text_quotes(const char *text, size_t len, const char *body, size_t body_len,
                         const char *const *secrets, size_t n_secrets);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_RESULT_H */
