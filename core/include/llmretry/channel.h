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

/* A channel is the one way a host learns which calls have news without
 * waiting on each: a ready list plus a file descriptor that is readable
 * exactly while the list is non-empty (an eventfd on Linux, else a pipe; or
 * a unix socket, below). The engine has one (llmretry_engine_channel: the
 * calls submitted with LLMRETRY_SUBMIT_POLL), each polling group has one
 * (llmretry_group_channel: the group's calls), and a host makes more with
 * llmretry_channel_new: calls submitted with options.channel report their
 * news there and nowhere else, so several consumers of one engine (one per
 * event loop, per dispatcher) never take each other's calls. Calls keep
 * their channel alive. options.channel may name the engine's own channel
 * (the same as LLMRETRY_SUBMIT_POLL), never a group's (EINVAL). */
llmretry_status llmretry_channel_new(llmretry_engine *e, llmretry_channel **out,
                                     char *err, size_t errlen);
/* Drop the host's reference to a channel it made; the engine's and the
 * groups' channels are left alone (they go with their owner). */
void llmretry_channel_free(llmretry_channel *ch);
/* The descriptor to watch (asyncio's add_reader, libuv's poll): readable
 * while a call has news. -1 for a socket channel. */
int llmretry_channel_fd(const llmretry_channel *ch);
/* Without blocking, return up to `max` calls that have news; each call is
 * reported once per batch of news, so drain each one's mailbox, and never
 * again once llmretry_call_next has returned its DONE. Returns the count.
 * The returned pointers are borrowed (the host still owns them). */
size_t llmretry_channel_poll(llmretry_channel *ch, llmretry_call **calls, size_t max);
/* Block until the descriptor is readable or timeout_ms passes (-1 =
 * forever): OK or ETIMEDOUT (ESTATE for a socket channel). */
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
