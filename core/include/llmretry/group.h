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
 * naming a wait pauses every new start for that long, and with `adaptive`
 * the window halves on a burst of 429s and grows back on successes. With a
 * deadline, no item runs past it: each call's deadline is the earlier of
 * its own and the group's, and items not started in time fail with
 * deadline_exceeded. */
typedef struct llmretry_group_options {
    int limit;                     /* 8, >= 1 */
    int64_t deadline_ms;           /* LLMRETRY_NO_DEADLINE, else >= 0 (from group_new) */
    int adaptive;                  /* 1 */
    /* 1: the group's calls report to llmretry_group_fd / _poll (a batch
     * read by one host thread). 0: the group only paces its calls, which
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

/* A group's calls report their news here (not to llmretry_engine_poll), so
 * that several batches on one engine never take each other's calls: the
 * same contract as llmretry_engine_fd / _poll / _wait. */
int llmretry_group_fd(const llmretry_group *g);
size_t llmretry_group_poll(llmretry_group *g, llmretry_call **calls, size_t max);
llmretry_status llmretry_group_wait(llmretry_group *g, int64_t timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_GROUP_H */
