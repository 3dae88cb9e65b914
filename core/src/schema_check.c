/* What the tree validator (schema_validate.c) and the text validator
 * (schema_text.c) share (schema_check.h): paths, errors and their words,
 * the bounds, the checks of a scalar. Pure. */
#include "schema_check.h"

#include "json_pull.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define LR_XSTR_SCHEMA(x) #x
#define LR_STR_SCHEMA(x) LR_XSTR_SCHEMA(x)

void lr_vshared_init(lr_vshared *sh)
{
    sh->steps = 0;
    sh->aborted = sh->reported = 0;
    sh->abort_msg = NULL;
    sh->nseg = 0;
}

#define KEY_SHOWN 48

/* One segment as text: .key, ["any key"] (JSON-escaped, cut on a UTF-8
 * boundary) or [index]. Its length. */
static size_t format_seg(const lr_seg *sg, char *buf)
{
    size_t n = 0;
    if (!sg->key)
        return (size_t)sprintf(buf, "[%zu]", sg->index);
    /* A key read from JSON text is decoded now: its first bytes are all a
     * path shows. */
    char decoded[KEY_SHOWN + 8];
    const char *key = sg->key;
    size_t len;
    if (sg->raw) {
        lr_jp_str s = { sg->key, sg->len, 0, 1 };
        len = lr_jp_decode(&s, decoded, sizeof decoded);
        key = decoded;
    } else {
        len = strlen(key);
    }
    int ident = key[0] == '_' || ((key[0] | 32) >= 'a' && (key[0] | 32) <= 'z');
    /* Past KEY_SHOWN bytes a key is quoted whatever it holds. */
    for (size_t k = 0; ident && k < len && k <= KEY_SHOWN; k++)
        ident = key[k] == '_' || (key[k] >= '0' && key[k] <= '9') ||
                ((key[k] | 32) >= 'a' && (key[k] | 32) <= 'z');
    if (ident && len <= KEY_SHOWN) {
        buf[n++] = '.';
        memcpy(buf + n, key, len);
        return n + len;
    }
    buf[n++] = '[';
    buf[n++] = '"';
    size_t shown = len;
    if (shown > KEY_SHOWN) {
        shown = KEY_SHOWN;
        while (shown > 0 && ((unsigned char)key[shown] & 0xC0) == 0x80)
            shown--;
    }
    for (size_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c == '"' || c == '\\') {
            buf[n++] = '\\';
            buf[n++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            n += (size_t)sprintf(buf + n, "\\u%04x", c);
        } else {
            buf[n++] = (char)c;
        }
    }
    if (shown < len) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n++] = '"';
    buf[n++] = ']';
    return n;
}

/* The current path, "$..." (a path too long for out ends in "..."). */
static void format_path(const lr_vshared *sh, char *out, size_t cap)
{
    size_t n = 0;
    out[n++] = '$';
    size_t kept = sh->nseg < LR_SCHEMA_MAX_SEGS ? sh->nseg : LR_SCHEMA_MAX_SEGS;
    int cut = sh->nseg > kept;
    char buf[KEY_SHOWN * 6 + 16];
    for (size_t i = 0; i < kept && !cut; i++) {
        size_t len = format_seg(&sh->segs[i], buf);
        if (n + len + 4 > cap)
            cut = 1;
        else {
            memcpy(out + n, buf, len);
            n += len;
        }
    }
    if (cut) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}

void lr_v_error(lr_vctx *v, const char *fmt, ...)
{
    if (!v->out)
        return;
    if (v->out->n == LR_SCHEMA_MAX_ERRORS) {
        v->out->truncated = 1;
        return;
    }
    lr_schema_error *e = &v->out->e[v->out->n++];
    format_path(v->sh, e->path, sizeof e->path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

int lr_v_abort(lr_vctx *v, const char *msg)
{
    if (!v->sh->aborted) {
        v->sh->aborted = 1;
        v->sh->abort_msg = msg;
    }
    if (v->out && !v->sh->reported) {
        /* A quiet check (an anyOf branch) ran out: its loud caller says so. */
        v->sh->reported = 1;
        lr_v_error(v, "%s", v->sh->abort_msg);
    }
    return 1;
}

int lr_v_enter(lr_vctx *v, const node *n, int vdepth, int frames)
{
    if (v->sh->aborted)
        return 1;
    if (++v->sh->steps > LR_SCHEMA_MAX_STEPS)
        return lr_v_abort(v, "validation stopped: too many steps for this schema and answer");
    if (vdepth > LR_SCHEMA_MAX_DEPTH || frames > 4 * LR_SCHEMA_MAX_DEPTH)
        return lr_v_abort(v, "nested too deep to validate (more than "
                          LR_STR_SCHEMA(LR_SCHEMA_MAX_DEPTH) " levels)");
    if (n->is_false) {
        lr_v_error(v, "no value is allowed here (the schema is false)");
        return 1;
    }
    return 0;
}

unsigned lr_number_type(double d)
{
    /* floor(d) == d, without a call to floor: every double of 2^53 or
     * more is integral, and below it the cast is exact. */
    if (!isfinite(d))
        return T_NUM;
    if (fabs(d) >= 9007199254740992.0)
        return T_NUM | T_INT;
    return (double)(long long)d == d ? T_NUM | T_INT : T_NUM;
}

void lr_v_type_error(lr_vctx *v, const node *n)
{
    if (!v->out)
        return;
    char want[96];
    size_t o = 0;
    want[0] = '\0';
    for (size_t i = 0; i < N_TYPES; i++)
        if (n->types & TYPES[i].bit)
            o += (size_t)snprintf(want + o, sizeof want - o, "%s%s", o ? " or " : "",
                                  TYPES[i].name);
    lr_v_error(v, "expected %s", want);
}

/* The schema's own value, cut for a message. */
static void shown_value(const cJSON *x, char *buf, size_t cap)
{
    char *s = cJSON_PrintUnformatted(x);
    snprintf(buf, cap, "%s", s ? s : "?");
    if (s && strlen(s) >= cap && cap > 4)
        memcpy(buf + cap - 4, "...", 4);
    free(s);
}

void lr_v_enum_error(lr_vctx *v, const node *n)
{
    if (!v->out)
        return;
    char vals[100];
    shown_value(n->enum_vals, vals, sizeof vals);
    lr_v_error(v, "must be one of %s", vals);
}

void lr_v_const_error(lr_vctx *v, const node *n)
{
    if (!v->out)
        return;
    char val[100];
    shown_value(n->const_val, val, sizeof val);
    lr_v_error(v, "must be %s", val);
}

void lr_v_not_allowed(lr_vctx *v)
{
    lr_v_error(v, "property not allowed (additionalProperties is false)");
}

void lr_v_missing(lr_vctx *v)
{
    lr_v_error(v, "required property is missing");
}

void lr_v_none_of(lr_vctx *v)
{
    lr_v_error(v, "matches none of the anyOf schemas");
}

int lr_v_check_items(lr_vctx *v, const node *n, long long count)
{
    int bad = 0;
    if (n->min_items >= 0 && count < n->min_items)
        bad = 1, lr_v_error(v, "must have at least %lld items", n->min_items);
    if (n->max_items >= 0 && count > n->max_items)
        bad = 1, lr_v_error(v, "must have at most %lld items", n->max_items);
    return bad;
}

int lr_v_check_number(lr_vctx *v, const node *n, double d)
{
    int bad = 0;
    if ((n->has & HAS_MIN) && !(d >= n->min))
        bad = 1, lr_v_error(v, "must be >= %.15g", n->min);
    if ((n->has & HAS_MAX) && !(d <= n->max))
        bad = 1, lr_v_error(v, "must be <= %.15g", n->max);
    if ((n->has & HAS_XMIN) && !(d > n->xmin))
        bad = 1, lr_v_error(v, "must be > %.15g", n->xmin);
    if ((n->has & HAS_XMAX) && !(d < n->xmax))
        bad = 1, lr_v_error(v, "must be < %.15g", n->xmax);
    if (n->has & HAS_MULT) {
        double q = d / n->mult;
        if (!isfinite(q) || fabs(q - nearbyint(q)) > 1e-9 * fmax(1.0, fabs(q)))
            bad = 1, lr_v_error(v, "must be a multiple of %.15g", n->mult);
    }
    return bad;
}

int lr_v_check_length(lr_vctx *v, const node *n, size_t cps)
{
    int bad = 0;
    long long len = (long long)cps;
    if (n->min_len >= 0 && len < n->min_len)
        bad = 1, lr_v_error(v, "must have at least %lld characters", n->min_len);
    if (n->max_len >= 0 && len > n->max_len)
        bad = 1, lr_v_error(v, "must have at most %lld characters", n->max_len);
    return bad;
}

int lr_v_check_pattern(lr_vctx *v, const node *n, const char *s)
{
    if (n->has_re && regexec(&n->re, s, 0, NULL, 0) != 0) {
        lr_v_error(v, "does not match the pattern '%.80s'", n->pattern);
        return 1;
    }
    return 0;
}

const node *lr_any_of_only(const node *n, unsigned t)
{
    const node *only = NULL;
    int candidates = 0;
    for (size_t i = 0; i < n->n_any_of; i++) {
        const node *b = n->any_of[i];
        while (b->ref && !b->types && !b->n_any_of)
            b = b->ref;
        if (!b->is_false && lr_type_ok(b->types, t)) {
            candidates++;
            only = n->any_of[i];
        }
    }
    return candidates == 1 ? only : NULL;
}

const prop *lr_find_prop(const node *n, const char *key, size_t len)
{
    size_t lo = 0, hi = n->n_props;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const prop *p = &n->props[mid];
        size_t m = len < p->name_len ? len : p->name_len;
        int c = memcmp(key, p->name, m);
        if (c == 0)
            c = len < p->name_len ? -1 : len > p->name_len;
        if (c == 0)
            return p;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}
