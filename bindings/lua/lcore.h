/* The Lua binding's private header: what its files share. See
 * llmretry_core.c for the module's API and its rules (no global mutable
 * state, C resources always owned by a userdata). One file per concern:
 *   llmretry_core.c  errors, argument checks, the module's registration
 *   json.c           decode, the JSON helpers, UTF-8 checks
 *   encode.c         encode (Lua value -> JSON text)
 *   calls.c          error tables, results, handles
 *   shapes.c         what the core hands over (events, meta, errors, stats) as tables
 *   options.c        a Lua table of options -> llmretry_options
 *   engine.c         engines and groups
 *   channel.c        channels (one consumer's view of an engine; OpenResty's socket)
 *   policies.c       named policies and ids, checked by the core
 *   ffi.c            plain C entry points for LuaJIT's FFI (lffi.h) */
#ifndef LLMRETRY_LUA_LCORE_H
#define LLMRETRY_LUA_LCORE_H

#include "compat.h"

#include "llmretry.h"

#include <stddef.h>
#include <stdint.h>
#pragma GCC visibility push(hidden)

#define ENGINE_MT "llmretry.engine"
#define GROUP_MT "llmretry.group"
#define CHANNEL_MT "llmretry.channel"
#define HANDLE_MT "llmretry.handle"
#define ERROR_MT "llmretry.error"
#define ARRAY_MT "llmretry.array_mt"
#define WEAKV_MT "llmretry.weak_values"
#define SBUF_MT "llmretry.encode_buffer"
#define JTREE_MT "llmretry.decode_tree"

/* Deeper Lua values are almost surely cycles or mistakes; a chat body is a
 * few levels deep. */
#define ENCODE_MAX_DEPTH 100
/* channel:poll takes calls from the core in batches of this many. */
#define POLL_BATCH 64

/* What the binding's files share is private to the module: hidden, so the
 * rock's core.so exports luaopen_llmretry_core and the core's prefixed
 * names only (unprefixed names like `engine_gc` would clash with other
 * modules loaded into the same process). tools/lua-test.sh checks it. */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* Only its address matters: core.empty_array, a sentinel like cjson's
 * (defined once, in llmretry_core.c). */
extern const char lrl_empty_array_tag;
#define EMPTY_ARRAY ((void *)&lrl_empty_array_tag)

#if defined(__GNUC__)
#define LR_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define LR_PRINTF(f, a)
#endif

typedef struct lr_handle {
    llmretry_call *call;        /* NULL only while submit is failing */
    /* An event taken from the mailbox but not yet handed to Lua: if
     * building its table raises, the next call to next() retries it and
     * __gc frees it. Same idea for a validation request. */
    llmretry_event *parked;
    int validate_parked;
    /* result()'s answer, built once: a registry reference (0: not yet) to
     * the result (cached_err 0) or the error table (1). Not a table per
     * handle: most handles are read once, and each table was garbage. */
    int cached_ref;
    int cached_err;
} lr_handle;

typedef struct lr_group {
    llmretry_group *g;
    int poll;                      /* its calls report to group:channel() (else the engine's) */
} lr_group;

/* A channel: one a host made (engine:new_channel), or the engine's or a
 * group's own (engine:channel(), group:channel()), which lives as long as
 * its owner: the userdata keeps the owner's userdata alive (a registry
 * reference) and reads as closed once the owner is closed. */
typedef struct lr_chan {
    llmretry_channel *ch;          /* NULL once closed */
    int socket;                    /* a socket channel (llmretry_channel_new_socket) */
    const void *owner;             /* an own channel's owner userdata, else NULL */
    int (*owner_open)(const void *owner);
    int owner_ref;                 /* registry reference to the owner (LUA_NOREF) */
} lr_chan;

/* The channel, or NULL once it (or its owner) is closed. */
llmretry_channel *lr_chan_open(const lr_chan *c);
/* Push the userdata of an owner's own channel: the owner is at index
 * `owner` and its uservalue is the weak call -> handle table the channel
 * polls through. */
void lr_push_own_channel(lua_State *L, int owner, llmretry_channel *ch,
                         int (*owner_open)(const void *owner));

int lr_fail(lua_State *L, const char *fmt, ...) LR_PRINTF(2, 3);

/* llmretry_core.c: errors, argument checks, the module */
int check_int(lua_State *L, int idx, const char *name, int lo, int hi);
int64_t check_int64(lua_State *L, int idx, const char *name);
const char *got(lua_State *L, int idx, char *buf, size_t n);
/* The userdata of metatable `tname` at index 1 (a method's self), else raise
 * "self must be <what> (got ...); call methods with ':'". */
void *lr_check_self(lua_State *L, const char *tname, const char *what);
void push_null(lua_State *L);
void push_ptr_key(lua_State *L, const void *p);
int to_int64(lua_State *L, int idx, int64_t *out);

/* json.c, encode.c: JSON in lua-cjson's conventions */
size_t utf8_invalid_at(const char *s, size_t n);
int jtree_gc(lua_State *L);
int l_assert_shape(lua_State *L);
int l_decode(lua_State *L);
int l_encode(lua_State *L);
int l_extract_json(lua_State *L);
int push_decoded(lua_State *L, const char *s, size_t n, char *err, size_t errlen);
/* Push core.array_mt (llmretry_core.c): by a registry key, not its name. */
void lr_push_array_mt(lua_State *L);
void push_encoded(lua_State *L, int idx, const char *root);
void push_text0(lua_State *L, const char *s);
int sbuf_gc(lua_State *L);

/* calls.c: error tables, events, results and handles */
int64_t check_timeout(lua_State *L, int idx);
int err_tostring(lua_State *L);
int handle_cancel(lua_State *L);
int handle_done(lua_State *L);
/* Free a handle's parked event and its call (its __gc, or an early free). */
void lr_handle_release(lr_handle *h);
int lr_handle_gc(lua_State *L);
int lr_push_result(lua_State *L, const llmretry_result *r);
int handle_next(lua_State *L);
int handle_request_id(lua_State *L);
int handle_result(lua_State *L);
int handle_tostring(lua_State *L);
int handle_validated(lua_State *L);
int handle_wait(lua_State *L);

/* shapes.c: the core's shapes and events as Lua tables (walked, not named) */
int lr_push_field(lua_State *L, const llmretry_field *f);
void lr_shape_into(lua_State *L, llmretry_shape s, const void *obj);
void lr_push_shape(lua_State *L, llmretry_shape s, const void *obj);
void lr_push_event(lua_State *L, const llmretry_event *ev);
void lr_push_names(lua_State *L, const char *(*name)(int));

/* options.c: submit options (Lua table -> llmretry_options) */
void parse_opts(lua_State *L, int t, llmretry_options *o, int need_body, int also);
void rename_header_error(const llmretry_options *o, char *err, size_t errlen);

/* engine.c: engines and groups */
llmretry_engine *check_open_engine(lua_State *L);
llmretry_engine *lr_engine_of(const void *ud);
/* The handles with news from `src` (fetch: its poll), found through the
 * weak call -> handle table in the uservalue of the userdata at index 1. */
typedef size_t (*poll_fn)(void *src, llmretry_call **calls, size_t max);
int push_polled(lua_State *L, void *src, poll_fn fetch);
int engine_close(lua_State *L);
int engine_channel(lua_State *L);
int engine_endpoint_stats(lua_State *L);
int engine_forked(lua_State *L);
int engine_gc(lua_State *L);
int engine_group(lua_State *L);
int engine_submit(lua_State *L);
int engine_tostring(lua_State *L);
int group_channel(lua_State *L);
int group_close(lua_State *L);
int group_stats(lua_State *L);
int group_tostring(lua_State *L);
int l_check_options(lua_State *L);
int l_suggest(lua_State *L);
int l_new_engine(lua_State *L);

/* channel.c: channels */
int engine_new_channel(lua_State *L);
int channel_accept(lua_State *L);
int channel_close(lua_State *L);
int channel_fd(lua_State *L);
int channel_path(lua_State *L);
int channel_poll(lua_State *L);
int channel_tostring(lua_State *L);
int channel_wait(lua_State *L);

/* ffi.c: the LuaJIT FFI entry points (core._ffi) */
int l_ffi_api(lua_State *L);

/* policies.c: named policies and ids (the core's) */
int l_parse_policies(lua_State *L);
int l_resolve_policy(lua_State *L);
int l_uuid4(lua_State *L);

/* url.c: URL text, the core's rules */
int l_url_join(lua_State *L);
int l_url_shown(lua_State *L);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#pragma GCC visibility pop
#endif
