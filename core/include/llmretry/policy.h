/* llmretry/policy.h — the retry policy as pure functions, and the batch pacer.
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_POLICY_H
#define LLMRETRY_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/options.h"
#include "llmretry/result.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Policy: pure functions (docs/reliability.md), exposed for bindings and tests.  */
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

/* Rules 1-7 of docs/reliability.md after attempt `attempt` (0-based) failed.
 * deadline_left_ms: time left before the deadline, or LLMRETRY_NO_DEADLINE.
 * A cancelled failure is `kind == LLMRETRY_ERR_CANCELLED`. */
llmretry_decision llmretry_decide(const llmretry_options *o, const llmretry_failure *f,
                                  int attempt, int64_t now_unix_ms,
                                  int64_t deadline_left_ms, double u01);

/* Per-attempt timeout: min(timeout_ms, deadline_left_ms); deadline_left_ms
 * may be LLMRETRY_NO_DEADLINE. */
int64_t llmretry_attempt_timeout_ms(int64_t timeout_ms, int64_t deadline_left_ms);

/* ------------------------------------------------------------------ */
/* The batch pacer: pure, on the caller's clock (docs/reliability.md, batches).  */
/* ------------------------------------------------------------------ */

/* How many items of a batch may run at once. A 429 that names a wait
 * (Retry-After, x-ratelimit-reset) pauses new starts for that long; with
 * `adaptive`, a 429 also halves the window (once per burst: not again
 * within LLMRETRY_PACER_COOLDOWN_MS) and it grows back by one slot per
 * window-full of successes (additive increase), never above
 * `limit` nor below 1. Host pools (Python, Lua) and engine groups use it;
 * an engine group holds only the paused endpoint's items, not all (its
 * pause then only counts the pauses). */
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

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_POLICY_H */
