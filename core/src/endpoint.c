/* The engine's endpoints (endpoint.h): found or made for a call's current
 * target, and what hosts may read of them. */
#include "endpoint.h"

#include <stdlib.h>
#include <string.h>

/* More endpoints than this are not tracked (their calls are neither
 * limited nor guarded). */
#define MAX_ENDPOINTS 256
/* A URL and key get an endpoint for at most this many models; the calls of
 * any model past them share the URL and key's endpoint without a model (as
 * calls naming none do). The model comes from the request body, which a
 * gateway's downstream clients write: a flood of made-up names must not
 * use up the engine's endpoints, or a shared store's slots, before the
 * real models have theirs. */
#define MAX_MODELS_PER_KEY 64

static void endpoint_free(lr_endpoint *ep)
{
    free(ep->url);
    free(ep->shown_url);
    free(ep->model);
    free(ep);
}

static lr_endpoint *endpoint_new(llmretry_engine *e, const llmretry_call *c,
                                 const char *model)
{
    lr_endpoint *ep = calloc(1, sizeof *ep);
    if (!ep)
        return NULL;
    ep->url = lr_strdup(c->url);
    ep->shown_url = llmretry_url_shown(c->url);
    ep->model = model ? lr_strdup(model) : NULL;
    if (!ep->url || !ep->shown_url || (model && !ep->model)) {
        endpoint_free(ep);
        return NULL;
    }
    ep->key_hash = c->key_hash;
    ep->refilled_at = -1;
    ep->req.remaining = ep->tok.remaining = -1;
    ep->req.reset_at = ep->tok.reset_at = -1;
    lr_shared_ep_init(&ep->local, 1);
    ep->sh = &ep->local;
    if (e->shared) {
        /* The endpoint as every process knows it: URL, key hash and model,
         * never the key. Out of slots: this process keeps its own numbers. */
        uint64_t id = lr_endpoint_id(ep->url, ep->key_hash, ep->model);
        lr_shared_ep *slot = lr_shared_store_endpoint(e->shared, id);
        if (slot) {
            ep->sh = slot;
            ep->rd = lr_shared_store_redis(e->shared, id);
        }
    }
    /* Never the URL's user info or query in the stats (a key could be
     * there): they reach logs and dashboards. */
    ep->stats.url = ep->shown_url;
    ep->stats.model = ep->model;
    ep->stats.has_key = c->key_hash != 0;
    ep->stats.breaker = "closed";
    /* Hosts read the array under the mutex: grow it under it. */
    pthread_mutex_lock(&e->mu);
    lr_endpoint **more = realloc(e->endpoints, (e->n_endpoints + 1) * sizeof *more);
    if (more) {
        e->endpoints = more;
        e->endpoints[e->n_endpoints++] = ep;
    }
    pthread_mutex_unlock(&e->mu);
    if (!more) {
        endpoint_free(ep);
        return NULL;
    }
    return ep;
}

/* Two calls' models name one endpoint: the same text, or both none. */
static int same_model(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

/* The endpoint of (the call's URL and key, model), or NULL; *models: how
 * many of that URL and key's endpoints have a model. */
static lr_endpoint *endpoint_find(llmretry_engine *e, const llmretry_call *c,
                                  const char *model, int *models)
{
    *models = 0;
    for (size_t i = 0; i < e->n_endpoints; i++) {
        lr_endpoint *x = e->endpoints[i];
        if (x->key_hash != c->key_hash || strcmp(x->url, c->url) != 0)
            continue;
        if (same_model(x->model, model))
            return x;
        *models += x->model != NULL;
    }
    return NULL;
}

lr_endpoint *lr_endpoint_of(llmretry_engine *e, llmretry_call *c)
{
    lr_endpoint *ep = c->endpoint;
    if (!ep) {
        int models;
        const char *model = c->model;
        ep = endpoint_find(e, c, model, &models);
        if (!ep && model && models >= MAX_MODELS_PER_KEY) {
            model = NULL;           /* past the models a key may have */
            ep = endpoint_find(e, c, NULL, &models);
        }
        if (!ep && e->n_endpoints < MAX_ENDPOINTS)
            ep = endpoint_new(e, c, model);
        if (!ep)
            return NULL;            /* out of memory: this call is not limited */
        c->endpoint = ep;
    }
    /* The latest call's configured limits and health options hold for the
     * endpoint. */
    if (c->o.rpm > 0)
        ep->rpm = c->o.rpm;
    if (c->o.tpm > 0)
        ep->tpm = c->o.tpm;
    ep->health.budget_ratio = c->o.retry_budget_ratio;
    ep->health.budget_min = c->o.retry_budget_min;
    ep->health.threshold = c->o.breaker_failures;
    ep->health.cooldown_ms = c->o.breaker_cooldown_ms;
    return ep;
}

static const char *breaker_name(lr_shared_breaker s)
{
    switch (s) {
    case LR_SHARED_OPEN: return "open";
    case LR_SHARED_HALF_OPEN: return "half_open";
    default: return "closed";
    }
}

uint64_t lr_endpoint_id(const char *url, uint64_t key_hash, const char *model)
{
    uint64_t x = 1469598103934665603ull ^ key_hash;     /* FNV-1a over the URL */
    for (const unsigned char *p = (const unsigned char *)url; *p; p++)
        x = (x ^ *p) * 1099511628211ull;
    if (model) {
        /* Then a NUL (no URL has one) and the model: "u" + "m" differs
         * from "um" + none. */
        x = x * 1099511628211ull;
        for (const unsigned char *p = (const unsigned char *)model; *p; p++)
            x = (x ^ *p) * 1099511628211ull;
    }
    return x ? x : 1;                                   /* 0 marks a free slot */
}

void lr_endpoint_publish(llmretry_engine *e, lr_endpoint *ep)
{
    int64_t now = lr_mono_ms(), wreq, wret;
    /* With a shared store, the window and the breaker are every process's;
     * the counts since the endpoint was made are this engine's. */
    lr_shared_budget_window(ep->sh, now, &wreq, &wret);
    lr_shared_breaker state = lr_shared_breaker_state(ep->sh, now);
    int64_t open_until = atomic_load(&ep->sh->breaker_open_until);
    pthread_mutex_lock(&e->mu);
    llmretry_endpoint_stats *s = &ep->stats;
    s->requests = ep->requests;
    s->retries = ep->retries;
    s->retries_refused = ep->retries_refused;
    s->breaker_opened = ep->breaker_opened;
    s->short_circuited = ep->short_circuited;
    s->window_requests = wreq;
    s->window_retries = wret;
    s->breaker = breaker_name(state);
    s->consecutive_failures = (int)atomic_load(&ep->sh->breaker_failures);
    s->open_ms_left = state == LR_SHARED_OPEN ? open_until - now : 0;
    s->rpm = lr_budget_rpm(ep);
    s->tpm = ep->tpm > 0 ? ep->tpm : ep->tok.limit;
    s->in_flight = ep->in_flight;
    pthread_mutex_unlock(&e->mu);
}

size_t llmretry_engine_endpoint_stats(llmretry_engine *e, llmretry_endpoint_stats *out,
                                      size_t max)
{
    if (!e || lr_forked(e))
        return 0;
    pthread_mutex_lock(&e->mu);
    size_t n = e->n_endpoints;
    for (size_t i = 0; i < n && i < max && out; i++)
        out[i] = e->endpoints[i]->stats;
    pthread_mutex_unlock(&e->mu);
    return n;
}

void lr_endpoints_free(llmretry_engine *e)
{
    /* Hosts may still ask for stats: they see none from here on. */
    pthread_mutex_lock(&e->mu);
    lr_endpoint **eps = e->endpoints;
    size_t n = e->n_endpoints;
    e->endpoints = NULL;
    e->n_endpoints = 0;
    pthread_mutex_unlock(&e->mu);
    for (size_t i = 0; i < n; i++)
        endpoint_free(eps[i]);
    free(eps);
}
