/* llmretry/group.h — groups: the calls of one batch, paced together on the engine thread.
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_GROUP_H
#define LLMRETRY_GROUP_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/engine.h"
#include "llmretry/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Groups: the calls of one batch, paced together on the engine thread. */
/* ------------------------------------------------------------------ */

/* A call submitted with options.group waits in the group until the group's
 * pacer lets it start: at most `limit` items run at once (an item counts
 * from its first attempt until it finishes, backoff waits included), a 429
 * naming a wait pauses the new starts of its endpoint (URL, key and model:
 * the other models' items go on) for that long, and with `adaptive`
 * the window halves on a burst of 429s and grows back on successes. With a
 * deadline, no item runs past it: each call's deadline is the earlier of
 * its own and the group's, and items not started in time fail with
 * deadline_exceeded. */
typedef struct llmretry_group_options {
    int limit;                     /* 8, >= 1 */
    int64_t deadline_ms;           /* LLMRETRY_NO_DEADLINE, else >= 0 (from group_new) */
    int adaptive;                  /* 1 */
    /* 1: the group's calls report to its channel (llmretry_group_channel:
     * a batch read by one host thread). 0: the group only paces its calls, which
     * report where they would without it (options.channel, the engine's
     * for LLMRETRY_SUBMIT_POLL, else none: each call's own host thread
     * waits on it): a pool of host threads, or an event loop's pool that
     * watches one fd, paced as one batch. */
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

/* A polling group's calls report their news to the group's own channel
 * (llmretry/channel.h: fd, poll, wait), not to the engine's, so that
 * several batches on one engine never take each other's calls. NULL for a
 * group made with poll 0. It lives as long as the group (calls still in it
 * keep it alive; llmretry_channel_free leaves it alone). */
llmretry_channel *llmretry_group_channel(llmretry_group *g);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_GROUP_H */
