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
 * while the list is non-empty (an eventfd on Linux, else a pipe; or a unix
 * socket, below). Calls
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
/* A channel whose notifier is a unix-domain socket, for a host that can
 * connect to an address but cannot watch a descriptor it did not open (an
 * nginx cosocket connects to "unix:/path" only). The channel listens on a
 * fresh path in a private (0700) directory; the host connects to
 * llmretry_channel_socket_path and calls llmretry_channel_accept, which
 * takes that one connection (made by this process: SO_PEERCRED where the
 * system has it) and removes the path, so nobody else can reach it. From
 * then on the engine writes one byte to the connection each time the
 * channel's list goes from empty to non-empty: the host reads whatever
 * bytes are there, then polls until llmretry_channel_poll returns nothing;
 * news that comes meanwhile is either taken by that poll or writes another
 * byte, so no news is missed (a byte may find the list already drained).
 * llmretry_channel_fd is -1 and llmretry_channel_wait ESTATE for it. */
llmretry_status llmretry_channel_new_socket(llmretry_engine *e, llmretry_channel **out,
                                            char *err, size_t errlen);
/* The path to connect to, until accepted (then NULL; NULL for other kinds). */
const char *llmretry_channel_socket_path(const llmretry_channel *ch);
/* Take the connection to the path, waiting at most timeout_ms (-1: forever)
 * for it: OK; ETIMEDOUT (nobody connected); ESTATE (not a socket channel,
 * or accepted already); EINTERNAL (a system call failed; err says which). */
llmretry_status llmretry_channel_accept(llmretry_channel *ch, int64_t timeout_ms, char *err,
                                        size_t errlen);
/* "eventfd" or "pipe": the notifier this build uses. */
const char *llmretry_notifier_kind(void);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_CHANNEL_H */
