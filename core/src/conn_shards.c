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
 * I/O thread only. */
#include "engine.h"

#include <stdlib.h>

/* Transfers per shard: a walk of 64 records costs a few hundred ns. */
#define SHARD_SIZE 64
/* The most shards: 64 x 64 = 4,096 transfers in flight, beyond which the
 * last shard takes the rest. */
#define MAX_SHARDS 64

/* May this call leave shard 0? */
static int shardable(llmretry_engine *e, llmretry_call *c)
{
    if (e->max_host_connections > 0)
        return 0;
    lr_origin *o = lr_origin_of(e, c);
    return !o || lr_origin_multiplexes(o) == 0;
}

/* The lowest shard with room, made when first needed (-1: none could be). */
static int pick(llmretry_engine *e)
{
    lr_shards *s = &e->shards;
    int i = 0;
    while (i < MAX_SHARDS - 1 && i < s->n && s->load[i] >= SHARD_SIZE)
        i++;
    if (i < s->n)
        return i;
    if (i == 0) {               /* shard 0 needs no share handle */
        s->n = 1;
        s->load[0] = 0;
        s->share[0] = NULL;
        return 0;
    }
    CURLSH *sh = curl_share_init();
    if (!sh)
        return -1;
    if (curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK) {
        curl_share_cleanup(sh);
        return -1;
    }
    s->share[i] = sh;
    s->load[i] = 0;
    s->n = i + 1;
    return i;
}

void lr_shard_attach(llmretry_engine *e, llmretry_call *c, CURL *easy)
{
    lr_shards *s = &e->shards;
    if (!s->share) {
        s->share = calloc(MAX_SHARDS, sizeof *s->share);
        s->load = calloc(MAX_SHARDS, sizeof *s->load);
        if (!s->share || !s->load) {
            free(s->share);
            free(s->load);
            s->share = NULL;
            s->load = NULL;
        }
    }
    int i = s->share && shardable(e, c) ? pick(e) : -1;
    if (i < 0)
        i = 0;      /* out of memory, or not shardable: the multi's own cache */
    /* A pooled handle keeps the share of its last transfer: always set. */
    if (curl_easy_setopt(easy, CURLOPT_SHARE, i > 0 ? s->share[i] : NULL) != CURLE_OK)
        i = 0;
    c->shard = i;
    if (s->load)
        s->load[i]++;
}

void lr_shard_detach(llmretry_engine *e, llmretry_call *c)
{
    if (c->shard >= 0 && e->shards.load)
        e->shards.load[c->shard]--;
    c->shard = -1;
}

void lr_shards_free(llmretry_engine *e)
{
    lr_shards *s = &e->shards;
    /* After every easy handle is cleaned up: a share in use is not freed.
     * Its idle connections are closed here, through the socket table. */
    for (int i = 1; i < s->n; i++)
        curl_share_cleanup(s->share[i]);
    free(s->share);
    free(s->load);
    s->share = NULL;
    s->load = NULL;
    s->n = 0;
}

int lr_shards_in_use(const llmretry_engine *e)
{
    return e->shards.n;
}
