/* llmretry/engine.h — engines and calls: submitting, the mailbox, event-loop integration.
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_ENGINE_H
#define LLMRETRY_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/options.h"
#include "llmretry/result.h"
#include "llmretry/events.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Engine and calls.                                                   */
/* ------------------------------------------------------------------ */
typedef struct llmretry_engine llmretry_engine;
typedef struct llmretry_call llmretry_call;

/* How an engine's I/O thread waits for its transfers (docs/reliability.md,
 * "The I/O loop"). */
typedef enum llmretry_io_loop {
    /* curl_multi_perform, then curl_multi_poll: every transfer in flight is
     * looked at on every wake-up. Cheapest when most of them have news at
     * once (a batch whose calls answer together). The default. */
    LLMRETRY_IO_LOOP_PERFORM = 0,
    /* curl_multi_socket_action on the engine's own epoll set: a wake-up
     * touches only the transfers whose sockets are ready. Cheaper with many
     * transfers waiting on a slow server while few answer at a time (a
     * gateway). Linux only: elsewhere llmretry_engine_new says ENOTSUP. */
    LLMRETRY_IO_LOOP_EVENTS = 1,
    /* No I/O thread: the host runs the engine (llmretry_engine_run) and
     * performs each attempt's HTTP/1.1 exchange on its own sockets
     * (llmretry/host_io.h). For a host whose own event loop must do the
     * I/O: an nginx worker and its cosockets. The policy is the engine's
     * as ever; only who moves the bytes differs. */
    LLMRETRY_IO_LOOP_HOST = 2
} llmretry_io_loop;

typedef struct llmretry_engine_options {
    /* Most HTTP attempts in flight at once; more calls queue. 256. */
    int max_in_flight;
    /* Most connections kept open per host (0 = libcurl's default). */
    int max_host_connections;
    /* Where endpoints' budgets live (docs/shared.md): NULL or "" = in this
     * process; "shm:NAME" = shared by every process on the host naming
     * NAME. Copied; checked by llmretry_engine_new (EINVAL names it). */
    const char *shared;
    /* An llmretry_io_loop: LLMRETRY_IO_LOOP_PERFORM (the default),
     * LLMRETRY_IO_LOOP_EVENTS or LLMRETRY_IO_LOOP_HOST. */
    int io_loop;
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
/* This process's count of forks: what it was in the parent plus one in
 * each child of fork() (counted by a pthread_atfork handler, registered by
 * the first call here or the first engine). A host object that must know
 * whether it is used after a fork keeps the count of its creation and
 * compares: an atomic load where getpid() is a system call. */
unsigned llmretry_fork_generation(void);

/* Submit flags. */
#define LLMRETRY_SUBMIT_POLL 1u  /* report this call to llmretry_engine_channel */

/* Submit a call. Options are checked and copied (the caller may free them
 * on return); EINVAL names the field, before any I/O. */
llmretry_status llmretry_engine_submit(llmretry_engine *e, const llmretry_options *opts,
                                       unsigned flags, llmretry_call **out,
                                       char *err, size_t errlen);

/* Event-loop integration: the engine's own channel (llmretry/channel.h),
 * where calls submitted with LLMRETRY_SUBMIT_POLL report their news: its
 * fd is readable while one has news, llmretry_channel_poll takes them and
 * llmretry_channel_wait blocks for them. It lives as long as the engine
 * (llmretry_channel_free leaves it alone). */
llmretry_channel *llmretry_engine_channel(llmretry_engine *e);

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
    LLMRETRY_MAIL_DONE,        /* the result is ready (repeats once reached) */
    /* *ev is a stream chunk (llmretry_chunk_data; free it with
     * llmretry_event_free). Taking the first one is the commit point. */
    LLMRETRY_MAIL_CHUNK
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

/* A keep_response call's response head (as result.headers) before the
 * call ends: once the host has taken a chunk of a stream, the head of the
 * attempt its chunks come from (it no longer changes: the commit point),
 * else NULL until the mailbox says DONE. *len gets its length. Valid until
 * the call is freed. */
const char *llmretry_call_response_head(llmretry_call *c, size_t *len);

/* Blocking convenience: submit, deliver each event to `on_event` (may be
 * NULL) on this thread, and return the finished call. A call with
 * opts->validate set is rejected (EINVAL): validation needs the mailbox. */
typedef void (*llmretry_event_fn)(const llmretry_event *ev, void *ud);
llmretry_status llmretry_call_blocking(llmretry_engine *e, const llmretry_options *opts,
                                       llmretry_event_fn on_event, void *ud,
                                       llmretry_call **out, char *err, size_t errlen);

/* Report i (0..result.n_targets-1) of a finished call; EINVAL past the end
 * or before the call is done. */
llmretry_status llmretry_call_target_report(const llmretry_call *c, size_t i,
                                            llmretry_target_report *out);

/* What the engine knows of one endpoint (a URL and the key sent to it):
 * its retry budget, circuit breaker and rate budget. */
typedef struct llmretry_endpoint_stats {
    const char *url;               /* valid until llmretry_engine_free; its user
                                    * info and query shown as "***" (secrets) */
    int has_key;                   /* its calls send an Authorization header */
    int64_t requests;              /* first attempts sent, ever */
    int64_t retries;               /* retries sent, ever */
    int64_t window_requests;       /* over the retry budget's rolling 10 s */
    int64_t window_retries;
    int64_t retries_refused;       /* retry_budget_exhausted, ever */
    const char *breaker;           /* "closed", "open", "half_open" ("closed" when off) */
    int consecutive_failures;
    int64_t breaker_opened;        /* times it opened, ever */
    int64_t short_circuited;       /* attempts failed at once as circuit_open */
    int64_t open_ms_left;          /* while open: until a probe may go */
    int64_t rpm, tpm;              /* in force: configured, else learned; 0 = none */
    int in_flight;
    const char *model;             /* the model its calls name, NULL for none
                                    * (an endpoint is a URL, a key and a model:
                                    * providers limit each model apart); valid
                                    * until llmretry_engine_free */
} llmretry_endpoint_stats;

/* Up to `max` endpoints' stats (in the order first used) into out; returns
 * how many endpoints there are (may exceed max). Any thread. */
size_t llmretry_engine_endpoint_stats(llmretry_engine *e, llmretry_endpoint_stats *out,
                                      size_t max);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_ENGINE_H */
