/* llmretry/channel.h — channels: one consumer's view of the engine.
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_CHANNEL_H
#define LLMRETRY_CHANNEL_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Channels: one consumer's view of the engine.                         */
/* ------------------------------------------------------------------ */

/* A channel is a ready list plus a file descriptor that is readable exactly
 * while the list is non-empty (an eventfd on Linux, else a pipe). Calls
 * submitted with options.channel report their news here and nowhere else,
 * so several consumers of one engine (one per event loop, per dispatcher)
 * never take each other's calls. fd / poll / wait follow the contract of
 * llmretry_engine_fd / _poll / _wait. Calls keep their channel alive. */
llmretry_status llmretry_channel_new(llmretry_engine *e, llmretry_channel **out,
                                     char *err, size_t errlen);
void llmretry_channel_free(llmretry_channel *ch);
int llmretry_channel_fd(const llmretry_channel *ch);
size_t llmretry_channel_poll(llmretry_channel *ch, llmretry_call **calls, size_t max);
llmretry_status llmretry_channel_wait(llmretry_channel *ch, int64_t timeout_ms);
/* "eventfd" or "pipe": the notifier this build uses. */
const char *llmretry_notifier_kind(void);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_CHANNEL_H */
