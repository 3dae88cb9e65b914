/* An endpoint: a URL, the API key sent to it (as a hash of the
 * Authorization header) and the model its calls name. The model is part of
 * it because providers limit each model on a key apart and say so per model
 * (OpenAI's limits, and the x-ratelimit-* of every answer, are a model's;
 * so are a gateway's, LiteLLM's included): one endpoint per URL and key let
 * a model limited to 10 requests a minute pace every other model of that
 * gateway at 10. Everything the engine learns and decides per endpoint
 * lives here, shared by every call of the engine:
 *
 *   endpoint.c   the table of endpoints and what hosts may read of them
 *   ratelimit.c  the rate budget: rpm, tpm, x-ratelimit-*, a 429's pause,
 *                the slow-down after 429s naming no wait
 *   health.c     the retry budget and the circuit breaker (docs/reliability.md)
 *
 * I/O thread only, except `stats`, which the engine publishes under the
 * engine's mutex for llmretry_engine_endpoint_stats. */
#ifndef LR_ENDPOINT_H
#define LR_ENDPOINT_H

#include "engine.h"
#include "shared.h"
#pragma GCC visibility push(hidden)

/* The health options in force for an endpoint (the latest call's). The
 * numbers they act on live in the endpoint's lr_shared_ep (shared.h). */
typedef struct lr_health_config {
    double budget_ratio;               /* retry_budget_ratio */
    int64_t budget_min;                /* retry_budget_min */
    int threshold;                     /* breaker_failures: 0 = off */
    int64_t cooldown_ms;               /* breaker_cooldown_ms */
} lr_health_config;

/* What the server's x-ratelimit-* headers last said of one limit, requests
 * or tokens (ratelimit.c). */
typedef struct lr_stated {
    int64_t limit;                     /* -limit-*, 0 = not seen */
    int64_t remaining;                 /* -remaining-*, less what we sent since; -1 = not known */
    int64_t at;                        /* when remaining was said */
    int64_t reset_at;                  /* -reset-*: when its window has room again; -1 = not known */
    int per_window;                    /* limit is its (shorter) window's, not a minute's */
    int64_t verdict_used;              /* how much of the limit the answer that said so had used */
    int64_t window_ms;                 /* then: its length as far as known (the longest reset) */
} lr_stated;

/* Successes are counted in this many slots of 100 ms (the last second). */
#define LR_OK_SLOTS 10

struct lr_endpoint {
    char *url;
    char *shown_url;                   /* url for the stats (llmretry_url_shown) */
    uint64_t key_hash;
    char *model;                       /* its calls' model; NULL: they name none */
    /* The rate budget (ratelimit.c). */
    int64_t rpm, tpm;                  /* configured (the latest call's), 0 = none */
    lr_stated req, tok;                /* learned from the responses */
    double req_level, tok_level;       /* the buckets (tok_level may be in debt) */
    double tok_cap;                    /* the token bucket's size: its next call's */
    int64_t refilled_at;               /* -1: the buckets start full */
    int64_t paused_until;              /* a 429's wait (named, or the slow-down's) */
    /* The slow-down that 429s naming no wait teach (ratelimit.c). */
    double slow_rpm;                   /* the request rate they allow, 0 = none */
    int64_t slow_mark;                 /* when it last reacted */
    int slow_refusals;                 /* refusals it reacted to since a success */
    int64_t ok_tenth[LR_OK_SLOTS];     /* the 100 ms each slot counts */
    int64_t ok_count[LR_OK_SLOTS];     /* 2xx responses in it */
    int in_flight;                     /* attempts admitted and not ended */
    int64_t in_flight_tok;             /* their tokens */
    int64_t sent_req, sent_tok;        /* requests and tokens admitted, ever */
    lr_queue queue;                    /* calls waiting for budget */
    /* Health (health.c): its options, and its numbers in `sh`: this
     * process's own `local`, or the engine's shared store's slot for this
     * endpoint (engine option `shared`). Counts since it was made. */
    lr_health_config health;
    lr_shared_ep local;
    lr_shared_ep *sh;
    /* A Redis store's endpoint (NULL otherwise): `sh` is its mirror, read
     * as any slot, and every change goes through the lr_redis_* calls
     * (shared.h), which also queue it for Redis. */
    lr_redis_ep *rd;
    int64_t requests, retries, retries_refused, breaker_opened, short_circuited;
    /* Published for hosts (engine mutex). */
    llmretry_endpoint_stats stats;
};

/* endpoint.c: publish the endpoint's numbers for hosts (one lock of the
 * engine's mutex); call after a change worth seeing. */
void lr_endpoint_publish(llmretry_engine *e, lr_endpoint *ep);

/* An endpoint's name in a shared store: a hash of its URL, key hash and
 * model (never 0). */
uint64_t lr_endpoint_id(const char *url, uint64_t key_hash, const char *model);

/* ratelimit.c: the request rate in force, a minute's worth (0: none). */
int64_t lr_budget_rpm(const lr_endpoint *ep);

#pragma GCC visibility pop
#endif
