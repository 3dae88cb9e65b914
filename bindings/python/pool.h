/* The run_pool thread pool of llmretry._llmretry, and what Engine.call
 * needs to know about the pool it may be running in. */
#ifndef LLMRETRY_PY_POOL_H
#define LLMRETRY_PY_POOL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "llmretry.h"

/* How often a waiting thread wakes to run signal handlers. */
#define WAKE_MS 50

/* Keys made once (building a dict per call from C strings would create
 * and hash every key again each time): an outcome's own three and the two
 * a batch's bodies are read for (batch_encode.c) here, the fields of the
 * core's shapes in module_state.shape_keys (shapes.c). */
#define OUTCOME_KEYS(X) X(ok) X(body) X(headers) X(model) X(stream)
#define KEY_ENUM(name) K_##name,
enum { OUTCOME_KEYS(KEY_ENUM) K_COUNT };
#undef KEY_ENUM

#define LR_RESULT_FIELDS 2          /* Result: data, _meta */
#define LR_SHAPE_MAX_FIELDS 24      /* the most fields of a core shape (checked) */

typedef struct {
    PyTypeObject *engine_type;
    PyTypeObject *call_type;        /* call_type.c */
    PyTypeObject *channel_type, *group_type;   /* channel_type.c */
    PyTypeObject *batch_run_type;   /* batch.c */
    PyTypeObject *lazy_meta_type;   /* results.c */
    PyObject *pool_stop;            /* the PoolStop exception class */
    PyObject *not_started;          /* the NOT_STARTED sentinel */
    PyObject *keys[K_COUNT];        /* interned outcome keys */
    /* Each shape's field names, interned, in the core's order. */
    PyObject *shape_keys[LLMRETRY_SHAPE_COUNT][LR_SHAPE_MAX_FIELDS];
    /* What lr_build_result needs (results.c); NULL until registered. */
    PyTypeObject *result_type, *meta_type;
    PyObject *result_fields[LR_RESULT_FIELDS];  /* Result's slot descriptors */
    PyObject *meta_fields[LR_SHAPE_MAX_FIELDS]; /* Meta's, in the core's meta order */
    PyObject *scan_once;            /* json's scanner: (text, index) -> (value, end) */
    PyObject *parse;                /* the package's parser, for what scan_once refuses */
    struct lr_key_cache *key_cache; /* json_decode.c: object keys kept across bodies */
} module_state;

typedef struct lr_pool lr_pool;

/* The pool whose worker this thread is running, or NULL. */
lr_pool *lr_pool_current(void);
int lr_pool_stopping(lr_pool *p);
PyObject *lr_pool_stop_type(lr_pool *p);
/* Time left before the pool's deadline (LLMRETRY_NO_DEADLINE when none). */
int64_t lr_pool_deadline_left(lr_pool *p);
/* The pool's group on engine `e`, made on first use: a worker's call is
 * submitted into it, so the engine paces the pool (NULL: out of memory). */
llmretry_group *lr_pool_group(lr_pool *p, llmretry_engine *e);

PyObject *lr_run_pool(PyObject *module, PyObject *args, PyObject *kw);

#endif
