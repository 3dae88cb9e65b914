/* The engine's private parts, shared by the files that make it up:
 *
 *   engine.c     the I/O thread's loop, the op queue, the public engine API
 *   fork.c       which process an engine belongs to (lr_forked)
 *   timers.c     one timer per call: its deadline, backoff and not-before
 *   admission.c  what an attempt passes before it starts (slots, pacers)
 *   attempt.c    attempts on the wire and what the policy makes of them
 *   mailbox.c    what the engine publishes to hosts and the host side of it
 *   channel.c    ready lists with a notifier (eventfd or pipe)
 *   sockets.c    the engine's open sockets, found by their ports
 *   io_events.c  the events loop: libcurl's socket interface on epoll
 *   spares.c     freed call records and exchanges kept for the next call
 *
 * Everything marked "I/O thread" is touched by that thread only. */
#ifndef LR_ENGINE_PRIVATE_H
#define LR_ENGINE_PRIVATE_H

#include "internal.h"

#include <stdint.h>
#pragma GCC visibility push(hidden)

#define LR_NO_TIMER SIZE_MAX        /* heap_index of a call without a timer */

/* A list of freed objects of one kind (spares.c). */
typedef struct lr_spares {
    void *head;
    int n;
} lr_spares;

/* ---- sockets.c ------------------------------------------------------------ */
typedef struct lr_sock {
    curl_socket_t fd;
    int lport, rport;              /* 0 until known */
} lr_sock;

#define LR_GOAWAYS 16
typedef struct lr_goaway {
    int lport, rport;              /* 0 = free slot */
    unsigned long last_stream;
} lr_goaway;

/* A socket whose ports are known, by its ports (lr_socktab.index). */
typedef struct lr_sock_slot {
    uint32_t ports;                /* local << 16 | remote; 0 = empty */
    curl_socket_t fd;
} lr_sock_slot;

typedef struct lr_socktab {
    lr_sock *socks;                /* every open socket, in no order */
    size_t len, cap;
    size_t unknown;                /* of them, how many have ports not yet learned */
    lr_sock_slot *index;           /* open addressing, linear probing; a power of two */
    size_t index_cap, index_len;
    lr_goaway goaways[LR_GOAWAYS]; /* the latest, oldest overwritten */
    unsigned next_goaway;
    /* Told of each socket the table opens (open 1) and is about to close
     * (open 0): the events loop keeps idle connections in its epoll set
     * (io_events.c). NULL: nobody. */
    void (*watch)(void *arg, curl_socket_t fd, int open);
    void *watch_arg;
} lr_socktab;

/* Connection caches, shard 0 the multi handle's own (conn_shards.c). */
typedef struct lr_shards {
    CURLSH **share;                /* [0] unused: the multi's cache; NULL: closed */
    int *load;                     /* transfers in each */
    int64_t *idle_since;           /* when its load last fell to 0 (monotonic ms) */
    int n;                         /* shards in use: the highest opened + 1 */
    int64_t idle_ms;               /* a shard idle this long is closed */
    int64_t next_tidy;             /* when lr_shards_tidy looks again */
} lr_shards;

/* Make the easy handle open and close its sockets through the table. */
void lr_socktab_attach(lr_socktab *t, CURL *easy);
/* What the handle's open and close callbacks do (tests call them too). */
curl_socket_t lr_socktab_open(lr_socktab *t, int family, int socktype, int protocol);
int lr_socktab_close(lr_socktab *t, curl_socket_t fd);
/* The open socket with these ports, or CURL_SOCKET_BAD. */
curl_socket_t lr_socktab_find(lr_socktab *t, int local_port, int remote_port);
/* After curl_multi_cleanup: libcurl closes sockets through the table. */
void lr_socktab_free(lr_socktab *t);

struct llmretry_engine {
    atomic_int refs;               /* the host's + one per unfreed call */
    unsigned fork_generation;      /* lr_forked: engine.c's count of forks at creation */
    int max_in_flight;

    /* Freed objects kept for the next of their kind (spares.c), under
     * spare_mu: call records (call.c: a 2.4 KB calloc per call cost the
     * submitting thread more than the rest of its record) and, io_loop
     * host, exchanges with their buffers (host_io.c). */
    pthread_mutex_t spare_mu;
    lr_spares spare_calls, spare_xfers;

    pthread_mutex_t mu;            /* guards everything down to `thread` */
    llmretry_call *ops_head, *ops_tail;
    llmretry_channel channel;      /* LLMRETRY_SUBMIT_POLL calls with news (owned) */
    int stopping;
    int multi_gone;                /* the I/O thread has released `multi` */
    CURLM *multi;
    /* LLMRETRY_IO_LOOP_EVENTS: the epoll set (io_events.c); NULL: the
     * perform loop. Set before the thread starts, freed with `multi`. */
    struct lr_io_events *events;
    /* LLMRETRY_IO_LOOP_HOST: no thread; the host runs the loop's turns
     * (llmretry_engine_run) and performs the attempts (host_io.c). */
    int host_io;
    struct lr_host_url *host_url;  /* host_io.c: the URL parsed last (host thread) */
    pthread_t thread;

    /* I/O thread only. */
    llmretry_call **heap;          /* timers, earliest first (timers.c) */
    size_t heap_len, heap_cap;
    lr_queue waiting;              /* admitted but no free slot */
    llmretry_group *groups;        /* groups with items to start */
    llmretry_call *live_head;      /* every unfinished call */
    int in_flight;
    /* Transfers' ends read from libcurl, then handled (read_finished). */
    struct lr_done { llmretry_call *call; CURL *easy; CURLcode result; } *done;
    size_t done_cap;
    CURL **easy_pool;
    size_t n_easy;
    lr_socktab socks;              /* sockets of plain-http connections */
    lr_shards shards;              /* connection caches (conn_shards.c) */
    int max_host_connections;      /* the option: 0 = none */
    struct lr_origin **origins;    /* https origins seen (origins.c) */
    size_t n_origins;
    uint64_t *reached;             /* hashes of the origins reached (origins.c) */
    size_t n_reached, cap_reached;
    int reached_full;              /* more were reached than it keeps */
    struct lr_endpoint **endpoints;  /* rate budgets (ratelimit.c) */
    struct lr_shared_store *shared;  /* option `shared`, or NULL (shared.h) */
    size_t n_endpoints;
    uint64_t rng;
    llmretry_call *pend_head;      /* calls with news, published once per loop, */
    llmretry_call *pend_tail;      /* in the order they had it */
};

/* ---- conn_shards.c: connection caches of SHARD_SIZE transfers ------------- */
/* Give the call's easy handle (not yet added) its connection cache. */
void lr_shard_attach(llmretry_engine *e, llmretry_call *c, CURL *easy);
/* The call's easy handle is out of the multi handle for good. */
void lr_shard_detach(llmretry_engine *e, llmretry_call *c, CURL *easy);
/* Close the shards idle for their idle time (looks once a second). */
void lr_shards_tidy(llmretry_engine *e, int64_t now);
/* Tests: a shard's idle time before it is closed (before any call). */
void lr_shards_set_idle_ms(llmretry_engine *e, int64_t ms);
/* After the easy handles and the multi handle are cleaned up. */
void lr_shards_free(llmretry_engine *e);

/* ---- io_events.c: the events loop (LLMRETRY_IO_LOOP_EVENTS) --------------- */
typedef struct lr_io_events lr_io_events;
/* 1 where the events loop exists (epoll: Linux). */
int lr_events_supported(void);
/* The epoll set and its wake-up notifier, libcurl's socket callback set on
 * e->multi; NULL when a system call fails. */
lr_io_events *lr_events_open(llmretry_engine *e);
/* Free e->events and take its hook off the socket table. */
void lr_events_free(llmretry_engine *e);
/* Wake the loop's wait; any thread (curl_multi_wakeup's counterpart). */
void lr_events_wake(lr_io_events *ev);
/* Run the transfers whose sockets the last wait found ready and those
 * whose libcurl timers are due (curl_multi_perform's counterpart). */
void lr_events_drive(llmretry_engine *e);
/* Wait for a socket, a wake-up, libcurl's next timer or timeout_ms. */
void lr_events_wait(llmretry_engine *e, int timeout_ms);

/* ---- timers.c ----------------------------------------------------------- */
/* Place the call's one timer where its state says (a backoff's end, or the
 * deadline of a call that waits for admission), or remove it. -1 when out
 * of memory: the caller fails the call (it would wait unseen). */
int lr_timer_update(llmretry_engine *e, llmretry_call *c);
void lr_timer_remove(llmretry_engine *e, llmretry_call *c);
/* The earliest call whose timer is due at `now`, taken off the heap. */
llmretry_call *lr_timer_take_due(llmretry_engine *e, int64_t now);
/* Milliseconds until the earliest timer (0 if due), or `cap` if later. */
int64_t lr_timer_due_in(const llmretry_engine *e, int64_t now, int64_t cap);

/* ---- admission.c ---------------------------------------------------------- */
/* A new call: its group's pacer first (if it has one), then a slot. */
void lr_admit_new(llmretry_engine *e, llmretry_call *c);
/* A retry whose wait is over: a slot (before fresh calls). */
void lr_admit_retry(llmretry_engine *e, llmretry_call *c);
/* Start whatever the admission stage now lets through. */
void lr_admission_pump(llmretry_engine *e);
/* Take a waiting call out of whatever queue holds it. */
void lr_admission_leave(llmretry_engine *e, llmretry_call *c);
/* The call has finished: its group may start another. */
void lr_admission_finished(llmretry_engine *e, llmretry_call *c);
/* How soon the admission stage needs the loop again, at most `cap`. */
int64_t lr_admission_due_in(const llmretry_engine *e, int64_t now, int64_t cap);
/* Drop every group from the list (shutdown, once nothing is queued). */
void lr_admission_unlist_all(llmretry_engine *e);

/* ---- origins.c: the connection gate of HTTPS origins ------------------------ */
typedef struct lr_origin lr_origin;
/* The call's https origin (made on first use), or NULL: not gated. */
lr_origin *lr_origin_of(llmretry_engine *e, llmretry_call *c);
/* May an attempt of this call start now as far as its origin goes? */
int lr_origin_admits(llmretry_engine *e, llmretry_call *c);
/* The queue of calls held for the call's origin (lr_origin_of is set). */
lr_queue *lr_origin_queue(llmretry_call *c);
/* An attempt was added / its connection is ready (or it ended). */
void lr_origin_connecting(llmretry_engine *e, llmretry_call *c);
void lr_origin_connected(llmretry_call *c);
/* The TLS handshake's ALPN answer: 1 = HTTP/2, 0 = HTTP/1.x. */
void lr_origin_learned(llmretry_call *c, int multiplexed);
/* What the origin's first handshake said: -1 not known yet, 0 HTTP/1.x,
 * 1 HTTP/2. */
int lr_origin_multiplexes(const lr_origin *o);
/* Start the held calls whose origin now admits them; how soon one may
 * start (0: now), at most `cap`. */
void lr_origins_pump(llmretry_engine *e);
int64_t lr_origins_due_in(const llmretry_engine *e, int64_t now, int64_t cap);
void lr_origins_free(llmretry_engine *e);
/* Any origin, http or https: a connection to the call's current URL's
 * origin is up (libcurl is about to send on it). */
void lr_origin_reached(llmretry_engine *e, llmretry_call *c);
/* 1 when no connection of this engine has ever reached url's origin (as
 * far as it knows: 0 once it stopped keeping count). */
int lr_origin_never_reached(const llmretry_engine *e, const char *url);
/* url's origin as scheme://host[:port], any user:password@ left out,
 * into buf (cut to fit). */
void lr_origin_text(const char *url, char *buf, size_t size);

/* ---- ratelimit.c: the rate budget of each endpoint (URL + API key) ---------- */
typedef struct lr_endpoint lr_endpoint;
/* The call's endpoint (made on first use; NULL when out of memory). */
lr_endpoint *lr_endpoint_of(llmretry_engine *e, llmretry_call *c);
/* 0 when an attempt of c may start now (its request and tokens are taken),
 * else the milliseconds to wait: c then waits in lr_budget_queue(c). */
int64_t lr_budget_admits(llmretry_engine *e, llmretry_call *c, int64_t now);
lr_queue *lr_budget_queue(llmretry_call *c);
/* Pass the waiting calls the budgets now admit on to `admit`. */
void lr_budget_pump(llmretry_engine *e, void (*admit)(llmretry_engine *, llmretry_call *));
int64_t lr_budget_due_in(const llmretry_engine *e, int64_t now, int64_t cap);
/* An attempt ended with a response (its headers, its usage; ok: a 2xx),
 * or without one (detached: cancelled); a 429's wait pauses the endpoint. */
void lr_budget_attempt_ended(llmretry_call *c, int ok, const llmretry_usage *usage);
void lr_budget_detached(llmretry_call *c);
void lr_budget_pause(llmretry_engine *e, llmretry_call *c, int64_t until);
/* How long the endpoint's pause still holds its calls (0: none): a 429's
 * wait or the slow-down's, this process's or, through a shared store,
 * another's. */
int64_t lr_budget_paused_ms(const lr_endpoint *ep, int64_t now);
/* A failed attempt: a 429 naming no wait slows c's endpoint down for every
 * call (its retry still counts against max_retries). */
void lr_budget_slow_down(llmretry_engine *e, llmretry_call *c, const llmretry_failure *f,
                        int64_t now);
void lr_endpoints_free(llmretry_engine *e);

/* ---- health.c: the retry budget and circuit breaker of each endpoint -------- */
/* May an attempt of c start as far as its endpoint's breaker goes? 0 with
 * `why` (a message for the result) when the breaker is open; -1 when a
 * Redis store has not yet said who probes a half-open breaker (the budget
 * holds the call until it has, lr_budget_pump asking again). */
int lr_health_admits(llmretry_engine *e, llmretry_call *c, int64_t now, char *why, size_t len);
void lr_health_attempt_started(llmretry_engine *e, llmretry_call *c);
/* May c retry now as far as the retry budget goes? Counts the retry. */
int lr_health_retry_allowed(llmretry_engine *e, llmretry_call *c, int64_t now);
/* An attempt came back: with a response (f NULL for a 2xx) or a failure. */
void lr_health_attempt_ended(llmretry_engine *e, llmretry_call *c, const llmretry_failure *f);
/* The attempt was taken off the wire without a verdict (cancelled). */
void lr_health_detached(llmretry_call *c);

/* ---- attempt.c ------------------------------------------------------------ */
void lr_attempt_start(llmretry_engine *e, llmretry_call *c);
void lr_attempt_finished(llmretry_engine *e, llmretry_call *c, CURLcode rc);
void lr_attempt_validated(llmretry_engine *e, llmretry_call *c);
void lr_give_up(llmretry_engine *e, llmretry_call *c, llmretry_giveup_reason reason);
void lr_cancel(llmretry_engine *e, llmretry_call *c);
void lr_easy_pool_clear(llmretry_engine *e);
/* The attempt's easy handle off the multi handle and back to the pool. */
void lr_detach_easy(llmretry_engine *e, llmretry_call *c);
/* The call succeeded: its result and event published, the call finished. */
void lr_succeed(llmretry_engine *e, llmretry_call *c, int status, int64_t duration_ms,
                llmretry_usage usage, char *response_model, char *fingerprint);

/* ---- mailbox.c (engine side) ---------------------------------------------- */
/* A fresh event of type t, or NULL when the call did not ask for it. */
llmretry_event *lr_event(llmretry_call *c, llmretry_event_type t);
void lr_post(llmretry_call *c, llmretry_event *ev);
/* Append an item (an event, or a stream chunk) to the call's mailbox and
 * wake its reader; dropped when the host has freed the call. */
void lr_mail_event(llmretry_call *c, llmretry_event *ev);
/* The call has news for its channel (published by lr_publish). */
void lr_notify(llmretry_call *c);
/* Publish every call with news, once per loop pass. */
void lr_publish(llmretry_engine *e);
/* Mark the call done and wake whoever waits for it. */
void lr_mail_done(llmretry_call *c);
/* Hand a 2xx body to the host's validator. */
void lr_mail_validate(llmretry_call *c);

/* ---- spares.c -------------------------------------------------------------- */
/* Take a kept object (NULL: none, or a forked child); keep one (1) unless
 * `max` are kept already or the engine is forked (0: the caller frees it);
 * pop one at the engine's end (no lock: nobody else is left). An object's
 * first pointer-sized bytes are the list's while it is kept. */
int lr_spares_cap(const llmretry_engine *e);
void *lr_spares_take(llmretry_engine *e, lr_spares *s);
int lr_spares_put(llmretry_engine *e, lr_spares *s, void *p, int max);
void *lr_spares_pop(lr_spares *s);

/* ---- engine.c -------------------------------------------------------------- */
/* 1 in a process forked from the one that made the engine. Every public
 * entry point that would lock the engine's or a call's mutex asks first:
 * the parent's I/O thread may have held it at the fork, and in the child
 * nobody would ever unlock it. */
int lr_forked(const llmretry_engine *e);
/* Queue an op for the I/O thread; -1 once the engine has shut down. */
int lr_queue_op(llmretry_call *c, unsigned op);
void lr_live_unlink(llmretry_engine *e, llmretry_call *c);

/* ---- the intrusive FIFO of waiting calls (admission.c) --------------------- */
void lr_queue_push(lr_queue *q, llmretry_call *c, int front);
void lr_queue_unlink(lr_queue *q, llmretry_call *c);

#pragma GCC visibility pop
#endif
