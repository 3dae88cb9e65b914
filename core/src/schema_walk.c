/* Reading a value of the text again (schema_walk.h): to skip it, to take a
 * string's value, to compare a scalar or a container with an enum's or a
 * const's value (as cJSON_Compare says: the tree validator's answer). */
#include "schema_walk.h"

#include <stdlib.h>
#include <string.h>

/* The value at m, read to its end unchecked. */
void lr_walk_skip_from(walk *w, mark m)
{
    back(w, m);
    if (lr_jp_skip(&w->j) != 0)
        not_json(w);
}

/* A string's value into buf (cap bytes) or a malloc'd buffer when longer:
 * NULL when out of memory. Free it when it is not buf. */
char *lr_walk_string_value(const lr_jp_str *s, char *buf, size_t cap)
{
    size_t n = lr_jp_decode(s, buf, cap);
    if (n < cap)
        return buf;
    char *big = malloc(n + 1);
    if (big)
        lr_jp_decode(s, big, n + 1);
    return big;
}



/* Does the scalar equal x (enum and const), as cJSON_Compare says? The
 * scalar is made a cJSON value on the stack, so the answer is cJSON's. */
int lr_walk_scalar_equals(const scalar *sc, const cJSON *x, int *oom)
{
    cJSON tmp;
    memset(&tmp, 0, sizeof tmp);
    char buf[256], *s = NULL;
    if (sc->type & T_NUM) {
        tmp.type = cJSON_Number;
        tmp.valuedouble = sc->num;
        /* valueint as cJSON's parser sets it (some versions compare it). */
        tmp.valueint = sc->num >= 2147483647.0 ? 2147483647
                     : sc->num <= -2147483648.0 ? (-2147483647 - 1) : (int)sc->num;
    } else if (sc->type == T_STR) {
        if (!cJSON_IsString(x))
            return 0;
        if (!sc->str.escaped)      /* its text is its value: no copy */
            return strlen(x->valuestring) == sc->str.len &&
                   memcmp(x->valuestring, sc->str.raw, sc->str.len) == 0;
        if (!(s = lr_walk_string_value(&sc->str, buf, sizeof buf))) {
            *oom = 1;
            return 0;
        }
        tmp.type = cJSON_String;
        tmp.valuestring = s;
    } else if (sc->type == T_BOOL) {
        tmp.type = sc->truth ? cJSON_True : cJSON_False;
    } else {
        tmp.type = cJSON_NULL;
    }
    int same = cJSON_Compare(x, &tmp, 1);
    if (s && s != buf)
        free(s);
    return same;
}

/* Does the container at m equal x? It is read as a tree for that (enum and
 * const of an array or object are rare). Leaves the walk at m. */
int lr_walk_container_equals(walk *w, mark m, const cJSON *x, int *oom)
{
    if (!cJSON_IsArray(x) && !cJSON_IsObject(x))
        return 0;
    lr_walk_skip_from(w, m);
    if (w->not_json)
        return 0;
    cJSON *tree = cJSON_ParseWithLength(m.p, (size_t)(w->j.p - m.p));
    back(w, m);
    if (!tree) {
        /* Text cJSON cannot read (a number past its 63 characters) is
         * equal to nothing, as the tree validator never saw it. */
        return 0;
    }
    (void)oom;
    int same = cJSON_Compare(x, tree, 1);
    cJSON_Delete(tree);
    return same;
}
