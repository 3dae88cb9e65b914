/* The LuaJIT FFI entry points (issue 36): plain C functions that LuaJIT's
 * compiler can call from a trace, for the per-call path of a call nobody
 * listens to (no logger, no validate, no stream): submit it (the core's
 * option setters), drain its mailbox, read its result, walk its meta, free
 * it, and poll a channel. The classic functions (engine:submit,
 * handle:next, handle:result, channel:poll) stop a trace each.
 *
 * Lua reaches them through core._ffi(): a light userdata pointing at one
 * table of function pointers (lr_ffi_api, declared in lffi.h and, the same,
 * in lua/llmretry/ffi.lua's cdef), so nothing new is exported and the
 * functions are always those of the module the state loaded. Each takes
 * the payload of a handle or channel userdata (LuaJIT passes a userdata to
 * a `void *` parameter as its payload): Lua never sees the binding's
 * structs. A handle is its call's one owner: a userdata's __gc, or, for
 * a call submitted here, the ffi.gc finalizer Lua gives it (handle_free);
 * free() only frees the call early. */
#include "lcore.h"
#include "lffi.h"
#include "submit_checked.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A call's mail for a host that listens to none of it, up to the end:
 * events and chunks dropped, a validation answered "ok" (what the classic
 * drain does with no logger, no on_chunk and no validate). 1 once the call
 * is done, 0 while it is not, -1 without a call. */
static int ffi_drain(void *ud)
{
    lr_handle *h = ud;
    if (!h->call)
        return -1;
    if (h->parked) {                /* left by a classic next() that raised */
        llmretry_event_free(h->parked);
        h->parked = NULL;
    }
    for (;;) {
        llmretry_event *ev = NULL;
        const char *body;
        size_t len;
        switch (llmretry_call_next(h->call, &ev)) {
        case LLMRETRY_MAIL_EVENT:
        case LLMRETRY_MAIL_CHUNK:
            llmretry_event_free(ev);
            break;
        case LLMRETRY_MAIL_VALIDATE:
            h->validate_parked = 0;
            if (llmretry_call_pending_body(h->call, &body, &len) == LLMRETRY_OK)
                (void)llmretry_call_validated(h->call, 1, NULL);
            break;
        case LLMRETRY_MAIL_DONE:
            return 1;
        case LLMRETRY_MAIL_EMPTY:
            return 0;
        }
    }
}

/* The finished call's result (NULL while it runs, or without a call);
 * *flags: LR_FFI_OK for a success, LR_FFI_RAW for raw_response, and
 * *body/*len its body (NULL, 0 when none). */
static const void *ffi_result(void *ud, const char **body, size_t *len, int *flags)
{
    lr_handle *h = ud;
    const llmretry_result *r = h->call ? llmretry_call_result(h->call) : NULL;
    *body = NULL;
    *len = 0;
    *flags = 0;
    if (!r)
        return NULL;
    *body = r->body;
    *len = r->body ? r->body_len : 0;
    *flags = (r->ok ? LR_FFI_OK : 0) | (r->raw_response ? LR_FFI_RAW : 0);
    return r;
}

/* Free the handle's call now (its result read): the handle reads as freed
 * from then on, and its __gc has nothing left to do. */
static void ffi_free(void *ud)
{
    lr_handle_release(ud);
}

/* The key a channel's poll names this handle's call by (0 without one):
 * its address as a double (exact: user-space addresses are below 2^53), a
 * plain Lua number where a uintptr_t would be a boxed 64-bit cdata, made
 * by the interpreter on every read. */
static double ffi_key(void *ud)
{
    return (double)(uintptr_t)((lr_handle *)ud)->call;
}

/* Up to max keys (ffi_key) of the calls with news on the channel; 0 once
 * it (or its owner) is closed. */
static size_t ffi_poll(void *ud, double *keys, size_t max)
{
    llmretry_channel *ch = lr_chan_open(ud);
    llmretry_call *calls[POLL_BATCH];
    if (!ch)
        return 0;
    if (max > POLL_BATCH)
        max = POLL_BATCH;
    size_t n = llmretry_channel_poll(ch, calls, max);
    for (size_t i = 0; i < n; i++)
        keys[i] = (double)(uintptr_t)calls[i];
    return n;
}

/* strlen(s) when s is valid UTF-8, else -1 (the classic path replaces
 * what is not, which the Lua side leaves to it). */
static ptrdiff_t ffi_text_len(const char *s)
{
    size_t n = strlen(s);
    return utf8_invalid_at(s, n) == n ? (ptrdiff_t)n : -1;
}

/* The core's shape walk, with the shape as an int (an enum's size is the
 * compiler's; an int is what the cdef says). */
static int ffi_shape_field(int s, const void *obj, size_t i, llmretry_field *out)
{
    return llmretry_shape_field((llmretry_shape)s, obj, i, out);
}

static size_t ffi_shape_field_count(int s)
{
    return llmretry_shape_field_count((llmretry_shape)s);
}

/* Field i's name of a shape (NULL past its end): keys made once. */
static const char *ffi_field_name(int s, size_t i)
{
    const llmretry_field_info *f = llmretry_shape_field_info((llmretry_shape)s, i);
    return f ? f->name : NULL;
}

/* Field i's declared type (an llmretry_field_type), -1 past the end. */
static int ffi_field_type(int s, size_t i)
{
    const llmretry_field_info *f = llmretry_shape_field_info((llmretry_shape)s, i);
    return f ? (int)f->type : -1;
}

/* Every field of obj (of shape s) in one call, by index, for a table
 * constructor generated from the shape (llmretry.ffi): a number in nums[i]
 * (INT; BOOL as 0 or 1; a null INT is NaN), a text in strs[i] and its length
 * in lens[i] (NULL when null), an object in objs[i] (USAGE; NULL when null).
 * One call instead of one per field, and no boxed 64-bit integer per
 * field, which the interpreter made of every int64_t read (issue 36). -1
 * when a field is of another type or a text is not UTF-8: the classic
 * path, whose replacement rules apply. */
static int ffi_shape_values(int s, const void *obj, double *nums, const char **strs,
                            double *lens, const void **objs)
{
    size_t n = llmretry_shape_field_count((llmretry_shape)s);
    for (size_t i = 0; i < n; i++) {
        llmretry_field f;
        if (llmretry_shape_field((llmretry_shape)s, obj, i, &f) != 0)
            return -1;
        nums[i] = 0.0 / 0.0;
        strs[i] = NULL;
        lens[i] = 0;
        objs[i] = NULL;
        switch (f.type) {
        case LLMRETRY_FIELD_NULL:
            break;
        case LLMRETRY_FIELD_INT:
        case LLMRETRY_FIELD_BOOL:
            nums[i] = (double)f.i;
            break;
        case LLMRETRY_FIELD_STRING: {
            size_t len = strlen(f.s);
            if (utf8_invalid_at(f.s, len) != len)
                return -1;
            strs[i] = f.s;
            lens[i] = (double)len;
            break;
        }
        case LLMRETRY_FIELD_USAGE:
            objs[i] = f.usage;
            break;
        default:
            return -1;
        }
    }
    return (int)n;
}

/* ---- calls submitted through the FFI --------------------------------------
 * A call_llm nobody listens to is also submitted from Lua (llmretry.ffi's
 * submit): its options filled by the core's setters into one options
 * struct per Lua state (prep), its handle a plain lr_handle in C memory
 * that Lua owns by ffi.gc(h, handle_free) (never a userdata: only the
 * classic API makes those). Anything these do not take, Lua sends through
 * the classic engine:submit, which raises what it raises. */

/* prep: the options, and whether they passed llmretry_options_check on a
 * submit and have not been set since (but for what ffi_set_body and
 * ffi_submit set anew each call). A gateway sends every call with the
 * options of the one before; the next call's submit then checks only its
 * body (LR_SUBMIT_CHECKED): the whole check was ~1.5k instructions a call
 * (issue 36). Every setter and the reset clear the mark. */
struct ffi_prep {
    llmretry_options o;             /* first: the setters take a prep as options */
    int checked;
};

static void *ffi_prep_new(void)
{
    struct ffi_prep *p = calloc(1, sizeof *p);
    if (p)
        llmretry_options_defaults(&p->o);
    return p;
}

static void ffi_prep_free(void *p)
{
    free(p);
}

/* prep's options for the reset or a setter: set anew, they are checked
 * again. */
static llmretry_options *unchecked(void *p)
{
    struct ffi_prep *prep = p;
    prep->checked = 0;
    return &prep->o;
}

static void ffi_prep_reset(void *p)
{
    llmretry_options_defaults(unchecked(p));
}

static int ffi_set_int(void *p, const char *name, int64_t v, char *err, size_t errlen)
{
    return llmretry_options_set_int(unchecked(p), name, v, err, errlen);
}

static int ffi_set_bool(void *p, const char *name, int v, char *err, size_t errlen)
{
    return llmretry_options_set_bool(unchecked(p), name, v, err, errlen);
}

static int ffi_set_text(void *p, const char *name, const char *v, char *err, size_t errlen)
{
    return llmretry_options_set_text(unchecked(p), name, v, err, errlen);
}

static int ffi_set_number(void *p, const char *name, double v, char *err, size_t errlen)
{
    return llmretry_options_set_number(unchecked(p), name, v, err, errlen);
}

/* The binding's own keys, as parse_opts sets them: the body (a table body
 * encoded by Lua: stream_usage), validate and stream_chunks. */
static void ffi_set_body(void *p, const char *body, size_t len, int stream_usage, int validate,
                         int stream_chunks)
{
    llmretry_options *o = &((struct ffi_prep *)p)->o;
    o->body = body;
    o->body_len = len;
    o->stream_usage = stream_usage;
    o->validate = validate;
    o->stream_chunks = stream_chunks;
}

/* Option i of the core's table: its name and type (NULL past the end). */
static const char *ffi_option(size_t i, int *type)
{
    const llmretry_option_info *opt = llmretry_option_at(i);
    if (!opt)
        return NULL;
    *type = (int)opt->type;
    return opt->name;
}

/* Submit o on the engine of engine_ud, reporting to the channel of
 * channel_ud (NULL: the engine's own), in poll mode like engine:submit;
 * table_model: a table body's model (parse_opts' rule). A new handle, or
 * NULL with err set (a closed engine or channel says so too). */
static struct lr_ffi_handle *ffi_submit(void *engine_ud, void *p, void *channel_ud,
                                        const char *table_model, char *err, size_t errlen)
{
    struct ffi_prep *prep = p;
    llmretry_options *o = &prep->o;
    llmretry_engine *e = lr_engine_of(engine_ud);
    if (errlen)
        err[0] = '\0';
    if (!e)
        return NULL;
    lr_handle *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    /* The channel and the table's model are this call's only: prep goes
     * back as the setters left it, for the next call with the same
     * options (llmretry.ffi sets them once). */
    llmretry_channel *channel = o->channel;
    const char *model = o->model;
    int ok = 1;
    if (channel_ud)
        ok = (o->channel = lr_chan_open(channel_ud)) != NULL;
    if (table_model && !o->model && !o->content_type && o->method == LLMRETRY_METHOD_POST)
        o->model = table_model;
    unsigned flags = LLMRETRY_SUBMIT_POLL | (prep->checked ? LR_SUBMIT_CHECKED : 0u);
    ok = ok && lr_engine_submit(e, o, flags, &h->call, err, errlen) == LLMRETRY_OK;
    o->channel = channel;
    o->model = model;
    if (!ok) {
        free(h);
        return NULL;
    }
    prep->checked = 1;
    return (struct lr_ffi_handle *)(void *)h;
}

/* A handle of ffi_submit's: its call and itself (ffi.gc's finalizer, or
 * llmretry.ffi's free once its result is read). */
static void ffi_handle_free(void *ud)
{
    lr_handle *h = ud;
    if (!h)
        return;
    ffi_free(h);
    free(h);
}

static void ffi_cancel(void *ud)
{
    lr_handle *h = ud;
    if (h->call)
        llmretry_call_cancel(h->call);
}

static const char *ffi_request_id(void *ud)
{
    lr_handle *h = ud;
    return h->call ? llmretry_call_request_id(h->call) : NULL;
}

/* ---- io_loop "host": llmretry.openresty's cosocket transport ---------- */

/* The engine's turn (llmretry_engine_run): its status; *next_ms how soon
 * it must run again. A closed engine says ESTATE. */
static int ffi_run(void *engine_ud, double *next_ms)
{
    llmretry_engine *e = lr_engine_of(engine_ud);
    int64_t next = 1000;
    int st = e ? (int)llmretry_engine_run(e, &next) : (int)LLMRETRY_ESTATE;
    *next_ms = (double)next;        /* a Lua number, not a boxed int64 */
    return st;
}

static int ffi_exchange(void *ud, llmretry_exchange *x)
{
    lr_handle *h = ud;
    return h->call ? llmretry_call_exchange(h->call, x) : 0;
}

static int ffi_feed(void *ud, unsigned token, const char *data, size_t len)
{
    lr_handle *h = ud;
    return h->call ? (int)llmretry_call_exchange_feed(h->call, token, data, len)
                   : (int)LLMRETRY_FEED_GONE;
}

static void ffi_failed(void *ud, unsigned token, int why, int reused, const char *message)
{
    lr_handle *h = ud;
    if (h->call)
        llmretry_call_exchange_failed(h->call, token, (llmretry_xfer_error)why, reused, message);
}

static const lr_ffi_api API = {
    LR_FFI_ABI,
    ffi_drain,
    ffi_result,
    ffi_free,
    ffi_key,
    ffi_poll,
    ffi_text_len,
    ffi_shape_field,
    ffi_shape_field_count,
    ffi_field_name,
    ffi_prep_new,
    ffi_prep_free,
    ffi_prep_reset,
    ffi_option,
    ffi_set_int,
    ffi_set_bool,
    ffi_set_text,
    ffi_set_number,
    ffi_set_body,
    ffi_submit,
    ffi_handle_free,
    ffi_cancel,
    ffi_request_id,
    ffi_run,
    ffi_exchange,
    ffi_feed,
    ffi_failed,
    ffi_field_type,
    ffi_shape_values,
};

/* result(address) -> res | nil, err: what handle:result() gives, for a
 * handle of ffi_submit's (its address as a number: LuaJIT has no light
 * userdata from a cdata), on llmretry.ffi's rare path (a failure, text it
 * does not convert). Any other number is not a handle, so this function
 * is in no table: core._ffi() hands it to llmretry.ffi, and only where
 * the FFI exists (Lua 5.1's API: LuaJIT), never to a Lua 5.4 state. */
static int ffi_result_of_address(lua_State *L)
{
    lr_handle *h = (lr_handle *)(uintptr_t)luaL_checknumber(L, 1);
    const llmretry_result *r = h && h->call ? llmretry_call_result(h->call) : NULL;
    if (!r)
        return lr_fail(L, "the call is not finished");
    lua_settop(L, 0);
    return lr_push_result(L, r);
}

/* core._ffi() -> the table above as a light userdata (lua/llmretry/ffi.lua)
 * and, under LuaJIT, the result function above. */
int l_ffi_api(lua_State *L)
{
    lua_pushlightuserdata(L, (void *)&API);
#if LUA_VERSION_NUM == 501
    lua_pushcfunction(L, ffi_result_of_address);
    return 2;
#else
    return 1;
#endif
}
