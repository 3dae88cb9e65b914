/* Groups: the calls of one batch, paced together. This file holds the
 * group's life cycle; engine.c schedules its calls. */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

void llmretry_group_options_defaults(llmretry_group_options *o)
{
    o->limit = 8;
    o->deadline_ms = LLMRETRY_NO_DEADLINE;
    o->adaptive = 1;
    o->poll = 1;
}

llmretry_status llmretry_group_new(llmretry_engine *e, const llmretry_group_options *o,
                                   llmretry_group **out, char *err, size_t errlen)
{
    llmretry_group_options defaults;
    if (!e || !out) {
        lr_errf(err, errlen, "%s must not be NULL", !e ? "engine" : "out");
        return LLMRETRY_EINVAL;
    }
    *out = NULL;
    if (!o) {
        llmretry_group_options_defaults(&defaults);
        o = &defaults;
    }
    if (o->limit < 1) {
        lr_errf(err, errlen, "limit must be >= 1 (got %d)", o->limit);
        return LLMRETRY_EINVAL;
    }
    if (o->deadline_ms < LLMRETRY_NO_DEADLINE) {
        lr_errf(err, errlen, "deadline_ms must be >= 0 (got %lld)", (long long)o->deadline_ms);
        return LLMRETRY_EINVAL;
    }
    llmretry_group *g = calloc(1, sizeof *g);
    if (!g)
        return LLMRETRY_ENOMEM;
    /* A pacing-only group's calls report elsewhere: no notifier to open. */
    g->ready.ch.notifier.rfd = g->ready.ch.notifier.wfd = -1;
    if (o->poll && lr_channel_embed(&g->ready, e) != 0) {
        free(g);
        lr_errf(err, errlen, "could not create the group's notifier (%s)", llmretry_notifier_kind());
        return LLMRETRY_EINTERNAL;
    }
    atomic_init(&g->refs, 1);
    g->engine = e;
    lr_engine_ref(e);
    g->deadline_at = o->deadline_ms == LLMRETRY_NO_DEADLINE ? -1 : lr_time_add(lr_mono_ms(), o->deadline_ms);
    g->poll = o->poll != 0;
    llmretry_pacer_init(&g->pacer, o->limit, o->adaptive);
    g->stats.window = o->limit;
    *out = g;
    return LLMRETRY_OK;
}

void lr_group_unref(llmretry_group *g)
{
    if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1)
        return;
    llmretry_engine *e = g->engine;
    lr_channel_close(&g->ready.ch);
    free(g);
    lr_engine_unref(e);
}

void llmretry_group_free(llmretry_group *g)
{
    if (g && !lr_forked(g->engine))
        lr_group_unref(g);
}

void llmretry_group_stats_get(llmretry_group *g, llmretry_group_stats *out)
{
    if (lr_forked(g->engine)) {
        memset(out, 0, sizeof *out);
        return;
    }
    pthread_mutex_t *mu = lr_engine_mutex(g->engine);
    pthread_mutex_lock(mu);
    *out = g->stats;
    pthread_mutex_unlock(mu);
}

llmretry_channel *llmretry_group_channel(llmretry_group *g)
{
    return g->poll ? &g->ready : NULL;
}
