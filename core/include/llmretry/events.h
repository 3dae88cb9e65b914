/* llmretry/events.h — events (docs/reliability.md): typed, read field by field or as JSON.
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_EVENTS_H
#define LLMRETRY_EVENTS_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/result.h"
#include "llmretry/shapes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Events (docs/reliability.md).                                                 */
/* ------------------------------------------------------------------ */
typedef enum llmretry_event_type {
    LLMRETRY_EV_REQUEST_STARTED = 0,
    LLMRETRY_EV_REQUEST_FAILED,    /* a non-2xx HTTP response */
    LLMRETRY_EV_REQUEST_ERROR,     /* timeout, network, invalid response... */
    LLMRETRY_EV_RETRY_SCHEDULED,
    LLMRETRY_EV_REQUEST_SUCCEEDED,
    LLMRETRY_EV_REQUEST_GAVE_UP,
    /* The `shared` store (Redis) became unreachable, slow or refused the
     * password: every process paces alone until it is back. Reported once
     * per engine and change, on the first call that asks for it after. */
    LLMRETRY_EV_SHARED_UNAVAILABLE,
    LLMRETRY_EV_SHARED_RECOVERED,  /* ... and it is back */
    /* Not an event: the type of a mailbox item holding one stream chunk
     * (LLMRETRY_MAIL_CHUNK; read it with llmretry_chunk_data). */
    LLMRETRY_EV_CHUNK
} llmretry_event_type;

const char *llmretry_event_name(llmretry_event_type t);

typedef struct llmretry_event llmretry_event;

/* Events are read field by field (llmretry_field, llmretry/shapes.h):
 * the schema of each event lives in the core alone. */

llmretry_event_type llmretry_event_type_of(const llmretry_event *ev);
size_t llmretry_event_field_count(const llmretry_event *ev);
/* Fill `out` with field `index` (0 = "event"); 0 on success, -1 past the end. */
int llmretry_event_field(const llmretry_event *ev, size_t index, llmretry_field *out);
/* The event as one line of JSON (malloc'd; free with llmretry_free). */
char *llmretry_event_to_json(const llmretry_event *ev);
void llmretry_event_free(llmretry_event *ev);

/* The JSON text of a LLMRETRY_EV_CHUNK item (one `data:` payload, as the
 * server sent it; NUL-terminated), or NULL for any other item. */
const char *llmretry_chunk_data(const llmretry_event *item, size_t *len);
/* Its SSE event name: "message" unless the stream typed its events (the
 * Responses API's "response.output_text.delta", ...); NULL for other items. */
const char *llmretry_chunk_event(const llmretry_event *item);

void llmretry_free(void *p);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_EVENTS_H */
