/* libFuzzer target: the SSE reader (core/src/sse.c) and the chunk
 * classifier (core/src/sse_payload.c) on arbitrary response bodies.
 *
 * Input: byte 0 picks max_event_bytes (16, 256, 4096 or the default) and
 * a slice size (1..128 bytes); bytes 1-2 pick a split point; the rest is
 * the body. It is read three ways: in one piece, cut in two at the split
 * point, and in slices; each way must give the same transcript (every
 * event's fields, what the classifier said of it, the end and the
 * activity count), else the reader depends on where the network cut the
 * bytes. Along the way: every event within the limits and NUL-terminated,
 * errors sticky, and every error payload a failure the policy can judge.
 * Each slice is its own exact-size buffer, so ASan sees any over-read.
 * Build: tools/fuzz.sh. */
#include "sse.h"

#include <cjson/cJSON.h>
#include <stdint.h>

#include "fuzz_util.h"

typedef struct text {
    char *p;
    size_t len, cap;
} text;

static void put(text *t, const void *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->p = realloc(t->p, t->cap);
        if (!t->p)
            abort();
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
}

/* Length-prefixed, so no field can run into the next. */
static void put_field(text *t, const char *s, size_t n)
{
    put(t, &n, sizeof n);
    put(t, s, n);
}

static void check_event(const lr_sse_reader *r, const lr_sse_event *ev)
{
    if (!ev->event || !ev->data || !ev->id)
        fail("event with a NULL string");
    if (ev->data_len > r->max_event_bytes || ev->data[ev->data_len] != '\0')
        fail("event data above the limit or not NUL-terminated");
    if (strlen(ev->event) > r->max_line || strlen(ev->id) > r->max_line)
        fail("event type or id longer than a line");
    if (ev->retry < -1 || ev->retry > LLMRETRY_MAX_WAIT_MS)
        fail("retry out of range");
    if (ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0)
        fail("[DONE] dispatched as an event");
}

static void record(text *t, lr_sse_reader *r, const lr_sse_event *ev)
{
    lr_sse_payload p;
    cJSON *doc = NULL;
    check_event(r, ev);
    if (lr_sse_classify(ev->event, ev->data, ev->data_len, &p, &doc) != 0)
        abort();                    /* out of memory: not a finding */
    /* An error event whose data is not JSON has no document either. */
    if ((p.kind == LR_SSE_CHUNK && !doc) || (p.kind == LR_SSE_INVALID && doc))
        fail("a chunk without its document, or an invalid payload with one");
    cJSON_Delete(doc);
    if (p.kind == LR_SSE_ERROR) {
        llmretry_failure f;
        if (p.status < 400 || p.status > 599)
            fail("error payload status outside 400..599");
        if (p.err_class == LR_SSE_ERR_QUOTA && (!p.code || strcmp(p.code, "insufficient_quota")))
            fail("quota error without its code");
        lr_sse_payload_failure(&p, &f);
        llmretry_decision d = llmretry_decide(NULL, &f, 0, INT64_C(1700000000000),
                                              LLMRETRY_NO_DEADLINE, 0.5);
        if (d.delay_ms < 0 || (p.err_class == LR_SSE_ERR_QUOTA && d.retry))
            fail("a negative delay, or a quota error retried");
    }
    lr_sse_note(r, &p);
    put_field(t, ev->event, strlen(ev->event));
    put_field(t, ev->data, ev->data_len);
    put_field(t, ev->id, strlen(ev->id));
    put(t, &ev->retry, sizeof ev->retry);
    put(t, &p.kind, sizeof p.kind);
    put(t, &p.has_finish_reason, sizeof p.has_finish_reason);
    put(t, &p.has_open_choice, sizeof p.has_open_choice);
    put(t, &p.status, sizeof p.status);
    put_field(t, p.code ? p.code : "", p.code ? strlen(p.code) : 0);
    lr_sse_payload_clear(&p);
}

/* Read body[0, n) in slices of step (> 0) bytes, or with split > 0 in two
 * pieces cut there. */
static text run(const uint8_t *body, size_t n, size_t max, size_t step, size_t split)
{
    lr_sse_reader r;
    lr_sse_event ev;
    text t = {0};
    int rc = LR_SSE_AGAIN;
    uint64_t activity = 0;
    put(&t, "", 0);
    lr_sse_init(&r, max);
    for (size_t off = 0; off < n;) {
        size_t len = split ? (off == 0 ? split : n - split) : (n - off < step ? n - off : step);
        char *slice = copy(body + off, len);
        int frc = lr_sse_feed(&r, slice, len);
        free(slice);
        off += len;
        if (rc < 0 || rc == LR_SSE_DONE) {
            if (frc != rc)
                fail("a feed after the end or a failure did not repeat it");
            continue;               /* keep feeding: later bytes must change nothing */
        }
        while ((rc = lr_sse_next(&r, &ev)) == LR_SSE_EVENT)
            record(&t, &r, &ev);
        if (r.activity < activity)
            fail("activity went down");
        activity = r.activity;
        if (rc < 0 && lr_sse_next(&r, &ev) != rc)
            fail("a failure that is not sticky");
    }
    lr_sse_end end = lr_sse_finish(&r);
    if ((end == LR_SSE_END_DONE) != (r.done != 0))
        fail("end done without [DONE], or the reverse");
    if ((end == LR_SSE_END_TOO_LARGE) != (r.failed == LR_SSE_TOO_LARGE))
        fail("end too_large without the failure, or the reverse");
    put(&t, &end, sizeof end);
    put(&t, &r.activity, sizeof r.activity);
    lr_sse_free(&r);
    return t;
}

static int same(const text *a, const text *b)
{
    return a->len == b->len && memcmp(a->p, b->p, a->len) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t limits[4] = {16, 256, 4096, 0};
    if (size < 3)
        return 0;
    uint8_t ctl = data[0];
    size_t max = limits[ctl & 3];
    size_t step = (size_t)1 << ((ctl >> 2) & 7);
    size_t body_len = size - 3;
    size_t split = body_len > 1 ? 1 + ((size_t)data[1] << 8 | data[2]) % (body_len - 1) : 0;
    const uint8_t *body = data + 3;

    text one = run(body, body_len, max, body_len ? body_len : 1, 0);
    text two = run(body, body_len, max, 1, split);  /* split 0: byte by byte */
    text sliced = run(body, body_len, max, step, 0);
    if (!same(&one, &two))
        fail("split in two: not the transcript of one piece");
    if (!same(&one, &sliced))
        fail("in slices: not the transcript of one piece");
    free(two.p);
    free(sliced.p);
    free(one.p);
    return 0;
}
