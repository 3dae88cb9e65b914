/* The run_pool thread pool of llmretry._llmretry, and what Engine.call
 * needs to know about the pool it may be running in. */
#ifndef LLMRETRY_PY_POOL_H
#define LLMRETRY_PY_POOL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "llmretry.h"

/* How often a waiting thread wakes to run signal handlers. */
#define WAKE_MS 50

typedef struct {
    PyTypeObject *engine_type;
    PyObject *pool_stop;            /* the PoolStop exception class */
    PyObject *not_started;          /* the NOT_STARTED sentinel */
} module_state;

typedef struct lr_pool lr_pool;

/* The pool whose worker this thread is running, or NULL. */
lr_pool *lr_pool_current(void);
int lr_pool_stopping(lr_pool *p);
PyObject *lr_pool_stop_type(lr_pool *p);
/* Time left before the pool's deadline (LLMRETRY_NO_DEADLINE when none). */
int64_t lr_pool_deadline_left(lr_pool *p);
/* The events a call must produce for the pool to see 429s and successes. */
#define LR_POOL_EVENTS ((1u << LLMRETRY_EV_REQUEST_FAILED) | \
                        (1u << LLMRETRY_EV_RETRY_SCHEDULED) | \
                        (1u << LLMRETRY_EV_REQUEST_SUCCEEDED) | \
                        (1u << LLMRETRY_EV_REQUEST_GAVE_UP))
/* Tell the pool's pacer about an event of a call made in a worker;
 * last_status is the status of the call's last llm_request_failed. */
void lr_pool_observe(lr_pool *p, const llmretry_event *ev, int last_status);

PyObject *lr_run_pool(PyObject *module, PyObject *args, PyObject *kw);

#endif
