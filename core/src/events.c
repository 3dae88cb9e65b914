/* The events of docs/reliability.md. The field list of each event lives here
 * alone: bindings walk it with llmretry_event_field, so Python, Lua and
 * the JSON form cannot drift apart. Events never hold the API key, the
 * Authorization header or the request body. */
#include "internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

static const char *const event_names[] = {
    "llm_request_started", "llm_request_failed", "llm_request_error",
    "llm_retry_scheduled", "llm_request_succeeded", "llm_request_gave_up",
    "llm_shared_unavailable", "llm_shared_recovered",
    "llm_stream_chunk",
};

const char *llmretry_event_name(llmretry_event_type t)
{
    return (unsigned)t < sizeof event_names / sizeof *event_names ? event_names[t] : NULL;
}

llmretry_event *lr_event_new(llmretry_call *c, llmretry_event_type t)
{
    llmretry_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return NULL;
    ev->type = t;
    ev->call = c;
    ev->attempt = c->attempt;
    ev->target = c->target;
    ev->model = c->model;
    ev->deadline_left_ms = LLMRETRY_NO_DEADLINE;
    lr_call_ref(c);
    return ev;
}

void llmretry_event_free(llmretry_event *ev)
{
    if (!ev)
        return;
    free(ev->retry_after);
    free(ev->error_code);
    free(ev->body_preview);
    free(ev->error_message);
    free(ev->response_model);
    free(ev->system_fingerprint);
    free(ev->chunk);
    free(ev->chunk_event);
    free(ev->validation_path);
    free(ev->shared);
    llmretry_call *c = ev->call;
    free(ev);
    lr_call_unref(c);
}

llmretry_event_type llmretry_event_type_of(const llmretry_event *ev)
{
    return ev->type;
}

/* Field tables: the common prefix, then each event's own fields. */
enum { F_EVENT, F_REQUEST_ID, F_ATTEMPT, F_MODEL, F_POLICY,
       F_TIMEOUT_MS, F_DEADLINE_LEFT_MS, F_STATUS, F_DURATION_MS, F_RETRY_AFTER,
       F_ERROR_CODE, F_BODY_PREVIEW, F_ERROR_KIND, F_ERROR_MESSAGE, F_DELAY_MS,
       F_DELAY_SOURCE, F_NEXT_ATTEMPT, F_USAGE, F_RESPONSE_MODEL,
       F_SYSTEM_FINGERPRINT, F_REASON, F_ATTEMPTS, F_TOTAL_MS, F_STREAM, F_TTFT_MS,
       F_CHUNKS, F_STREAM_REASON, F_TARGET, F_VALIDATION_PATH, F_REPAIR, F_SHARED, F_DOWN_MS,
       F_END = -1 };

#define COMMON F_EVENT, F_REQUEST_ID, F_ATTEMPT, F_MODEL, F_POLICY
static const int fields_started[] = { COMMON, F_TIMEOUT_MS, F_DEADLINE_LEFT_MS, F_END };
static const int fields_failed[] = { COMMON, F_STATUS, F_DURATION_MS, F_RETRY_AFTER,
                                     F_ERROR_CODE, F_BODY_PREVIEW, F_END };
static const int fields_error[] = { COMMON, F_ERROR_KIND, F_ERROR_MESSAGE, F_DURATION_MS, F_END };
static const int fields_retry[] = { COMMON, F_DELAY_MS, F_DELAY_SOURCE, F_NEXT_ATTEMPT, F_END };
static const int fields_succeeded[] = { COMMON, F_STATUS, F_DURATION_MS, F_USAGE,
                                        F_RESPONSE_MODEL, F_SYSTEM_FINGERPRINT, F_END };
static const int fields_gave_up[] = { COMMON, F_REASON, F_ATTEMPTS, F_TOTAL_MS,
                                      F_ERROR_KIND, F_STATUS, F_END };
static const int fields_shared_down[] = { COMMON, F_SHARED, F_ERROR_MESSAGE, F_END };
static const int fields_shared_up[] = { COMMON, F_SHARED, F_DOWN_MS, F_END };
static const int fields_chunk[] = { F_END };
/* Only for calls that stream: what follows a succeeded / gave_up event's own
 * fields (never the text of a chunk). */
static const int fields_stream[] = { F_STREAM, F_TTFT_MS, F_CHUNKS, F_END };
static const int *const field_tables[] = {
    fields_started, fields_failed, fields_error, fields_retry, fields_succeeded, fields_gave_up,
    fields_shared_down, fields_shared_up, fields_chunk,
};

static const char *const field_names[] = {
    "event", "request_id", "attempt", "model", "policy", "timeout_ms", "deadline_left_ms",
    "status", "duration_ms", "retry_after", "error_code", "body_preview",
    "error_kind", "error_message", "delay_ms", "delay_source", "next_attempt",
    "usage", "response_model", "system_fingerprint", "reason", "attempts", "total_ms",
    "stream", "ttft_ms", "chunks", "stream_reason", "target", "validation_path", "repair",
    "shared", "down_ms",
};

/* Calls with fallbacks: every event says which target it is about, right
 * after the common fields (calls without keep their events as they were). */
static int has_target(const llmretry_event *ev)
{
    return ev->type != LLMRETRY_EV_CHUNK && ev->call->n_targets > 1;
}

static size_t own_count(const llmretry_event *ev)
{
    size_t n = 0;
    for (const int *f = field_tables[ev->type]; *f != F_END; f++)
        n++;
    return n;
}

/* Streaming calls' succeeded and gave_up events carry the stream fields
 * (gave_up: and stream_reason, when the stream broke). */
static size_t stream_count(const llmretry_event *ev)
{
    if (!ev->stream || (ev->type != LLMRETRY_EV_REQUEST_SUCCEEDED &&
                        ev->type != LLMRETRY_EV_REQUEST_GAVE_UP))
        return 0;
    return 3 + (ev->type == LLMRETRY_EV_REQUEST_GAVE_UP &&
                ev->stream_reason != LLMRETRY_STREAM_NONE);
}

/* An answer the schema refused: its error event ends with the first
 * error's path, and a retry that repairs it with "repair": true (events of
 * other failures and retries keep their fields as they were). */
static int has_verdict_field(const llmretry_event *ev)
{
    return (ev->type == LLMRETRY_EV_REQUEST_ERROR && ev->validation_path) ||
           (ev->type == LLMRETRY_EV_RETRY_SCHEDULED && ev->repair);    /* "repair": true */
}

size_t llmretry_event_field_count(const llmretry_event *ev)
{
    return own_count(ev) + stream_count(ev) + (size_t)has_target(ev) +
           (size_t)has_verdict_field(ev);
}

#define N_COMMON 5

static void set_int(llmretry_field *out, int64_t v)
{
    out->type = LLMRETRY_FIELD_INT;
    out->i = v;
}

static void set_str(llmretry_field *out, const char *s)
{
    out->type = s ? LLMRETRY_FIELD_STRING : LLMRETRY_FIELD_NULL;
    out->s = s;
}

int llmretry_event_field(const llmretry_event *ev, size_t index, llmretry_field *out)
{
    if (index >= llmretry_event_field_count(ev))
        return -1;
    int f;
    if (has_verdict_field(ev) && index == llmretry_event_field_count(ev) - 1) {
        f = ev->type == LLMRETRY_EV_RETRY_SCHEDULED ? F_REPAIR : F_VALIDATION_PATH;
    } else if (has_target(ev) && index == N_COMMON) {
        f = F_TARGET;
    } else {
        if (has_target(ev) && index > N_COMMON)
            index--;
        size_t own = own_count(ev);
        f = index < own ? field_tables[ev->type][index]
          : index - own < 3 ? fields_stream[index - own] : F_STREAM_REASON;
    }
    const llmretry_call *c = ev->call;
    *out = (llmretry_field){ .name = field_names[f], .type = LLMRETRY_FIELD_NULL };
    switch (f) {
    case F_EVENT: set_str(out, llmretry_event_name(ev->type)); break;
    case F_REQUEST_ID: set_str(out, c->request_id); break;
    case F_ATTEMPT: set_int(out, ev->attempt); break;
    case F_MODEL: set_str(out, ev->model); break;
    case F_TARGET: set_int(out, ev->target); break;
    case F_POLICY: set_str(out, c->policy); break;   /* null when none */
    case F_TIMEOUT_MS: set_int(out, ev->timeout_ms); break;
    case F_DEADLINE_LEFT_MS:
        if (ev->deadline_left_ms != LLMRETRY_NO_DEADLINE)
            set_int(out, ev->deadline_left_ms);
        break;
    case F_STATUS:
        if (ev->status > 0)
            set_int(out, ev->status);
        break;
    case F_DURATION_MS: set_int(out, ev->duration_ms); break;
    case F_RETRY_AFTER: set_str(out, ev->retry_after); break;
    case F_ERROR_CODE: set_str(out, ev->error_code); break;
    case F_BODY_PREVIEW: set_str(out, ev->body_preview); break;
    case F_ERROR_KIND: set_str(out, llmretry_error_kind_name(ev->error_kind)); break;
    case F_ERROR_MESSAGE: set_str(out, ev->error_message); break;
    case F_DELAY_MS: set_int(out, ev->delay_ms); break;
    case F_DELAY_SOURCE: set_str(out, llmretry_delay_source_name(ev->delay_source)); break;
    case F_NEXT_ATTEMPT: set_int(out, ev->next_attempt); break;
    case F_USAGE:
        if (ev->usage.present) {
            out->type = LLMRETRY_FIELD_USAGE;
            out->usage = &ev->usage;
        }
        break;
    case F_RESPONSE_MODEL: set_str(out, ev->response_model); break;
    case F_SYSTEM_FINGERPRINT: set_str(out, ev->system_fingerprint); break;
    case F_REASON: set_str(out, llmretry_reason_name(ev->reason)); break;
    case F_ATTEMPTS: set_int(out, ev->attempts); break;
    case F_TOTAL_MS: set_int(out, ev->total_ms); break;
    case F_STREAM:
        out->type = LLMRETRY_FIELD_BOOL;
        out->i = ev->stream != 0;
        break;
    case F_TTFT_MS:
        if (ev->ttft_ms >= 0)
            set_int(out, ev->ttft_ms);
        break;
    case F_CHUNKS: set_int(out, ev->chunks); break;
    case F_STREAM_REASON: set_str(out, llmretry_stream_reason_name(ev->stream_reason)); break;
    case F_VALIDATION_PATH: set_str(out, ev->validation_path); break;
    case F_REPAIR:
        out->type = LLMRETRY_FIELD_BOOL;
        out->i = 1;
        break;
    case F_SHARED: set_str(out, ev->shared); break;
    case F_DOWN_MS: set_int(out, ev->down_ms); break;
    }
    return 0;
}

char *llmretry_event_to_json(const llmretry_event *ev)
{
    cJSON *obj = cJSON_CreateObject();
    if (!obj)
        return NULL;
    size_t n = llmretry_event_field_count(ev);
    for (size_t i = 0; i < n; i++) {
        llmretry_field fl;
        llmretry_event_field(ev, i, &fl);
        cJSON *v = NULL;
        switch (fl.type) {
        case LLMRETRY_FIELD_NULL: v = cJSON_CreateNull(); break;
        case LLMRETRY_FIELD_INT: v = cJSON_CreateNumber((double)fl.i); break;
        case LLMRETRY_FIELD_BOOL: v = cJSON_CreateBool(fl.i != 0); break;
        case LLMRETRY_FIELD_STRING: v = cJSON_CreateString(fl.s); break;
        case LLMRETRY_FIELD_USAGE:
            v = cJSON_CreateObject();
            for (size_t k = 0; v && k < llmretry_shape_field_count(LLMRETRY_SHAPE_USAGE); k++) {
                llmretry_field u;
                llmretry_shape_field(LLMRETRY_SHAPE_USAGE, fl.usage, k, &u);
                cJSON_AddNumberToObject(v, u.name, (double)u.i);
            }
            break;
        default:        /* events hold no lists or JSON text */
            v = cJSON_CreateNull();
            break;
        }
        if (!v) {
            cJSON_Delete(obj);
            return NULL;
        }
        cJSON_AddItemToObject(obj, fl.name, v);
    }
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    return s;
}

const char *llmretry_chunk_data(const llmretry_event *item, size_t *len)
{
    if (!item || item->type != LLMRETRY_EV_CHUNK)
        return NULL;
    if (len)
        *len = item->chunk_len;
    return item->chunk;
}

const char *llmretry_chunk_event(const llmretry_event *item)
{
    if (!item || item->type != LLMRETRY_EV_CHUNK)
        return NULL;
    return item->chunk_event ? item->chunk_event : "message";
}
