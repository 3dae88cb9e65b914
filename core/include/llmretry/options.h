/* llmretry/options.h — the options of one call (DESIGN §2): a plain struct, its defaults and checks.
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_OPTIONS_H
#define LLMRETRY_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Options of one call (DESIGN §2).                                    */
/* ------------------------------------------------------------------ */
typedef enum llmretry_jitter {
    LLMRETRY_JITTER_ADDITIVE = 0, /* min(cap, base*2^n) + U(0, base) */
    LLMRETRY_JITTER_FULL,         /* U(0, min(cap, base*2^n)) */
    LLMRETRY_JITTER_NONE          /* min(cap, base*2^n) */
} llmretry_jitter;

typedef enum llmretry_retry_mode {
    LLMRETRY_RETRY_SAFE = 0,
    /* Never retry once the request may have reached the server. */
    LLMRETRY_RETRY_UNSAFE
} llmretry_retry_mode;

/* Parse "additive"/"full"/"none" and "safe"/"unsafe"; EINVAL otherwise. */
llmretry_status llmretry_jitter_parse(const char *s, llmretry_jitter *out);
llmretry_status llmretry_retry_mode_parse(const char *s, llmretry_retry_mode *out);
const char *llmretry_jitter_name(llmretry_jitter j);
const char *llmretry_retry_mode_name(llmretry_retry_mode m);

typedef struct llmretry_group llmretry_group;
typedef struct llmretry_channel llmretry_channel;

#define LLMRETRY_NO_DEADLINE (-1)
#define LLMRETRY_EVENTS_ALL 0x3fu
#define LLMRETRY_MAX_STATUSES 64
/* Deepest nesting of arrays and objects in a 2xx body that counts as a
 * success: real responses nest a handful of levels; Python's decoder gives
 * up somewhere below cJSON's 1000, depending on its caller's stack. */
#define LLMRETRY_MAX_BODY_DEPTH 256

/* Longest request_id accepted, in bytes. */
#define LLMRETRY_REQUEST_ID_MAX 256

typedef struct llmretry_options {
    /* Endpoint. `url` is used as is when set; otherwise base_url (else
     * $OPENAI_BASE_URL, else https://api.openai.com/v1) + "/chat/completions". */
    const char *url;
    const char *base_url;
    /* Sent as "Authorization: Bearer <key>" when non-NULL (else
     * $OPENAI_API_KEY when use_env_api_key). Never logged. */
    const char *api_key;
    int use_env_api_key;           /* default 1 */

    /* The request body: JSON text, sent as is. Required. */
    const char *body;
    size_t body_len;
    /* Model name for events; NULL = read "model" from the body. */
    const char *model;

    /* Extra request headers, "Name: value" each. HTAB is allowed in values
     * (RFC 9110 field values); CR, LF, NUL and other controls are EINVAL.
     * Content-Length, Transfer-Encoding, Host, X-Client-Request-Id and
     * Idempotency-Key are EINVAL (framing, and the ids have options), as
     * is Authorization while api_key is set. A caller's Authorization
     * replaces a key from $OPENAI_API_KEY; a caller's Content-Type, Accept
     * or User-Agent replaces the default one. A value of only spaces or
     * tabs sends the header empty. */
    const char *const *headers;
    size_t n_headers;

    /* NULL = a fresh UUID v4. Sent as X-Client-Request-Id. Printable
     * ASCII, at most LLMRETRY_REQUEST_ID_MAX bytes (longer is EINVAL, never
     * cut: a cut id would not match the caller's records). */
    const char *request_id;
    /* Sent as Idempotency-Key on every attempt when non-NULL. */
    const char *idempotency_key;
    /* Name of the policy these options came from, copied into events
     * (NULL = none). */
    const char *policy;

    int64_t timeout_ms;            /* 60000, > 0 */
    int max_retries;               /* 3, >= 0 */
    int64_t base_delay_ms;         /* 800, >= 0 */
    int64_t max_delay_ms;          /* 30000, >= 0 */
    llmretry_jitter jitter;        /* additive */
    int64_t deadline_ms;           /* LLMRETRY_NO_DEADLINE, else >= 0 */
    llmretry_retry_mode retry_mode;/* safe */
    /* Statuses that may be retried; n_retry_statuses == 0 = the default
     * set (408, 429, 500-599 except 501 and 505). */
    int retry_statuses[LLMRETRY_MAX_STATUSES];
    size_t n_retry_statuses;
    int64_t max_retry_after_ms;    /* 120000, >= 0 */
    int retry_invalid_response;    /* 1 */
    int64_t max_response_bytes;    /* 32 MiB, > 0 */

    /* 1 = each 2xx JSON response waits for llmretry_call_validated()
     * from the host before the call succeeds (DESIGN §1). */
    int validate;
    /* Which events to produce: bit (1u << type) for each llmretry_event_type.
     * LLMRETRY_EVENTS_ALL by default; 0 = none (the call still has its
     * result). Hosts whose logger drops some levels ask only for the rest. */
    unsigned events;
    /* CA bundle to verify servers with, instead of libcurl's default bundle
     * (CURLOPT_CAINFO; NULL = the default). */
    const char *ca_file;
    /* Submit into this batch group (NULL = none): see llmretry_group_new. */
    llmretry_group *group;
    /* Report this call's news to this channel (NULL = the engine's own for
     * LLMRETRY_SUBMIT_POLL, or none): see llmretry_channel_new. A group's
     * calls always report to the group. */
    llmretry_channel *channel;
    /* The host's own pointer, returned by llmretry_call_user_data. */
    void *user_data;
} llmretry_options;

/* Fill `o` with the defaults of DESIGN §2. */
void llmretry_options_defaults(llmretry_options *o);

/* Check every field; EINVAL with a message naming the field. */
llmretry_status llmretry_options_check(const llmretry_options *o, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_OPTIONS_H */
