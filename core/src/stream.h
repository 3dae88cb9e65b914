/* stream.h — streaming calls on the engine (docs/streaming.md), private.
 *
 * An attempt whose 2xx answer is text/event-stream is read through the SSE
 * reader (sse.c) as it arrives; every chunk goes to the assembler
 * (assembly.c), and, when the host asked for chunks (options.stream_chunks),
 * into the mailbox as a CHUNK item. The host reading its first chunk is the
 * commit point: before it a failed attempt is retried like any other and its
 * unread chunks are dropped with it; after it nothing is retried and a
 * failure ends the call as stream_interrupted, with the partial result.
 *
 * Waits of a running stream are the call's timer (timers.c): the first
 * chunk within timeout_ms of the attempt's start, then no gap above
 * idle_timeout_ms (any comment or event counts), the deadline throughout.
 * libcurl's own timeout is the deadline's. The stream's terminal event
 * ([DONE], response.completed) ends the attempt, as a success, within
 * LR_STREAM_END_GRACE_MS even if the server keeps the body open: the grace
 * only lets the body's own end (the last chunk of a chunked body) arrive,
 * so the connection can be reused. Backpressure: past
 * stream_buffer_bytes of unread chunks the transfer pauses (the write
 * callback returns CURL_WRITEFUNC_PAUSE) until the host reads; a paused
 * stream has no idle timer (the host is slow, not the server).
 *
 * Threads: everything runs on the engine thread except the fields marked
 * (c->mu), which the host's llmretry_call_next reads and writes too. */
#ifndef LR_STREAM_H
#define LR_STREAM_H

#include "engine.h"
#include "assembly.h"
#include "sse.h"
#pragma GCC visibility push(hidden)

/* How long after its terminal event a stream waits for the end of its
 * body before the engine ends the transfer itself. A server that ends its
 * body sends that end with, or just after, [DONE]: the grace only spares
 * its connection (cut, it could not be reused); one that keeps the body
 * open, sends junk after [DONE] or promises more bytes than it sends costs
 * the call this much, instead of an idle timeout and a retry. */
#define LR_STREAM_END_GRACE_MS 50

typedef enum lr_stream_fail {
    LR_SF_NONE = 0,
    LR_SF_ERROR_EVENT,             /* payload: an error the policy judges */
    LR_SF_INVALID_CHUNK,           /* payload: data that is not a JSON object */
    LR_SF_TOO_LARGE,               /* the reader's bound, or max_response_bytes */
    LR_SF_NOMEM,
    LR_SF_FIRST_CHUNK_TIMEOUT,     /* the engine's timer, below */
    LR_SF_IDLE_TIMEOUT,
    LR_SF_DEADLINE
} lr_stream_fail;

typedef struct lr_stream {
    lr_sse_reader reader;
    lr_asm *assembler;             /* this attempt's chunks */
    int active;                    /* this attempt's answer is being read as SSE */
    int chunks;                    /* this attempt's */
    int done;                      /* the terminal event seen: [DONE], response.completed */
    int64_t done_at;               /* monotonic ms, when done was set */
    int truncated;                 /* the server ended it (FIN) before the end of the stream */
    /* A typed stream's final object (the Responses API's response.completed
     * "response"): the result's body instead of the assembled chunks. */
    char *final_body;
    int64_t raw_bytes;             /* against max_response_bytes */
    lr_stream_fail fail;           /* why the attempt was cut short */
    lr_sse_payload payload;        /* of ERROR_EVENT / INVALID_CHUNK */
    /* ERROR_EVENT: the event's data as it came, for its message
     * (lr_stream_error_text screens it); NULL when out of memory. */
    char *error_data;
    size_t error_len;
    int64_t first_chunk_at;        /* monotonic ms, -1 = none yet */
    int64_t last_activity_at;      /* monotonic ms */
    uint64_t activity;             /* the reader's count, last seen */
    int64_t ttft_ms;               /* of the last attempt with a chunk, -1 = none */

    /* (c->mu) */
    int committed;                 /* the host has read a chunk */
    int delivered;                 /* chunks the host has read */
    int64_t unread_bytes;          /* chunk bytes in the mailbox */
    int paused;                    /* the transfer waits for the host to read */
    int resume_asked;              /* an LR_OP_RESUME is on its way */
} lr_stream;

/* A streaming body (a JSON object) with "stream_options":{"include_usage":
 * true} appended: malloc'd, *len updated; NULL to keep the body as it is,
 * always for a url whose path ends with /responses (stream_options is a
 * Chat Completions field: the Responses API reports usage anyway). */
char *lr_stream_with_usage(const char *url, const char *body, size_t *len);
/* A streamed call's body (a JSON object) made to say "stream": true: its
 * top-level "stream" value replaced by true, or the member added; the rest
 * of the text as it was. malloc'd, *len updated; NULL when the body says
 * so already or is not an object. */
char *lr_stream_forced(const char *body, size_t *len);

/* The response's headers said text/event-stream (on_header) and the status
 * is 2xx: read it as a stream. 0, or -1 when out of memory. */
int lr_stream_begin(llmretry_call *c);
/* A new response (an attempt or a re-send): forget the last one's stream. */
void lr_stream_reset(llmretry_call *c);
void lr_stream_free(llmretry_call *c);

/* The write callback of an active stream. */
size_t lr_stream_write(llmretry_call *c, const char *data, size_t n);

/* Is the finished attempt's outcome the stream's to read? */
int lr_stream_owns_outcome(const llmretry_call *c);
/* The finished attempt's outcome, for a stream (instead of the body's). */
void lr_stream_outcome(llmretry_call *c, CURLcode rc, lr_outcome *out);

/* A failed attempt of a call that may have delivered chunks: 1 when the
 * host has read one (the call must end: stream_interrupted), else 0 after
 * dropping the unread chunks of the attempt. */
int lr_stream_attempt_failed(llmretry_call *c);
/* The reason a committed stream failed, from the attempt's outcome. */
llmretry_stream_reason lr_stream_reason_of(const llmretry_call *c, llmretry_error_kind kind);
/* Fill the stream fields of the result (and, when `partial`, its body with
 * what was assembled so far). */
void lr_stream_result(llmretry_call *c, int partial);
/* Mail one chunk (`event`: its SSE event name, NULL or "message" for
 * none), the call's stream state made if it has none. 0, or -1 when out of
 * memory. */
int lr_stream_mail_chunk(llmretry_call *c, const char *data, size_t len, const char *event);
/* A call that asked to stream and whose success was a whole answer (a
 * server that does not stream): that answer mailed as the chunks it would
 * have streamed (stream_whole.c). 0, or -1 when out of memory. */
int lr_stream_mail_whole(llmretry_call *c, const char *body, size_t len);
/* The telling itself: each event of the whole answer `body` (JSON text),
 * in order, handed to fn (its JSON text, NUL terminated, and its event
 * name: NULL for a plain chunk); none for a body of no kind that streams.
 * 0, or -1 when out of memory or fn returned non-zero. */
typedef int lr_whole_emit(void *ud, const char *data, size_t len, const char *event);
int lr_whole_as_events(const char *body, size_t len, lr_whole_emit *fn, void *ud);

/* The running call's timer (-1 = none) and what to do when it fires. */
int64_t lr_stream_due_at(llmretry_call *c);
void lr_stream_timer(llmretry_engine *e, llmretry_call *c, int64_t now);

/* Host side (under c->mu): the host took a chunk item of `len` bytes; 1
 * when the engine must be asked to resume the transfer. */
int lr_stream_delivered(llmretry_call *c, size_t len);
/* Engine side of LR_OP_RESUME. */
void lr_stream_resume(llmretry_engine *e, llmretry_call *c);

#pragma GCC visibility pop
#endif
