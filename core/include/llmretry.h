/*
 * llmretry.h — the one public header of the llmretry C core.
 *
 * llmretry wraps calls to an OpenAI-compatible chat API in a production
 * policy: a timeout per attempt, one total deadline, retries of transient
 * failures only (exponential backoff with jitter, Retry-After), a request id,
 * structured events, response validation and token accounting.
 *
 * Threading model (DESIGN §1): an engine owns one I/O thread that performs
 * all network I/O. Host threads submit calls and wait on each call's
 * mailbox; events and results are delivered to whichever host thread waits.
 * Nothing is ever called back from the I/O thread.
 *
 * Conventions: every function that can fail returns an llmretry_status;
 * text describing an argument error is written to the caller's `err`
 * buffer (when given) and names the offending field. Whoever creates a
 * handle frees it with the matching _free function.
 */
#ifndef LLMRETRY_H
#define LLMRETRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LLMRETRY_VERSION "0.1.0"

/* ------------------------------------------------------------------ */
/* Status codes returned by API functions.                             */
/* ------------------------------------------------------------------ */
typedef enum llmretry_status {
    LLMRETRY_OK = 0,
    LLMRETRY_EINVAL,    /* bad argument: the message names the field */
    LLMRETRY_ENOMEM,
    LLMRETRY_ESTATE,    /* engine shut down, or used after fork() */
    LLMRETRY_ETIMEDOUT, /* a wait ran out of time; the call goes on */
    LLMRETRY_EINTERNAL  /* a system call failed (thread, eventfd...) */
} llmretry_status;

const char *llmretry_status_name(llmretry_status s);

/* Size of the message buffers the API writes argument errors into. */
#define LLMRETRY_ERRBUF 256

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

/* ------------------------------------------------------------------ */
/* Errors, usage and results (DESIGN §4).                              */
/* ------------------------------------------------------------------ */
typedef enum llmretry_error_kind {
    LLMRETRY_ERR_NONE = 0,
    LLMRETRY_ERR_HTTP_STATUS,
    LLMRETRY_ERR_TIMEOUT,
    LLMRETRY_ERR_NETWORK,
    LLMRETRY_ERR_INVALID_RESPONSE,
    LLMRETRY_ERR_DEADLINE_EXCEEDED,
    LLMRETRY_ERR_CANCELLED,
    LLMRETRY_ERR_RESPONSE_TOO_LARGE
} llmretry_error_kind;

/* "http_status", "timeout", ... ; NULL for NONE. */
const char *llmretry_error_kind_name(llmretry_error_kind k);

typedef enum llmretry_giveup_reason {
    LLMRETRY_REASON_NONE = 0,
    LLMRETRY_REASON_RETRIES_EXHAUSTED,
    LLMRETRY_REASON_NOT_RETRYABLE,
    LLMRETRY_REASON_DEADLINE,
    LLMRETRY_REASON_RETRY_AFTER_TOO_LONG,
    LLMRETRY_REASON_UNSAFE_MODE,
    LLMRETRY_REASON_CANCELLED
} llmretry_giveup_reason;

const char *llmretry_reason_name(llmretry_giveup_reason r);

typedef enum llmretry_delay_source {
    LLMRETRY_DELAY_BACKOFF = 0,
    LLMRETRY_DELAY_RETRY_AFTER,
    LLMRETRY_DELAY_RATELIMIT_RESET
} llmretry_delay_source;

const char *llmretry_delay_source_name(llmretry_delay_source s);

typedef struct llmretry_usage {
    int present;                   /* 0 = the response had no usage */
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t total_tokens;
} llmretry_usage;

/* The final outcome of a call. Owned by the call; valid until
 * llmretry_call_free. Strings are NUL-terminated or NULL. */
typedef struct llmretry_result {
    int ok;
    const char *request_id;
    const char *model;             /* from the request */
    int status;                    /* last HTTP status, 0 = none */
    int attempt;                   /* 0-based index of the last attempt */
    int attempts;                  /* attempts made */
    /* Requests sent again at once, within an attempt, because they provably
     * never reached the server (a refused HTTP/2 stream, a keep-alive
     * connection with unread bytes) or, in safe mode, a reused connection
     * closed before any byte of a response. Not attempts: no backoff. */
    int resends;
    int64_t duration_ms;           /* of the last attempt */
    int64_t total_ms;              /* of the whole call */

    /* ok == 1 */
    /* The raw response body. A 2xx body counts as a success only when it
     * is a JSON object in valid UTF-8 with no raw control characters in
     * its strings, nested at most LLMRETRY_MAX_BODY_DEPTH deep (what every
     * host's decoder accepts); anything else is an invalid_response,
     * retried like one. Escapes such as \u0000 are
     * fine. Token counts in usage below are whole numbers 0..2^53 (others
     * read as 0); the raw usage stays here. */
    const char *body;
    size_t body_len;
    llmretry_usage usage;
    const char *response_model;
    const char *system_fingerprint;

    /* ok == 0 */
    llmretry_error_kind kind;
    llmretry_giveup_reason reason;
    /* One line for people and logs. For an HTTP error: "HTTP 404 from
     * /v1/chat/completions (code); gave up after ...": the URL's path only
     * (no host, query or credentials) and the provider's code with control
     * characters escaped (\n, \xNN). The provider's message is left out
     * (servers echo prompts in it); see body_preview. */
    const char *message;
    int64_t retry_after_ms;        /* server-requested wait, -1 = none */
    const char *error_code;        /* the provider's error code */
    const char *body_preview;      /* first 500 bytes of the response body */
} llmretry_result;

/* ------------------------------------------------------------------ */
/* Events (DESIGN §3).                                                 */
/* ------------------------------------------------------------------ */
typedef enum llmretry_event_type {
    LLMRETRY_EV_REQUEST_STARTED = 0,
    LLMRETRY_EV_REQUEST_FAILED,    /* a non-2xx HTTP response */
    LLMRETRY_EV_REQUEST_ERROR,     /* timeout, network, invalid response... */
    LLMRETRY_EV_RETRY_SCHEDULED,
    LLMRETRY_EV_REQUEST_SUCCEEDED,
    LLMRETRY_EV_REQUEST_GAVE_UP
} llmretry_event_type;

const char *llmretry_event_name(llmretry_event_type t);

typedef struct llmretry_event llmretry_event;

/* One field of an event, for bindings that build host maps generically:
 * the schema of each event lives in the core alone. */
typedef enum llmretry_field_type {
    LLMRETRY_FIELD_NULL = 0,
    LLMRETRY_FIELD_INT,
    LLMRETRY_FIELD_STRING,
    LLMRETRY_FIELD_USAGE           /* an object of the three token counts */
} llmretry_field_type;

typedef struct llmretry_field {
    const char *name;
    llmretry_field_type type;
    int64_t i;
    const char *s;
    const llmretry_usage *usage;
} llmretry_field;

llmretry_event_type llmretry_event_type_of(const llmretry_event *ev);
size_t llmretry_event_field_count(const llmretry_event *ev);
/* Fill `out` with field `index` (0 = "event"); 0 on success, -1 past the end. */
int llmretry_event_field(const llmretry_event *ev, size_t index, llmretry_field *out);
/* The event as one line of JSON (malloc'd; free with llmretry_free). */
char *llmretry_event_to_json(const llmretry_event *ev);
void llmretry_event_free(llmretry_event *ev);

void llmretry_free(void *p);

/* ------------------------------------------------------------------ */
/* Engine and calls.                                                   */
/* ------------------------------------------------------------------ */
typedef struct llmretry_engine llmretry_engine;
typedef struct llmretry_call llmretry_call;

typedef struct llmretry_engine_options {
    /* Most HTTP attempts in flight at once; more calls queue. 256. */
    int max_in_flight;
    /* Most connections kept open per host (0 = libcurl's default). */
    int max_host_connections;
} llmretry_engine_options;

void llmretry_engine_options_defaults(llmretry_engine_options *o);

/* Start an engine and its I/O thread. `opts` may be NULL. */
llmretry_status llmretry_engine_new(const llmretry_engine_options *opts,
                                    llmretry_engine **out, char *err, size_t errlen);

/* Cancel every call in flight, join the I/O thread and drop the caller's
 * reference. Calls still held by the host stay valid (finished, cancelled)
 * until they are freed. Safe with NULL. */
void llmretry_engine_free(llmretry_engine *e);

/* 1 when called in a process forked from the one that made the engine.
 * There every function of the engine, its calls, groups and channels
 * returns at once without touching them (submit: ESTATE; poll: 0; free:
 * nothing): the parent's I/O thread does not exist in the child and may
 * have held their locks at the fork. A host makes a new engine. */
int llmretry_engine_forked(const llmretry_engine *e);

/* Submit flags. */
#define LLMRETRY_SUBMIT_POLL 1u  /* report this call via llmretry_engine_poll */

/* Submit a call. Options are checked and copied (the caller may free them
 * on return); EINVAL names the field, before any I/O. */
llmretry_status llmretry_engine_submit(llmretry_engine *e, const llmretry_options *opts,
                                       unsigned flags, llmretry_call **out,
                                       char *err, size_t errlen);

/* Event-loop integration: a file descriptor that is readable when a call
 * submitted with LLMRETRY_SUBMIT_POLL has news (events or its result). */
int llmretry_engine_fd(const llmretry_engine *e);

/* Without blocking, return up to `max` calls that have news; each call is
 * reported once per batch of news, so drain each one's mailbox, and never
 * again once llmretry_call_next has returned its DONE. Returns the count.
 * The returned pointers are borrowed (the host still owns them). */
size_t llmretry_engine_poll(llmretry_engine *e, llmretry_call **calls, size_t max);

/* Block until engine_fd is readable or timeout_ms passes (-1 = forever).
 * OK or ETIMEDOUT. */
llmretry_status llmretry_engine_wait(llmretry_engine *e, int64_t timeout_ms);

/* Cancel a call at any moment (attempt in flight or backoff wait). The
 * result becomes `cancelled` promptly. Harmless on a finished call. */
void llmretry_call_cancel(llmretry_call *c);

/* Free a call; an unfinished call is cancelled first. */
void llmretry_call_free(llmretry_call *c);

const char *llmretry_call_request_id(const llmretry_call *c);
void *llmretry_call_user_data(const llmretry_call *c);

/* The mailbox. llmretry_call_next takes the next item without blocking. */
typedef enum llmretry_mail {
    LLMRETRY_MAIL_EMPTY = 0,   /* nothing now */
    LLMRETRY_MAIL_EVENT,       /* *ev is set; free it with llmretry_event_free */
    LLMRETRY_MAIL_VALIDATE,    /* the host must call llmretry_call_validated */
    LLMRETRY_MAIL_DONE         /* the result is ready (repeats once reached) */
} llmretry_mail;

llmretry_mail llmretry_call_next(llmretry_call *c, llmretry_event **ev);

/* Block until the mailbox has an item or timeout_ms passes (-1 = forever).
 * OK when an item is waiting, ETIMEDOUT otherwise. */
llmretry_status llmretry_call_wait(llmretry_call *c, int64_t timeout_ms);

/* While LLMRETRY_MAIL_VALIDATE is pending: the 2xx body to validate. */
llmretry_status llmretry_call_pending_body(llmretry_call *c, const char **body, size_t *len);

/* Answer a validation request: ok != 0 accepts the response; otherwise it
 * fails as invalid_response with `message` and the policy decides. */
llmretry_status llmretry_call_validated(llmretry_call *c, int ok, const char *message);

/* The result once the mailbox said DONE (NULL before). */
const llmretry_result *llmretry_call_result(const llmretry_call *c);

/* Blocking convenience: submit, deliver each event to `on_event` (may be
 * NULL) on this thread, and return the finished call. A call with
 * opts->validate set is rejected (EINVAL): validation needs the mailbox. */
typedef void (*llmretry_event_fn)(const llmretry_event *ev, void *ud);
llmretry_status llmretry_call_blocking(llmretry_engine *e, const llmretry_options *opts,
                                       llmretry_event_fn on_event, void *ud,
                                       llmretry_call **out, char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* Policy: pure functions (DESIGN §2), exposed for bindings and tests.  */
/* ------------------------------------------------------------------ */

/* Server waits longer than this (~31.7 years) saturate at it: a number too
 * big to represent is "too long" (above any sane max_retry_after_ms), not
 * unparseable. */
#define LLMRETRY_MAX_WAIT_MS INT64_C(1000000000000)

/* Parse a Retry-After value: seconds (decimals allowed) or an HTTP-date in
 * any RFC 9110 format, relative to now_unix_ms. Returns the wait in ms
 * (> 0, at most LLMRETRY_MAX_WAIT_MS), or -1 when not usable (garbage,
 * <= 0, inf/nan, a date in the past). */
int64_t llmretry_parse_retry_after(const char *value, int64_t now_unix_ms);

/* Parse retry-after-ms (milliseconds, decimals allowed): > 0 or -1. */
int64_t llmretry_parse_retry_after_ms(const char *value);

/* Parse an x-ratelimit-reset-* duration ("1s", "6m0s", "20ms", "1h2m3.5s"):
 * ms (> 0) or -1. */
int64_t llmretry_parse_reset_duration(const char *value);

/* The backoff before retry number n (0 = first retry). u01 is a random
 * number in [0, 1) (ignored with JITTER_NONE). */
int64_t llmretry_backoff_ms(llmretry_jitter jitter, int64_t base_ms, int64_t cap_ms,
                            int n, double u01);

/* Is `status` retryable under these options (rule 5's status part)? */
int llmretry_status_retryable(const llmretry_options *o, int status);

/* What one failed attempt looked like, as the policy needs to see it. */
typedef struct llmretry_failure {
    llmretry_error_kind kind;      /* HTTP_STATUS, TIMEOUT, NETWORK, ... */
    int status;                    /* HTTP status, 0 = none */
    int never_connected;           /* could not resolve/connect: never reached the server */
    int fatal;                     /* TLS verification, bad URL...: never retry */
    const char *error_code;        /* provider's code, NULL = none */
    const char *retry_after;       /* raw header values, NULL = absent */
    const char *retry_after_ms;
    const char *ratelimit_reset_requests;
    const char *ratelimit_reset_tokens;
    const char *should_retry;      /* x-should-retry */
} llmretry_failure;

typedef struct llmretry_decision {
    int retry;                     /* 1 = retry after delay_ms */
    int64_t delay_ms;
    llmretry_delay_source delay_source;
    llmretry_giveup_reason reason; /* when retry == 0 */
    int64_t retry_after_ms;        /* the usable server value, -1 = none */
} llmretry_decision;

/* Rules 1-7 of DESIGN §2 after attempt `attempt` (0-based) failed.
 * deadline_left_ms: time left before the deadline, or LLMRETRY_NO_DEADLINE.
 * A cancelled failure is `kind == LLMRETRY_ERR_CANCELLED`. */
llmretry_decision llmretry_decide(const llmretry_options *o, const llmretry_failure *f,
                                  int attempt, int64_t now_unix_ms,
                                  int64_t deadline_left_ms, double u01);

/* Per-attempt timeout: min(timeout_ms, deadline_left_ms); deadline_left_ms
 * may be LLMRETRY_NO_DEADLINE. */
int64_t llmretry_attempt_timeout_ms(int64_t timeout_ms, int64_t deadline_left_ms);

/* ------------------------------------------------------------------ */
/* The batch pacer: pure, on the caller's clock (DESIGN §2, batches).  */
/* ------------------------------------------------------------------ */

/* How many items of a batch may run at once. A 429 that names a wait
 * (Retry-After, x-ratelimit-reset) pauses new starts for that long; with
 * `adaptive`, a 429 also halves the window (once per burst: not again
 * within LLMRETRY_PACER_COOLDOWN_MS) and it grows back by one slot per
 * window-full of successes (additive increase), never above
 * `limit` nor below 1. Host pools (Python, Lua) and engine groups use it. */
typedef struct llmretry_pacer {
    int limit;
    int adaptive;
    int window;                    /* items allowed in flight, 1..limit */
    int credit;                    /* successes since the window last grew */
    int64_t paused_until_ms;       /* 0 = not paused */
    int64_t last_halving_ms;       /* -1 = never */
    int pauses, halvings;          /* for batch summaries */
} llmretry_pacer;

#define LLMRETRY_PACER_COOLDOWN_MS 1000

void llmretry_pacer_init(llmretry_pacer *p, int limit, int adaptive);
/* Items that may be in flight now: 0 while paused, else the window. */
int llmretry_pacer_allowed(const llmretry_pacer *p, int64_t now_ms);
/* Milliseconds until the pause ends (0 when not paused). */
int64_t llmretry_pacer_paused_ms(const llmretry_pacer *p, int64_t now_ms);
/* An attempt got a 429; wait_ms is the server's wait (-1 = none named). */
void llmretry_pacer_on_429(llmretry_pacer *p, int64_t now_ms, int64_t wait_ms);
void llmretry_pacer_on_success(llmretry_pacer *p);

/* ------------------------------------------------------------------ */
/* Groups: the calls of one batch, paced together on the engine thread. */
/* ------------------------------------------------------------------ */

/* A call submitted with options.group waits in the group until the group's
 * pacer lets it start: at most `limit` items run at once (an item counts
 * from its first attempt until it finishes, backoff waits included), a 429
 * naming a wait pauses every new start for that long, and with `adaptive`
 * the window halves on a burst of 429s and grows back on successes. With a
 * deadline, no item runs past it: each call's deadline is the earlier of
 * its own and the group's, and items not started in time fail with
 * deadline_exceeded. */
typedef struct llmretry_group_options {
    int limit;                     /* 8, >= 1 */
    int64_t deadline_ms;           /* LLMRETRY_NO_DEADLINE, else >= 0 (from group_new) */
    int adaptive;                  /* 1 */
    /* 1: the group's calls report to llmretry_group_fd / _poll (a batch
     * read by one host thread). 0: to no channel; each call's own host
     * thread waits on it (a pool of host threads paced as one batch). */
    int poll;                      /* 1 */
} llmretry_group_options;

typedef struct llmretry_group_stats {
    int window;                    /* items allowed in flight now */
    int active;                    /* items started and not finished */
    int queued;                    /* items waiting to start */
    int pauses;                    /* 429 pauses so far */
    int halvings;                  /* window halvings so far */
} llmretry_group_stats;

void llmretry_group_options_defaults(llmretry_group_options *o);
llmretry_status llmretry_group_new(llmretry_engine *e, const llmretry_group_options *o,
                                   llmretry_group **out, char *err, size_t errlen);
/* Drop the host's reference; calls still in the group keep it alive. */
void llmretry_group_free(llmretry_group *g);
/* A snapshot, updated by the engine thread as it schedules. */
void llmretry_group_stats_get(llmretry_group *g, llmretry_group_stats *out);

/* A group's calls report their news here (not to llmretry_engine_poll), so
 * that several batches on one engine never take each other's calls: the
 * same contract as llmretry_engine_fd / _poll / _wait. */
int llmretry_group_fd(const llmretry_group *g);
size_t llmretry_group_poll(llmretry_group *g, llmretry_call **calls, size_t max);
llmretry_status llmretry_group_wait(llmretry_group *g, int64_t timeout_ms);

/* ------------------------------------------------------------------ */
/* Named policies: sets of call options as plain data.                  */
/* ------------------------------------------------------------------ */

/* A policies document is a JSON object {name: {key: value, ...}, ...}; the
 * keys are llmretry_policy_key(0..), each with the rules of DESIGN §2
 * (types, ranges), plus base_url, model and idempotency_key ("auto" only).
 * JSON null in a policy means "unset" for base_url, model, deadline_ms,
 * retry_statuses and idempotency_key. Integers are exact JSON integers
 * (|n| <= 2^53 - 1). Everything is checked at parse time; EINVAL's message
 * names the source (when given), the policy and the key, e.g.
 *   policies.json: policy 'fast': timeout_ms must be an integer (got string)
 * Hosts with other formats (Python's TOML, a Lua table) convert to JSON and
 * call this, so every binding accepts and refuses alike, with one text. */
typedef struct llmretry_policies llmretry_policies;

llmretry_status llmretry_policies_parse(const char *json, size_t len, const char *source,
                                        llmretry_policies **out, char *err, size_t errlen);
void llmretry_policies_free(llmretry_policies *p);
size_t llmretry_policies_count(const llmretry_policies *p);
/* Names in the order of the document; NULL past the end. */
const char *llmretry_policies_name(const llmretry_policies *p, size_t i);
/* The keys policy `name` sets, as a JSON object (malloc'd: llmretry_free),
 * or NULL when there is no such policy. */
char *llmretry_policies_get_json(const llmretry_policies *p, const char *name);
/* Every policy key's value for one call, as a JSON object (malloc'd):
 * explicit > policy `name` (NULL = none) > client defaults > built-in.
 * explicit_json and defaults_json are JSON objects of call options (NULL or
 * empty = none; keys that are not policy keys are ignored; null = not
 * given); their policy keys are checked by the same rules. EINVAL for an
 * unknown policy ("unknown policy 'x' (known: 'a', 'b')") or a bad value. */
llmretry_status llmretry_policies_resolve(const llmretry_policies *p, const char *name,
                                          const char *explicit_json, size_t explicit_len,
                                          const char *defaults_json, size_t defaults_len,
                                          char **out_json, char *err, size_t errlen);
/* The i-th policy key (NULL past the end), in the order resolve lists them. */
const char *llmretry_policy_key(size_t i);
/* Check one value (JSON text) of policy key `key` by the policy rules. */
llmretry_status llmretry_policy_check_value(const char *key, const char *json, size_t len,
                                            char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* Channels: one consumer's view of the engine.                         */
/* ------------------------------------------------------------------ */

/* A channel is a ready list plus a file descriptor that is readable exactly
 * while the list is non-empty (an eventfd on Linux, else a pipe). Calls
 * submitted with options.channel report their news here and nowhere else,
 * so several consumers of one engine (one per event loop, per dispatcher)
 * never take each other's calls. fd / poll / wait follow the contract of
 * llmretry_engine_fd / _poll / _wait. Calls keep their channel alive. */
llmretry_status llmretry_channel_new(llmretry_engine *e, llmretry_channel **out,
                                     char *err, size_t errlen);
void llmretry_channel_free(llmretry_channel *ch);
int llmretry_channel_fd(const llmretry_channel *ch);
size_t llmretry_channel_poll(llmretry_channel *ch, llmretry_call **calls, size_t max);
llmretry_status llmretry_channel_wait(llmretry_channel *ch, int64_t timeout_ms);
/* "eventfd" or "pipe": the notifier this build uses. */
const char *llmretry_notifier_kind(void);

/* ------------------------------------------------------------------ */
/* JSON helpers shared by the bindings.                                */
/* ------------------------------------------------------------------ */

/* Find the JSON value in model output: a ```json (or ```) fenced block,
 * bare JSON, or the first parseable object/array surrounded by prose.
 * On success *start and *len delimit the JSON text inside `text` and OK is
 * returned; EINVAL (with a message) when there is none. */
llmretry_status llmretry_extract_json(const char *text, size_t text_len,
                                      size_t *start, size_t *len,
                                      char *err, size_t errlen);

/* assert_shape on JSON text: `shape` is JSON too, where a string leaf names
 * the expected type ("string" = non-empty string, "number", "boolean",
 * "array", "object"), an object maps keys to shapes, and a one-element
 * array means "an array whose every element has this shape". OK, or
 * EINVAL with a message naming the path (e.g. "root.items[2].name"). */
llmretry_status llmretry_assert_shape(const char *json, size_t json_len,
                                      const char *shape, size_t shape_len,
                                      const char *root_path,
                                      char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_H */
