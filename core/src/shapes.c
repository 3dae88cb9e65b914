/* What the core hands to hosts, described once (llmretry/shapes.h): each
 * shape is a table of rows (name, type, where the value lives, when it is
 * null), walked by the bindings' marshallers and read by the generator of
 * the Python surface. A field added here reaches Python's Meta and errors,
 * Lua's tables and the docs without a list to edit elsewhere. */
#include "internal.h"

#include <stddef.h>
#include <string.h>

/* When a value reads as null. */
enum {
    NULL_IF_NOT_POSITIVE = 1,      /* 0 = none (an HTTP status) */
    NULL_IF_NEGATIVE = 2,          /* -1 = none (ttft_ms, retry_after_ms) */
    NULL_IF_OK = 4,                /* a failure's field, read from a success */
};

typedef struct row {
    llmretry_field_info info;
    size_t offset, size;           /* the member read (getter NULL) */
    unsigned when_null;
    /* For values that are not a plain member: an enum's name, a list. */
    void (*get)(const void *obj, llmretry_field *out);
} row;

#define AT(T, m) offsetof(T, m), sizeof(((T *)0)->m)
#define FIELD(T, m, type, nullable, when_null, doc) \
    { { #m, type, nullable, 0, doc }, AT(T, m), when_null, NULL }
#define INT(T, m, doc) FIELD(T, m, LLMRETRY_FIELD_INT, 0, 0, doc)
#define STR(T, m, nullable, doc) FIELD(T, m, LLMRETRY_FIELD_STRING, nullable, 0, doc)
#define COMPUTED(name, type, nullable, get, doc) { { name, type, nullable, 0, doc }, 0, 0, 0, get }

static void set_str(llmretry_field *out, const char *s)
{
    out->type = s ? LLMRETRY_FIELD_STRING : LLMRETRY_FIELD_NULL;
    out->s = s;
}

static void result_kind(const void *o, llmretry_field *out)
{
    set_str(out, llmretry_error_kind_name(((const llmretry_result *)o)->kind));
}

/* A broken stream's reason is how it broke (its gave_up event says
 * "stream_interrupted" and stream_reason apart). */
static void result_reason(const void *o, llmretry_field *out)
{
    const llmretry_result *r = o;
    set_str(out, r->kind == LLMRETRY_ERR_STREAM_INTERRUPTED
                     ? llmretry_stream_reason_name(r->stream_reason)
                     : llmretry_reason_name(r->reason));
}

static void result_stream_reason(const void *o, llmretry_field *out)
{
    set_str(out, llmretry_stream_reason_name(((const llmretry_result *)o)->stream_reason));
}

/* Only calls with fallbacks have a list of what each target came to. */
static void result_targets(const void *o, llmretry_field *out)
{
    const llmretry_result *r = o;
    if (!r->targets || r->n_targets < 2)
        return;
    out->type = LLMRETRY_FIELD_LIST;
    out->list.shape = LLMRETRY_SHAPE_TARGET;
    out->list.items = r->targets;
    out->list.size = sizeof *r->targets;
    out->list.n = (size_t)r->n_targets;
}

static void target_kind(const void *o, llmretry_field *out)
{
    set_str(out, llmretry_error_kind_name(((const llmretry_target_report *)o)->kind));
}

static void target_reason(const void *o, llmretry_field *out)
{
    set_str(out, llmretry_reason_name(((const llmretry_target_report *)o)->reason));
}

#define R llmretry_result
#define USAGE_OF(m, doc) FIELD(R, m, LLMRETRY_FIELD_USAGE, 1, 0, doc)

/* In the order of Python's Meta slots (the first ten are positional). */
static const row META[] = {
    INT(R, attempt, "0-based index of the attempt that succeeded"),
    INT(R, attempts, "how many attempts were made"),
    INT(R, duration_ms, "how long the successful attempt took"),
    INT(R, total_ms, "how long the whole call took, waits included"),
    INT(R, status, "the HTTP status of the successful response"),
    USAGE_OF(usage, "the response's token usage; null when it had none"),
    STR(R, request_id, 0, "the call's request id (sent as X-Client-Request-Id)"),
    STR(R, model, 1, "the model named in the request body"),
    STR(R, response_model, 1, "the model the server says answered"),
    STR(R, system_fingerprint, 1, "the server's system_fingerprint"),
    INT(R, resends, "requests sent again at once, not counted as attempts (a refused "
                    "stream, a dead kept-alive connection): the server saw at most "
                    "attempts + resends requests"),
    FIELD(R, stream, LLMRETRY_FIELD_BOOL, 0, 0,
          "true when the call streamed (its body asked to, or the answer was an event stream)"),
    FIELD(R, ttft_ms, LLMRETRY_FIELD_INT, 1, NULL_IF_NEGATIVE,
          "for a stream, from the call's start to the first chunk of the attempt that "
          "succeeded; null otherwise"),
    INT(R, chunks, "the chunks that attempt received (0 when not streamed)"),
    INT(R, target, "which target answered: 0 the call's own, 1 its first fallback, ..."),
    USAGE_OF(usage_total, "the usage of every attempt that returned one, summed (answers "
                          "that failed validation are billed too); null when none did"),
};

/* In the order of Python's LLMError keywords (message is its argument). */
static const row ERROR[] = {
    COMPUTED("kind", LLMRETRY_FIELD_STRING, 1, result_kind,
             "the failure class (an error kind: http_status, timeout, ...)"),
    FIELD(R, message, LLMRETRY_FIELD_STRING, 1, NULL_IF_OK,
          "what went wrong, for people (never the key or the prompt)"),
    FIELD(R, status, LLMRETRY_FIELD_INT, 1, NULL_IF_NOT_POSITIVE,
          "the last HTTP status; null when no response arrived"),
    INT(R, attempt, "the 0-based index of the last attempt"),
    INT(R, attempts, "how many attempts were made"),
    STR(R, request_id, 1, "the call's request id (sent as X-Client-Request-Id)"),
    FIELD(R, retry_after_ms, LLMRETRY_FIELD_INT, 1, NULL_IF_NEGATIVE | NULL_IF_OK,
          "the server's requested wait, when it sent one"),
    FIELD(R, error_code, LLMRETRY_FIELD_STRING, 1, NULL_IF_OK,
          "the provider's error code (\"invalid_code\" when it was not a short token)"),
    FIELD(R, body_preview, LLMRETRY_FIELD_STRING, 1, NULL_IF_OK,
          "the first 500 bytes of the last response body"),
    COMPUTED("reason", LLMRETRY_FIELD_STRING, 1, result_reason,
             "why the policy stopped (a give-up reason); for stream_interrupted, how the "
             "stream broke (a stream reason)"),
    STR(R, model, 1, "the model named in the request body"),
    INT(R, duration_ms, "how long the last attempt took"),
    INT(R, total_ms, "how long the whole call took"),
    INT(R, resends, "requests sent again at once, not counted as attempts"),
    INT(R, target, "with fallbacks, the target the last attempt went to (0: the call's own)"),
    { { "targets", LLMRETRY_FIELD_LIST, 1, LLMRETRY_SHAPE_TARGET,
        "with fallbacks, what each target came to, in order; null without" },
      0, 0, 0, result_targets },
    FIELD(R, validation_errors, LLMRETRY_FIELD_JSON, 1, NULL_IF_OK,
          "an answer that did not match the call's schema: the last attempt's errors, "
          "[{path, message}, ...] (at most 20); null otherwise"),
    USAGE_OF(usage_total, "the usage of every attempt that returned one, summed (what the "
                          "failed call was billed); null when none did"),
};

static const row STREAM[] = {
    FIELD(R, stream, LLMRETRY_FIELD_BOOL, 0, 0, "true: the call streamed"),
    INT(R, chunks, "the chunks its last attempt received"),
    INT(R, chunks_delivered, "the chunks the host had read"),
    FIELD(R, ttft_ms, LLMRETRY_FIELD_INT, 1, NULL_IF_NEGATIVE,
          "from the call's start to the last attempt's first chunk; null when none came"),
    COMPUTED("stream_reason", LLMRETRY_FIELD_STRING, 1, result_stream_reason,
             "how the stream broke (a stream reason); null when it did not"),
};
#undef R

static const row USAGE[] = {
    INT(llmretry_usage, prompt_tokens, "tokens of the prompt"),
    INT(llmretry_usage, completion_tokens, "tokens of the answer"),
    INT(llmretry_usage, total_tokens, "both"),
};

#define T llmretry_target_report
static const row TARGET[] = {
    STR(T, model, 1, "the target's model"),
    INT(T, attempts, "attempts it had (0: never tried)"),
    FIELD(T, status, LLMRETRY_FIELD_INT, 1, NULL_IF_NOT_POSITIVE, "its last HTTP status"),
    COMPUTED("kind", LLMRETRY_FIELD_STRING, 1, target_kind,
             "how it failed; null for the target that succeeded or was never tried"),
    COMPUTED("reason", LLMRETRY_FIELD_STRING, 1, target_reason, "why it was given up"),
};
#undef T

#define E llmretry_endpoint_stats
static const row ENDPOINT[] = {
    STR(E, url, 0, "the endpoint's URL, its user info and query as ***"),
    STR(E, model, 1, "the model its calls name (each model on a key is an endpoint of its own)"),
    FIELD(E, has_key, LLMRETRY_FIELD_BOOL, 0, 0, "its calls send an Authorization header"),
    INT(E, requests, "first attempts sent, ever"),
    INT(E, retries, "retries sent, ever"),
    INT(E, window_requests, "first attempts over the retry budget's rolling 10 s"),
    INT(E, window_retries, "retries over the retry budget's rolling 10 s"),
    INT(E, retries_refused, "calls given up as retry_budget_exhausted, ever"),
    STR(E, breaker, 0, "the circuit breaker: \"closed\", \"open\" or \"half_open\""),
    INT(E, consecutive_failures, "transient failures in a row"),
    INT(E, breaker_opened, "times the breaker opened, ever"),
    INT(E, short_circuited, "attempts failed at once as circuit_open"),
    INT(E, open_ms_left, "while open: until a probe may go"),
    INT(E, rpm, "requests a minute in force (configured, else learned; 0: none)"),
    INT(E, tpm, "tokens a minute in force (configured, else learned; 0: none)"),
    INT(E, in_flight, "calls in flight"),
};
#undef E

#define G llmretry_group_stats
static const row GROUP[] = {
    INT(G, window, "items allowed in flight now"),
    INT(G, active, "items started and not finished"),
    INT(G, queued, "items waiting to start"),
    INT(G, pauses, "429 pauses so far"),
    INT(G, halvings, "window halvings so far"),
};
#undef G

#define N(t) t, sizeof t / sizeof t[0]
static const struct {
    const char *name;
    const row *rows;
    size_t n;
} SHAPES[LLMRETRY_SHAPE_COUNT] = {
    [LLMRETRY_SHAPE_META] = { "meta", N(META) },
    [LLMRETRY_SHAPE_ERROR] = { "error", N(ERROR) },
    [LLMRETRY_SHAPE_STREAM] = { "stream", N(STREAM) },
    [LLMRETRY_SHAPE_USAGE] = { "usage", N(USAGE) },
    [LLMRETRY_SHAPE_TARGET] = { "target", N(TARGET) },
    [LLMRETRY_SHAPE_ENDPOINT] = { "endpoint", N(ENDPOINT) },
    [LLMRETRY_SHAPE_GROUP] = { "group", N(GROUP) },
};

const char *llmretry_shape_name(llmretry_shape s)
{
    return (unsigned)s < LLMRETRY_SHAPE_COUNT ? SHAPES[s].name : NULL;
}

size_t llmretry_shape_field_count(llmretry_shape s)
{
    return (unsigned)s < LLMRETRY_SHAPE_COUNT ? SHAPES[s].n : 0;
}

const llmretry_field_info *llmretry_shape_field_info(llmretry_shape s, size_t i)
{
    return i < llmretry_shape_field_count(s) ? &SHAPES[s].rows[i].info : NULL;
}

int llmretry_shape_field(llmretry_shape s, const void *obj, size_t i, llmretry_field *out)
{
    if (i >= llmretry_shape_field_count(s))
        return -1;
    const row *r = &SHAPES[s].rows[i];
    memset(out, 0, sizeof *out);
    out->name = r->info.name;
    if (r->get) {
        r->get(obj, out);
        return 0;
    }
    /* Only the result's shapes say NULL_IF_OK. */
    if ((r->when_null & NULL_IF_OK) && ((const llmretry_result *)obj)->ok)
        return 0;
    const char *p = (const char *)obj + r->offset;
    switch (r->info.type) {
    case LLMRETRY_FIELD_STRING:
    case LLMRETRY_FIELD_JSON:
        memcpy(&out->s, p, sizeof out->s);
        out->type = out->s ? r->info.type : LLMRETRY_FIELD_NULL;
        break;
    case LLMRETRY_FIELD_USAGE:
        out->usage = (const llmretry_usage *)(const void *)p;
        out->type = out->usage->present ? LLMRETRY_FIELD_USAGE : LLMRETRY_FIELD_NULL;
        break;
    case LLMRETRY_FIELD_INT:
    case LLMRETRY_FIELD_BOOL:
        out->i = lr_int_at(obj, r->offset, r->size);
        if (r->info.type == LLMRETRY_FIELD_BOOL)
            out->i = out->i != 0;
        if (((r->when_null & NULL_IF_NOT_POSITIVE) && out->i <= 0) ||
            ((r->when_null & NULL_IF_NEGATIVE) && out->i < 0))
            break;
        out->type = r->info.type;
        break;
    default:
        break;
    }
    return 0;
}
