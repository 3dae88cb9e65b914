/* The Engine type: an engine of the core, one call run to completion with
 * its mailbox (events, validation: mailbox.c) delivered on the calling
 * thread, the GIL released while it waits (Ctrl-C within 50 ms). */
#include "binding.h"
#include "results.h"

#include <cjson/cJSON.h>

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- Engine -------------------------------------------------------------- */


static int Engine_init(EngineObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "max_in_flight", "max_host_connections", "shared", "io_loop",
                              NULL };
    int max_in_flight = 256, max_host_connections = 0;
    const char *shared = NULL, *io_loop = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iizz:Engine", kwlist, &max_in_flight,
                                     &max_host_connections, &shared, &io_loop))
        return -1;
    int loop = LLMRETRY_IO_LOOP_PERFORM;
    if (io_loop && strcmp(io_loop, "events") == 0)
        loop = LLMRETRY_IO_LOOP_EVENTS;
    else if (io_loop && strcmp(io_loop, "perform") != 0) {
        PyErr_Format(PyExc_ValueError, "io_loop must be 'perform' or 'events', not '%s'",
                     io_loop);
        return -1;
    }
    if (self->engine) {
        PyErr_SetString(PyExc_RuntimeError, "Engine is already initialised");
        return -1;
    }
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    eo.max_in_flight = max_in_flight;
    eo.max_host_connections = max_host_connections;
    eo.shared = shared;
    eo.io_loop = loop;
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_engine *e = NULL;
    llmretry_status st = llmretry_engine_new(&eo, &e, err, sizeof err);
    if (st != LLMRETRY_OK) {
        PyErr_SetString(st == LLMRETRY_EINVAL ? PyExc_ValueError : PyExc_RuntimeError, err);
        return -1;
    }
    pthread_mutex_lock(&self->mu);
    self->engine = e;
    self->fork_gen = llmretry_fork_generation();
    pthread_mutex_unlock(&self->mu);
    return 0;
}

static PyObject *Engine_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    EngineObject *self = (EngineObject *)type->tp_alloc(type, 0);
    if (self) {
        pthread_mutex_init(&self->mu, NULL);
        self->engine = NULL;
    }
    return (PyObject *)self;
}

static void engine_close(EngineObject *self)
{
    if (self->engine && llmretry_fork_generation() != self->fork_gen) {
        /* A forked child: the engine, its thread and even the state of our
         * lock are the parent's. Forget it; never touch it. */
        self->engine = NULL;
        return;
    }
    pthread_mutex_lock(&self->mu);
    llmretry_engine *e = self->engine;
    self->engine = NULL;
    pthread_mutex_unlock(&self->mu);
    if (e) {
        /* Joining the I/O thread can take a moment: let others run. */
        Py_BEGIN_ALLOW_THREADS
        llmretry_engine_free(e);
        Py_END_ALLOW_THREADS
    }
}

static PyObject *Engine_close(EngineObject *self, PyObject *unused)
{
    (void)unused;
    engine_close(self);
    Py_RETURN_NONE;
}

static PyObject *Engine_closed(EngineObject *self, void *unused)
{
    (void)unused;
    pthread_mutex_lock(&self->mu);
    int closed = self->engine == NULL;
    pthread_mutex_unlock(&self->mu);
    return PyBool_FromLong(closed);
}

static void Engine_dealloc(EngineObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    engine_close(self);
    pthread_mutex_destroy(&self->mu);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* After a wait: 0 to go on, -1 when Ctrl-C (or a stopping pool) must end
 * the wait, with the Python error set. */
int check_interrupts(void)
{
    if (PyErr_CheckSignals() < 0)
        return -1;
    lr_pool *pool = lr_pool_current();
    if (pool && lr_pool_stopping(pool)) {
        PyErr_SetString(lr_pool_stop_type(pool), "the pool is stopping");
        return -1;
    }
    return 0;
}

/* A finished call's value: with as_result, the package's Result for a
 * success it can build (no validator: its verdict and parse belong to the
 * package); else the outcome dict. NULL with an exception set on failure. */
PyObject *call_value(const module_state *st, const llmretry_result *r,
                            PyObject *validate, int as_result)
{
    PyObject *v = NULL;
    int built = as_result && validate == Py_None ? lr_build_result(st, r, &v) : 0;
    return built == 0 ? lr_py_outcome(st, r) : v;
}

/* Wait for the call, delivering its mail on this thread. Returns its value
 * (call_value), or NULL with an exception set (the call is then cancelled). */
static PyObject *wait_call(llmretry_call *c, const mail_route *rt, int as_result)
{
    int reported = 0;
    for (;;) {
        int rc = lr_py_read_mail(c, rt, &reported, NULL);
        if (rc == LR_PY_MAIL_DONE)
            return call_value(rt->st, llmretry_call_result(c), rt->validate, as_result);
        if (rc < 0)
            break;
        Py_BEGIN_ALLOW_THREADS
        llmretry_call_wait(c, WAKE_MS);
        Py_END_ALLOW_THREADS
        if (check_interrupts() < 0)
            break;
    }
    llmretry_call_cancel(c);
    return NULL;
}

/* Submit converted arguments on this engine (inside a batch pool: under
 * its deadline and pacer). The call, or NULL with the Python error set. */
llmretry_call *engine_submit(EngineObject *self, call_args *a)
{
    lr_pool *pool = lr_pool_current();
    if (pool) {
        /* In a batch pool: no call outlives the batch's deadline. */
        int64_t left = lr_pool_deadline_left(pool);
        if (left != LLMRETRY_NO_DEADLINE &&
            (a->o.deadline_ms == LLMRETRY_NO_DEADLINE || a->o.deadline_ms > left))
            a->o.deadline_ms = left;
    }
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_call *c = NULL;
    llmretry_status st = LLMRETRY_ESTATE;
    pthread_mutex_lock(&self->mu);
    if (self->engine) {
        /* A pool's calls pass its group's pacer on the engine thread. */
        if (pool)
            a->o.group = lr_pool_group(pool, self->engine);
        st = llmretry_engine_submit(self->engine, &a->o, 0, &c, err, sizeof err);
    } else {
        snprintf(err, sizeof err, "the engine is closed");
    }
    pthread_mutex_unlock(&self->mu);
    if (st != LLMRETRY_OK) {
        PyErr_SetString(st == LLMRETRY_EINVAL ? PyExc_ValueError
                        : st == LLMRETRY_ENOMEM ? PyExc_MemoryError : PyExc_RuntimeError, err);
        return NULL;
    }
    return c;
}

static PyObject *Engine_call(EngineObject *self, PyObject *args, PyObject *kw)
{
    call_args a;
    memset(&a, 0, sizeof a);
    PyObject *on_event, *validate;
    if (parse_call_args(args, kw, &a, &on_event, &validate) < 0) {
        call_args_release(&a);
        return NULL;
    }
    const module_state *mst = lr_py_state_of(PyType_GetModule(Py_TYPE(self)));
    mail_route rt = { on_event, a.o.events, mst, validate };
    llmretry_call *c = engine_submit(self, &a);
    int as_result = a.as_result;
    call_args_release(&a);
    if (!c)
        return NULL;
    /* Keep the callables alive while Python code may drop its references. */
    Py_INCREF(on_event);
    Py_INCREF(validate);
    PyObject *r = wait_call(c, &rt, as_result);
    Py_DECREF(on_event);
    Py_DECREF(validate);
    llmretry_call_free(c);
    return r;
}

/* What the engine knows of each endpoint: a list of dicts (the core's
 * endpoint shape). Their URLs live until the engine is freed: the dicts
 * are made under the lock. */
static PyObject *Engine_endpoint_stats(EngineObject *self, PyObject *unused)
{
    (void)unused;
    const module_state *mst = lr_py_state_of(PyType_GetModule(Py_TYPE(self)));
    llmretry_endpoint_stats stats[256];        /* the engine tracks at most 256 */
    pthread_mutex_lock(&self->mu);
    size_t n = self->engine ? llmretry_engine_endpoint_stats(self->engine, stats, 256) : 0;
    if (n > 256)
        n = 256;
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *d = lr_py_shape_dict(mst, LLMRETRY_SHAPE_ENDPOINT, &stats[i]);
        if (!d)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    pthread_mutex_unlock(&self->mu);
    return list;
}

static PyMethodDef Engine_methods[] = {
    { "endpoint_stats", (PyCFunction)Engine_endpoint_stats, METH_NOARGS,
      "endpoint_stats() -> list[dict]: each endpoint's requests, retries, retry budget,\n"
      "circuit breaker and rate limits (see _llmretry.pyi)." },
    { "stream", (PyCFunction)(void (*)(void))lr_engine_stream, METH_VARARGS | METH_KEYWORDS,
      "stream(body, **options) -> Call: start a streaming call (see _llmretry.pyi)." },
    { "call", (PyCFunction)(void (*)(void))Engine_call, METH_VARARGS | METH_KEYWORDS,
      "call(body, **options) -> dict: run one call to completion (see _llmretry.pyi)." },
    { "call_many", (PyCFunction)(void (*)(void))Engine_call_many, METH_VARARGS | METH_KEYWORDS,
      "call_many(bodies, *, models=None, limit=8, batch_deadline_ms=None, adaptive=True,\n"
      "          on_result=None, results=None, keep_results=True, stats=None, **options)\n"
      "          -> list | None: a batch on the engine thread (see _llmretry.pyi)." },
    { "batch", (PyCFunction)(void (*)(void))Engine_batch, METH_VARARGS | METH_KEYWORDS,
      "batch(bodies, **call_many's keywords) -> BatchRun: call_many without the wait,\n"
      "for an event loop (step() when fileno() is readable)." },
    { "channel", (PyCFunction)lr_engine_channel, METH_NOARGS,
      "channel() -> Channel: one event loop's view of this engine." },
    { "group", (PyCFunction)(void (*)(void))lr_engine_group, METH_VARARGS | METH_KEYWORDS,
      "group(limit, deadline_ms=None, adaptive=True) -> Group: a batch pacer for\n"
      "Channel.call(..., group=)." },
    { "close", (PyCFunction)Engine_close, METH_NOARGS,
      "close(): cancel calls in flight and stop the I/O thread. Idempotent." },
    { NULL, NULL, 0, NULL },
};

static PyGetSetDef Engine_getset[] = {
    { "closed", (getter)Engine_closed, NULL, "True once close() has run.", NULL },
    { NULL, NULL, NULL, NULL, NULL },
};

static PyType_Slot Engine_slots[] = {
    { Py_tp_new, Engine_new },
    { Py_tp_init, Engine_init },
    { Py_tp_dealloc, Engine_dealloc },
    { Py_tp_methods, Engine_methods },
    { Py_tp_getset, Engine_getset },
    { Py_tp_doc, "Engine(max_in_flight=256, max_host_connections=0, shared=None, io_loop='perform'): an I/O thread and its "
                 "connection cache." },
    { 0, NULL },
};

PyType_Spec Engine_spec = {
    .name = "llmretry._llmretry.Engine",
    .basicsize = sizeof(EngineObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Engine_slots,
};
