/* Engine.call_many: a batch on the engine thread, one group, results filled
 * in place as items finish (or handed to on_result only), totals summed in
 * C. The items come from sequences or, read lazily, from an iterator. */
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

/* A submitted, unfinished call: its item's index (what on_result gets) and
 * its place in the submission order (batch_cancel_all). */
typedef struct {
    llmretry_call *call;            /* NULL: a free slot */
    Py_ssize_t index;
    unsigned long long seq;
    int logger_reported;            /* lr_py_read_mail's: its logger's error reported */
} batch_slot;

/* A batch's items come from sequences (a list or tuple of bodies, checked
 * whole before anything is sent: the fast path) or from an iterator that
 * hands over one (index, body bytes, model, key) tuple at a time, as the
 * pacer wants more (an iterable read lazily: only what is in flight is
 * held). Either way only the calls in flight have a slot: at most `ahead`,
 * whatever the batch's length. */
typedef struct {
    PyObject *bodies, *models, *keys; /* sequences (PySequence_Fast); models, keys optional */
    PyObject *tokens;               /* estimated_tokens per item (ints), optional */
    PyObject *item_headers;         /* item_headers(index) -> header lines or None, optional */
    PyObject *iter;                 /* or: the iterator of tuples */
    Py_ssize_t n;                   /* sequences: their length */
    Py_ssize_t next;                /* sequences: the next to submit */
    int exhausted;                  /* nothing more to submit */
    batch_slot *slots;              /* cap of them; user_data = the slot's number */
    Py_ssize_t *free;               /* the free slots' numbers (a stack) */
    Py_ssize_t cap, nfree, in_flight;
    unsigned long long seq;
} batch;

static int slot_later_first(const void *x, const void *y)
{
    const batch_slot *a = *(batch_slot *const *)x, *b = *(batch_slot *const *)y;
    return a->seq < b->seq ? 1 : a->seq > b->seq ? -1 : 0;
}

/* Last item first: the items still queued in the group (the later ones) are
 * cancelled before a running item's cancel frees a slot that the pacer
 * would give to one of them (the server would see a new request after a
 * Ctrl-C or a cancelled acall_many). */
static void batch_cancel_all(batch *b)
{
    batch_slot **live = PyMem_Malloc((size_t)(b->cap ? b->cap : 1) * sizeof *live);
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < b->cap; i++)
        if (b->slots[i].call) {
            if (live)
                live[k++] = &b->slots[i];
            else {                  /* no memory to sort: cancel in slot order */
                llmretry_call_free(b->slots[i].call);
                b->slots[i].call = NULL;
            }
        }
    if (!live)
        return;
    qsort(live, (size_t)k, sizeof *live, slot_later_first);
    for (Py_ssize_t i = 0; i < k; i++) {
        llmretry_call_free(live[i]->call);     /* cancels when unfinished */
        live[i]->call = NULL;
    }
    PyMem_Free(live);
    b->in_flight = 0;
}

/* A free slot's number, growing the slots (doubling, up to `ahead`); -1
 * with MemoryError set. */
static Py_ssize_t slot_take(batch *b)
{
    if (b->nfree == 0) {
        Py_ssize_t cap = b->cap ? 2 * b->cap : 64;
        batch_slot *s = PyMem_Realloc(b->slots, (size_t)cap * sizeof *s);
        if (!s) {
            PyErr_NoMemory();
            return -1;
        }
        b->slots = s;
        Py_ssize_t *f = PyMem_Realloc(b->free, (size_t)cap * sizeof *f);
        if (!f) {
            PyErr_NoMemory();
            return -1;
        }
        b->free = f;
        for (Py_ssize_t i = cap - 1; i >= b->cap; i--) {
            s[i].call = NULL;
            f[b->nfree++] = i;
        }
        b->cap = cap;
    }
    return b->free[--b->nfree];
}

static void slot_release(batch *b, Py_ssize_t s)
{
    b->slots[s].call = NULL;
    b->free[b->nfree++] = s;
    b->in_flight--;
}

/* What a batch adds up as its items finish, for the batch summary. */
typedef struct {
    long long attempts, retries, resends;
    llmretry_usage tokens;          /* every attempt's, failed calls' too: what is billed */
} batch_totals;

static void totals_add(batch_totals *t, const llmretry_result *r)
{
    t->attempts += r->attempts;
    t->retries += r->attempts > 1 ? r->attempts - 1 : 0;
    t->resends += r->resends;
    if (r->usage_total.present) {
        t->tokens.prompt_tokens += r->usage_total.prompt_tokens;
        t->tokens.completion_tokens += r->usage_total.completion_tokens;
        t->tokens.total_tokens += r->usage_total.total_tokens;
    }
}

/* Fill the caller's stats dict: the group's pacing (the core's group
 * shape), the totals so far and their tokens (its usage shape). */
static int put_stats(const module_state *st, PyObject *stats, llmretry_group *g,
                     const batch_totals *t)
{
    llmretry_group_stats gs = { 0 };
    if (g)
        llmretry_group_stats_get(g, &gs);
    if (lr_py_shape_into(st, stats, LLMRETRY_SHAPE_GROUP, &gs) < 0 ||
        lr_py_shape_into(st, stats, LLMRETRY_SHAPE_USAGE, &t->tokens) < 0)
        return -1;
    const struct { const char *name; long long v; } f[] = {
        { "attempts", t->attempts }, { "retries", t->retries }, { "resends", t->resends },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (lr_py_put(stats, f[i].name, PyLong_FromLongLong(f[i].v)) < 0)
            return -1;
    return 0;
}

/* Check every body before any is sent: a bad one late in a batch must not
 * raise after earlier calls have run. Bodies whose model the host gave
 * were built as JSON by the host; the others the core would parse anyway. */
static int batch_check(batch *b)
{
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *body = PySequence_Fast_GET_ITEM(b->bodies, i);
        if (!PyBytes_Check(body)) {
            PyErr_Format(PyExc_TypeError, "bodies[%zd] must be bytes, not %.100s", i,
                         Py_TYPE(body)->tp_name);
            return -1;
        }
        if (b->keys) {
            PyObject *key = PySequence_Fast_GET_ITEM(b->keys, i);
            if (key != Py_None && !PyUnicode_Check(key)) {
                PyErr_Format(PyExc_TypeError, "idempotency_keys[%zd] must be a str or None", i);
                return -1;
            }
        }
        if (b->models) {
            PyObject *m = PySequence_Fast_GET_ITEM(b->models, i);
            if (m != Py_None) {
                if (!PyUnicode_Check(m)) {
                    PyErr_Format(PyExc_TypeError, "models[%zd] must be a str or None", i);
                    return -1;
                }
                continue;
            }
        }
        cJSON *doc = cJSON_ParseWithLength(PyBytes_AS_STRING(body), (size_t)PyBytes_GET_SIZE(body));
        if (!doc) {
            PyErr_Format(PyExc_ValueError, "bodies[%zd]: body is not valid JSON", i);
            return -1;
        }
        cJSON_Delete(doc);
    }
    return 0;
}

static int batch_submit_with(EngineObject *self, batch *b, llmretry_options *o,
                             Py_ssize_t index, PyObject *body, PyObject *model, PyObject *key,
                             PyObject *tokens);

/* Submit one item (index: what on_result will get; what: how errors name
 * it); 0, or -1 with a Python error set. The core copies what it keeps.
 * With item_headers, the item's requests carry the header lines it gives
 * for that index instead of the batch's (None: the batch's): what a host
 * adds to one item alone (llmretry.otel: the item's span as traceparent),
 * asked for just before the item is submitted. */
static int batch_submit(EngineObject *self, batch *b, llmretry_options *o, Py_ssize_t index,
                        PyObject *body, PyObject *model, PyObject *key, PyObject *tokens)
{
    if (!b->item_headers)
        return batch_submit_with(self, b, o, index, body, model, key, tokens);
    PyObject *k = PyLong_FromSsize_t(index);
    PyObject *given = k ? PyObject_CallOneArg(b->item_headers, k) : NULL;
    Py_XDECREF(k);
    if (!given)
        return -1;
    if (given == Py_None) {
        Py_DECREF(given);
        return batch_submit_with(self, b, o, index, body, model, key, tokens);
    }
    const char *const *batch_lines = o->headers;
    size_t batch_n = o->n_headers;
    PyObject *fast = NULL;
    const char **lines = NULL;
    Py_ssize_t n = lr_py_header_lines(given, "item_headers()", &fast, &lines);
    int rc = -1;
    if (n >= 0) {
        o->headers = lines;
        o->n_headers = (size_t)n;
        rc = batch_submit_with(self, b, o, index, body, model, key, tokens);
        o->headers = batch_lines;
        o->n_headers = batch_n;
    }
    PyMem_Free(lines);
    Py_XDECREF(fast);
    Py_DECREF(given);
    return rc;
}

static int batch_submit_with(EngineObject *self, batch *b, llmretry_options *o,
                             Py_ssize_t index, PyObject *body, PyObject *model, PyObject *key,
                             PyObject *tokens)
{
    /* The host's count of the item's tokens for the tpm budget (0: the
     * core estimates): tiktoken's, when the host has it. */
    o->estimated_tokens = 0;
    if (tokens && tokens != Py_None) {
        long long t = PyLong_AsLongLong(tokens);
        if (t == -1 && PyErr_Occurred())
            return -1;
        o->estimated_tokens = t > 0 ? t : 0;
    }
    o->body = PyBytes_AS_STRING(body);
    o->body_len = (size_t)PyBytes_GET_SIZE(body);
    o->model = NULL;
    if (model && model != Py_None && !(o->model = PyUnicode_AsUTF8(model)))
        return -1;
    o->idempotency_key = NULL;
    if (key && key != Py_None && !(o->idempotency_key = PyUnicode_AsUTF8(key)))
        return -1;
    Py_ssize_t s = slot_take(b);
    if (s < 0)
        return -1;
    o->user_data = (void *)(intptr_t)s;
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = LLMRETRY_ESTATE;
    llmretry_call *call = NULL;
    pthread_mutex_lock(&self->mu);
    if (self->engine)
        st = llmretry_engine_submit(self->engine, o, 0, &call, err, sizeof err);
    else
        snprintf(err, sizeof err, "the engine is closed");
    pthread_mutex_unlock(&self->mu);
    if (st == LLMRETRY_OK) {
        b->slots[s] = (batch_slot){ call, index, b->seq++ };
        b->in_flight++;
        return 0;
    }
    b->free[b->nfree++] = s;
    if (st == LLMRETRY_EINVAL)
        PyErr_Format(PyExc_ValueError, "bodies[%zd]: %s", index, err);
    else
        PyErr_SetString(st == LLMRETRY_ENOMEM ? PyExc_MemoryError : PyExc_RuntimeError, err);
    return -1;
}

/* Submit the next item: 0 (also when there is none left: exhausted set),
 * or -1 with a Python error set (the iterator's own, a bad tuple). */
static int batch_submit_next(EngineObject *self, batch *b, llmretry_options *o)
{
    if (!b->iter) {
        Py_ssize_t i = b->next++;
        if (b->next >= b->n)
            b->exhausted = 1;
        return batch_submit(self, b, o, i, PySequence_Fast_GET_ITEM(b->bodies, i),
                            b->models ? PySequence_Fast_GET_ITEM(b->models, i) : NULL,
                            b->keys ? PySequence_Fast_GET_ITEM(b->keys, i) : NULL,
                            b->tokens ? PySequence_Fast_GET_ITEM(b->tokens, i) : NULL);
    }
    PyObject *t = PyIter_Next(b->iter);
    if (!t) {
        if (PyErr_Occurred())
            return -1;
        b->exhausted = 1;
        return 0;
    }
    int rc = -1;
    Py_ssize_t index;
    Py_ssize_t nt = PyTuple_Check(t) ? PyTuple_GET_SIZE(t) : 0;
    if (nt != 4 && nt != 5) {
        PyErr_SetString(PyExc_TypeError, "a batch iterator yields (index, body bytes, model, "
                        "key[, estimated tokens]) tuples");
    } else if ((index = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 0))) == -1 && PyErr_Occurred()) {
        /* the error set */
    } else {
        PyObject *body = PyTuple_GET_ITEM(t, 1), *model = PyTuple_GET_ITEM(t, 2),
                 *key = PyTuple_GET_ITEM(t, 3);
        if (!PyBytes_Check(body))
            PyErr_Format(PyExc_TypeError, "bodies[%zd] must be bytes, not %.100s", index,
                         Py_TYPE(body)->tp_name);
        else if (model != Py_None && !PyUnicode_Check(model))
            PyErr_Format(PyExc_TypeError, "models[%zd] must be a str or None", index);
        else if (key != Py_None && !PyUnicode_Check(key))
            PyErr_Format(PyExc_TypeError, "idempotency_keys[%zd] must be a str or None", index);
        else
            rc = batch_submit(self, b, o, index, body, model, key,
                              nt == 5 ? PyTuple_GET_ITEM(t, 4) : NULL);
    }
    Py_DECREF(t);                   /* the body is the core's copy now */
    return rc;
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
        bad = put_stats(r->rt.st, r->stats, r->g, &r->totals) < 0;
        if (et) {
            PyErr_Restore(et, ev, tb);
            bad = 0;
        }
    }
    if (r->b.slots) {
        batch_cancel_all(&r->b);
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
        if (batch_check(b) < 0)
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
     * call record of a huge batch at once. */
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
        while (!b->exhausted && b->in_flight < r->ahead)
            if (batch_submit_next(r->engine, b, &r->a.o) < 0)
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
            totals_add(&r->totals, res);
            PyObject *d = call_value(r->rt.st, res, r->validate, r->a.as_result);
            llmretry_call_free(ready[j]);
            slot_release(b, s);
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
