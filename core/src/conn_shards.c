/* Connection-cache shards: many HTTP/1.1 connections to one host without
 * libcurl 7.88 walking all of them for every request.
 *
 * libcurl keeps the connections of a multi handle in one cache, and per
 * request it walks that cache twice: ConnectionExists goes through the
 * host's connections, in the order they were opened, to the first idle
 * one; and curl_multi_remove_handle goes through every connection until
 * it meets the one the transfer used (close_connect_only). With a
 * thousand HTTP/1.1 requests in flight that is hundreds of connection
 * records read per request, each on its own cache line: the largest part
 * of the engine thread's time per call in an OpenResty gateway (issue 36).
 *
 * A share handle (CURLSH) with CURL_LOCK_DATA_CONNECT has a cache of its
 * own, and a transfer given the share uses that cache instead. So calls
 * fill shards of SHARD_SIZE transfers: shard 0 is the multi handle's own
 * cache, and only when it holds SHARD_SIZE transfers does the next call
 * go to shard 1, and so on (the lowest shard with room). Below SHARD_SIZE
 * calls in flight nothing changes; above, each walk is at most about
 * SHARD_SIZE long, and each shard's connections are reused by its own
 * transfers (a shard with room is refilled first).
 *
 * Only calls that need a connection each are sharded: plain http:// and
 * https origins known to speak HTTP/1.x. An HTTP/2 origin (or one not
 * known yet) stays in shard 0, where its streams share few connections
 * (origins.c). With max_host_connections set, libcurl counts a host's
 * connections per cache, so the engine keeps the one cache.
 *
 * libcurl prunes a cache's dead connections only when one of its own
 * transfers connects, so a shard nobody uses after a burst would keep its
 * connections (and their descriptors) for the engine's life. A shard with
 * no transfer for SHARD_IDLE_MS is closed instead: libcurl's own rule
 * (CURLOPT_MAXAGE_CONN, 118 s) would not reuse those connections anyway.
 * A transfer's easy handle leaves its share when the transfer ends, so that
 * a share nobody uses is free to be cleaned up.
 * I/O thread only. */
#include "engine.h"

#include <stdlib.h>

/* Transfers per shard: a walk of 64 records costs a few hundred ns. */
#define SHARD_SIZE 64
/* The most shards: 64 x 64 = 4,096 transfers in flight, beyond which the
 * last shard takes the rest. */
#define MAX_SHARDS 64
/* A shard idle this long is closed: libcurl's CURLOPT_MAXAGE_CONN default. */
#define SHARD_IDLE_MS 118000
/* How often idle shards are looked for. */
#define TIDY_EVERY_MS 1000

/* May this call leave shard 0? */
static int shardable(llmretry_engine *e, llmretry_call *c)
{
    if (e->max_host_connections > 0)
        return 0;
    lr_origin *o = lr_origin_of(e, c);
    return !o || lr_origin_multiplexes(o) == 0;
}

static void shards_release(lr_shards *s)
{
    free(s->share);
    free(s->load);
    free(s->idle_since);
    s->share = NULL;
    s->load = NULL;
    s->idle_since = NULL;
    s->n = 0;
}

static int shards_alloc(lr_shards *s)
{
    s->share = calloc(MAX_SHARDS, sizeof *s->share);
    s->load = calloc(MAX_SHARDS, sizeof *s->load);
    s->idle_since = calloc(MAX_SHARDS, sizeof *s->idle_since);
    if (s->share && s->load && s->idle_since) {
        if (!s->idle_ms)
            s->idle_ms = SHARD_IDLE_MS;
        return 0;
    }
    shards_release(s);
    return -1;
}

/* The lowest shard with room, its share handle made when first needed
 * (again after it was closed); -1 when none could be made. */
static int pick(lr_shards *s)
{
    int i = 0;
    while (i < MAX_SHARDS - 1 && i < s->n && s->load[i] >= SHARD_SIZE)
        i++;
    if (i > 0 && !s->share[i]) {
        CURLSH *sh = curl_share_init();
        if (!sh)
            return -1;
        if (curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK) {
            curl_share_cleanup(sh);
            return -1;
        }
        s->share[i] = sh;
    }
    if (i >= s->n)
        s->n = i + 1;
    return i;
}

void lr_shard_attach(llmretry_engine *e, llmretry_call *c, CURL *easy)
{
    lr_shards *s = &e->shards;
    c->shard = -1;
    if (!s->share && shards_alloc(s) != 0)
        return;                 /* out of memory: the multi's own cache, uncounted */
    int i = shardable(e, c) ? pick(s) : 0;
    /* No share handle could be made or set: the multi's own cache. */
    if (i > 0 && curl_easy_setopt(easy, CURLOPT_SHARE, s->share[i]) != CURLE_OK)
        i = 0;
    if (i < 0)
        i = 0;
    c->shard = i;
    s->load[i]++;
}

void lr_shard_detach(llmretry_engine *e, llmretry_call *c, CURL *easy)
{
    lr_shards *s = &e->shards;
    int i = c->shard;
    c->shard = -1;
    if (i < 0)
        return;
    if (i > 0)
        curl_easy_setopt(easy, CURLOPT_SHARE, NULL);
    if (--s->load[i] == 0)
        s->idle_since[i] = lr_mono_ms();
}

void lr_shards_tidy(llmretry_engine *e, int64_t now)
{
    lr_shards *s = &e->shards;
    if (now < s->next_tidy || !s->share)
        return;
    s->next_tidy = now + TIDY_EVERY_MS;
    for (int i = 1; i < s->n; i++)
        if (s->share[i] && s->load[i] == 0 && now - s->idle_since[i] >= s->idle_ms &&
            curl_share_cleanup(s->share[i]) == CURLSHE_OK)
            s->share[i] = NULL;
    while (s->n > 1 && !s->share[s->n - 1] && s->load[s->n - 1] == 0)
        s->n--;
}

void lr_shards_set_idle_ms(llmretry_engine *e, int64_t ms)
{
    e->shards.idle_ms = ms;
}

void lr_shards_free(llmretry_engine *e)
{
    lr_shards *s = &e->shards;
    /* After every easy handle is cleaned up: a share in use is not freed.
     * Its idle connections are closed here, through the socket table. */
    for (int i = 1; i < s->n; i++)
        if (s->share[i])
            curl_share_cleanup(s->share[i]);
    shards_release(s);
}
