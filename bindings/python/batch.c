/* Engine.call_many: a batch on the engine thread, one group, results filled
 * in place as items finish (or handed to on_result only), totals summed in
 * C. The items come from sequences or, read lazily, from an iterator
 * (batch_items.c). */
#include "batch.h"
#include "results.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- call_many: a batch on the engine thread ------------------------------ */

/* Pop a keyword from kw (a dict we own), or return dflt (borrowed). */
static PyObject *pop_kw(PyObject *kw, const char *name, PyObject *dflt)
{
    PyObject *v = kw ? PyDict_GetItemString(kw, name) : NULL;
    if (!v)
        return dflt;
    Py_INCREF(v);
    PyDict_DelItemString(kw, name);
    Py_DECREF(v);                   /* the caller's dict still holds it */
    return v;
}

/* ---- BatchRun: one batch, stepped by its host ------------------------------ */

/* A batch in progress: its items, its group (one reader: group poll 1), the
 * results filled in place and the totals. step() does what can be done now
 * without waiting: Engine.call_many loops over it, waiting on fileno() with
 * the GIL released; an event loop calls it when fileno() is readable. */
typedef struct {
    PyObject_HEAD
    EngineObject *engine;           /* strong */
    PyObject *kw;                   /* our copy: what call_args borrows from */
    batch b;
    batch_totals totals;
    call_args a;
    mail_route rt;
    PyObject *on_event, *validate;  /* borrowed from kw */
    PyObject *on_result, *stats;    /* strong (Py_None when not given) */
    PyObject *results;              /* strong; Py_None: values go to on_result only */
    llmretry_group *g;
    Py_ssize_t ahead;
    int closed;
} BatchRunObject;

/* The totals into stats, the unfinished calls cancelled, the group freed.
 * Idempotent; keeps a pending exception (the first error wins). */
static int batch_run_close(BatchRunObject *r)
{
    if (r->closed)
        return 0;
    r->closed = 1;
    int bad = 0;
    if (r->stats != Py_None && r->g) {
        /* Also after Ctrl-C: the summary counts what ran. */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        bad = lr_batch_put_stats(r->rt.st, r->stats, r->g, &r->totals) < 0;
        if (et) {
            PyErr_Restore(et, ev, tb);
            bad = 0;
        }
    }
    if (r->b.slots) {
        lr_batch_cancel_all(&r->b);
        PyMem_Free(r->b.slots);
        r->b.slots = NULL;
    }
    PyMem_Free(r->b.free);
    r->b.free = NULL;
    r->b.cap = r->b.nfree = 0;
    llmretry_group_free(r->g);
    r->g = NULL;
    call_args_release(&r->a);
    return bad ? -1 : 0;
}

static void BatchRun_dealloc(BatchRunObject *r)
{
    PyTypeObject *tp = Py_TYPE(r);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (batch_run_close(r) < 0)
        PyErr_WriteUnraisable((PyObject *)r);
    PyErr_Restore(et, ev, tb);
    Py_XDECREF(r->b.bodies);
    Py_XDECREF(r->b.models);
    Py_XDECREF(r->b.keys);
    Py_XDECREF(r->b.tokens);
    Py_XDECREF(r->b.item_headers);
    Py_XDECREF(r->b.iter);
    Py_XDECREF(r->results);
    Py_XDECREF(r->on_result);
    Py_XDECREF(r->stats);
    Py_XDECREF(r->kw);
    Py_XDECREF(r->engine);
    tp->tp_free((PyObject *)r);
    Py_DECREF(tp);
}

/* Parse call_many's arguments into a new BatchRun (nothing submitted yet). */
static BatchRunObject *batch_run_new(EngineObject *self, PyObject *args, PyObject *kw_in)
{
    PyObject *bodies_arg;
    if (!PyArg_ParseTuple(args, "O:call_many", &bodies_arg))
        return NULL;
    const module_state *mst = lr_py_state_of(PyType_GetModule(Py_TYPE(self)));
    PyTypeObject *type = mst->batch_run_type;
    BatchRunObject *r = (BatchRunObject *)type->tp_alloc(type, 0);
    if (!r)
        return NULL;
    r->engine = (EngineObject *)Py_NewRef(self);
    r->on_event = r->validate = Py_None;
    r->on_result = Py_NewRef(Py_None);
    r->stats = Py_NewRef(Py_None);
    PyObject *kw = r->kw = kw_in ? PyDict_Copy(kw_in) : PyDict_New();
    if (!kw)
        goto fail;
    PyObject *models_arg = pop_kw(kw, "models", Py_None);
    PyObject *keys_arg = pop_kw(kw, "idempotency_keys", Py_None);
    PyObject *tokens_arg = pop_kw(kw, "estimated_tokens", Py_None);
    PyObject *item_headers_arg = pop_kw(kw, "item_headers", Py_None);
    PyObject *limit_arg = pop_kw(kw, "limit", NULL);
    PyObject *deadline_arg = pop_kw(kw, "batch_deadline_ms", Py_None);
    PyObject *adaptive_arg = pop_kw(kw, "adaptive", Py_True);
    PyObject *on_result = pop_kw(kw, "on_result", Py_None);
    PyObject *results_arg = pop_kw(kw, "results", Py_None);
    PyObject *stats_arg = pop_kw(kw, "stats", Py_None);
    PyObject *keep_arg = pop_kw(kw, "keep_results", Py_True);
    /* pop_kw hands back borrowed values the caller's dict still holds: own
     * the ones kept past this call. */
    Py_SETREF(r->on_result, Py_NewRef(on_result));
    Py_SETREF(r->stats, Py_NewRef(stats_arg));

    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    if (limit_arg) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(limit_arg, &overflow);
        if (v == -1 && PyErr_Occurred())
            goto fail;
        if (overflow || v < 1 || v > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "limit must be between 1 and %d", INT_MAX);
            goto fail;
        }
        go.limit = (int)v;
    }
    if (deadline_arg != Py_None) {
        int overflow = 0;
        go.deadline_ms = PyLong_AsLongLongAndOverflow(deadline_arg, &overflow);
        if (go.deadline_ms == -1 && PyErr_Occurred())
            goto fail;
        if (overflow) {
            PyErr_SetString(PyExc_ValueError, "batch_deadline_ms is out of range (at most 2**63-1)");
            goto fail;
        }
        if (go.deadline_ms < 0) {
            PyErr_Format(PyExc_ValueError, "batch_deadline_ms must be >= 0 or None (got %lld)",
                         (long long)go.deadline_ms);
            goto fail;
        }
    }
    go.adaptive = PyObject_IsTrue(adaptive_arg);
    if (on_result != Py_None && !PyCallable_Check(on_result)) {
        PyErr_SetString(PyExc_TypeError, "on_result must be callable or None");
        goto fail;
    }
    if (stats_arg != Py_None && !PyDict_Check(stats_arg)) {
        PyErr_SetString(PyExc_TypeError, "stats must be a dict or None");
        goto fail;
    }
    if (item_headers_arg != Py_None) {
        if (!PyCallable_Check(item_headers_arg)) {
            PyErr_SetString(PyExc_TypeError, "item_headers must be callable or None");
            goto fail;
        }
        r->b.item_headers = Py_NewRef(item_headers_arg);
    }
    PyObject *empty = Py_BuildValue("(y)", "");
    if (!empty)
        goto fail;
    int bad = parse_call_args(empty, kw, &r->a, &r->on_event, &r->validate);
    Py_DECREF(empty);
    if (bad < 0)
        goto fail;
    if (check_shared_args(&r->a) < 0)
        goto fail;
    int keep = PyObject_IsTrue(keep_arg);
    if (keep < 0)
        goto fail;
    batch *b = &r->b;
    if (!PyList_Check(bodies_arg) && !PyTuple_Check(bodies_arg)) {
        /* An iterator of (index, body, model, key): read as the pacer
         * wants more; each item checked as it comes. */
        if (models_arg != Py_None || keys_arg != Py_None || tokens_arg != Py_None ||
            results_arg != Py_None || keep) {
            PyErr_SetString(PyExc_TypeError, "a batch from an iterator takes no models, "
                            "idempotency_keys, estimated_tokens or results, and needs "
                            "keep_results=False");
            goto fail;
        }
        if (!(b->iter = PyObject_GetIter(bodies_arg)))
            goto fail;
        r->results = Py_NewRef(Py_None);
    } else {
        if (!(b->bodies = PySequence_Fast(bodies_arg, "bodies must be a sequence of bytes")))
            goto fail;
        b->n = PySequence_Fast_GET_SIZE(b->bodies);
        b->exhausted = b->n == 0;
        if (models_arg != Py_None) {
            if (!(b->models = PySequence_Fast(models_arg, "models must be a sequence")))
                goto fail;
            if (PySequence_Fast_GET_SIZE(b->models) != b->n) {
                PyErr_SetString(PyExc_ValueError, "models must be as long as bodies");
                goto fail;
            }
        }
        if (keys_arg != Py_None) {
            /* One key per item: each item is its own call (all its attempts). */
            if (!(b->keys = PySequence_Fast(keys_arg, "idempotency_keys must be a sequence")))
                goto fail;
            if (PySequence_Fast_GET_SIZE(b->keys) != b->n) {
                PyErr_SetString(PyExc_ValueError, "idempotency_keys must be as long as bodies");
                goto fail;
            }
        }
        if (tokens_arg != Py_None) {
            if (!(b->tokens = PySequence_Fast(tokens_arg, "estimated_tokens must be a sequence")))
                goto fail;
            if (PySequence_Fast_GET_SIZE(b->tokens) != b->n) {
                PyErr_SetString(PyExc_ValueError, "estimated_tokens must be as long as bodies");
                goto fail;
            }
        }
        if (lr_batch_check(b) < 0)
            goto fail;
        if (results_arg != Py_None) {
            /* The caller's list, filled in place: what finished before a Ctrl-C
             * stays there for the batch's record. */
            if (!PyList_Check(results_arg) || PyList_GET_SIZE(results_arg) != b->n) {
                PyErr_SetString(PyExc_ValueError, "results must be a list as long as bodies");
                goto fail;
            }
            r->results = Py_NewRef(results_arg);
        } else if (!keep) {
            r->results = Py_NewRef(Py_None);
        } else if (!(r->results = PyList_New(b->n))) {
            goto fail;
        }
    }
    char err[LLMRETRY_ERRBUF] = "";
    pthread_mutex_lock(&self->mu);
    llmretry_status st = self->engine ? llmretry_group_new(self->engine, &go, &r->g, err, sizeof err)
                                      : LLMRETRY_ESTATE;
    pthread_mutex_unlock(&self->mu);
    if (st != LLMRETRY_OK) {
        PyErr_SetString(st == LLMRETRY_EINVAL ? PyExc_ValueError : PyExc_RuntimeError,
                        st == LLMRETRY_ESTATE ? "the engine is closed" : err);
        goto fail;
    }
    r->a.o.group = r->g;
    r->rt = (mail_route){ r->on_event, r->a.o.events, mst, r->validate };
    /* Keep the engine's queue ahead of the pacer without holding every
     * call record of a huge batch at once. Not less with item_headers
     * (llmretry.otel's spans, started as items are submitted, live that
     * much longer): measured in issue 34's benchmark, limit + 16 ahead
     * saved the SDK's GC ~5 µs a call and cost the I/O thread, left
     * without queued work between the host's runs, 10-30. */
    r->ahead = 4 * (Py_ssize_t)go.limit + 64;
    if (r->ahead > (Py_ssize_t)1 << 24)
        r->ahead = (Py_ssize_t)1 << 24;     /* a limit beyond any engine's max_in_flight */
    return r;
fail:
    Py_DECREF(r);
    return NULL;
}

/* Do what can be done now: submit ahead of the pacer, take the items that
 * finished. 1 when every item has finished, 0 to wait for fileno(), -1 with
 * the Python error set (an item's value, on_result, a validator). */
static int batch_run_step(BatchRunObject *r)
{
    batch *b = &r->b;
    if (r->closed) {
        PyErr_SetString(PyExc_RuntimeError, "the batch is closed");
        return -1;
    }
    for (;;) {
        if (b->in_flight < r->ahead && lr_batch_submit(r->engine, b, &r->a.o,
                                                       r->ahead - b->in_flight) < 0)
            return -1;
        if (b->exhausted && b->in_flight == 0)
            return 1;
        llmretry_call *ready[64];
        size_t k = llmretry_channel_poll(llmretry_group_channel(r->g), ready, 64);
        if (k == 0)
            return 0;
        for (size_t j = 0; j < k; j++) {
            Py_ssize_t s = (Py_ssize_t)(intptr_t)llmretry_call_user_data(ready[j]);
            Py_ssize_t i = b->slots[s].index;
            int rc = lr_py_read_mail(ready[j], &r->rt, &b->slots[s].logger_reported, NULL);
            if (rc < 0)
                return -1;
            if (rc != LR_PY_MAIL_DONE)
                continue;
            /* A Result, or an outcome dict for the package to turn into
             * an error (call_value). */
            const llmretry_result *res = llmretry_call_result(ready[j]);
            lr_batch_totals_add(&r->totals, res);
            PyObject *d = call_value(r->rt.st, res, r->validate, r->a.as_result);
            llmretry_call_free(ready[j]);
            lr_batch_slot_release(b, s);
            if (!d)
                return -1;
            /* The caller's list may hold None (SetItem drops it). */
            if (r->results != Py_None)
                PyList_SetItem(r->results, i, Py_NewRef(d));
            if (r->on_result != Py_None) {
                PyObject *cr = PyObject_CallFunction(r->on_result, "nO", i, d);
                if (!cr) {
                    Py_DECREF(d);
                    return -1;
                }
                Py_DECREF(cr);
            }
            Py_DECREF(d);
        }
    }
}

static PyObject *BatchRun_step(BatchRunObject *r, PyObject *unused)
{
    (void)unused;
    int rc = batch_run_step(r);
    return rc < 0 ? NULL : PyBool_FromLong(rc);
}

static PyObject *BatchRun_fileno(BatchRunObject *r, PyObject *unused)
{
    (void)unused;
    if (!r->g) {
        PyErr_SetString(PyExc_RuntimeError, "the batch is closed");
        return NULL;
    }
    return PyLong_FromLong(llmretry_channel_fd(llmretry_group_channel(r->g)));
}

static PyObject *BatchRun_close(BatchRunObject *r, PyObject *unused)
{
    (void)unused;
    if (batch_run_close(r) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *BatchRun_results(BatchRunObject *r, void *unused)
{
    (void)unused;
    return Py_NewRef(r->results ? r->results : Py_None);   /* None: not kept */
}

static PyMethodDef BatchRun_methods[] = {
    { "step", (PyCFunction)BatchRun_step, METH_NOARGS,
      "step() -> bool: submit and collect what can be done now; True once every item\n"
      "has finished (wait for fileno() to be readable otherwise)." },
    { "fileno", (PyCFunction)BatchRun_fileno, METH_NOARGS,
      "fileno() -> int: readable while some item has news." },
    { "close", (PyCFunction)BatchRun_close, METH_NOARGS,
      "close(): fill stats, cancel what is unfinished. Idempotent." },
    { NULL, NULL, 0, NULL },
};

static PyGetSetDef BatchRun_getset[] = {
    { "results", (getter)BatchRun_results, NULL, "The values, filled in place.", NULL },
    { NULL, NULL, NULL, NULL, NULL },
};

static PyType_Slot BatchRun_slots[] = {
    { Py_tp_dealloc, BatchRun_dealloc },
    { Py_tp_methods, BatchRun_methods },
    { Py_tp_getset, BatchRun_getset },
    { Py_tp_doc, "A batch in progress (Engine.batch(), as call_many without the wait)." },
    { 0, NULL },
};

PyType_Spec BatchRun_spec = {
    .name = "llmretry._llmretry.BatchRun",
    .basicsize = sizeof(BatchRunObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = BatchRun_slots,
};

PyObject *Engine_batch(EngineObject *self, PyObject *args, PyObject *kw)
{
    return (PyObject *)batch_run_new(self, args, kw);
}

/* call_many: a BatchRun stepped to its end on this thread, waiting with the
 * GIL released (Ctrl-C within WAKE_MS). */
PyObject *Engine_call_many(EngineObject *self, PyObject *args, PyObject *kw)
{
    BatchRunObject *r = batch_run_new(self, args, kw);
    if (!r)
        return NULL;
    int rc;
    while ((rc = batch_run_step(r)) == 0) {
        llmretry_channel *ch = llmretry_group_channel(r->g);
        Py_BEGIN_ALLOW_THREADS
        llmretry_channel_wait(ch, WAKE_MS);
        Py_END_ALLOW_THREADS
        if (check_interrupts() < 0) {
            rc = -1;
            break;
        }
    }
    PyObject *out = rc > 0 ? Py_NewRef(r->results) : NULL;
    if (batch_run_close(r) < 0)
        Py_CLEAR(out);
    Py_DECREF(r);
    return out;
}
