/* schema_tree.h — a compiled schema, shared by the files that make it
 * (schema.c, schema_pattern.c) and walk it (schema_validate.c). Private to
 * them: the rest of the core sees schema.h only. */
#ifndef LLMRETRY_SCHEMA_TREE_H
#define LLMRETRY_SCHEMA_TREE_H

#include "schema.h"

#include <cjson/cJSON.h>
#include <regex.h>
#include <stdatomic.h>
#include <string.h>
#pragma GCC visibility push(hidden)

/* Types as bits; an integral number is a number too. */
enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64 };
static const struct { const char *name; unsigned bit; } TYPES[] = {
    { "object", T_OBJ }, { "array", T_ARR }, { "string", T_STR }, { "integer", T_INT },
    { "number", T_NUM }, { "boolean", T_BOOL }, { "null", T_NULL },
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

enum { HAS_MIN = 1, HAS_MAX = 2, HAS_XMIN = 4, HAS_XMAX = 8, HAS_MULT = 16 };

typedef struct lr_schema_node node;
typedef struct prop {
    const char *name;              /* in the schema's copy */
    size_t name_len;
    size_t src_index;              /* its place in the schema's properties */
    node *schema;
} prop;

typedef struct required {
    const char *name;
    long prop;                     /* its index in props, -1 = not a property */
} required;

struct lr_schema_node {
    const cJSON *src;              /* where it is in the schema's copy */
    char *where;                   /* its path in the schema, for messages */
    int is_false;                  /* the schema false: nothing matches */
    unsigned types;                /* T_* bits; 0 = any */
    prop *props;                   /* sorted by name */
    size_t n_props;
    size_t *order;                 /* props' indexes in the schema's order */
    required *req;
    size_t n_req;
    int closed;                    /* additionalProperties: false */
    node *additional;              /* additionalProperties: a schema */
    node *items;
    const cJSON *enum_vals;        /* an array */
    const cJSON *const_val;        /* NULL = no const */
    node **any_of;
    size_t n_any_of;
    node *ref;
    int ref_only;                  /* $ref and no other check: the value is its target's */
    unsigned has;                  /* HAS_* */
    double min, max, xmin, xmax, mult;
    long long min_items, max_items, min_len, max_len;   /* -1 = none */
    int has_re;
    regex_t re;
    const char *pattern;
    int visiting;                  /* compile: cycle check */
};

struct lr_schema {
    atomic_int refs;               /* lr_schema_ref / lr_schema_free */
    cJSON *doc;
    node **nodes;                  /* every node, owned; also the $ref memo */
    size_t n_nodes, cap;
    node *root;
};

static inline int lr_schema_prop_cmp(const void *a, const void *b)
{
    return strcmp(((const prop *)a)->name, ((const prop *)b)->name);
}

/* pattern (ECMA-262's common subset) compiled as POSIX ERE (schema_pattern.c):
 * 0, or -1 with why (regfree is the caller's only after a 0). */
int lr_schema_pattern_compile(regex_t *re, const char *pattern, char *why, size_t whylen);

#pragma GCC visibility pop
#endif
