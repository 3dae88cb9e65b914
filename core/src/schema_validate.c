/* Validating a cJSON tree against a compiled schema (schema.c): errors
 * with JSON paths, at most LR_SCHEMA_MAX_ERRORS, bounded in depth and
 * steps whatever the value (schema.h). The engine checks answers as text
 * (schema_text.c, without building them); this walk of a tree is the
 * reference that one is held to (tests/fuzz/fuzz_schema_text.c) and the
 * check of a value a caller already holds as a tree. Pure; a compiled
 * schema is only read, so any thread may validate with it. */
#include "schema_check.h"

#include <math.h>
#include <stdlib.h>

static unsigned type_of(const cJSON *x)
{
    if (cJSON_IsNull(x)) return T_NULL;
    if (cJSON_IsBool(x)) return T_BOOL;
    if (cJSON_IsString(x)) return T_STR;
    if (cJSON_IsArray(x)) return T_ARR;
    if (cJSON_IsObject(x)) return T_OBJ;
    if (cJSON_IsNumber(x)) return lr_number_type(x->valuedouble);
    return 0;                      /* cJSON_Raw / invalid: matches no type */
}

static size_t code_points(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int check(lr_vctx *v, const node *n, const cJSON *x, int vdepth, int frames);

static int check_array(lr_vctx *v, const node *n, const cJSON *x, int vdepth, int frames)
{
    int bad = lr_v_check_items(v, n, cJSON_GetArraySize(x));
    if (bad && !v->out)
        return 1;
    if (!n->items)
        return bad;
    size_t i = 0;
    for (const cJSON *it = x->child; it && !(bad && lr_v_stopped(v)); it = it->next, i++) {
        size_t at = lr_v_push(v, NULL, 0, 0, i);
        bad |= check(v, n->items, it, vdepth + 1, frames + 1);
        lr_v_pop(v, at);
    }
    return bad;
}

static int check_object(lr_vctx *v, const node *n, const cJSON *x, int vdepth, int frames)
{
    int bad = 0;
    unsigned char few[64], *seen = few;
    if (n->n_props > sizeof few && !(seen = calloc(n->n_props, 1)))
        return lr_v_abort(v, "out of memory");
    if (seen == few)
        memset(few, 0, sizeof few);
    for (const cJSON *m = x->child; m && !(bad && lr_v_stopped(v)); m = m->next) {
        const char *key = m->string ? m->string : "";
        const prop *p = n->n_props ? lr_find_prop(n, key, strlen(key)) : NULL;
        const node *sub = p ? p->schema : n->additional;
        if (p)
            seen[p - n->props] = 1;
        if (!sub && !n->closed)
            continue;
        size_t at = lr_v_push(v, key, 0, 0, 0);
        if (sub) {
            bad |= check(v, sub, m, vdepth + 1, frames + 1);
        } else {
            bad = 1;
            lr_v_not_allowed(v);
        }
        lr_v_pop(v, at);
    }
    for (size_t i = 0; i < n->n_req && !(bad && lr_v_stopped(v)); i++) {
        const required *r = &n->req[i];
        int present = r->prop >= 0 ? seen[r->prop]
                                   : cJSON_GetObjectItemCaseSensitive(x, r->name) != NULL;
        if (!present) {
            bad = 1;
            size_t at = lr_v_push(v, r->name, 0, 0, 0);
            lr_v_missing(v);
            lr_v_pop(v, at);
        }
    }
    if (seen != few)
        free(seen);
    return bad;
}

static int check_any_of(lr_vctx *v, const node *n, const cJSON *x, int vdepth, int frames)
{
    lr_vctx quiet = { v->sh, NULL };
    for (size_t i = 0; i < n->n_any_of; i++) {
        if (check(&quiet, n->any_of[i], x, vdepth, frames + 1) == 0)
            return 0;
        if (v->sh->aborted)
            return lr_v_abort(v, v->sh->abort_msg);
    }
    /* One branch of the value's type (say object of anyOf [object, null]):
     * its errors say more than "none matched". */
    const node *only = lr_any_of_only(n, type_of(x));
    if (only && v->out)
        return check(v, only, x, vdepth, frames + 1) | 1;
    lr_v_none_of(v);
    return 1;
}

static int check(lr_vctx *v, const node *n, const cJSON *x, int vdepth, int frames)
{
    if (lr_v_enter(v, n, vdepth, frames))
        return 1;
    int bad = 0;
    if (n->ref) {
        bad |= check(v, n->ref, x, vdepth, frames + 1);
        if (bad && lr_v_stopped(v))
            return 1;
    }
    unsigned t = type_of(x);
    if (!lr_type_ok(n->types, t)) {
        lr_v_type_error(v, n);
        return 1;
    }
    if (n->enum_vals) {
        int found = 0;
        for (const cJSON *e = n->enum_vals->child; e && !found; e = e->next)
            found = cJSON_Compare(e, x, 1);
        if (!found) {
            lr_v_enum_error(v, n);
            if (lr_v_stopped(v))
                return 1;
            bad = 1;
        }
    }
    if (n->const_val && !cJSON_Compare(n->const_val, x, 1)) {
        lr_v_const_error(v, n);
        if (lr_v_stopped(v))
            return 1;
        bad = 1;
    }
    if (t & T_NUM) {
        bad |= lr_v_check_number(v, n, x->valuedouble);
    } else if (t == T_STR) {
        if (n->min_len >= 0 || n->max_len >= 0)
            bad |= lr_v_check_length(v, n, code_points(x->valuestring));
        bad |= lr_v_check_pattern(v, n, x->valuestring);
    } else if (t == T_ARR) {
        bad |= check_array(v, n, x, vdepth, frames);
    } else if (t == T_OBJ) {
        bad |= check_object(v, n, x, vdepth, frames);
    }
    if (bad && lr_v_stopped(v))
        return 1;
    if (n->n_any_of)
        bad |= check_any_of(v, n, x, vdepth, frames);
    return bad;
}

int lr_schema_validate(const lr_schema *s, const cJSON *value, lr_schema_errors *out)
{
    lr_vshared sh;
    lr_vshared_init(&sh);
    lr_vctx v = { &sh, out };
    out->n = out->truncated = 0;
    if (!s || !value) {
        lr_v_error(&v, "no value");
        return out->n;
    }
    if (check(&v, s->root, value, 0, 0) && out->n == 0)
        lr_v_error(&v, "does not match the schema");
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
