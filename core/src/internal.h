/* Private declarations shared by the core's source files. */
#ifndef LLMRETRY_INTERNAL_H
#define LLMRETRY_INTERNAL_H

#include "llmretry.h"
#include "submit_checked.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

/* The core's private functions are not exported from the module that
 * holds it: a host that loads other modules (nginx, Neovim) cannot have
 * one of theirs bind in place of ours, and calls between the core's files
 * are direct, not through the PLT. Each private header that declares
 * functions brackets them so, after its #includes (a system header's must
 * keep their visibility): luarocks' builtin build takes no
 * -fvisibility=hidden, which setup.py passes for Python's module. The
 * public llmretry_* API is declared in core/include, outside any bracket. */
#pragma GCC visibility push(hidden)

/* ---- ids.c: clocks, randomness, ids ---------------------------------- */
int64_t lr_mono_ms(void);
int64_t lr_unix_ms(void);
/* A UUID v4 from getrandom(); out must hold 37 bytes. 0 on success. */
int lr_uuid4(char out[37]);
/* xorshift64* state seeded from getrandom(); one per engine thread. */
uint64_t lr_rng_seed(void);
double lr_rng_next01(uint64_t *state);
char *lr_strdup(const char *s);
char *lr_strndup(const char *s, size_t n);
/* A message, formatted (at most 511 bytes) and malloc'd; NULL when out of memory. */
char *lr_printf_alloc(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void lr_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- option_table.c --------------------------------------------------- */
/* "<name> must be <range> (got v)" unless v is in the option's range. */
llmretry_status lr_option_check_int(const llmretry_option_info *opt, int64_t v, char *err,
                                    size_t errlen);
llmretry_status lr_option_check_number(const llmretry_option_info *opt, double v, char *err,
                                       size_t errlen);
/* The choices of an ENUM option as "\"a\", \"b\"" into buf. */
void lr_option_choices(const llmretry_option_info *opt, char *buf, size_t len);
/* A list of n statuses is 1..LLMRETRY_MAX_STATUSES long (empty would read as
 * "the default set", which the caller did not ask for). */
llmretry_status lr_option_check_statuses(size_t n, char *err, size_t errlen);
/* Every INT and ENUM field of `o` against its range. */
llmretry_status lr_options_check_table(const llmretry_options *o, char *err, size_t errlen);
/* Is the body JSON (a POST with a JSON content_type), so read for its model and stream? */
int lr_options_json_body(const llmretry_options *o);
/* The integer member at base + offset, an int (or an int-sized enum) or an
 * int64_t as `size` says: how the option table and the shapes read fields. */
int64_t lr_int_at(const void *base, size_t offset, size_t size);

/* ---- the per-call record ---------------------------------------------- */

/* Where a call sends its request (targets.c): the caller's (target 0) and
 * each fallback's. What a target does not own it borrows from target 0. */
typedef struct lr_target {
    char *url;
    struct curl_slist *headers;
    char *model;                   /* for events and results; NULL = none */
    char *body;
    size_t body_len;
    uint64_t key_hash;
    int is_https;
    unsigned owns;                 /* which of the above it frees */
    /* What it came to (engine thread), for the final result. */
    int attempts, status;
    llmretry_error_kind kind;
    llmretry_giveup_reason reason;
} lr_target;

/* Response headers the policy reads, captured without allocating. */
/* Response headers a call keeps: the policy's (up to LR_H_POLICY_COUNT),
 * then what the endpoint's rate budget learns from (ratelimit.c). */
enum { LR_H_RETRY_AFTER, LR_H_RETRY_AFTER_MS, LR_H_SHOULD_RETRY,
       LR_H_RESET_REQUESTS, LR_H_RESET_TOKENS, LR_H_POLICY_COUNT,
       LR_H_LIMIT_REQUESTS = LR_H_POLICY_COUNT, LR_H_LIMIT_TOKENS,
       LR_H_REMAINING_REQUESTS, LR_H_REMAINING_TOKENS, LR_H_COUNT };
/* The values kept in the call record: every value these headers carry is
 * short (digits, "6m0s", an HTTP-date's 29 characters); a longer one goes
 * to hdr_long. 32, not more: the record lives as long as its call is in
 * flight, and LR_H_COUNT values at 96 were 864 bytes of each. */
#define LR_HVAL 32

typedef struct lr_buf {
    char *data;
    size_t len, cap;
} lr_buf;

/* ids.c: append n bytes, keeping a NUL after them; -1 when out of memory.
 * Allocates even for n == 0 (data != NULL says something came). */
int lr_buf_add(lr_buf *b, const char *s, size_t n);

typedef enum lr_state {
    LR_NEW,          /* submitted, not yet seen by the engine thread */
    LR_GROUP_QUEUED, /* waiting for its group's pacer */
    LR_QUEUED,       /* waiting for a free in-flight slot */
    LR_HELD,         /* waiting for its origin's connection (origins.c) */
    LR_BUDGET,       /* waiting for its endpoint's rate budget (ratelimit.c) */
    LR_RUNNING,      /* an attempt is on the wire */
    LR_WAITING,      /* backoff timer */
    LR_VALIDATING,   /* host is validating a 2xx body */
    LR_DONE
} lr_state;

/* A file descriptor readable exactly while something waits (notifier.c):
 * an eventfd (rfd == wfd) where there is one, else a pipe. Or, for a host
 * that can only connect to an address (an nginx cosocket), a unix socket
 * (notifier_socket.c): wfd is the connection the host made, rfd is -1, and
 * each signal is one byte that the host reads at its own end. */
typedef struct lr_listener lr_listener;
typedef struct lr_notifier {
    int rfd, wfd;
    int is_socket;
    lr_listener *listener;         /* a socket notifier's until accepted */
} lr_notifier;

int lr_notifier_open(lr_notifier *n);
int lr_fd_nonblock_cloexec(int fd);
void lr_notifier_close(lr_notifier *n);
void lr_notifier_signal(lr_notifier *n);
void lr_notifier_clear(lr_notifier *n);

/* notifier_socket.c: listen on a fresh path in a private directory (0 on
 * success); the path (NULL once accepted); take the one connection to it
 * within timeout_ms (its fd in *fd: the caller stores it in wfd under the
 * engine mutex); and the socket kind's signal and close. */
int lr_notifier_listen(lr_notifier *n, char *err, size_t errlen);
const char *lr_notifier_path(const lr_notifier *n);
llmretry_status lr_notifier_accept(lr_notifier *n, int64_t timeout_ms, int *fd, char *err,
                                   size_t errlen);
void lr_notifier_socket_signal(lr_notifier *n);
void lr_notifier_socket_close(lr_notifier *n);

/* A channel (channel.c): calls with news for a poll-mode host, and a
 * notifier readable exactly while the list is non-empty. Guarded by the
 * engine's mutex. The engine has one (LLMRETRY_SUBMIT_POLL), each polling
 * group has one, and hosts make more with llmretry_channel_new. */
typedef struct lr_channel {
    llmretry_call *head, *tail;
    lr_notifier notifier;
    /* The notifier is left alone until a host asks for it (its fd, a
     * wait): a channel of an io_loop host engine, polled by its host right
     * after each turn, would otherwise cost a write and a read per call. */
    int quiet;
} lr_channel;

int lr_channel_init(lr_channel *r);
/* A channel whose notifier is a unix socket (llmretry_channel_new_socket). */
int lr_channel_init_socket(lr_channel *r, char *err, size_t errlen);
void lr_channel_close(lr_channel *r);
/* Under the engine mutex: add (engine thread), take, remove. */
int lr_channel_add(lr_channel *r, llmretry_call *c);
size_t lr_channel_take(lr_channel *r, llmretry_call **calls, size_t max);
void lr_channel_remove(lr_channel *r, llmretry_call *c);
llmretry_status lr_channel_wait(const lr_channel *r, int64_t timeout_ms);
/* The public channel: the list, and who keeps it. The engine's channel
 * and each polling group's are embedded in their owner (`owned`): they
 * live as long as it does, take no engine reference and ignore
 * llmretry_channel_free. A host's (llmretry_channel_new) is counted: the
 * host's reference plus one per call sent to it, and holds the engine. */
struct llmretry_channel {
    atomic_int refs;
    llmretry_engine *engine;
    int owned;
    lr_channel ch;
};
/* An owner's embedded channel (0, or -1 when the notifier cannot be made). */
int lr_channel_embed(llmretry_channel *ch, llmretry_engine *e);
void lr_channel_ref(llmretry_channel *ch);
void lr_channel_unref(llmretry_channel *ch);

/* a + b for times in ms, saturating instead of overflowing: a server's
 * INT64_MAX wait or a caller's huge deadline means "never", not the past. */
static inline int64_t lr_time_add(int64_t a, int64_t b)
{
    if (b > 0 && a > INT64_MAX - b)
        return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b)
        return INT64_MIN;
    return a + b;
}

/* An intrusive FIFO of calls (through wait_prev/wait_next). */
typedef struct lr_queue {
    llmretry_call *head, *tail;
} lr_queue;

/* A batch's items held while their endpoint (a model) is paused: a 429's
 * named wait, or the slow-down's (admission.c). */
#define LR_GROUP_HOLDS 8
typedef struct lr_group_hold {
    struct lr_endpoint *endpoint;  /* whose pause; its items in `parked` */
    lr_queue parked;               /* empty: the hold is free */
} lr_group_hold;

struct llmretry_group {
    atomic_int refs;               /* the host's + one per call in the group */
    llmretry_engine *engine;       /* holds an engine reference */
    int64_t deadline_at;           /* monotonic ms, -1 = none */
    int poll;                      /* its calls report to `ready` */
    /* Engine thread only. */
    llmretry_pacer pacer;
    int active;                    /* items started and not finished */
    int queued;
    lr_queue queue;                /* items not started yet */
    lr_group_hold holds[LR_GROUP_HOLDS];   /* items not started, their endpoint paused */
    int parked;                    /* items in the holds (counted in queued) */
    llmretry_channel ready;        /* its calls' news, when `poll` (engine mutex) */
    int listed;                    /* on the engine's list of groups to pump */
    llmretry_group *next_listed;
    /* What llmretry_group_stats_get returns (engine mutex). */
    llmretry_group_stats stats;
};

/* Host-to-engine requests, OR-ed into call->ops. */
enum { LR_OP_SUBMIT = 1, LR_OP_CANCEL = 2, LR_OP_VALIDATED = 4, LR_OP_RESUME = 8 };

struct llmretry_event {
    llmretry_event_type type;
    llmretry_event *next;          /* mailbox link */
    llmretry_call *call;           /* holds a reference: borrowed strings below */
    int attempt;
    int target;                    /* the call's target when it was made */
    const char *model;             /* that target's (borrowed from the call) */
    int64_t timeout_ms, deadline_left_ms;
    int status;
    int64_t duration_ms;
    char *retry_after, *error_code, *body_preview;
    llmretry_error_kind error_kind;
    char *error_message;
    int64_t delay_ms;
    llmretry_delay_source delay_source;
    int next_attempt;
    llmretry_usage usage;
    char *response_model, *system_fingerprint;
    llmretry_giveup_reason reason;
    int attempts;
    int64_t total_ms;
    /* succeeded / gave_up of a streaming call */
    int stream, chunks;
    int64_t ttft_ms;
    llmretry_stream_reason stream_reason;
    /* LLMRETRY_EV_CHUNK items: the payload (malloc'd) */
    char *chunk;
    size_t chunk_len;
    char *chunk_event;             /* a typed event's name, NULL = "message" */
    /* llm_request_error of an answer that did not match the schema: the
     * first error's path (never the answer's text); NULL otherwise. */
    char *validation_path;
    int repair;                    /* llm_retry_scheduled: the next body is a repair */
    /* llm_shared_unavailable / _recovered: the store as it may be shown
     * (a Redis password as ***), and how long it was unavailable. */
    char *shared;
    int64_t down_ms;
};

struct llmretry_call {
    llmretry_engine *engine;       /* holds an engine reference */
    atomic_int refs;               /* host + engine + queued ops + live events */
    unsigned flags;

    /* Immutable after submit; owned copies. */
    llmretry_options o;            /* string fields point at the copies below */
    char *policy, *ca_file;
    /* The request id: request_id_buf (a generated UUID, or a caller's id
     * that fits), else a malloc'd copy of the caller's (up to
     * LLMRETRY_REQUEST_ID_MAX bytes, rare: not worth 257 bytes of every
     * call in flight). */
    char *request_id;
    char request_id_buf[37];
    /* The targets (targets.c) and the current one's request, borrowed
     * from it: the engine switches target on a fallback. */
    lr_target *targets;            /* &target0 until fallbacks make an array */
    lr_target target0;             /* the call's own: no allocation of its own */
    int n_targets, target;
    int target_first_attempt;      /* the attempt index its first attempt had */
    char *url, *body, *model;
    struct curl_slist *headers;
    int is_https;
    llmretry_group *group;         /* holds a group reference, or NULL */
    int group_active;              /* engine thread: counted in group->active */
    lr_queue *group_queue;         /* LR_GROUP_QUEUED: its group's queue or a hold's */
    int64_t submitted_at;          /* monotonic ms */
    int64_t deadline_at;           /* monotonic ms, -1 = none */

    /* Engine-thread state. */
    lr_state state;
    int attempt;                   /* index of the current/next attempt */
    int attempts_started;
    CURL *easy;
    int shard;                     /* its connection cache (conn_shards.c) */
    int64_t attempt_started_at;
    int cut_by_deadline;           /* this attempt's timeout is the deadline's */
    int prereq_calls;              /* requests libcurl began this attempt */
    int saw_refused;               /* libcurl said REFUSED_STREAM since the last */
    unsigned long h2_stream;       /* the request's HTTP/2 stream id, 0 = none */
    int conn_lport, conn_rport;    /* ports of the request's connection */
    int resend_pending;            /* lr_resend_why: on_prereq aborted to re-send */
    int resend_refused;            /* lr_resend_why: a re-send that is not free */
    int attempt_resends;           /* free re-sends within this attempt */
    long sent_at_prereq;           /* CURLINFO_REQUEST_SIZE when the last request began */
    size_t send_pos;               /* bytes of the body handed to libcurl */
    lr_buf resp;
    int too_large;
    char hdr[LR_H_COUNT][LR_HVAL];
    char *hdr_long[LR_H_COUNT];    /* values too long for hdr (malloc'd) */
    int hdr_set[LR_H_COUNT];
    /* keep_response: the response's head as received (transfer.c); it is
     * complete, and no longer written, once its body has begun. */
    lr_buf resp_head;
    int body_begun;
    int interim;                   /* reading a 1xx response's headers */
    int redirect;                  /* reading a 3xx response's headers */
    char *location;                /* its Location (malloc'd): the give-up's hint */
    int sse;                       /* this response says text/event-stream */
    int stream_req;                /* the body asks to stream ("stream": true) */
    struct lr_stream *st;          /* streaming state (stream.c), or NULL */
    struct lr_host_xfer *hx;       /* io_loop host: the exchange (host_io.c), or NULL */
    char curl_err[CURL_ERROR_SIZE];
    size_t heap_index;             /* in the timer heap, or LR_NO_TIMER */
    int64_t wake_at;               /* the timer's time (heap key) */
    int64_t retry_at;              /* LR_WAITING: when the backoff ends */
    llmretry_call *wait_prev, *wait_next;   /* engine waiting queue */
    struct lr_origin *origin;      /* engine thread: its https origin, or NULL */
    struct lr_endpoint *endpoint;  /* engine thread: its rate budget (ratelimit.c) */
    int breaker_probe;             /* engine thread: this attempt is the half-open probe */
    uint64_t key_hash;             /* of its API key: endpoints are base URL + key */
    int64_t est_tokens;            /* tokens it is charged, -1 = not estimated yet */
    int64_t completion_limit;      /* the body's max_tokens (or alike), -1 = none */
    int on_budget;                 /* an attempt counted in endpoint->in_flight */
    /* Its attempt's requests and tokens on the endpoint's books (ratelimit.c):
     * the sent_* counts just after it went, what was on its way then, and
     * the tokens it took (counted in endpoint->in_flight_tok). */
    int64_t sent_mark[2], flight_mark[2], charged_tok;
    int origin_known;              /* origin looked up */
    int connecting;                /* counted in origin->connecting */
    const char *reached_url;       /* the url lr_origin_reached last marked */
    const char *url_option;        /* what named target 0's URL: "url", "base_url", ... */
    llmretry_call *live_prev, *live_next;   /* engine's unfinished calls */
    /* What the last failed attempt looked like, for the final error. */
    int last_status;
    llmretry_error_kind last_kind;
    int last_no_connect;           /* it could not resolve or connect (outcome.connect_failed) */
    char *last_message, *last_error_code, *last_body_preview;
    int64_t last_retry_after_ms;
    int64_t last_duration_ms;
    /* Structured outputs (answer.c): the compiled schema, or NULL; 1 when
     * it is the schema option's (the answer read by extract_json). */
    struct lr_schema *schema;
    int schema_extract;
    char *last_validation_errors;  /* JSON text, the last failed attempt's */
    char *repair_body;             /* repair.c: the body of a repair retry, or NULL */
    /* A validated 2xx waiting for the host's verdict. */
    llmretry_usage v_usage;
    char *v_response_model, *v_fingerprint;

    /* Host-to-engine op queue (engine->mu). */
    unsigned ops;
    int op_queued;
    llmretry_call *op_next;
    /* Poll-mode channel (engine->mu): the group's, else options.channel
     * (holding a reference), else the engine's for LLMRETRY_SUBMIT_POLL,
     * else none. */
    lr_channel *ready_to;
    llmretry_channel *channel;
    int in_ready;
    int pend_notify;               /* engine thread: on e->pend_head */
    llmretry_call *pend_next;
    llmretry_call *ready_next;

    /* The mailbox (mu). */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    llmretry_event *ev_head, *ev_tail;
    int validate_pending, validate_seen, validate_ok;
    char *validate_msg;
    int done;
    int host_freed;
    /* Set when llmretry_call_next has returned DONE: a later report of the
     * call (the engine may publish news the host already drained) has
     * nothing new, so the ready lists drop it. Written by the host, read
     * under the engine's mutex: atomic. */
    atomic_int done_read;
    llmretry_result result;
};

/* Add an attempt's usage (when it had one) to a sum. */
static inline void lr_usage_add(llmretry_usage *sum, const llmretry_usage *u)
{
    if (!u->present)
        return;
    sum->present = 1;
    sum->prompt_tokens += u->prompt_tokens;
    sum->completion_tokens += u->completion_tokens;
    sum->total_tokens += u->total_tokens;
}

/* ---- free re-sends (attempt.c decides, call.c detects) ----------------- */
/* Why a request is sent again within one attempt, without a backoff and
 * without counting an attempt. */
typedef enum lr_resend_why {
    LR_RESEND_NONE = 0,
    /* The server refused the HTTP/2 stream (REFUSED_STREAM, or a GOAWAY whose
     * last-stream-id is below ours): it never processed it. Both modes. */
    LR_RESEND_REFUSED,
    /* The idle keep-alive connection libcurl picked has unread bytes (or
     * was closed): its bytes would be taken as this request's answer. We
     * abort before sending, so it never left. Both modes. */
    LR_RESEND_STALE,
    /* A reused connection found dead before any byte of the request was
     * written (libcurl re-sends that on its own): it never left. Both modes. */
    LR_RESEND_UNSENT,
    /* A reused connection that died, with no byte of a response, after the
     * request was written (libcurl would re-send it on its own). The server
     * may have read it: never free, the transfer ends as a failed attempt
     * (retried at once in safe mode, a stop in unsafe mode:
     * docs/reliability.md, Re-sends). */
    LR_RESEND_REUSED_DIED,
} lr_resend_why;

/* At most this many free re-sends per attempt: a server that refuses every
 * stream must not loop the engine. Past it the attempt fails. */
#define LR_MAX_RESENDS 3

/* GOAWAY frames seen lately, by the ports of their connection (sockets.c):
 * a connection is gone by the time libcurl re-sends its refused streams. */
void lr_goaway_note(llmretry_engine *e, int lport, int rport, unsigned long last_stream);
int lr_goaway_find(llmretry_engine *e, int lport, int rport, unsigned long *last_stream);
void lr_goaway_forget(llmretry_engine *e, int lport, int rport);

/* May the call re-send now for `why`? Counts the re-send when it may. */
int lr_resend_allowed(llmretry_call *c, lr_resend_why why);

/* ---- call.c: building requests and reading responses ----------------- */
/* Build the call record from options (host thread). EINVAL names a field. */
llmretry_status lr_call_new(llmretry_engine *e, const llmretry_options *opts,
                            unsigned flags, llmretry_call **out, char *err, size_t errlen);
void lr_call_ref(llmretry_call *c);
void lr_call_unref(llmretry_call *c);
/* Set up an easy handle for the call's next attempt. */
void lr_call_setup_easy(llmretry_call *c, CURL *easy, int64_t timeout_ms);
/* The call's easy handle, off the multi handle, made ready to send the
 * same request again on a new connection within `timeout_ms`. */
void lr_call_setup_resend(llmretry_call *c, int64_t timeout_ms);
void lr_call_reset_response(llmretry_call *c);
/* transfer.c: drop the captured response headers; one captured header's
 * value (the policy's slots, LR_H_*). */
void lr_call_forget_headers(llmretry_call *c);
const char *lr_call_header(const llmretry_call *c, int i);
/* libcurl's write and header callbacks of an attempt; a host's response
 * goes through them too (host_io.c), so both are read alike. */
size_t lr_call_on_body(char *data, size_t size, size_t nmemb, void *ud);
size_t lr_call_on_header(char *line, size_t size, size_t nmemb, void *ud);
/* The attempt's HTTP status so far (0 = none yet), from libcurl or the host's. */
long lr_call_status(const llmretry_call *c);

/* ---- host_io.c: attempts the host performs (io_loop host) ---------------- */
struct lr_host_xfer;
/* Hand the call's attempt to the host, timeout_ms for it (0 = none); -1
 * with why (a static message) when it cannot be set up. */
int lr_host_attempt_start(llmretry_call *c, int64_t timeout_ms, const char **why);
/* The attempt is over (ended, or taken off: cancelled): no more feeds. */
void lr_host_attempt_detach(llmretry_call *c);
long lr_host_status(const llmretry_call *c);
void lr_host_xfer_free(llmretry_call *c);
/* The engine's spare exchanges freed (at its end, before spare_mu goes). */
void lr_host_xfer_spares_free(llmretry_engine *e);
/* The engine's end: what host_io.c keeps on it. */
void lr_host_io_free(llmretry_engine *e);

/* The outcome of a finished transfer, before the policy sees it. */
#define LR_VALIDATION_PATH_MAX 192
typedef struct lr_outcome {
    int success;                   /* 2xx with a JSON body */
    char *validation_errors;       /* malloc'd JSON text: the schema's verdict */
    char validation_path[LR_VALIDATION_PATH_MAX];  /* its first error's path, for events */
    llmretry_failure f;
    char *message;                 /* malloc'd, failures only */
    int connect_failed;            /* the host did not resolve or the connect failed */
    llmretry_usage usage;
    char *response_model, *fingerprint, *error_code; /* malloc'd */
    int64_t duration_ms;
} lr_outcome;

void lr_call_read_outcome(llmretry_call *c, CURLcode rc, lr_outcome *out);
void lr_outcome_clear(lr_outcome *o);
/* The first 500 bytes of the last response body (malloc'd), or NULL. */
char *lr_call_preview(const llmretry_call *c);

/* ---- building a request (call.c, targets.c) ----------------------------- */
/* url as is, else base_url + "/" + api's path, e.g. "/chat/completions"
 * (else $OPENAI_BASE_URL, else OpenAI's, when is_default is non-NULL: it
 * is set when that is used), joined as llmretry_url_join says. malloc'd;
 * NULL when out of memory. */
char *lr_call_url(const char *url, const char *base_url, llmretry_api api, int *is_default);
/* The path an endpoint appends to base_url: "/chat/completions", ... */
const char *lr_api_path(llmretry_api api);
/* url's path, without its query or fragment ("/" when it has none): *path
 * and its *len, within url. url.c. */
void lr_url_path(const char *url, const char **path, size_t *len);
/* Does url's path (query and trailing slashes aside) end with suffix, e.g.
 * "/embeddings"? Case-insensitive. url.c. */
int lr_url_path_ends(const char *url, const char *suffix);
/* llmretry_estimate_tokens, also giving the body's completion bound
 * (*limit: -1 = none set; 0 for embeddings). estimate.c. */
int64_t lr_estimate_tokens(const char *url, const char *body, size_t len,
                           llmretry_token_counter count, void *ud, int64_t *limit);
/* The request's header list: the key (if any), the defaults the caller's
 * lines do not replace, the ids of c, then the caller's lines. One block
 * (not libcurl's list: never curl_slist_append to it nor
 * curl_slist_free_all it); freed by lr_call_headers_free. 0, or -1 (out of
 * memory, *out NULL). */
int lr_call_headers(const llmretry_call *c, const char *const *lines, size_t n,
                    const char *api_key, int key_from_env, struct curl_slist **out);
void lr_call_headers_free(struct curl_slist *headers);
/* The engine's spare call records freed, and its spare_mu (at its end). */
void lr_call_spares_free(llmretry_engine *e);
uint64_t lr_call_key_hash(const struct curl_slist *headers);
/* The value of a header line ("Name: value") whose name is a credential's
 * (Authorization, api-key, x-goog-api-key: a name holding auth, key,
 * token, secret, cookie or password), its leading blanks skipped; NULL for
 * any other line. response.c. */
const char *lr_credential_value(const char *line);
/* options.c: the body's part of llmretry_options_check (method, body,
 * body_len, content_type). */
llmretry_status lr_options_check_body(const llmretry_options *o, char *err, size_t errlen);
/* options.c: one "name: value" header as headers[] would be checked. */
llmretry_status lr_check_header_parts(const char *name, const char *value, const char *label,
                                      int has_key, char *err, size_t errlen);

/* targets.c */
struct cJSON;
int lr_targets_check(const struct cJSON *doc, const char *name, int in_policy, char *err,
                     size_t errlen);
int lr_targets_check_json(const char *json, const char *name, char *err, size_t errlen);

/* answer.c: structured outputs (docs/structured-outputs.md) */
/* JSON text of a schema option: 0, or -1 with "<name>: <why>" in err. */
int lr_schema_check_json(const char *json, const char *name, char *err, size_t errlen);
/* The call's schema, compiled once at submit: the schema option's, else
 * the body's response_format / text.format json_schema (body is its JSON
 * text). 0 (c->schema may stay NULL: none), or -1 with err (EINVAL), or
 * -2 when out of memory. */
int lr_answer_schema(llmretry_call *c, const llmretry_options *o, char *err, size_t errlen);
/* A 2xx answer held to the call's schema (a parsed body; NULL: parse
 * c->resp): out turns into an invalid_response with validation_errors,
 * or a refusal, when it falls short. Nothing without a schema. */
struct lr_outcome;
void lr_answer_check(llmretry_call *c, const struct cJSON *doc, struct lr_outcome *out);
/* repair.c: with option repair, after an invalid answer, make the next
 * attempt's body the target's with the failed answer and a note of its
 * errors; 1 when it did. */
int lr_repair_body(llmretry_call *c);
/* The fallbacks' targets after target 0 (the array grows to hold them). */
int lr_targets_build(llmretry_call *c, const char *fallbacks);
void lr_targets_free(llmretry_call *c);
/* Fill result.targets from what each target came to (at the end). */
void lr_targets_report(llmretry_call *c);
/* Make target i the call's current one. */
void lr_target_use(llmretry_call *c, int i);
/* Switch to the next target: 0, or -1 when there is none (or no memory). */
int lr_target_next(llmretry_call *c);

/* ---- response_body.c (a 2xx body), response.c (an HTTP error) ------- */
/* A copy of obj[key] when it is a string, else NULL. */
char *lr_json_str(const struct cJSON *obj, const char *key);
/* A 2xx body as the hosts will read it: NULL unless it is UTF-8 JSON with
 * no raw control characters in strings (the caller frees the tree). */
/* The body as JSON, or NULL with *why saying what is wrong (the doc may be
 * returned with *why set when it is not an object). */
struct cJSON *lr_parse_body(const char *text, size_t n, const char **why);
#define LR_XSTR(x) #x
#define LR_STR(x) LR_XSTR(x)
/* Usage (only sane counts), model and fingerprint of a 2xx document. */
void lr_read_success(const struct cJSON *doc, llmretry_usage *usage, char **model,
                     char **fingerprint);
/* What a 2xx body's top level says of it, for answer_error.c: where the
 * values of its "error", "choices" and "data" start in its text (NULL: no
 * such member), whether its "status" is "failed", and whether an object
 * in its "choices" array has finish_reason "error". */
typedef struct lr_body_tops {
    const char *error, *choices, *data;
    int failed, error_choice;
} lr_body_tops;
/* A 2xx body judged as lr_parse_body judges it (the same *why), and its
 * usage, model and fingerprint read as lr_read_success reads them, without
 * building the tree: read in place (json_pull.h). 0 with *tops filled, or
 * -1 with *why set. */
int lr_read_body(const char *text, size_t n, const char **why, llmretry_usage *usage,
                 char **model, char **fingerprint, lr_body_tops *tops);
/* A 2xx JSON body (read by lr_read_body) that is no answer to the
 * generation endpoint c asked (a POST to .../chat/completions,
 * .../completions, .../embeddings or .../responses): an error inside it
 * (judged as a stream's error event is), or no choices (no data for
 * embeddings). 1 with out's failure and message set, else 0.
 * answer_error.c. */
int lr_answer_error(llmretry_call *c, const char *text, size_t n, const lr_body_tops *tops,
                    lr_outcome *out);
/* What an error shows of the server's text (docs/security.md). A provider's
 * code shows when it is a token of [A-Za-z0-9_.:-], at most LR_CODE_MAX
 * bytes, that does not quote the request, else as LR_INVALID_CODE; its
 * message, cut to LR_MESSAGE_MAX bytes, unless the part shown holds
 * LR_ECHO_RUN bytes in a row of the request's message contents (or a
 * credential header's value), then a note that it was withheld. */
#define LR_CODE_MAX 64
#define LR_INVALID_CODE "invalid_code"
#define LR_MESSAGE_MAX 300
#define LR_ECHO_RUN 16
/* The longest lr_http_error text: the give-up's text follows it in 640. */
#define LR_HTTP_ERROR_MAX 450
/* "HTTP 400 from /v1/chat/completions (code): \"message\"", escaped
 * (malloc'd); *error_code gets the provider's code (malloc'd, checked as
 * lr_error_code_checked does) or NULL. */
char *lr_http_error(const llmretry_call *c, long status, char **error_code);
/* The same text for a 2xx body that is an error standing for HTTP `like`
 * (answer_error.c): "HTTP 200 from /v1/chat/completions whose body is an
 * error (HTTP 502-like): \"message\"". malloc'd. */
char *lr_body_error_text(const llmretry_call *c, long status, int like);
/* The same for an error event of a 2xx stream whose data is data[0..len)
 * (NULL: out of memory, no message): "HTTP 200 from /v1/chat/completions:
 * the server sent an error inside the stream (HTTP 500-like) (code):
 * \"message\"". malloc'd. */
char *lr_stream_error_text(const llmretry_call *c, const char *data, size_t len, int like);
/* code (malloc'd, taken) as errors may show it: itself, or LR_INVALID_CODE
 * (malloc'd); NULL stays NULL. For the codes of stream error events. */
char *lr_error_code_checked(const llmretry_call *c, char *code);

/* ---- events.c ---------------------------------------------------------- */
llmretry_event *lr_event_new(llmretry_call *c, llmretry_event_type t);

/* ---- ca_bundle.c --------------------------------------------------------- */
/* The CA bundle for a call without ca_file when libcurl's built-in one is
 * missing (a wheel's libcurl on another distribution), else NULL. */
const char *lr_default_ca_file(void);

/* ---- engine.c, group.c: references --------------------------------------- */
void lr_engine_ref(llmretry_engine *e);
void lr_engine_unref(llmretry_engine *e);
pthread_mutex_t *lr_engine_mutex(llmretry_engine *e);
void lr_group_unref(llmretry_group *g);

#pragma GCC visibility pop
#endif
