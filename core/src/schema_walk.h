/* schema_walk.h — the walk over JSON text that schema_text.c validates in
 * place: where it stands (a mark to go back to), and reading a value again
 * to compare it (enum, const) or to skip it (schema_walk.c). */
#ifndef LLMRETRY_SCHEMA_WALK_H
#define LLMRETRY_SCHEMA_WALK_H

#include "json_pull.h"
#include "schema_check.h"
#pragma GCC visibility push(hidden)

typedef struct walk {
    lr_jp j;
    int not_json;                  /* the text is not JSON: everything stops */
} walk;

/* A place to go back to: a value's start. */
typedef struct mark {
    const char *p;
    int depth;
} mark;

static inline mark here(const walk *w)
{
    return (mark){ w->j.p, w->j.depth };
}

static inline void back(walk *w, mark m)
{
    w->j.p = m.p;
    w->j.depth = m.depth;
}

static inline int not_json(walk *w)
{
    w->not_json = 1;
    return 1;
}

/* A scalar read from the text. */
typedef struct scalar {
    unsigned type;                 /* T_* bits */
    double num;
    int truth;
    lr_jp_str str;
} scalar;

/* The value at m, read to its end unchecked. */
void lr_walk_skip_from(walk *w, mark m);

/* A string's value into buf (cap bytes) or a malloc'd buffer when longer:
 * NULL when out of memory. Free it when it is not buf. */
char *lr_walk_string_value(const lr_jp_str *s, char *buf, size_t cap);

/* Does the scalar equal x (enum and const), as cJSON_Compare says? Its own
 * function, out of check()'s frame (buffers of its own: check() recurses
 * per level of the value). */
int lr_walk_scalar_equals(const scalar *sc, const cJSON *x, int *oom);

/* Does the container at m equal x? Leaves the walk at m. */
int lr_walk_container_equals(walk *w, mark m, const cJSON *x, int *oom);

#pragma GCC visibility pop
#endif
