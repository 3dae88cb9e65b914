/* Validating a value against a compiled schema (schema.c): errors with
 * JSON paths, at most LR_SCHEMA_MAX_ERRORS, bounded in depth and steps
 * whatever the value (schema.h). Pure; a compiled schema is only read, so
 * any thread may validate with it. */
#include "schema_tree.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define LR_XSTR_SCHEMA(x) #x
#define LR_STR_SCHEMA(x) LR_XSTR_SCHEMA(x)

/* ---- validating ------------------------------------------------------------ */

/* One step of the path to the value being checked: a key (borrowed from
 * the value) or an array index. Paths are formatted only for an error: a
 * valid answer costs no formatting at all. */
typedef struct seg {
    const char *key;               /* NULL: index */
    size_t index;
} seg;

#define MAX_SEGS (LR_SCHEMA_MAX_DEPTH + 8)

/* What every check of one validation shares, the quiet ones of anyOf too. */
typedef struct vshared {
    long steps;
    int aborted;                   /* out of steps or too deep: everything stops */
    int reported;                  /* ... and a loud check has said so */
    const char *abort_msg;
    seg segs[MAX_SEGS];            /* the loud check's path */
    size_t nseg;                   /* may pass MAX_SEGS: those are not kept */
} vshared;

typedef struct vctx {
    vshared *sh;
    lr_schema_errors *out;         /* NULL: quiet, the first error ends it */
} vctx;

/* Stop walking: quiet, or the list is full, or everything stopped. */
static int stopped(const vctx *v)
{
    return !v->out || v->sh->aborted || v->out->truncated;
}

#define KEY_SHOWN 48

/* One segment as text: .key, ["any key"] (JSON-escaped, cut on a UTF-8
 * boundary) or [index]. Its length. */
static size_t format_seg(const seg *sg, char *buf)
{
    size_t n = 0;
    const char *key = sg->key;
    if (!key)
        return (size_t)sprintf(buf, "[%zu]", sg->index);
    int ident = key[0] == '_' || ((key[0] | 32) >= 'a' && (key[0] | 32) <= 'z');
    for (const char *k = key; ident && *k; k++)
        ident = *k == '_' || (*k >= '0' && *k <= '9') || ((*k | 32) >= 'a' && (*k | 32) <= 'z');
    size_t len = strlen(key);
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
static void format_path(const vshared *sh, char *out, size_t cap)
{
    size_t n = 0;
    out[n++] = '$';
    size_t kept = sh->nseg < MAX_SEGS ? sh->nseg : MAX_SEGS;
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

static void add_error(vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_error(vctx *v, const char *fmt, ...)
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

static int abort_with(vctx *v, const char *msg)
{
    if (!v->sh->aborted) {
        v->sh->aborted = 1;
        v->sh->abort_msg = msg;
    }
    if (v->out && !v->sh->reported) {
        /* A quiet check (an anyOf branch) ran out: its loud caller says so. */
        v->sh->reported = 1;
        add_error(v, "%s", v->sh->abort_msg);
    }
    return 1;
}

/* Path segments: pushed before a check, popped after (quiet checks keep
 * none: they report nothing). */
static size_t push_seg(vctx *v, const char *key, size_t index)
{
    size_t old = v->sh->nseg;
    if (!v->out)
        return old;
    if (old < MAX_SEGS)
        v->sh->segs[old] = (seg){ key, index };
    v->sh->nseg = old + 1;
    return old;
}

static void pop(vctx *v, size_t old)
{
    if (v->out)
        v->sh->nseg = old;
}

static size_t push_key(vctx *v, const char *key)
{
    return push_seg(v, key, 0);
}

static size_t push_index(vctx *v, size_t i)
{
    return push_seg(v, NULL, i);
}

static unsigned type_of(const cJSON *x)
{
    if (cJSON_IsNull(x)) return T_NULL;
    if (cJSON_IsBool(x)) return T_BOOL;
    if (cJSON_IsString(x)) return T_STR;
    if (cJSON_IsArray(x)) return T_ARR;
    if (cJSON_IsObject(x)) return T_OBJ;
    if (cJSON_IsNumber(x)) {
        double d = x->valuedouble;
        return isfinite(d) && floor(d) == d ? T_NUM | T_INT : T_NUM;
    }
    return 0;                      /* cJSON_Raw / invalid: matches no type */
}

static int type_ok(unsigned want, unsigned have)
{
    return want == 0 || (want & have) != 0 || ((want & T_NUM) && (have & T_NUM));
}

static void type_names(unsigned bits, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_TYPES; i++)
        if (bits & TYPES[i].bit)
            o += (size_t)snprintf(buf + o, cap - o, "%s%s", o ? " or " : "", TYPES[i].name);
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

static size_t code_points(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int check(vctx *v, const node *n, const cJSON *x, int vdepth, int frames);

static int check_number(vctx *v, const node *n, double d)
{
    int bad = 0;
    if ((n->has & HAS_MIN) && !(d >= n->min))
        bad = 1, add_error(v, "must be >= %.15g", n->min);
    if ((n->has & HAS_MAX) && !(d <= n->max))
        bad = 1, add_error(v, "must be <= %.15g", n->max);
    if ((n->has & HAS_XMIN) && !(d > n->xmin))
        bad = 1, add_error(v, "must be > %.15g", n->xmin);
    if ((n->has & HAS_XMAX) && !(d < n->xmax))
        bad = 1, add_error(v, "must be < %.15g", n->xmax);
    if (n->has & HAS_MULT) {
        double q = d / n->mult;
        if (!isfinite(q) || fabs(q - nearbyint(q)) > 1e-9 * fmax(1.0, fabs(q)))
            bad = 1, add_error(v, "must be a multiple of %.15g", n->mult);
    }
    return bad;
}

static int check_string(vctx *v, const node *n, const char *s)
{
    int bad = 0;
    if (n->min_len >= 0 || n->max_len >= 0) {
        long long len = (long long)code_points(s);
        if (n->min_len >= 0 && len < n->min_len)
            bad = 1, add_error(v, "must have at least %lld characters", n->min_len);
        if (n->max_len >= 0 && len > n->max_len)
            bad = 1, add_error(v, "must have at most %lld characters", n->max_len);
    }
    if (n->has_re && regexec(&n->re, s, 0, NULL, 0) != 0)
        bad = 1, add_error(v, "does not match the pattern '%.80s'", n->pattern);
    return bad;
}

static int check_array(vctx *v, const node *n, const cJSON *x, int vdepth, int frames)
{
    int bad = 0;
    long long count = cJSON_GetArraySize(x);
    if (n->min_items >= 0 && count < n->min_items)
        bad = 1, add_error(v, "must have at least %lld items", n->min_items);
    if (n->max_items >= 0 && count > n->max_items)
        bad = 1, add_error(v, "must have at most %lld items", n->max_items);
    if (bad && !v->out)
        return 1;
    if (!n->items)
        return bad;
    size_t i = 0;
    for (const cJSON *it = x->child; it && !(bad && stopped(v)); it = it->next, i++) {
        size_t at = push_index(v, i);
        bad |= check(v, n->items, it, vdepth + 1, frames + 1);
        pop(v, at);
    }
    return bad;
}

static int check_object(vctx *v, const node *n, const cJSON *x, int vdepth, int frames)
{
    int bad = 0;
    unsigned char few[64], *seen = few;
    if (n->n_props > sizeof few && !(seen = calloc(n->n_props, 1)))
        return abort_with(v, "out of memory");
    if (seen == few)
        memset(few, 0, sizeof few);
    for (const cJSON *m = x->child; m && !(bad && stopped(v)); m = m->next) {
        const char *key = m->string ? m->string : "";
        prop want = { key, NULL };
        const prop *p = n->n_props ? bsearch(&want, n->props, n->n_props, sizeof *n->props,
                                             lr_schema_prop_cmp) : NULL;
        const node *sub = p ? p->schema : n->additional;
        if (p)
            seen[p - n->props] = 1;
        if (!sub && !n->closed)
            continue;
        size_t at = push_key(v, key);
        if (sub) {
            bad |= check(v, sub, m, vdepth + 1, frames + 1);
        } else {
            bad = 1;
            add_error(v, "property not allowed (additionalProperties is false)");
        }
        pop(v, at);
    }
    for (size_t i = 0; i < n->n_req && !(bad && stopped(v)); i++) {
        const required *r = &n->req[i];
        int present = r->prop >= 0 ? seen[r->prop]
                                   : cJSON_GetObjectItemCaseSensitive(x, r->name) != NULL;
        if (!present) {
            bad = 1;
            size_t at = push_key(v, r->name);
            add_error(v, "required property is missing");
            pop(v, at);
        }
    }
    if (seen != few)
        free(seen);
    return bad;
}

static int check_any_of(vctx *v, const node *n, const cJSON *x, int vdepth, int frames)
{
    vctx quiet = { v->sh, NULL };
    for (size_t i = 0; i < n->n_any_of; i++) {
        if (check(&quiet, n->any_of[i], x, vdepth, frames + 1) == 0)
            return 0;
        if (v->sh->aborted)
            return abort_with(v, v->sh->abort_msg);
    }
    /* One branch of the value's type (say object of anyOf [object, null]):
     * its errors say more than "none matched". */
    const node *only = NULL;
    int candidates = 0;
    unsigned t = type_of(x);
    for (size_t i = 0; i < n->n_any_of; i++) {
        const node *b = n->any_of[i];
        while (b->ref && !b->types && !b->n_any_of)
            b = b->ref;
        if (!b->is_false && type_ok(b->types, t)) {
            candidates++;
            only = n->any_of[i];
        }
    }
    if (candidates == 1 && v->out)
        return check(v, only, x, vdepth, frames + 1) | 1;
    add_error(v, "matches none of the anyOf schemas");
    return 1;
}

static int check(vctx *v, const node *n, const cJSON *x, int vdepth, int frames)
{
    if (v->sh->aborted)
        return 1;
    if (++v->sh->steps > LR_SCHEMA_MAX_STEPS)
        return abort_with(v, "validation stopped: too many steps for this schema and answer");
    if (vdepth > LR_SCHEMA_MAX_DEPTH || frames > 4 * LR_SCHEMA_MAX_DEPTH)
        return abort_with(v, "nested too deep to validate (more than "
                          LR_STR_SCHEMA(LR_SCHEMA_MAX_DEPTH) " levels)");
    if (n->is_false) {
        add_error(v, "no value is allowed here (the schema is false)");
        return 1;
    }
    int bad = 0;
    if (n->ref) {
        bad |= check(v, n->ref, x, vdepth, frames + 1);
        if (bad && stopped(v))
            return 1;
    }
    unsigned t = type_of(x);
    if (!type_ok(n->types, t)) {
        char want[96];
        type_names(n->types, want, sizeof want);
        add_error(v, "expected %s", want);
        return 1;
    }
    if (n->enum_vals) {
        int found = 0;
        for (const cJSON *e = n->enum_vals->child; e && !found; e = e->next)
            found = cJSON_Compare(e, x, 1);
        if (!found) {
            char vals[100];
            shown_value(n->enum_vals, vals, sizeof vals);
            add_error(v, "must be one of %s", vals);
            if (stopped(v))
                return 1;
            bad = 1;
        }
    }
    if (n->const_val && !cJSON_Compare(n->const_val, x, 1)) {
        char val[100];
        shown_value(n->const_val, val, sizeof val);
        add_error(v, "must be %s", val);
        if (stopped(v))
            return 1;
        bad = 1;
    }
    if (t & T_NUM)
        bad |= check_number(v, n, x->valuedouble);
    else if (t == T_STR)
        bad |= check_string(v, n, x->valuestring);
    else if (t == T_ARR)
        bad |= check_array(v, n, x, vdepth, frames);
    else if (t == T_OBJ)
        bad |= check_object(v, n, x, vdepth, frames);
    if (bad && stopped(v))
        return 1;
    if (n->n_any_of)
        bad |= check_any_of(v, n, x, vdepth, frames);
    return bad;
}

int lr_schema_validate(const lr_schema *s, const cJSON *value, lr_schema_errors *out)
{
    vshared sh;
    sh.steps = sh.aborted = sh.reported = 0;
    sh.abort_msg = NULL;
    sh.nseg = 0;
    vctx v = { &sh, out };
    out->n = out->truncated = 0;
    if (!s || !value) {
        add_error(&v, "no value");
        return out->n;
    }
    if (check(&v, s->root, value, 0, 0) && out->n == 0)
        add_error(&v, "does not match the schema");
    return out->n;
}

char *lr_schema_errors_json(const lr_schema_errors *errs)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < errs->n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddStringToObject(o, "path", errs->e[i].path) ||
            !cJSON_AddStringToObject(o, "message", errs->e[i].message)) {
            cJSON_Delete(o);
            cJSON_Delete(arr);
            return NULL;
        }
        cJSON_AddItemToArray(arr, o);
    }
    char *s = arr ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    return s;
}
