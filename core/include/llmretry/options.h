/* llmretry/options.h — the options of one call (docs/reliability.md): a plain
 * struct, its defaults and checks.
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
/* Options of one call (docs/reliability.md).                                    */
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

/* The API a call's URL ends with (the `endpoint` option), appended to
 * base_url; a `url` is used as is whatever it says. */
typedef enum llmretry_api {
    LLMRETRY_API_CHAT_COMPLETIONS = 0, /* "/chat/completions" */
    LLMRETRY_API_COMPLETIONS,          /* "/completions" (legacy text completions) */
    LLMRETRY_API_EMBEDDINGS,           /* "/embeddings" */
    LLMRETRY_API_RESPONSES             /* "/responses" */
} llmretry_api;

/* The HTTP method of a call (the `method` option). Only a POST has a body;
 * GET and DELETE are idempotent, so retrying them is always safe. */
typedef enum llmretry_method {
    LLMRETRY_METHOD_POST = 0,
    LLMRETRY_METHOD_GET,
    LLMRETRY_METHOD_DELETE
} llmretry_method;

/* Parse "additive"/"full"/"none" and "safe"/"unsafe"; EINVAL otherwise. */
llmretry_status llmretry_jitter_parse(const char *s, llmretry_jitter *out);
llmretry_status llmretry_retry_mode_parse(const char *s, llmretry_retry_mode *out);
const char *llmretry_jitter_name(llmretry_jitter j);
const char *llmretry_retry_mode_name(llmretry_retry_mode m);

typedef struct llmretry_group llmretry_group;
typedef struct llmretry_channel llmretry_channel;

#define LLMRETRY_NO_DEADLINE (-1)
#define LLMRETRY_EVENTS_ALL 0xffu
#define LLMRETRY_MAX_STATUSES 64
/* Deepest nesting of arrays and objects in a 2xx body that counts as a
 * success: real responses nest a handful of levels; Python's decoder gives
 * up somewhere below cJSON's 1000, depending on its caller's stack. */
#define LLMRETRY_MAX_BODY_DEPTH 256

/* Most retries one call may make: a typo like 1000 would turn one failing
 * endpoint into hours of retries. */
#define LLMRETRY_MAX_RETRIES 100

/* Longest request_id accepted, in bytes. */
#define LLMRETRY_REQUEST_ID_MAX 256

/* Most bytes of a response head keep_response keeps (whole lines; the
 * lines past it are dropped). */
#define LLMRETRY_MAX_RESPONSE_HEAD 65536

/* Most fallback targets one call may have. */
#define LLMRETRY_MAX_FALLBACKS 8

typedef struct llmretry_options {
    /* Endpoint. `url` is used as is when set; otherwise base_url (else
     * $OPENAI_BASE_URL, else https://api.openai.com/v1) + "/" + endpoint's
     * path ("chat/completions" by default). */
    const char *url;
    const char *base_url;
    llmretry_api endpoint;         /* chat/completions */
    /* Sent as "Authorization: Bearer <key>" when non-NULL (else
     * $OPENAI_API_KEY when use_env_api_key). Never logged. */
    const char *api_key;
    int use_env_api_key;           /* default 1 */

    /* The request body: JSON text, sent as is. Required for a POST; a GET
     * or DELETE has none (body NULL or body_len 0). */
    const char *body;
    size_t body_len;
    /* POST by default; GET and DELETE (the Files API's retrieve, content
     * and delete) send no body. */
    llmretry_method method;
    /* The body's Content-Type (NULL = application/json). Another type (say
     * "multipart/form-data; boundary=...") sends the body as is, unparsed:
     * no model, stream or fallback is read from it. POST only. */
    const char *content_type;
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
    /* 32 MiB, > 0. For a stream read as a whole (stream_chunks 0), the
     * bytes of the stream; a stream whose chunks the host reads is not
     * bounded by length (its unread chunks are: stream_buffer_bytes). */
    int64_t max_response_bytes;

    /* Client-side rate limits (docs/policies.md), per endpoint (URL + API key),
     * shared by every call of the engine: at most rpm requests and tpm
     * tokens a minute, paced evenly (a second's worth at most at once).
     * 0 = none configured (the server's x-ratelimit-* headers still pace). */
    int64_t rpm;
    int64_t tpm;
    /* The tokens this call is charged against tpm; 0 = the engine's
     * estimate (prompt characters / 4 plus max_tokens, else 256),
     * corrected by the response's usage. A host with a tokenizer sets it. */
    int64_t estimated_tokens;

    /* Endpoint health (docs/reliability.md), per endpoint like rpm and tpm (the
     * latest call's values hold for it), shared by every call of the
     * engine. Retry budget: over a rolling 10 s, an endpoint's retries may
     * be at most retry_budget_ratio (0.2, >= 0) x its requests (first
     * attempts) + retry_budget_min (10, >= 0); past it a call gives up at
     * once (reason retry_budget_exhausted). Retries the server timed
     * (Retry-After, x-ratelimit-reset) are not counted: it asked for them.
     * Circuit breaker: breaker_failures (0 = off) consecutive transient
     * failures (timeout, network, 408, 429, 5xx) open it for
     * breaker_cooldown_ms (30000, > 0); meanwhile attempts fail at once
     * (kind circuit_open, no request sent); then one probe goes through and
     * its success closes it (its failure opens it again). */
    double retry_budget_ratio;
    int retry_budget_min;
    int breaker_failures;
    int64_t breaker_cooldown_ms;

    /* Fallback targets (docs/reliability.md): JSON text of an array of objects
     * {"model", "base_url" | "url", "api_key" | "api_key_env", "headers":
     * {name: value}} (NULL = none; at most LLMRETRY_MAX_FALLBACKS). When
     * the current target gives up for any reason but a cancel, a passed
     * deadline, an unsafe-mode stop, a broken stream or a 400/422 (the
     * request itself is wrong), the next one is tried within the same
     * deadline, its retries counted afresh. A target's body is the
     * caller's with "model" replaced when it names one. A target with no
     * URL of its own is the caller's endpoint and sends the caller's key
     * and headers; one with its own URL sends only its own (a key never
     * goes to a host it was not given for). Set with
     * llmretry_options_set_json; never appears in messages. */
    const char *fallbacks;

    /* Structured outputs (docs/structured-outputs.md): JSON text of a JSON
     * Schema (NULL = none) that every 2xx answer must match: each choice's
     * message content (or a Responses answer's output text), read as JSON
     * after llmretry_extract_json. Without it, a body that asks for
     * response_format {"type": "json_schema"} (Chat Completions) or
     * text.format {"type": "json_schema"} (Responses) is held to its own
     * schema, its content read as JSON as it is. A mismatch is an
     * invalid_response (retried per retry_invalid_response) with
     * result.validation_errors; with a schema, a message.refusal is kind
     * refusal, never retried. A schema with an unsupported keyword is
     * EINVAL at submit. Set with llmretry_options_set_json. */
    const char *schema;
    /* 1 = a retry after an answer that failed the schema (or validate) sends
     * the body with two more messages: the failed answer, as the
     * assistant's, and one user message naming the errors (0 by default). */
    int repair;

    /* Streaming (docs/streaming.md): a call streams when its body says
     * "stream": true; a text/event-stream response is read as SSE whatever
     * the body said. For a streaming request timeout_ms bounds the attempt
     * up to its first chunk, idle_timeout_ms (30000, > 0) each gap between
     * two (keep-alive comments count), deadline_ms everything. */
    int64_t idle_timeout_ms;
    /* At most this many bytes of unread chunks per call (1 MiB, > 0); past
     * it the transfer pauses until the host reads (stream_chunks only). */
    int64_t stream_buffer_bytes;
    /* 1 = hand each chunk to the host (LLMRETRY_MAIL_CHUNK). Reading the
     * first one is the commit point: until then a failure is retried and
     * unread chunks are dropped with their attempt; after it nothing is
     * retried and a failure ends the call as stream_interrupted. 0 = the
     * engine only assembles: the result is one chat.completion, the whole
     * call retryable. */
    int stream_chunks;
    /* 1 = the body is the host's encoding of its caller's object (hosts
     * set it for bodies they encoded, never for the caller's own text):
     * with stream_chunks the body is made to say "stream": true (its
     * "stream" member replaced or added), and a streaming body (a JSON
     * object with "stream": true) that sets no stream_options gets
     * "stream_options": {"include_usage": true}, so the stream reports its
     * usage (not for a url ending with /responses). */
    int stream_usage;
    /* 1 = keep the last attempt's response as received, for hosts that hand
     * it on as it came (an HTTP client's transport): result.headers holds
     * its status line and header lines (llmretry_call_response_head reads
     * them while a stream runs), and a call that gives up on an HTTP status
     * (or on a 2xx body that is not JSON) keeps that response's whole body
     * in result.body. 0 by default: nothing is kept. */
    int keep_response;
    /* 1 = a 2xx answer's bytes are the result as they came (result.body,
     * result.raw_response set), not required to be a JSON object: a file's
     * content, JSON Lines. No usage is read from it, no stream, no schema. */
    int raw_response;

    /* 1 = each 2xx JSON response waits for llmretry_call_validated()
     * from the host before the call succeeds (docs/design.md). */
    int validate;
    /* Which events to produce: bit (1u << type) for each llmretry_event_type.
     * LLMRETRY_EVENTS_ALL by default; 0 = none (the call still has its
     * result). Hosts whose logger drops some levels ask only for the rest. */
    unsigned events;
    /* CA bundle to verify servers with, instead of libcurl's default bundle
     * (CURLOPT_CAINFO; NULL = the default, or where libcurl's built-in path
     * is missing, the system's bundle at a distribution's usual place). */
    const char *ca_file;
    /* Submit into this batch group (NULL = none): see llmretry_group_new. */
    llmretry_group *group;
    /* Report this call's news to this channel (NULL = the engine's own for
     * LLMRETRY_SUBMIT_POLL, or none): see llmretry_channel_new. A polling group's
     * calls always report to the group's channel. */
    llmretry_channel *channel;
    /* The host's own pointer, returned by llmretry_call_user_data. */
    void *user_data;
} llmretry_options;

/* Fill `o` with the defaults of docs/reliability.md. */
void llmretry_options_defaults(llmretry_options *o);

/* Check every field; EINVAL with a message naming the field. */
llmretry_status llmretry_options_check(const llmretry_options *o, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* The option table: every call option a host sets by name.            */
/* ------------------------------------------------------------------ */
/* Bindings look options up here and set them with the typed setters
 * below, so they keep no list of options and no rule of their own. The
 * host-only fields (body, group, channel, user_data, validate,
 * use_env_api_key) are not in the table. */
typedef enum llmretry_option_type {
    LLMRETRY_OPTTYPE_TEXT = 1,     /* const char *; NULL = unset */
    LLMRETRY_OPTTYPE_INT,          /* an int or int64_t field, in min..max */
    LLMRETRY_OPTTYPE_BOOL,         /* an int, 0 or 1 */
    LLMRETRY_OPTTYPE_ENUM,         /* set by the name of one of `choices` */
    LLMRETRY_OPTTYPE_STATUSES,     /* retry_statuses/n_retry_statuses, each min..max */
    LLMRETRY_OPTTYPE_HEADERS,      /* headers/n_headers, "Name: value" lines */
    LLMRETRY_OPTTYPE_NUMBER,       /* a double, min..max, finite */
    LLMRETRY_OPTTYPE_TARGETS,      /* JSON text of a list of targets (fallbacks) */
    LLMRETRY_OPTTYPE_SCHEMA        /* JSON text of a JSON Schema (schema) */
} llmretry_option_type;

#define LLMRETRY_OPTFLAG_NULLABLE 1u    /* may be unset (null, None, nil) */
#define LLMRETRY_OPTFLAG_POLICY 2u      /* a named policy may set it */
#define LLMRETRY_OPTFLAG_SECRET 4u      /* its value never appears anywhere */
#define LLMRETRY_OPTFLAG_PER_CALL 8u    /* the calls of a batch cannot share it */
#define LLMRETRY_OPTFLAG_POLICY_AUTO 16u/* in a policy only "auto": a new value per call */

typedef struct llmretry_option_info {
    const char *name;
    llmretry_option_type type;
    unsigned flags;                /* LLMRETRY_OPTFLAG_* */
    size_t offset, size;           /* the field in llmretry_options */
    int64_t min, max;              /* INT, and each of STATUSES */
    const char *range;             /* INT: how min..max reads in messages ("> 0") */
    const char *const *choices;    /* ENUM: names, NULL-terminated; value = index */
    const char *builtin;           /* the built-in value as JSON text ("null" = unset) */
    const char *doc;               /* one line: what it does (docs/reliability.md's table) */
} llmretry_option_info;

/* The options in a fixed order; NULL past the end / for an unknown name. */
size_t llmretry_option_count(void);
const llmretry_option_info *llmretry_option_at(size_t i);
const llmretry_option_info *llmretry_option_find(const char *name);
/* The name an unknown option name most likely meant, for "did you mean
 * ...?": among `names` (n of them), or the table's options when names is
 * NULL. Case, '_' and '-' aside (maxRetries, api-key); else name + "_ms"
 * (timeout: times are in milliseconds); else the one name nearest by
 * edits, within one edit in three letters (max_retires, max_retry,
 * retry_status); else the one name holding name as whole words (cooldown:
 * breaker_cooldown_ms). NULL for a known name, or when none is clear.
 * Points into `names` (or the table). */
const char *llmretry_option_suggest(const char *name, const char *const *names, size_t n);
/* The request body's own fields ("model", "messages", "temperature"...;
 * NULL-terminated): given as keywords or option keys a host does not take,
 * they were meant for the body, and the host's message says so. */
const char *const *llmretry_body_fields(void);
/* What a value of the option is, for messages: "an integer", "a string"... */
const char *llmretry_option_expects(const llmretry_option_info *opt);

/* Set option `name` of `o`: EINVAL (message naming the option, never
 * repeating a text value) for an unknown name, the wrong setter for its
 * type, or a value out of range; `o` is unchanged then. set_text sets TEXT
 * and ENUM options and borrows `v` (it must outlive the submit, which
 * copies it); set_text(NULL) is unset. unset returns a NULLABLE option to
 * "not set" (no deadline, the default statuses, no headers). */
llmretry_status llmretry_options_set_int(llmretry_options *o, const char *name, int64_t v,
                                         char *err, size_t errlen);
llmretry_status llmretry_options_set_bool(llmretry_options *o, const char *name, int v,
                                          char *err, size_t errlen);
llmretry_status llmretry_options_set_text(llmretry_options *o, const char *name, const char *v,
                                          char *err, size_t errlen);
llmretry_status llmretry_options_unset(llmretry_options *o, const char *name, char *err,
                                       size_t errlen);
llmretry_status llmretry_options_set_number(llmretry_options *o, const char *name, double v,
                                            char *err, size_t errlen);
/* A TARGETS or SCHEMA option from JSON text (borrowed, like set_text;
 * NULL = unset): checked now, so a mistake is reported naming the field
 * ("fallbacks[1].base_url must start with http:// or https://", "schema:
 * unsupported keyword 'oneOf' at $.properties.x"). */
llmretry_status llmretry_options_set_json(llmretry_options *o, const char *name, const char *json,
                                          char *err, size_t errlen);
/* retry_statuses: 1..LLMRETRY_MAX_STATUSES statuses, each 100..599 (copied). */
llmretry_status llmretry_options_set_statuses(llmretry_options *o, const int *statuses, size_t n,
                                              char *err, size_t errlen);

/* One extra header as a host holds it (a name and a value, each with its
 * length: NUL is refused, not an end), checked by the rule the core
 * applies to its "Name: value" lines: the name an RFC 9110 token (no ':',
 * which a line could not tell apart), the value without control
 * characters but HTAB. `index` is its place among the caller's headers,
 * named in the message instead of the name when the name is invalid (it
 * may be a secret); (size_t)-1 = no order (a Lua table). EINVAL with the
 * message in err. Reserved names (Content-Length, ...) are refused with
 * the other options, by llmretry_options_check. */
llmretry_status llmretry_check_header(const char *name, size_t name_len, const char *value,
                                      size_t value_len, size_t index, char *err, size_t errlen);

/* The body the core sends for an object the host encoded (what
 * llmretry_options.stream_usage = 1 asks for; a host calls it itself for
 * bodies it sends another way, such as a batch's items): with `streamed`,
 * "stream": true (the body's "stream" member replaced or added); then, if
 * the body streams and sets no stream_options, "stream_options":
 * {"include_usage": true} (not for a url whose path ends with /responses).
 * The rest of the text is left as written. A new body (free with
 * llmretry_free; *len updated), or NULL to send the body as it is. */
char *llmretry_stream_body(const char *url, const char *body, size_t *len, int streamed);

/* A host's tokenizer for llmretry_estimate_tokens: the tokens of one
 * prompt text (UTF-8, `len` bytes, not NUL-terminated); < 0 = cannot count. */
typedef int64_t (*llmretry_token_counter)(const char *text, size_t len, void *ud);

/* The tokens a request body is charged against tpm, the engine's rule in
 * one place: its prompt texts (the strings under "messages", "input" and
 * "prompt" that are content or text, not roles or names) counted by
 * `count` (NULL = characters / 4, rounded up), plus the completion's bound
 * (max_completion_tokens, max_tokens or max_output_tokens; 0 for a url
 * whose path ends with /embeddings; else 256). A body that is not JSON
 * counts as all prompt. -1 when `count` fails on a text; a host then
 * leaves estimated_tokens at 0 (the engine's own estimate). */
int64_t llmretry_estimate_tokens(const char *url, const char *body, size_t len,
                                 llmretry_token_counter count, void *ud);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_OPTIONS_H */
