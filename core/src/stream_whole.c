/* A whole answer to a request that asked to stream, told again as the
 * chunks it would have streamed.
 *
 * A server may answer "stream": true with the whole answer in one JSON body
 * (one that does not stream, a cache, a gateway). The call succeeds with
 * it, but a host reading chunks (a Neovim buffer filling, a text_deltas
 * loop, the openai SDK on llmretry.httpx) got none: an empty answer on its
 * screen. So the success is mailed as chunks before the call's end:
 *   - a chat.completion: one chat.completion.chunk, each choice's message
 *     its delta (a tool call's place in "index"), the usage on it;
 *   - a text_completion: itself;
 *   - a Responses API response: its events, numbered, from
 *     response.created (no output yet) through each item's output_item,
 *     content_part and output_text events to response.completed;
 *   - anything else: no chunk (the result holds it).
 * The result is the body as the server sent it; result.chunks stays 0 (the
 * server streamed none). The telling (lr_whole_as_events) is pure: it
 * hands each event to a callback, so the fuzzer runs it on any body. */
#include "stream.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    lr_whole_emit *fn;
    void *ud;
} emitter;

/* Print one event's data (U+0000 back: sse.h) and hand it on. */
static int mail(const emitter *out, const cJSON *data, const char *event)
{
    char *text = cJSON_PrintUnformatted(data);
    if (!text)
        return -1;
    size_t n = lr_sse_unmask(text, strlen(text));
    int rc = out->fn(out->ud, text, n, event);
    free(text);
    return rc;
}

static int has_type(const cJSON *obj, const char *type)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) && strcmp(t->valuestring, type) == 0;
}

/* Set obj[key] to value (taken; NULL: out of memory). */
static int set(cJSON *obj, const char *key, cJSON *value)
{
    if (!value)
        return -1;
    if (cJSON_GetObjectItemCaseSensitive(obj, key))
        return cJSON_ReplaceItemInObjectCaseSensitive(obj, key, value) ? 0 : -1;
    return cJSON_AddItemToObject(obj, key, value) ? 0 : -1;
}

/* ---- chat completions ------------------------------------------------------ */

static int chat_chunk(const emitter *out, cJSON *doc)
{
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(doc, "choices");
    cJSON *choice;
    cJSON_ArrayForEach(choice, choices) {
        if (!cJSON_IsObject(choice))
            continue;
        cJSON *delta = cJSON_DetachItemFromObjectCaseSensitive(choice, "message");
        if (!cJSON_IsObject(delta)) {
            cJSON_Delete(delta);
            delta = cJSON_CreateObject();
        }
        if (set(choice, "delta", delta) != 0)
            return -1;
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(delta, "tool_calls");
        cJSON *call;
        int i = 0;
        if (!cJSON_IsArray(calls))
            calls = NULL;
        cJSON_ArrayForEach(call, calls) {
            if (cJSON_IsObject(call) && !cJSON_GetObjectItemCaseSensitive(call, "index") &&
                !cJSON_AddNumberToObject(call, "index", i))
                return -1;
            i++;
        }
    }
    if (set(doc, "object", cJSON_CreateString("chat.completion.chunk")) != 0)
        return -1;
    return mail(out, doc, NULL);
}

/* ---- the Responses API ------------------------------------------------------ */

typedef struct {
    const emitter *out;
    int seq;                /* sequence_number of the next event */
} events;

/* Mail `data` (taken) as the event `type`, numbered. */
static int emit(events *ev, const char *type, cJSON *data)
{
    int rc = -1;
    if (data && set(data, "type", cJSON_CreateString(type)) == 0 &&
        set(data, "sequence_number", cJSON_CreateNumber(ev->seq)) == 0)
        rc = mail(ev->out, data, type);
    ev->seq++;
    cJSON_Delete(data);
    return rc;
}

/* e (taken) with e[key] = value: value itself when `own` (taken), else a
 * reference to it (not copied, not freed with e). NULL when out of memory. */
static cJSON *holding(cJSON *e, const char *key, cJSON *value, int own)
{
    if (e && value &&
        (own ? cJSON_AddItemToObject(e, key, value) : cJSON_AddItemReferenceToObject(e, key, value)))
        return e;
    if (own)
        cJSON_Delete(value);
    cJSON_Delete(e);
    return NULL;
}

/* A new event object holding `key` (see holding). */
static cJSON *event_with(const char *key, cJSON *value, int own)
{
    return holding(cJSON_CreateObject(), key, value, own);
}

/* A copy of obj with obj[key] set to value (taken). */
static cJSON *copy_with(const cJSON *obj, const char *key, cJSON *value)
{
    cJSON *copy = cJSON_Duplicate(obj, 1);
    if (!copy || set(copy, key, value) != 0) {
        cJSON_Delete(copy);
        return NULL;
    }
    return copy;
}

/* An event of one content part: where it is, and `key` (see holding). */
static cJSON *part_event(const cJSON *where, int index, const char *key, cJSON *value, int own)
{
    cJSON *e = cJSON_Duplicate(where, 1);
    if (e && !cJSON_AddNumberToObject(e, "content_index", index)) {
        cJSON_Delete(e);
        e = NULL;
    }
    return holding(e, key, value, own);
}

static int text_events(events *ev, const cJSON *where, int index, cJSON *part, cJSON *text)
{
    cJSON *delta = part_event(where, index, "delta", text, 0);
    cJSON *done = part_event(where, index, "text", text, 0);
    int rc = emit(ev, "response.content_part.added",
                  part_event(where, index, "part", copy_with(part, "text", cJSON_CreateString("")), 1));
    rc |= delta ? set(delta, "logprobs", cJSON_CreateArray()) : -1;
    rc |= emit(ev, "response.output_text.delta", delta);
    rc |= done ? set(done, "logprobs", cJSON_CreateArray()) : -1;
    rc |= emit(ev, "response.output_text.done", done);
    return rc;
}

static int item_events(events *ev, int n, cJSON *item)
{
    cJSON *parts = has_type(item, "message") ? cJSON_GetObjectItemCaseSensitive(item, "content") : NULL;
    cJSON *added = !cJSON_IsArray(parts) ? event_with("item", item, 0)
                 : event_with("item", copy_with(item, "content", cJSON_CreateArray()), 1);
    int rc = added && cJSON_AddNumberToObject(added, "output_index", n) ? 0 : -1;
    rc |= emit(ev, "response.output_item.added", added);
    if (cJSON_IsArray(parts)) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(item, "id");
        cJSON *where = cJSON_CreateObject();
        if (!where || !(cJSON_IsString(id) ? cJSON_AddStringToObject(where, "item_id", id->valuestring)
                                           : cJSON_AddNullToObject(where, "item_id")) ||
            !cJSON_AddNumberToObject(where, "output_index", n)) {
            cJSON_Delete(where);
            return -1;
        }
        cJSON *part;
        int i = 0;
        cJSON_ArrayForEach(part, parts) {
            if (cJSON_IsObject(part)) {
                cJSON *text = has_type(part, "output_text")
                            ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
                if (cJSON_IsString(text))
                    rc |= text_events(ev, where, i, part, text);
                else
                    rc |= emit(ev, "response.content_part.added", part_event(where, i, "part", part, 0));
                rc |= emit(ev, "response.content_part.done", part_event(where, i, "part", part, 0));
            }
            i++;
        }
        cJSON_Delete(where);
    }
    cJSON *done = event_with("item", item, 0);
    rc |= done && cJSON_AddNumberToObject(done, "output_index", n) ? 0 : -1;
    rc |= emit(ev, "response.output_item.done", done);
    return rc;
}

static int response_events(const emitter *out, cJSON *doc)
{
    events ev = { out, 0 };
    cJSON *started = copy_with(doc, "output", cJSON_CreateArray());
    int rc = started ? set(started, "status", cJSON_CreateString("in_progress")) : -1;
    rc |= emit(&ev, "response.created", event_with("response", started, 1));
    cJSON *item;
    int n = 0;
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(doc, "output")) {
        if (cJSON_IsObject(item))
            rc |= item_events(&ev, n, item);
        n++;
    }
    rc |= emit(&ev, "response.completed", event_with("response", doc, 0));
    return rc;
}

/* ---- the answer ------------------------------------------------------------ */

int lr_whole_as_events(const char *body, size_t len, lr_whole_emit *fn, void *ud)
{
    emitter out = { fn, ud };
    int nomem = 0;
    const char *why = NULL;
    cJSON *doc = lr_sse_parse(body, len, &why, &nomem);
    if (nomem)
        return -1;
    const cJSON *object = cJSON_GetObjectItemCaseSensitive(doc, "object");
    const char *kind = cJSON_IsString(object) ? object->valuestring : "";
    int rc = 0;
    if (strcmp(kind, "chat.completion") == 0 &&
        cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(doc, "choices")))
        rc = chat_chunk(&out, doc);
    else if (strcmp(kind, "text_completion") == 0 &&
             cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(doc, "choices")))
        rc = mail(&out, doc, NULL);
    else if (strcmp(kind, "response") == 0 &&
             cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(doc, "output")))
        rc = response_events(&out, doc);
    cJSON_Delete(doc);
    return rc;
}

static int mail_chunk(void *call, const char *data, size_t len, const char *event)
{
    return lr_stream_mail_chunk(call, data, len, event);
}

int lr_stream_mail_whole(llmretry_call *c, const char *body, size_t len)
{
    return lr_whole_as_events(body, len, mail_chunk, c);
}
