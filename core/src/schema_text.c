/* Validating JSON text against a compiled schema (schema.c) in place: the
 * text is read once by a pull reader (json_pull.c) and checked as it is
 * read, with no tree built (the engine checks every answer so, and an
 * answer's tree cost more than twice its check). The same walk as the tree
 * validator's (schema_validate.c), check for check, step for step, with
 * the same words (schema_check.c): the same errors, in the same order,
 * for any text both read as JSON (tests/fuzz/fuzz_schema_text.c).
 *
 * What reading in place changes: a value is met once, in order, so the
 * walk goes back to a value's start when it must look at it again (an
 * anyOf's next branch, a node's own keywords after its $ref, an array's
 * items after minItems/maxItems counted them, a required name that is no
 * property). Any check that reports (a loud one) reads its value to the
 * end, even after the error list is full or the walk stopped, so that
 * every byte of the text is read and text that is not JSON is never
 * called valid. A quiet check (an anyOf branch) stops at its first error,
 * wherever it is; its caller goes back to the value's start. */
#include "schema_walk.h"

#include <stdlib.h>

/* Helpers with buffers of their own stay out of check()'s frame: check()
 * recurses once per level of the value (up to 4 x LR_SCHEMA_MAX_DEPTH
 * frames), so its frame is what a deep answer costs in stack. */
#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

static int check(lr_vctx *v, walk *w, const node *n, int vdepth, int frames);

/* The items of an array (p at its '['): how many. Leaves the walk at m. */
static long long count_items(walk *w, mark m)
{
    long long count = 0;
    if (lr_jp_enter(&w->j) != 0)
        return not_json(w), 0;
    lr_jp_ws(&w->j);
    if (lr_jp_peek(&w->j) != ']')
        for (;;) {
            if (lr_jp_skip(&w->j) != 0)
                return not_json(w), 0;
            count++;
            lr_jp_ws(&w->j);
            char c = lr_jp_peek(&w->j);
            if (c == ']')
                break;
            if (c != ',')
                return not_json(w), 0;
            w->j.p++;
        }
    back(w, m);
    return count;
}

/* The array at m (p there). Loud: read to its end. */
static int check_array(lr_vctx *v, walk *w, const node *n, mark m, int vdepth, int frames)
{
    int bad = 0;
    if (n->min_items >= 0 || n->max_items >= 0) {
        long long count = count_items(w, m);
        if (w->not_json)
            return 1;
        bad = lr_v_check_items(v, n, count);
        if (bad && !v->out)
            return 1;
    }
    if (!n->items) {
        lr_walk_skip_from(w, m);
        return bad;
    }
    if (lr_jp_enter(&w->j) != 0)
        return not_json(w);
    lr_jp_ws(&w->j);
    if (lr_jp_peek(&w->j) == ']') {
        lr_jp_leave(&w->j);
        return bad;
    }
    for (size_t i = 0;; i++) {
        if (bad && lr_v_stopped(v)) {
            if (v->out)
                lr_walk_skip_from(w, m);   /* the rest read, unchecked */
            return 1;
        }
        size_t at = lr_v_push(v, NULL, 0, 0, i);
        bad |= check(v, w, n->items, vdepth + 1, frames + 1);
        lr_v_pop(v, at);
        if (w->not_json || (bad && !v->out))
            return 1;
        lr_jp_ws(&w->j);
        char c = lr_jp_peek(&w->j);
        if (c == ']')
            break;
        if (c != ',')
            return not_json(w);
        w->j.p++;
        lr_jp_ws(&w->j);
    }
    lr_jp_leave(&w->j);
    return bad;
}

/* Is name a key of the object at m? Leaves the walk at m. */
NOINLINE static int has_key(walk *w, mark m, const char *name)
{
    size_t name_len = strlen(name);
    int found = 0;
    back(w, m);
    lr_jp_enter(&w->j);            /* read once already: JSON, not too deep */
    lr_jp_ws(&w->j);
    while (!found && lr_jp_peek(&w->j) == '"') {
        lr_jp_str key;
        char buf[256];
        lr_jp_string(&w->j, &key);
        if (!key.escaped) {
            found = key.len == name_len && memcmp(key.raw, name, name_len) == 0;
        } else if (lr_jp_decode(&key, buf, sizeof buf) == name_len && name_len < sizeof buf) {
            found = memcmp(buf, name, name_len) == 0;
        } else if (name_len >= sizeof buf) {
            char *big = lr_walk_string_value(&key, buf, sizeof buf);
            found = big && strcmp(big, name) == 0;
            if (big != buf)
                free(big);
        }
        lr_jp_ws(&w->j);
        w->j.p++;                  /* ':' */
        lr_jp_skip(&w->j);
        lr_jp_ws(&w->j);
        if (lr_jp_peek(&w->j) == ',') {
            w->j.p++;
            lr_jp_ws(&w->j);
        }
    }
    back(w, m);
    return found;
}

NOINLINE static const prop *escaped_key_prop(const node *n, const lr_jp_str *key, int *oom);

/* A member's key's property: the key's value (escapes decoded, up to a
 * \u0000) is what the tree validator looks up. *next: the property
 * expected next (the one after the last found, in the schema's order). */
static const prop *key_prop(const node *n, const lr_jp_str *key, size_t *next, int *oom)
{
    if (!n->n_props)
        return NULL;
    if (!key->escaped) {
        const prop *p = *next < n->n_props ? &n->props[n->order[*next]] : NULL;
        if (!p || p->name_len != key->len || memcmp(p->name, key->raw, key->len) != 0)
            p = lr_find_prop(n, key->raw, key->len);
        if (p)
            *next = p->src_index + 1;
        return p;
    }
    return escaped_key_prop(n, key, oom);
}

NOINLINE static const prop *escaped_key_prop(const node *n, const lr_jp_str *key, int *oom)
{
    char buf[256];
    size_t len = lr_jp_decode(key, buf, sizeof buf);
    if (len < sizeof buf)
        return lr_find_prop(n, buf, len);
    char *big = lr_walk_string_value(key, buf, sizeof buf);
    if (!big) {
        *oom = 1;
        return NULL;
    }
    const prop *p = lr_find_prop(n, big, len);
    free(big);
    return p;
}

/* The object at m (p there). Loud: read to its end. */
static int check_object(lr_vctx *v, walk *w, const node *n, mark m, int vdepth, int frames)
{
    int bad = 0;
    unsigned char few[64], *seen = few;
    size_t next = 0;
    if (n->n_props > sizeof few && !(seen = calloc(n->n_props, 1))) {
        lr_v_abort(v, "out of memory");
        if (v->out)
            lr_walk_skip_from(w, m);
        return 1;
    }
    if (seen == few)
        memset(few, 0, sizeof few);
    if (lr_jp_enter(&w->j) != 0) {
        bad = not_json(w);
        goto done;
    }
    lr_jp_ws(&w->j);
    if (lr_jp_peek(&w->j) == '}') {
        lr_jp_leave(&w->j);
    } else {
        for (;;) {
            if (bad && lr_v_stopped(v)) {
                if (v->out)
                    lr_walk_skip_from(w, m);
                goto done;
            }
            lr_jp_str key;
            if (lr_jp_peek(&w->j) != '"' || lr_jp_string(&w->j, &key) != 0) {
                bad = not_json(w);
                goto done;
            }
            lr_jp_ws(&w->j);
            if (lr_jp_peek(&w->j) != ':') {
                bad = not_json(w);
                goto done;
            }
            w->j.p++;
            lr_jp_ws(&w->j);
            int oom = 0;
            const prop *p = key_prop(n, &key, &next, &oom);
            if (oom) {
                bad = lr_v_abort(v, "out of memory");
                if (v->out)
                    lr_walk_skip_from(w, m);
                goto done;
            }
            const node *sub = p ? p->schema : n->additional;
            if (p)
                seen[p - n->props] = 1;
            if (!sub && !n->closed) {
                if (lr_jp_skip(&w->j) != 0) {
                    bad = not_json(w);
                    goto done;
                }
            } else {
                size_t at = lr_v_push(v, key.raw, key.len, 1, 0);
                if (sub) {
                    bad |= check(v, w, sub, vdepth + 1, frames + 1);
                } else {
                    bad = 1;
                    lr_v_not_allowed(v);
                    if (lr_jp_skip(&w->j) != 0)
                        not_json(w);
                }
                lr_v_pop(v, at);
                if (w->not_json || (bad && !v->out)) {
                    bad = 1;
                    goto done;
                }
            }
            lr_jp_ws(&w->j);
            char c = lr_jp_peek(&w->j);
            if (c == '}')
                break;
            if (c != ',') {
                bad = not_json(w);
                goto done;
            }
            w->j.p++;
            lr_jp_ws(&w->j);
        }
        lr_jp_leave(&w->j);
    }
    for (size_t i = 0; i < n->n_req && !(bad && lr_v_stopped(v)); i++) {
        const required *r = &n->req[i];
        int present;
        if (r->prop >= 0) {
            present = seen[r->prop];
        } else {
            mark end = here(w);
            present = has_key(w, m, r->name);
            back(w, end);
        }
        if (!present) {
            bad = 1;
            size_t at = lr_v_push(v, r->name, 0, 0, 0);
            lr_v_missing(v);
            lr_v_pop(v, at);
        }
    }
done:
    if (seen != few)
        free(seen);
    return bad;
}

/* The type of the value at m (numbers read for it). Leaves the walk at m. */
static unsigned type_at(walk *w, mark m)
{
    switch (lr_jp_peek(&w->j)) {
    case '{': return T_OBJ;
    case '[': return T_ARR;
    case '"': return T_STR;
    case 't': case 'f': return T_BOOL;
    case 'n': return T_NULL;
    default: {
        double d;
        unsigned t = lr_jp_number(&w->j, &d) == 0 ? lr_number_type(d) : 0;
        back(w, m);
        return t;
    }
    }
}

static int check_any_of(lr_vctx *v, walk *w, const node *n, mark m, int vdepth, int frames)
{
    lr_vctx quiet = { v->sh, NULL };
    for (size_t i = 0; i < n->n_any_of; i++) {
        back(w, m);
        if (check(&quiet, w, n->any_of[i], vdepth, frames + 1) == 0)
            return 0;              /* read to its end */
        if (w->not_json)
            return 1;
        if (v->sh->aborted) {
            lr_v_abort(v, v->sh->abort_msg);
            if (v->out)
                lr_walk_skip_from(w, m);
            return 1;
        }
    }
    back(w, m);
    const node *only = lr_any_of_only(n, type_at(w, m));
    if (only && v->out)
        return check(v, w, only, vdepth, frames + 1) | 1;
    lr_v_none_of(v);
    if (v->out)
        lr_walk_skip_from(w, m);
    return 1;
}

/* pattern, on the string's value (a C string for regexec). Apart from
 * check() (and not inlined) so its buffer is not in every frame of the
 * recursion. */
NOINLINE static int check_pattern(lr_vctx *v, const node *n, const lr_jp_str *str)
{
    char buf[512], *s = str->escaped ? lr_walk_string_value(str, buf, sizeof buf) : NULL;
    if (!str->escaped && str->len < sizeof buf) {
        memcpy(buf, str->raw, str->len);
        buf[str->len] = '\0';
        s = buf;
    } else if (!str->escaped && (s = malloc(str->len + 1))) {
        memcpy(s, str->raw, str->len);
        s[str->len] = '\0';
    }
    if (!s)
        return lr_v_abort(v, "out of memory");
    int bad = lr_v_check_pattern(v, n, s);
    if (s != buf)
        free(s);
    return bad;
}

/* Does the node check anything inside an array or an object? */
static int walks_array(const node *n)
{
    return n->items || n->min_items >= 0 || n->max_items >= 0;
}

static int walks_object(const node *n)
{
    return n->n_props || n->n_req || n->closed || n->additional;
}

/* The value at p against n. A loud check (v->out) and any check that
 * passes leave p past the value; a quiet one that fails may leave it
 * anywhere in it. */
static int check(lr_vctx *v, walk *w, const node *n, int vdepth, int frames)
{
    if (w->not_json)
        return 1;
    mark m = here(w);
    if (lr_v_enter(v, n, vdepth, frames)) {
        if (v->out)
            lr_walk_skip_from(w, m);
        return 1;
    }
    int bad = 0;
    if (n->ref) {
        bad |= check(v, w, n->ref, vdepth, frames + 1);
        if (w->not_json || (bad && lr_v_stopped(v)) || n->ref_only)
            return bad | w->not_json;
        back(w, m);                /* its own keywords, on the same value */
    }
    /* The value's type: a scalar is read whole now, a container entered
     * by its checks below. */
    scalar sc;
    int container = 0, what;
    switch (lr_jp_peek(&w->j)) {
    case '{': sc.type = T_OBJ; container = 1; break;
    case '[': sc.type = T_ARR; container = 1; break;
    case '"':
        sc.type = T_STR;
        if (lr_jp_string(&w->j, &sc.str) != 0)
            return not_json(w);
        break;
    case 't': case 'f': case 'n':
        if (lr_jp_literal(&w->j, &what) != 0)
            return not_json(w);
        sc.type = what == 2 ? T_NULL : T_BOOL;
        sc.truth = what == 1;
        break;
    default:
        if (lr_jp_number(&w->j, &sc.num) != 0)
            return not_json(w);
        sc.type = lr_number_type(sc.num);
        break;
    }
    /* Stop here: a loud check still reads its container to the end. */
#define FAIL() do { if (container && v->out) lr_walk_skip_from(w, m); return 1; } while (0)
    if (!lr_type_ok(n->types, sc.type)) {
        lr_v_type_error(v, n);
        FAIL();
    }
    int oom = 0;
    if (n->enum_vals) {
        int found = 0;
        for (const cJSON *e = n->enum_vals->child; e && !found && !oom; e = e->next)
            found = container ? lr_walk_container_equals(w, m, e, &oom) : lr_walk_scalar_equals(&sc, e, &oom);
        if (w->not_json)
            return 1;
        if (oom) {
            lr_v_abort(v, "out of memory");
            FAIL();
        }
        if (!found) {
            lr_v_enum_error(v, n);
            if (lr_v_stopped(v))
                FAIL();
            bad = 1;
        }
    }
    if (n->const_val) {
        int same = container ? lr_walk_container_equals(w, m, n->const_val, &oom)
                             : lr_walk_scalar_equals(&sc, n->const_val, &oom);
        if (w->not_json)
            return 1;
        if (oom) {
            lr_v_abort(v, "out of memory");
            FAIL();
        }
        if (!same) {
            lr_v_const_error(v, n);
            if (lr_v_stopped(v))
                FAIL();
            bad = 1;
        }
    }
    if (sc.type & T_NUM) {
        bad |= lr_v_check_number(v, n, sc.num);
    } else if (sc.type == T_STR) {
        if (n->min_len >= 0 || n->max_len >= 0)
            bad |= lr_v_check_length(v, n, sc.str.cps);
        if (n->has_re)
            bad |= check_pattern(v, n, &sc.str);
    } else if (sc.type == T_ARR && walks_array(n)) {
        bad |= check_array(v, w, n, m, vdepth, frames);
        container = 0;             /* read */
    } else if (sc.type == T_OBJ && walks_object(n)) {
        bad |= check_object(v, w, n, m, vdepth, frames);
        container = 0;
    }
    if (w->not_json)
        return 1;
    if (bad && lr_v_stopped(v))
        FAIL();
#undef FAIL
    if (n->n_any_of)
        return bad | check_any_of(v, w, n, m, vdepth, frames);   /* reads it */
    if (container)
        lr_walk_skip_from(w, m);           /* nothing inside it to check */
    return bad;
}

int lr_schema_validate_text(const lr_schema *s, const char *text, size_t len,
                            lr_schema_errors *out)
{
    lr_vshared sh;
    lr_vshared_init(&sh);
    lr_vctx v = { &sh, out };
    walk w = { { NULL, NULL, 0, 0 }, 0 };
    out->n = out->truncated = 0;
    lr_jp_init(&w.j, text ? text : "", text ? len : 0);
    lr_jp_ws(&w.j);
    if (w.j.p == w.j.end)
        return -1;
    int bad = s ? check(&v, &w, s->root, 0, 0) : (lr_jp_skip(&w.j) != 0 ? not_json(&w) : 1);
    lr_jp_ws(&w.j);
    if (w.not_json || w.j.p != w.j.end) {
        out->n = out->truncated = 0;
        return -1;
    }
    if (!s)
        lr_v_error(&v, "no value");
    else if (bad && out->n == 0)
        lr_v_error(&v, "does not match the schema");
    return out->n;
}
