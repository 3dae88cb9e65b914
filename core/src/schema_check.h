/* schema_check.h — what the two validators share (schema_check.c): the
 * path being walked, the errors and their words, the bounds, and the
 * checks of a scalar. schema_validate.c walks a cJSON tree, schema_text.c
 * walks JSON text in place; both report through these, so their errors
 * are the same to the byte (tests/fuzz/fuzz_schema_text.c holds them to it). */
#ifndef LLMRETRY_SCHEMA_CHECK_H
#define LLMRETRY_SCHEMA_CHECK_H

#include "schema_tree.h"
#pragma GCC visibility push(hidden)

/* One step of the path to the value being checked: a key or an array
 * index. Paths are formatted only for an error: a valid answer costs no
 * formatting at all. */
typedef struct lr_seg {
    const char *key;               /* NULL: index */
    size_t len;                    /* raw: the key's length in the text */
    int raw;                       /* key is JSON text (escapes kept), else a C string */
    size_t index;
} lr_seg;

#define LR_SCHEMA_MAX_SEGS (LR_SCHEMA_MAX_DEPTH + 8)

/* What every check of one validation shares, the quiet ones of anyOf too. */
typedef struct lr_vshared {
    long steps;
    int aborted;                   /* out of steps or too deep: everything stops */
    int reported;                  /* ... and a loud check has said so */
    const char *abort_msg;
    lr_seg segs[LR_SCHEMA_MAX_SEGS];   /* the loud check's path */
    size_t nseg;                   /* may pass LR_SCHEMA_MAX_SEGS: those are not kept */
} lr_vshared;

typedef struct lr_vctx {
    lr_vshared *sh;
    lr_schema_errors *out;         /* NULL: quiet, the first error ends it */
} lr_vctx;

void lr_vshared_init(lr_vshared *sh);

/* Stop walking: quiet, or the list is full, or everything stopped. */
static inline int lr_v_stopped(const lr_vctx *v)
{
    return !v->out || v->sh->aborted || v->out->truncated;
}

void lr_v_error(lr_vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Everything stops (out of steps, too deep, out of memory): 1. */
int lr_v_abort(lr_vctx *v, const char *msg);

/* Path segments: pushed before a check, popped after (quiet checks keep
 * none: they report nothing). */
static inline size_t lr_v_push(lr_vctx *v, const char *key, size_t len, int raw, size_t index)
{
    size_t old = v->sh->nseg;
    if (!v->out)
        return old;
    if (old < LR_SCHEMA_MAX_SEGS)
        v->sh->segs[old] = (lr_seg){ key, len, raw, index };
    v->sh->nseg = old + 1;
    return old;
}

static inline void lr_v_pop(lr_vctx *v, size_t old)
{
    if (v->out)
        v->sh->nseg = old;
}

/* What every check of a value begins with (a step counted, the depth and
 * the schema false): 0 to go on, 1 when the value fails here. */
int lr_v_enter(lr_vctx *v, const node *n, int vdepth, int frames);

static inline int lr_type_ok(unsigned want, unsigned have)
{
    return want == 0 || (want & have) != 0 || ((want & T_NUM) && (have & T_NUM));
}

/* The type bits of a number (an integral one is an integer too). */
unsigned lr_number_type(double d);

void lr_v_type_error(lr_vctx *v, const node *n);
void lr_v_enum_error(lr_vctx *v, const node *n);
void lr_v_const_error(lr_vctx *v, const node *n);
void lr_v_not_allowed(lr_vctx *v);
void lr_v_missing(lr_vctx *v);
void lr_v_none_of(lr_vctx *v);
/* minItems / maxItems against count: 1 when it fails. */
int lr_v_check_items(lr_vctx *v, const node *n, long long count);
int lr_v_check_number(lr_vctx *v, const node *n, double d);
/* minLength / maxLength (code points) and pattern (s: the string's value,
 * needed only when the node has one). */
int lr_v_check_length(lr_vctx *v, const node *n, size_t cps);
int lr_v_check_pattern(lr_vctx *v, const node *n, const char *s);

/* The branch of an anyOf whose errors say more than "none matched": the
 * only branch that takes a value of type t, else NULL. */
const node *lr_any_of_only(const node *n, unsigned t);

/* Property of key (len bytes, no NUL in them), NULL when none. */
const prop *lr_find_prop(const node *n, const char *key, size_t len);

#pragma GCC visibility pop
#endif
