/* sse.h — reading a text/event-stream (docs/streaming.md), private to the core.
 *
 * Two parts, one concern each:
 *  - sse.c: the reader. Pure and incremental in the manner of hiredis's
 *    read.c: no I/O, no globals; bytes go in with lr_sse_feed, in slices
 *    split anywhere (inside a CRLF, a UTF-8 sequence, the BOM, "[DONE]"),
 *    and dispatched events come out with lr_sse_next, following the
 *    EventSource rules (WHATWG HTML §9.2.6).
 *  - sse_payload.c: what one event's data says (lr_sse_classify): a chunk
 *    (has it a finish_reason?), an error the policy can judge, or not JSON.
 *
 * Why a pull API and not a callback: the consumer (a curl write callback)
 * decides after each event whether to go on (it stops at an error event
 * or at [DONE]), the event's strings simply stay valid until the next call
 * instead of living only inside a callback, and nothing re-enters the
 * reader from inside itself. The price is that fed bytes wait in the
 * reader until pulled: drain lr_sse_next until LR_SSE_AGAIN after every
 * lr_sse_feed, and the reader never holds more than twice one
 * unterminated line (bounded, or the reader fails) plus the last slice.
 *
 * Typical use, per HTTP response:
 *     lr_sse_reader r; lr_sse_init(&r, 0);
 *     on each body slice: lr_sse_feed(&r, buf, n);
 *         while ((rc = lr_sse_next(&r, &ev)) == LR_SSE_EVENT) {
 *             lr_sse_classify(ev.event, ev.data, ev.data_len, &p, &doc);
 *             lr_sse_note(&r, &p);   ... use doc or fail with p ...
 *         }
 *         rc: LR_SSE_AGAIN (more bytes), LR_SSE_DONE, or an error < 0
 *     at EOF: lr_sse_finish(&r) says done, eof_after_finish or truncated.
 *     lr_sse_free(&r);
 */
#ifndef LLMRETRY_SSE_H
#define LLMRETRY_SSE_H

#include <stddef.h>
#include <stdint.h>

#include "llmretry.h"
#pragma GCC visibility push(hidden)

struct cJSON;

/* The default bound on one event's data. A line may be LR_SSE_LINE_SLACK
 * bytes longer, room for its field name, so that a single data: line can
 * carry max_event_bytes of data. */
#define LR_SSE_DEFAULT_MAX_EVENT_BYTES ((size_t)1 << 20)
#define LR_SSE_LINE_SLACK 16

/* Results of lr_sse_feed and lr_sse_next. Errors are sticky: once one is
 * returned, every later call returns it again until lr_sse_reset. */
enum {
    LR_SSE_AGAIN = 0,        /* nothing complete yet: feed more bytes */
    LR_SSE_EVENT = 1,        /* *ev holds an event */
    LR_SSE_DONE = 2,         /* `data: [DONE]` seen; later bytes are ignored */
    LR_SSE_TOO_LARGE = -1,   /* an event's data above max_event_bytes, or a line
                              * above max_event_bytes + LR_SSE_LINE_SLACK */
    LR_SSE_NOMEM = -2
};

/* How a stream ended (lr_sse_finish). */
typedef enum lr_sse_end {
    LR_SSE_END_DONE,         /* [DONE] seen: clean */
    LR_SSE_END_AFTER_FINISH, /* EOF right after a finished chunk: clean */
    LR_SSE_END_TRUNCATED,    /* any other EOF */
    LR_SSE_END_TOO_LARGE,    /* the reader had failed with LR_SSE_TOO_LARGE */
    LR_SSE_END_NOMEM         /* ... or with LR_SSE_NOMEM */
} lr_sse_end;

/* A growable byte string, always NUL-terminated once allocated. */
typedef struct lr_sse_buf {
    char *p;
    size_t len, cap;
} lr_sse_buf;

/* One dispatched event. Every pointer is into the reader and stays valid
 * until the next lr_sse_next, lr_sse_finish, lr_sse_reset or lr_sse_free
 * (lr_sse_feed does not touch them). Each string is NUL-terminated; data
 * may hold NUL bytes itself (hence data_len). */
typedef struct lr_sse_event {
    const char *event;       /* the event type; "message" when none was given */
    const char *data;        /* the data lines joined with "\n" */
    size_t data_len;
    const char *id;          /* the last event id (persists across events); "" = none */
    int64_t retry;           /* ms from a retry: field in this event, -1 = none */
} lr_sse_event;

typedef struct lr_sse_reader {
    size_t max_event_bytes;
    size_t max_line;         /* max_event_bytes + LR_SSE_LINE_SLACK */
    lr_sse_buf in;           /* fed bytes; in.p[pos, len) not parsed yet */
    size_t pos;              /* start of the current, unterminated line */
    size_t scan;             /* where the search for its line end resumes */
    lr_sse_buf data, type, id;
    int has_data;            /* a data: line since the last dispatch */
    int error_field;         /* an error: line (llama.cpp) since then */
    int dispatched;          /* an event was returned: clear before parsing on */
    int bom_pending;         /* the stream's first bytes may still be a BOM */
    int skip_lf;             /* the last line ended with CR: an LF next is its end too */
    int failed;              /* 0, or the sticky LR_SSE_TOO_LARGE / LR_SSE_NOMEM */
    int done;                /* [DONE] seen */
    int finished;            /* lr_sse_note: the last chunk left no choice open */
    int64_t ev_retry;        /* a retry: value in the pending event, -1 = none */
    int64_t retry_ms;        /* the last valid retry: value of the stream, -1 = none */
    /* Comment lines and dispatched events (including [DONE]) so far: what
     * the engine's idle timeout counts as the server being alive. */
    uint64_t activity;
} lr_sse_reader;

/* max_event_bytes: 0 = LR_SSE_DEFAULT_MAX_EVENT_BYTES. Allocates nothing. */
void lr_sse_init(lr_sse_reader *r, size_t max_event_bytes);
/* A new stream (the next response): state cleared, buffers kept. */
void lr_sse_reset(lr_sse_reader *r);
void lr_sse_free(lr_sse_reader *r);

/* Append len bytes (any bytes, any split). Returns LR_SSE_AGAIN, or
 * LR_SSE_DONE (the bytes are ignored), or a sticky error. */
int lr_sse_feed(lr_sse_reader *r, const void *buf, size_t len);

/* Do a body's first bytes (n of them) open an event stream: a "data:" or
 * "event:" field, or a ":" comment, after a byte-order mark and blank
 * lines? No JSON text opens so (transfer.c reads a body by this, not by
 * its label alone). Pure. */
int lr_sse_opens(const char *data, size_t n);

/* The next dispatched event from the bytes fed so far: LR_SSE_EVENT (*ev
 * filled), LR_SSE_AGAIN, LR_SSE_DONE or an error. An event with no data:
 * line is not dispatched (EventSource), and neither is the [DONE] event. */
int lr_sse_next(lr_sse_reader *r, lr_sse_event *ev);

/* The response body ended; call it once lr_sse_next has returned
 * LR_SSE_AGAIN. An unterminated event is discarded (EventSource), except
 * that `data: [DONE]` counts without its blank line: it carries nothing
 * that could be lost. Then END_AFTER_FINISH when the last chunk noted
 * (lr_sse_note) had finished every choice it carried and no data: line
 * followed it (comments and other fields may); else END_TRUNCATED. */
lr_sse_end lr_sse_finish(lr_sse_reader *r);

/* "done", "eof_after_finish", "truncated", "too_large", "nomem". */
const char *lr_sse_end_name(lr_sse_end end);

/* ------------------------------------------------------------------ */
/* sse_payload.c: what an event's data says.                           */
/* ------------------------------------------------------------------ */

typedef enum lr_sse_kind {
    LR_SSE_CHUNK,            /* a JSON object that is not an error */
    LR_SSE_ERROR,            /* a top-level "error", or the event type "error" */
    LR_SSE_INVALID           /* data that is not a JSON object (a host could not decode it) */
} lr_sse_kind;

/* How an error payload would be retried, by its provider code or status. */
typedef enum lr_sse_err_class {
    LR_SSE_ERR_OTHER,        /* not retryable (unless its status says so) */
    LR_SSE_ERR_RATE_LIMIT,   /* like a 429: rate_limit_exceeded, rate_limit_error, ... */
    LR_SSE_ERR_SERVER,       /* like a 5xx: server_error, overloaded, api_error, ... */
    LR_SSE_ERR_QUOTA         /* insufficient_quota: a 429 never retried */
} lr_sse_err_class;

typedef struct lr_sse_payload {
    lr_sse_kind kind;
    /* CHUNK: some choice has a non-null finish_reason / some has none yet. */
    int has_finish_reason, has_open_choice;
    /* ERROR: the provider's code (error.code if a string, else error.type,
     * else error.status, else a numeric error.code as text: the order
     * lr_http_error uses; "insufficient_quota" for QUOTA; malloc'd, NULL =
     * none; never the message, which may echo the prompt), its class and
     * the HTTP status it stands for: a 400..599 code or status the
     * provider gave, else 429 (RATE_LIMIT, QUOTA), 503 (overloaded,
     * unavailable), 500 (other SERVER), 400 (OTHER). */
    char *code;
    lr_sse_err_class err_class;
    int status;
    /* INVALID: what is wrong (static text, no data quoted). */
    const char *why;
} lr_sse_payload;

/* cJSON's strings end at their first NUL, so a chunk's "\u0000" would cut
 * its string ("xa\u0000by" assembled as "xa", while hosts decoding the
 * chunk keep it). The trees lr_sse_classify parses hold no NUL: U+0000
 * comes as the two bytes 0x1F '0', and U+001F as 0x1F '1' (only an escape
 * gives it: lr_parse_body refuses raw control characters), so every
 * strlen on them is right. JSON text printed from such a tree (cJSON
 * prints 0x1F as \u001f) is turned back by lr_sse_unmask: in place, NUL
 * terminated, returning its new length (text[0..n) is NUL terminated). */
size_t lr_sse_unmask(char *text, size_t n);
/* A JSON text parsed as lr_parse_body parses a body (*why set when it is
 * refused), with "\u0000" and "\u001f" masked as above; NULL with *nomem
 * set when out of memory. */
struct cJSON *lr_sse_parse(const char *data, size_t n, const char **why, int *nomem);

/* The type of an event: its event: line's, when it had one; else, for a
 * JSON object whose "type" is "error" or "response.<something>", that type
 * (LiteLLM streams the Responses API's typed events as data: lines alone);
 * else "message". Points into event or doc. */
const char *lr_sse_type(const char *event, const struct cJSON *doc);

/* Classify one event (its type as lr_sse_type reads it). event may be NULL
 * ("message"). With doc non-NULL, *doc gets the parsed object (the
 * caller's, to cJSON_Delete), so the engine parses each chunk once; NULL when the data is not a JSON object
 * (INVALID, or an event: error whose data is not JSON). Returns 0, or
 * LR_SSE_NOMEM when the code could not be copied (p->code is then NULL). */
int lr_sse_classify(const char *event, const char *data, size_t len, lr_sse_payload *p,
                    struct cJSON **doc);
void lr_sse_payload_clear(lr_sse_payload *p);

/* A whole 2xx answer that says it failed (outcome.c), judged as an error
 * event is: a top-level "error" object or string, a choice ended by
 * finish_reason "error", or (responses: an answer of the Responses API)
 * "status": "failed". 1 with p an ERROR (lr_sse_payload_clear it), 0 when
 * it says no such thing, LR_SSE_NOMEM. */
int lr_body_error(const struct cJSON *doc, int responses, lr_sse_payload *p);

/* The failure an ERROR or INVALID payload is, for llmretry_decide:
 * ERROR -> HTTP_STATUS with status and error_code (pointing into p);
 * INVALID -> INVALID_RESPONSE. A CHUNK leaves *f zeroed. */
void lr_sse_payload_failure(const lr_sse_payload *p, llmretry_failure *f);

/* Tell the reader what the event just pulled was, for lr_sse_finish: a
 * chunk with a choice still open clears "finished", one whose choices all
 * carry a finish_reason sets it, one with no choices (a usage chunk)
 * keeps it; an error or invalid payload clears it. Kept out of the reader
 * so it stays free of JSON and the engine parses each chunk once. */
void lr_sse_note(lr_sse_reader *r, const lr_sse_payload *p);

#pragma GCC visibility pop
#endif /* LLMRETRY_SSE_H */
