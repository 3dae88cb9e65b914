/* A batch's items: the slots of its calls in flight, their submission
 * (from sequences or an iterator, with each item's own header lines), the
 * up-front check of sequences, the cancel of what is unfinished, and the
 * totals summed as items finish. batch.c's BatchRun drives them. */
#include "batch.h"
#include "results.h"

#include <cjson/cJSON.h>

#include <pthread.h>
#include <stdint.h>
#include <string.h>

static int slot_later_first(const void *x, const void *y)
{
    const batch_slot *a = *(batch_slot *const *)x, *b = *(batch_slot *const *)y;
    return a->seq < b->seq ? 1 : a->seq > b->seq ? -1 : 0;
}

/* Last item first: the items still queued in the group (the later ones) are
 * cancelled before a running item's cancel frees a slot that the pacer
 * would give to one of them (the server would see a new request after a
 * Ctrl-C or a cancelled acall_many). */
void lr_batch_cancel_all(batch *b)
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

void lr_batch_slot_release(batch *b, Py_ssize_t s)
{
    b->slots[s].call = NULL;
    b->free[b->nfree++] = s;
    b->in_flight--;
}

void lr_batch_totals_add(batch_totals *t, const llmretry_result *r)
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

/* _batch_tally(values) -> (finished, outcomes): of a batch's values filled
 * in place (None: not finished), how many finished and the indices of the
 * outcome dicts among them (the items the package turns into errors).
 * Why: a batch recorded at its end (no record, progress or on_result)
 * looked at every value in Python, ~0.08 µs an item on the calling
 * thread; most are Results and need nothing. */
PyObject *lr_py_batch_tally(PyObject *module, PyObject *values)
{
    (void)module;
    if (!PyList_Check(values))
        return PyErr_Format(PyExc_TypeError, "_batch_tally wants a list");
    PyObject *outcomes = PyList_New(0);
    if (!outcomes)
        return NULL;
    Py_ssize_t finished = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (v == Py_None)
            continue;
        finished++;
        if (PyDict_CheckExact(v)) {
            PyObject *k = PyLong_FromSsize_t(i);
            int rc = k ? PyList_Append(outcomes, k) : -1;
            Py_XDECREF(k);
            if (rc < 0) {
                Py_DECREF(outcomes);
                return NULL;
            }
        }
    }
    PyObject *out = Py_BuildValue("(nO)", finished, outcomes);
    Py_DECREF(outcomes);
    return out;
}

/* Fill the caller's stats dict: the group's pacing (the core's group
 * shape), the totals so far and their tokens (its usage shape). */
int lr_batch_put_stats(const module_state *st, PyObject *stats, llmretry_group *g,
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
int lr_batch_check(batch *b)
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

/* One item taken from the batch, to submit: its index (what on_result will
 * get; what errors name), body, model, key and tokens (borrowed from the
 * sequences or from t, the iterator's tuple, owned), and with item_headers
 * what it gave for the item (owned; None: the batch's lines). */
typedef struct {
    PyObject *t;
    Py_ssize_t index;
    PyObject *body, *model, *key, *tokens;
    PyObject *given;
} batch_item;

/* Submit an item taken (0, or -1 with a Python error set). The core copies
 * what it keeps. With item_headers, the item's requests carry the header
 * lines it gave for its index instead of the batch's (None: the batch's):
 * what a host adds to one item alone (llmretry.otel: the item's span as
 * traceparent). */
static int batch_submit(EngineObject *self, batch *b, llmretry_options *o, const batch_item *it)
{
    if (!it->given || it->given == Py_None)
        return batch_submit_with(self, b, o, it->index, it->body, it->model, it->key, it->tokens);
    const char *const *batch_lines = o->headers;
    size_t batch_n = o->n_headers;
    PyObject *fast = NULL;
    const char **lines = NULL;
    Py_ssize_t n = lr_py_header_lines(it->given, "item_headers()", &fast, &lines);
    int rc = -1;
    if (n >= 0) {
        o->headers = lines;
        o->n_headers = (size_t)n;
        rc = batch_submit_with(self, b, o, it->index, it->body, it->model, it->key, it->tokens);
        o->headers = batch_lines;
        o->n_headers = batch_n;
    }
    PyMem_Free(lines);
    Py_XDECREF(fast);
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

/* Take the next item into *it: 1, 0 when there is none left (exhausted
 * set), or -1 with a Python error set (the iterator's own, a bad tuple). */
static int batch_take(batch *b, batch_item *it)
{
    *it = (batch_item){ 0 };
    if (b->exhausted)
        return 0;
    if (!b->iter) {
        Py_ssize_t i = it->index = b->next++;
        if (b->next >= b->n)
            b->exhausted = 1;
        it->body = PySequence_Fast_GET_ITEM(b->bodies, i);
        it->model = b->models ? PySequence_Fast_GET_ITEM(b->models, i) : NULL;
        it->key = b->keys ? PySequence_Fast_GET_ITEM(b->keys, i) : NULL;
        it->tokens = b->tokens ? PySequence_Fast_GET_ITEM(b->tokens, i) : NULL;
        return 1;
    }
    PyObject *t = PyIter_Next(b->iter);
    if (!t) {
        if (PyErr_Occurred())
            return -1;
        b->exhausted = 1;
        return 0;
    }
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
        else {
            *it = (batch_item){ t, index, body, model, key,
                                nt == 5 ? PyTuple_GET_ITEM(t, 4) : NULL, NULL };
            return 1;       /* the tuple is released after the submission */
        }
    }
    Py_DECREF(t);
    return -1;
}

/* Items handed to item_headers before any of them is submitted: see
 * lr_batch_submit. */
#define HEADERS_RUN 64

/* Submit up to `want` more items: 0 (also when none is left: exhausted
 * set), or -1 with a Python error set (the iterator's own, a bad tuple,
 * item_headers' error, the engine's refusal). With item_headers, the
 * host's work for a run of items (llmretry.otel: each item's span, tens of
 * µs) comes first, then their submissions back to back: the engine's I/O
 * thread takes what was queued since it last looked at one wake-up, and
 * submissions spread out by the host's work woke it once per item (issue
 * 34's benchmark: its CPU per call under telemetry 57 -> 52 µs, its sleeps
 * 0.45 -> 0.31 a call). When taking a run fails (an
 * item_headers error, a bad tuple), none of the run is submitted. */
int lr_batch_submit(EngineObject *self, batch *b, llmretry_options *o, Py_ssize_t want)
{
    batch_item run[HEADERS_RUN];
    while (want > 0 && !b->exhausted) {
        Py_ssize_t most = b->item_headers ? (want < HEADERS_RUN ? want : HEADERS_RUN) : 1;
        Py_ssize_t n = 0;
        int rc = 0;
        while (n < most && (rc = batch_take(b, &run[n])) > 0) {
            batch_item *it = &run[n++];
            if (b->item_headers) {
                PyObject *k = PyLong_FromSsize_t(it->index);
                it->given = k ? PyObject_CallOneArg(b->item_headers, k) : NULL;
                Py_XDECREF(k);
                if (!it->given) {
                    rc = -1;
                    break;
                }
            }
        }
        for (Py_ssize_t j = 0; j < n && rc >= 0; j++)
            rc = batch_submit(self, b, o, &run[j]);
        for (Py_ssize_t j = 0; j < n; j++) {
            Py_XDECREF(run[j].given);
            Py_XDECREF(run[j].t);     /* the body is the core's copy now */
        }
        if (rc < 0)
            return -1;
        if (n == 0)
            break;
        want -= n;
    }
    return 0;
}
