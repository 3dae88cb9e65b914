/* llmretry/shapes.h — every structure the core hands to hosts, described
 * field by field: a result's meta and error, a stream's progress, token
 * usage, a fallback target's report, an endpoint's and a group's stats.
 * Part of the public API: include <llmretry.h>, which includes every part.
 *
 * Bindings walk these tables to build their host maps (one generic
 * marshaller each, as for events: llmretry/events.h), and generate their
 * typed surfaces from them (tools/gen_surface.py), so no binding keeps a
 * list of fields of its own. */
#ifndef LLMRETRY_SHAPES_H
#define LLMRETRY_SHAPES_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/result.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The type of one field's value. */
typedef enum llmretry_field_type {
    LLMRETRY_FIELD_NULL = 0,       /* no value (null, None, nil) */
    LLMRETRY_FIELD_INT,            /* i */
    LLMRETRY_FIELD_STRING,         /* s, NUL-terminated */
    LLMRETRY_FIELD_USAGE,          /* usage: an object of LLMRETRY_SHAPE_USAGE */
    LLMRETRY_FIELD_BOOL,           /* i is 0 or 1 */
    LLMRETRY_FIELD_LIST,           /* list.n objects of shape list.shape */
    LLMRETRY_FIELD_JSON            /* s: JSON text of a list of objects of strings */
} llmretry_field_type;

/* One field of an event or a shape, with its value. Strings and lists are
 * borrowed from the object read (valid as long as it is). */
typedef struct llmretry_field {
    const char *name;
    llmretry_field_type type;
    int64_t i;
    const char *s;
    const llmretry_usage *usage;
    struct {
        int shape;                 /* an llmretry_shape */
        const void *items;         /* the first object */
        size_t size, n;            /* each object's size in bytes; how many */
    } list;
} llmretry_field;

typedef enum llmretry_shape {
    LLMRETRY_SHAPE_META = 0,       /* llmretry_result of a success: its meta */
    LLMRETRY_SHAPE_ERROR,          /* llmretry_result of a failure: its error */
    LLMRETRY_SHAPE_STREAM,         /* llmretry_result of a failed stream (result.stream) */
    LLMRETRY_SHAPE_USAGE,          /* llmretry_usage (present) */
    LLMRETRY_SHAPE_TARGET,         /* llmretry_target_report */
    LLMRETRY_SHAPE_ENDPOINT,       /* llmretry_endpoint_stats */
    LLMRETRY_SHAPE_GROUP           /* llmretry_group_stats */
} llmretry_shape;
#define LLMRETRY_SHAPE_COUNT 7

/* What a field is, without a value: for code generators and for hosts
 * that prepare their keys once. */
typedef struct llmretry_field_info {
    const char *name;
    llmretry_field_type type;      /* of its values (LIST: of list_shape objects) */
    int nullable;                  /* 1: it may also be LLMRETRY_FIELD_NULL */
    int list_shape;                /* LIST: the llmretry_shape of its items */
    const char *doc;               /* one line: what it says */
} llmretry_field_info;

/* "meta", "error", "stream", "usage", "target", "endpoint", "group";
 * NULL past the last. */
const char *llmretry_shape_name(llmretry_shape s);
size_t llmretry_shape_field_count(llmretry_shape s);
/* Field `i` of shape `s`, in a fixed order; NULL past the end. */
const llmretry_field_info *llmretry_shape_field_info(llmretry_shape s, size_t i);
/* Fill `out` with field `i` of `obj`, an object of shape `s` (a NULL
 * value has type LLMRETRY_FIELD_NULL); 0 on success, -1 past the end. */
int llmretry_shape_field(llmretry_shape s, const void *obj, size_t i, llmretry_field *out);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_SHAPES_H */
