/* JSON Schema (the strict-mode subset) compiled once: every keyword
 * checked, every $ref resolved, every pattern compiled, so validating
 * (schema_validate.c) never meets a surprise. Pure: no I/O, no globals.
 * The subset, the pattern dialect and the bounds are in schema.h. */
#include "schema_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Annotations: accepted, never checked. */
static const char *const IGNORED[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "format",
    "deprecated", "readOnly", "writeOnly", "strict", NULL,
};

/* ---- compiling ------------------------------------------------------------ */

typedef struct cctx {
    lr_schema *s;
    char *err;
    size_t errlen;
    int failed;
} cctx;

static int cfail(cctx *cx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cfail(cctx *cx, const char *fmt, ...)
{
    if (!cx->failed && cx->err && cx->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(cx->err, cx->errlen, fmt, ap);
        va_end(ap);
    }
    cx->failed = 1;
    return -1;
}

static node *memo_find(const lr_schema *s, const cJSON *src)
{
    for (size_t i = 0; i < s->n_nodes; i++)
        if (s->nodes[i]->src == src)
            return s->nodes[i];
    return NULL;
}

static node *node_new(cctx *cx, const cJSON *src, const char *where)
{
    lr_schema *s = cx->s;
    if (s->n_nodes == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        node **nodes = realloc(s->nodes, cap * sizeof *nodes);
        if (!nodes)
            return NULL;
        s->nodes = nodes;
        s->cap = cap;
    }
    node *n = calloc(1, sizeof *n);
    if (!n || !(n->where = strdup(where))) {
        free(n);
        return NULL;
    }
    n->src = src;
    n->min_items = n->max_items = n->min_len = n->max_len = -1;
    s->nodes[s->n_nodes++] = n;
    return n;
}

/* where + ".key" (or ["key"] when key is no identifier), cut to fit. */
static void path_join(char *out, size_t cap, const char *where, const char *key)
{
    int ident = (key[0] == '_' || (key[0] | 32) >= 'a') && (key[0] | 32) <= 'z';
    for (const char *k = key; ident && *k; k++)
        ident = *k == '_' || *k == '$' || (*k >= '0' && *k <= '9') ||
                ((*k | 32) >= 'a' && (*k | 32) <= 'z');
    if (ident || key[0] == '$')
        snprintf(out, cap, "%s.%.60s", where, key);
    else
        snprintf(out, cap, "%s[\"%.60s\"]", where, key);
}

static node *compile_node(cctx *cx, const cJSON *src, const char *where, int depth);

static int compile_pattern(cctx *cx, node *n, const cJSON *v, const char *at)
{
    if (!cJSON_IsString(v))
        return cfail(cx, "pattern at %s must be a string", at);
    char why[128];
    if (lr_schema_pattern_compile(&n->re, v->valuestring, why, sizeof why) != 0)
        return cfail(cx, "pattern at %s is not supported: %s", at, why);
    n->has_re = 1;
    n->pattern = v->valuestring;
    return 0;
}

static int is_count(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 1e15 &&
           floor(v->valuedouble) == v->valuedouble;
}

/* One keyword of an object schema. */
static int compile_keyword(cctx *cx, node *n, const cJSON *kw, const char *where, int depth)
{
    const char *k = kw->string;
    /* Its path ("$.properties.x.minimum"), made only when needed: for a
     * message, or as its children's parent. */
    char at[LR_SCHEMA_PATH_MAX * 2];
#define AT() (path_join(at, sizeof at, where, k), at)
    if (strcmp(k, "type") == 0) {
        const cJSON *names = kw;
        if (cJSON_IsArray(kw) && cJSON_GetArraySize(kw) == 0)
            return cfail(cx, "type at %s must not be an empty array", AT());
        if (!cJSON_IsString(kw) && !cJSON_IsArray(kw))
            return cfail(cx, "type at %s must be a type name or an array of them", AT());
        const cJSON *one = cJSON_IsString(kw) ? kw : NULL;
        for (const cJSON *t = one ? one : names->child; t; t = one ? NULL : t->next) {
            size_t i = 0;
            while (i < N_TYPES && !(cJSON_IsString(t) && strcmp(t->valuestring, TYPES[i].name) == 0))
                i++;
            if (i == N_TYPES)
                return cfail(cx, "type at %s names an unknown type (not one of object, array, "
                             "string, integer, number, boolean, null)", AT());
            n->types |= TYPES[i].bit;
        }
    } else if (strcmp(k, "properties") == 0) {
        if (!cJSON_IsObject(kw))
            return cfail(cx, "properties at %s must be an object", AT());
        n->n_props = (size_t)cJSON_GetArraySize(kw);
        n->props = calloc(n->n_props ? n->n_props : 1, sizeof *n->props);
        if (!n->props)
            return cfail(cx, "out of memory");
        size_t i = 0;
        const char *base = AT();
        for (const cJSON *p = kw->child; p; p = p->next, i++) {
            char sub[LR_SCHEMA_PATH_MAX * 2];
            path_join(sub, sizeof sub, base, p->string);
            n->props[i].name = p->string;
            n->props[i].name_len = strlen(p->string);
            n->props[i].src_index = i;
            if (!(n->props[i].schema = compile_node(cx, p, sub, depth + 1)))
                return -1;
        }
    } else if (strcmp(k, "required") == 0) {
        if (!cJSON_IsArray(kw))
            return cfail(cx, "required at %s must be an array of property names", AT());
        n->n_req = (size_t)cJSON_GetArraySize(kw);
        n->req = calloc(n->n_req ? n->n_req : 1, sizeof *n->req);
        if (!n->req)
            return cfail(cx, "out of memory");
        size_t i = 0;
        for (const cJSON *r = kw->child; r; r = r->next, i++) {
            if (!cJSON_IsString(r))
                return cfail(cx, "required at %s must be an array of property names", AT());
            n->req[i].name = r->valuestring;
        }
    } else if (strcmp(k, "additionalProperties") == 0) {
        if (cJSON_IsFalse(kw))
            n->closed = 1;
        else if (!cJSON_IsTrue(kw) && !(n->additional = compile_node(cx, kw, AT(), depth + 1)))
            return -1;
    } else if (strcmp(k, "items") == 0) {
        if (cJSON_IsArray(kw))
            return cfail(cx, "items at %s must be one schema (tuples are not supported)", AT());
        if (!(n->items = compile_node(cx, kw, AT(), depth + 1)))
            return -1;
    } else if (strcmp(k, "enum") == 0) {
        if (!cJSON_IsArray(kw) || !kw->child)
            return cfail(cx, "enum at %s must be a non-empty array", AT());
        n->enum_vals = kw;
    } else if (strcmp(k, "const") == 0) {
        n->const_val = kw;
    } else if (strcmp(k, "anyOf") == 0) {
        if (!cJSON_IsArray(kw) || !kw->child)
            return cfail(cx, "anyOf at %s must be a non-empty array of schemas", AT());
        n->n_any_of = (size_t)cJSON_GetArraySize(kw);
        n->any_of = calloc(n->n_any_of, sizeof *n->any_of);
        if (!n->any_of)
            return cfail(cx, "out of memory");
        size_t i = 0;
        const char *base = AT();
        for (const cJSON *b = kw->child; b; b = b->next, i++) {
            char sub[LR_SCHEMA_PATH_MAX * 2];
            snprintf(sub, sizeof sub, "%.300s[%zu]", base, i);
            if (!(n->any_of[i] = compile_node(cx, b, sub, depth + 1)))
                return -1;
        }
    } else if (strcmp(k, "$ref") == 0) {
        /* Resolved once the whole schema is compiled (resolve_refs). */
        if (!cJSON_IsString(kw))
            return cfail(cx, "$ref at %s must be a string", AT());
        if (kw->valuestring[0] != '#' || (kw->valuestring[1] && kw->valuestring[1] != '/'))
            return cfail(cx, "$ref at %s: only local references (\"#\", \"#/$defs/Name\") are "
                         "supported", AT());
    } else if (strcmp(k, "$defs") == 0 || strcmp(k, "definitions") == 0) {
        if (!cJSON_IsObject(kw))
            return cfail(cx, "%s at %s must be an object of schemas", k, AT());
        const char *base = AT();
        for (const cJSON *d = kw->child; d; d = d->next) {
            char sub[LR_SCHEMA_PATH_MAX * 2];
            path_join(sub, sizeof sub, base, d->string);
            if (!compile_node(cx, d, sub, depth + 1))
                return -1;
        }
    } else if (strcmp(k, "minimum") == 0 || strcmp(k, "maximum") == 0 ||
               strcmp(k, "exclusiveMinimum") == 0 || strcmp(k, "exclusiveMaximum") == 0 ||
               strcmp(k, "multipleOf") == 0) {
        if (!cJSON_IsNumber(kw) || !isfinite(kw->valuedouble))
            return cfail(cx, "%s at %s must be a number", k, AT());
        double d = kw->valuedouble;
        if (k[0] == 'm' && k[1] == 'u') {
            if (d <= 0)
                return cfail(cx, "multipleOf at %s must be greater than 0", AT());
            n->mult = d, n->has |= HAS_MULT;
        } else if (k[0] == 'e') {
            if (k[10] == 'i')          /* exclusiveMinimum */
                n->xmin = d, n->has |= HAS_XMIN;
            else
                n->xmax = d, n->has |= HAS_XMAX;
        } else if (k[1] == 'i') {
            n->min = d, n->has |= HAS_MIN;
        } else {
            n->max = d, n->has |= HAS_MAX;
        }
    } else if (strcmp(k, "minItems") == 0 || strcmp(k, "maxItems") == 0 ||
               strcmp(k, "minLength") == 0 || strcmp(k, "maxLength") == 0) {
        if (!is_count(kw))
            return cfail(cx, "%s at %s must be a non-negative integer", k, AT());
        long long v = (long long)kw->valuedouble;
        if (strcmp(k, "minItems") == 0) n->min_items = v;
        else if (strcmp(k, "maxItems") == 0) n->max_items = v;
        else if (strcmp(k, "minLength") == 0) n->min_len = v;
        else n->max_len = v;
    } else if (strcmp(k, "pattern") == 0) {
        return compile_pattern(cx, n, kw, AT());
    } else {
        for (const char *const *ig = IGNORED; *ig; ig++)
            if (strcmp(k, *ig) == 0)
                return 0;
        return cfail(cx, "unsupported keyword '%.60s' at %s (supported: type, properties, "
                     "required, additionalProperties, items, enum, const, anyOf, $ref, $defs, "
                     "minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf, "
                     "minItems, maxItems, minLength, maxLength, pattern)", k, where);
    }
    return 0;
#undef AT
}

static node *compile_node(cctx *cx, const cJSON *src, const char *where, int depth)
{
    node *n = memo_find(cx->s, src);
    if (n)
        return n;
    if (depth > LR_SCHEMA_MAX_DEPTH) {
        cfail(cx, "schema nested deeper than %d levels at %.80s", LR_SCHEMA_MAX_DEPTH, where);
        return NULL;
    }
    if (!(n = node_new(cx, src, where))) {
        cfail(cx, "out of memory");
        return NULL;
    }
    if (cJSON_IsBool(src)) {
        n->is_false = cJSON_IsFalse(src);
        return n;
    }
    if (!cJSON_IsObject(src)) {
        cfail(cx, "the schema at %s must be an object or a boolean", where);
        return NULL;
    }
    for (const cJSON *kw = src->child; kw; kw = kw->next) {
        /* JSON lets a key repeat; which one counts would be a guess. */
        for (const cJSON *before = src->child; before != kw; before = before->next)
            if (strcmp(before->string, kw->string) == 0) {
                cfail(cx, "keyword '%.60s' appears twice at %s", kw->string, where);
                return NULL;
            }
        if (compile_keyword(cx, n, kw, where, depth) != 0)
            return NULL;
    }
    if (n->n_props) {
        qsort(n->props, n->n_props, sizeof *n->props, lr_schema_prop_cmp);
        /* Answers mostly give the properties in the schema's order: the
         * text validator tries the next one first (schema_text.c). */
        if (!(n->order = malloc(n->n_props * sizeof *n->order))) {
            cfail(cx, "out of memory");
            return NULL;
        }
        for (size_t i = 0; i < n->n_props; i++)
            n->order[n->props[i].src_index] = i;
    }
    for (size_t i = 0; i < n->n_props; i++)
        if (i > 0 && strcmp(n->props[i - 1].name, n->props[i].name) == 0) {
            cfail(cx, "properties at %s names '%.60s' twice", where, n->props[i].name);
            return NULL;
        }
    for (size_t i = 0; i < n->n_req; i++) {
        const prop *p = lr_find_prop(n, n->req[i].name, strlen(n->req[i].name));
        n->req[i].prop = p ? (long)(p - n->props) : -1;
    }
    return n;
}

/* "#/a/b~1c" in the schema's copy; NULL when it leads nowhere. */
static const cJSON *resolve_pointer(const cJSON *root, const char *ref)
{
    const cJSON *at = root;
    const char *p = ref + 1;
    char token[256];
    while (at && *p == '/') {
        p++;
        size_t t = 0;
        for (; *p && *p != '/'; p++) {
            char c = *p;
            if (c == '~' && (p[1] == '0' || p[1] == '1'))
                c = *++p == '0' ? '~' : '/';
            if (t + 1 >= sizeof token)
                return NULL;
            token[t++] = c;
        }
        token[t] = '\0';
        if (cJSON_IsObject(at)) {
            at = cJSON_GetObjectItemCaseSensitive(at, token);
        } else if (cJSON_IsArray(at)) {
            char *end;
            long i = strtol(token, &end, 10);
            at = *end || !t || i < 0 ? NULL : cJSON_GetArrayItem(at, (int)i);
        } else {
            at = NULL;
        }
    }
    return at;
}

/* Every $ref of every node (those compiled while resolving are in the list
 * too: it grows under this loop). */
static int resolve_refs(cctx *cx)
{
    lr_schema *s = cx->s;
    for (size_t i = 0; i < s->n_nodes; i++) {
        node *n = s->nodes[i];
        const cJSON *r = cJSON_IsObject(n->src) ? cJSON_GetObjectItemCaseSensitive(n->src, "$ref")
                                                : NULL;
        if (!r)
            continue;
        const cJSON *target = resolve_pointer(s->doc, r->valuestring);
        if (!target)
            return cfail(cx, "$ref at %s.$ref (\"%.80s\") does not resolve", n->where,
                         r->valuestring);
        char where[LR_SCHEMA_PATH_MAX * 2];
        snprintf(where, sizeof where, "$%.200s", r->valuestring + 1);
        for (char *c = where; *c; c++)
            if (*c == '/')
                *c = '.';
        if (!(n->ref = compile_node(cx, target, where, 1)))
            return -1;
        n->ref_only = !n->is_false && !n->types && !n->n_props && !n->n_req && !n->closed &&
                      !n->additional && !n->items && !n->enum_vals && !n->const_val &&
                      !n->n_any_of && !n->has && n->min_items < 0 && n->max_items < 0 &&
                      n->min_len < 0 && n->max_len < 0 && !n->has_re;
    }
    return 0;
}

/* A cycle through $ref and anyOf alone never reaches a smaller value: it
 * would loop on any value that gets there. */
static int no_progress_cycle(cctx *cx, node *n)
{
    if (n->visiting == 1)
        return cfail(cx, "$ref cycle that never reaches a property or an item, at %s", n->where);
    if (n->visiting == 2)
        return 0;
    n->visiting = 1;
    if (n->ref && no_progress_cycle(cx, n->ref) != 0)
        return -1;
    for (size_t i = 0; i < n->n_any_of; i++)
        if (no_progress_cycle(cx, n->any_of[i]) != 0)
            return -1;
    n->visiting = 2;
    return 0;
}

lr_schema *lr_schema_ref(lr_schema *s)
{
    if (s)
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

void lr_schema_free(lr_schema *s)
{
    if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (size_t i = 0; i < s->n_nodes; i++) {
        node *n = s->nodes[i];
        if (n->has_re)
            regfree(&n->re);
        free(n->where);
        free(n->props);
        free(n->order);
        free(n->req);
        free(n->any_of);
        free(n);
    }
    free(s->nodes);
    cJSON_Delete(s->doc);
    free(s);
}

/* Compile doc, which the schema takes (freed with it, or now on failure). */
static lr_schema *compile_owned(cJSON *doc, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    lr_schema *s = calloc(1, sizeof *s);
    cctx cx = { s, err, errlen, 0 };
    if (!s) {
        cJSON_Delete(doc);
        cfail(&cx, "out of memory");
        return NULL;
    }
    atomic_init(&s->refs, 1);
    s->doc = doc;
    s->root = compile_node(&cx, s->doc, "$", 0);
    if (s->root && resolve_refs(&cx) == 0) {
        for (size_t i = 0; i < s->n_nodes && !cx.failed; i++)
            no_progress_cycle(&cx, s->nodes[i]);
    }
    if (!s->root || cx.failed) {
        if (!cx.failed)
            cfail(&cx, "out of memory");
        lr_schema_free(s);
        return NULL;
    }
    return s;
}

lr_schema *lr_schema_compile(const cJSON *schema, char *err, size_t errlen)
{
    cJSON *doc = schema ? cJSON_Duplicate(schema, 1) : NULL;
    if (!doc) {
        if (err && errlen)
            snprintf(err, errlen, schema ? "out of memory" : "no schema");
        return NULL;
    }
    return compile_owned(doc, err, errlen);
}

lr_schema *lr_schema_compile_text(const char *json, size_t len, char *err, size_t errlen)
{
    cJSON *doc = json ? cJSON_ParseWithLength(json, len) : NULL;
    if (!doc) {
        if (err && errlen)
            snprintf(err, errlen, "schema is not valid JSON");
        return NULL;
    }
    return compile_owned(doc, err, errlen);
}
