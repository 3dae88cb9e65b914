/* sse.c — the incremental text/event-stream reader (docs/streaming.md; the API
 * and why it pulls are in sse.h). The parsing rules are the EventSource
 * ones (WHATWG HTML §9.2.6), plus three things servers of chat APIs need:
 * `data: [DONE]` ends the stream, an `error:` field (llama.cpp's server
 * sends errors as `error: {...}`, which a browser would drop as an unknown
 * field) is data of an event typed "error", and every line and every
 * event's data is bounded by max_event_bytes.
 *
 * Fed bytes are kept in one buffer, like hiredis's read.c; a line is
 * parsed in place once its end is in the buffer, and the partial line at
 * the end of the buffer stays there until more bytes come. Line ends are
 * bytes 0x0A and 0x0D, which never occur inside a UTF-8 sequence, so no
 * character is ever split; decoding the data is the consumer's job. */
#include "sse.h"

#include <stdlib.h>
#include <string.h>

static const char BOM[3] = {'\xEF', '\xBB', '\xBF'};

/* ------------------------------------------------------------------ */
/* Buffers                                                             */
/* ------------------------------------------------------------------ */

/* Room for n more bytes and the NUL. */
static int buf_reserve(lr_sse_buf *b, size_t n)
{
    size_t need, cap;
    if (n > SIZE_MAX - 1 - b->len)
        return -1;
    need = b->len + n + 1;
    if (need <= b->cap)
        return 0;
    cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* Always leaves b->p allocated and NUL-terminated, even for n == 0, so an
 * event's strings are never NULL. */
static int buf_append(lr_sse_buf *b, const char *s, size_t n)
{
    if (buf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static void buf_clear(lr_sse_buf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = '\0';
}

/* ------------------------------------------------------------------ */
/* Life cycle                                                          */
/* ------------------------------------------------------------------ */

void lr_sse_init(lr_sse_reader *r, size_t max_event_bytes)
{
    memset(r, 0, sizeof *r);
    r->max_event_bytes = max_event_bytes ? max_event_bytes : LR_SSE_DEFAULT_MAX_EVENT_BYTES;
    if (r->max_event_bytes > SIZE_MAX / 2)
        r->max_event_bytes = SIZE_MAX / 2;  /* no sum below can wrap */
    r->max_line = r->max_event_bytes + LR_SSE_LINE_SLACK;
    lr_sse_reset(r);
}

/* What one event accumulates; the last event id is not part of it (it
 * persists across events, EventSource's "last event ID buffer"). */
static void clear_event(lr_sse_reader *r)
{
    buf_clear(&r->data);
    buf_clear(&r->type);
    r->has_data = r->error_field = r->dispatched = 0;
    r->ev_retry = -1;
}

void lr_sse_reset(lr_sse_reader *r)
{
    r->in.len = r->pos = r->scan = 0;
    buf_clear(&r->id);
    clear_event(r);
    r->skip_lf = r->failed = r->done = r->finished = 0;
    r->bom_pending = 1;
    r->retry_ms = -1;
    r->activity = 0;
}

void lr_sse_free(lr_sse_reader *r)
{
    free(r->in.p);
    free(r->data.p);
    free(r->type.p);
    free(r->id.p);
    lr_sse_init(r, r->max_event_bytes);
}

static int fail(lr_sse_reader *r, int rc)
{
    r->failed = rc;
    return rc;
}

int lr_sse_feed(lr_sse_reader *r, const void *buf, size_t len)
{
    if (r->failed)
        return r->failed;
    if (r->done)
        return LR_SSE_DONE;
    /* Drop the parsed prefix once it is at least as long as what is kept:
     * each byte is then moved O(1) times on average, however the stream is
     * split, and the buffer stays within twice the partial line plus the
     * slice. */
    if (r->pos > 0 && r->pos >= r->in.len - r->pos) {
        memmove(r->in.p, r->in.p + r->pos, r->in.len - r->pos);
        r->in.len -= r->pos;
        r->scan -= r->pos;
        r->pos = 0;
    }
    if (len > 0 && buf_append(&r->in, buf, len))
        return fail(r, LR_SSE_NOMEM);
    return LR_SSE_AGAIN;
}

/* ------------------------------------------------------------------ */
/* Lines                                                               */
/* ------------------------------------------------------------------ */

static int is_field(const char *name, size_t n, const char *want)
{
    return n == strlen(want) && memcmp(name, want, n) == 0;
}

static int add_data(lr_sse_reader *r, const char *v, size_t n)
{
    size_t sep = r->has_data ? 1 : 0;
    /* data.len <= max_event_bytes always holds, so this cannot wrap. */
    if (n > r->max_event_bytes - r->data.len || sep > r->max_event_bytes - r->data.len - n)
        return fail(r, LR_SSE_TOO_LARGE);
    if ((sep && buf_append(&r->data, "\n", 1)) || buf_append(&r->data, v, n))
        return fail(r, LR_SSE_NOMEM);
    r->has_data = 1;
    return 0;
}

static int set_field(lr_sse_reader *r, lr_sse_buf *b, const char *v, size_t n)
{
    buf_clear(b);
    return buf_append(b, v, n) ? fail(r, LR_SSE_NOMEM) : 0;
}

/* retry: only when the value is all ASCII digits (and not empty); values
 * past LLMRETRY_MAX_WAIT_MS saturate there instead of overflowing. */
static void set_retry(lr_sse_reader *r, const char *v, size_t n)
{
    int64_t ms = 0;
    if (n == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return;
        if (ms <= LLMRETRY_MAX_WAIT_MS)
            ms = ms * 10 + (v[i] - '0');
    }
    r->ev_retry = r->retry_ms = ms > LLMRETRY_MAX_WAIT_MS ? LLMRETRY_MAX_WAIT_MS : ms;
}

/* A blank line: hand out the pending event, if it has data. */
static int dispatch(lr_sse_reader *r, lr_sse_event *ev)
{
    if (!r->has_data) {
        clear_event(r);             /* EventSource: no data, no event */
        return 0;
    }
    r->activity++;
    if (r->data.len == 6 && memcmp(r->data.p, "[DONE]", 6) == 0) {
        r->done = 1;
        return LR_SSE_DONE;
    }
    ev->event = r->type.len ? r->type.p : r->error_field ? "error" : "message";
    ev->data = r->data.p;
    ev->data_len = r->data.len;
    ev->id = r->id.p ? r->id.p : "";
    ev->retry = r->ev_retry;
    r->dispatched = 1;              /* cleared at the next call, not now: ev points here */
    return LR_SSE_EVENT;
}

/* One line, without its line end (n <= max_line). */
static int process_line(lr_sse_reader *r, const char *s, size_t n, lr_sse_event *ev)
{
    if (n == 0)
        return dispatch(r, ev);
    if (s[0] == ':') {
        r->activity++;              /* a comment: a keep-alive, typically */
        return 0;
    }
    const char *colon = memchr(s, ':', n);
    size_t nlen = colon ? (size_t)(colon - s) : n;
    const char *v = colon ? colon + 1 : s + n;
    size_t vlen = colon ? n - nlen - 1 : 0;
    if (vlen > 0 && v[0] == ' ') {
        v++;
        vlen--;
    }
    if (is_field(s, nlen, "data"))
        return add_data(r, v, vlen);
    if (is_field(s, nlen, "error")) {
        r->error_field = 1;
        return add_data(r, v, vlen);
    }
    if (is_field(s, nlen, "event"))
        return set_field(r, &r->type, v, vlen);
    if (is_field(s, nlen, "id"))
        return memchr(v, '\0', vlen) ? 0 : set_field(r, &r->id, v, vlen);
    if (is_field(s, nlen, "retry"))
        set_retry(r, v, vlen);
    return 0;                       /* unknown fields are ignored */
}

int lr_sse_opens(const char *data, size_t n)
{
    size_t i = n >= 3 && memcmp(data, BOM, 3) == 0 ? 3 : 0;
    while (i < n && (data[i] == '\r' || data[i] == '\n'))
        i++;
    return (n - i >= 5 && memcmp(data + i, "data:", 5) == 0) ||
           (n - i >= 6 && memcmp(data + i, "event:", 6) == 0) || (i < n && data[i] == ':');
}

int lr_sse_next(lr_sse_reader *r, lr_sse_event *ev)
{
    if (r->failed)
        return r->failed;
    if (r->done)
        return LR_SSE_DONE;
    if (r->dispatched)
        clear_event(r);
    for (;;) {
        const char *s = r->in.p;
        size_t end = r->in.len, e, start;
        if (r->pos == end)
            return LR_SSE_AGAIN;
        if (r->bom_pending) {
            /* Only the stream's first bytes; wait while they may still be one. */
            size_t n = end - r->pos < 3 ? end - r->pos : 3;
            if (memcmp(s + r->pos, BOM, n) != 0)
                r->bom_pending = 0;
            else if (n < 3)
                return LR_SSE_AGAIN;
            else {
                r->pos = r->scan = r->pos + 3;
                r->bom_pending = 0;
                continue;
            }
        }
        if (r->skip_lf) {
            r->skip_lf = 0;         /* the LF of a CRLF split across two feeds */
            if (s[r->pos] == '\n') {
                r->pos = r->scan = r->pos + 1;
                continue;
            }
        }
        for (e = r->scan; e < end && s[e] != '\n' && s[e] != '\r'; e++)
            ;
        if (e == end) {
            r->scan = end;          /* resume here: never rescan a long line */
            return end - r->pos > r->max_line ? fail(r, LR_SSE_TOO_LARGE) : LR_SSE_AGAIN;
        }
        start = r->pos;
        r->skip_lf = s[e] == '\r';
        r->pos = r->scan = e + 1;
        if (e - start > r->max_line)
            return fail(r, LR_SSE_TOO_LARGE);
        int rc = process_line(r, s + start, e - start, ev);
        if (rc != 0)
            return rc;
    }
}

/* ------------------------------------------------------------------ */
/* The end of the stream                                               */
/* ------------------------------------------------------------------ */

static lr_sse_end failed_end(const lr_sse_reader *r)
{
    return r->failed == LR_SSE_TOO_LARGE ? LR_SSE_END_TOO_LARGE : LR_SSE_END_NOMEM;
}

lr_sse_end lr_sse_finish(lr_sse_reader *r)
{
    lr_sse_event ev;
    if (r->failed)
        return failed_end(r);
    if (r->done)
        return LR_SSE_END_DONE;
    if (r->dispatched)
        clear_event(r);
    /* Complete lines not pulled yet: the caller broke the contract, and
     * events may be lost; never call that clean. */
    if (r->scan < r->in.len)
        return LR_SSE_END_TRUNCATED;
    /* The unterminated last line counts as a line (its event still needs a
     * blank line to be dispatched), unless it is the start of a BOM. */
    if (r->pos < r->in.len && !r->bom_pending) {
        process_line(r, r->in.p + r->pos, r->in.len - r->pos, &ev);
        r->pos = r->scan = r->in.len;
        if (r->failed)
            return failed_end(r);
    }
    if (r->has_data && r->data.len == 6 && memcmp(r->data.p, "[DONE]", 6) == 0) {
        r->done = 1;
        return LR_SSE_END_DONE;
    }
    return !r->has_data && r->finished ? LR_SSE_END_AFTER_FINISH : LR_SSE_END_TRUNCATED;
}

const char *lr_sse_end_name(lr_sse_end end)
{
    switch (end) {
    case LR_SSE_END_DONE: return "done";
    case LR_SSE_END_AFTER_FINISH: return "eof_after_finish";
    case LR_SSE_END_TRUNCATED: return "truncated";
    case LR_SSE_END_TOO_LARGE: return "too_large";
    case LR_SSE_END_NOMEM: return "nomem";
    }
    return "?";
}

void lr_sse_note(lr_sse_reader *r, const lr_sse_payload *p)
{
    if (p->kind != LR_SSE_CHUNK || p->has_open_choice)
        r->finished = 0;
    else if (p->has_finish_reason)
        r->finished = 1;
}
