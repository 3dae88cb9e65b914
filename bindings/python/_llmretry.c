/* llmretry._llmretry: the CPython face of the C core.
 *
 * Everything here converts between Python and C and waits: arguments are
 * turned into llmretry_options before the GIL is released; the calling
 * thread then waits on the call's mailbox with the GIL released, waking
 * every 50 ms to run signal handlers (the model is CPython's
 * Modules/timemodule.c), and delivers events and validation requests to
 * Python code on this same thread. The public API is python/llmretry; this
 * module's contract is python/llmretry/_llmretry.pyi. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "llmretry.h"
#include "policies.h"
#include "pool.h"
#include "results.h"

#include <cjson/cJSON.h>

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


static module_state *state_of(PyObject *module)
{
    return (module_state *)PyModule_GetState(module);
}

/* ---- C values to Python ------------------------------------------------ */

/* Set d[key] = v, stealing v; -1 (and v released) on failure. */
static int put(PyObject *d, const char *key, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* The same with a prepared key object. */
static int put_k(PyObject *d, PyObject *key, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItem(d, key, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *int_or_none(long long v, int present)
{
    if (!present)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

/* The event as a dict, walking the field list the core defines. */
static PyObject *event_dict(const module_state *st, const llmretry_event *ev)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    size_t n = llmretry_event_field_count(ev);
    for (size_t i = 0; i < n; i++) {
        llmretry_field f;
        llmretry_event_field(ev, i, &f);
        PyObject *v;
        switch (f.type) {
        case LLMRETRY_FIELD_INT: v = PyLong_FromLongLong((long long)f.i); break;
        case LLMRETRY_FIELD_STRING: v = lr_str_or_none(f.s); break;
        case LLMRETRY_FIELD_USAGE: v = lr_usage_dict(st, f.usage); break;
        default: v = Py_None; Py_INCREF(v); break;
        }
        if (put(d, f.name, v) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

static PyObject *result_dict(const module_state *st, const llmretry_result *r)
{
    PyObject *const *k = st->keys;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    int rc = 0;
    rc |= put_k(d, k[K_ok], PyBool_FromLong(r->ok));
    rc |= put_k(d, k[K_request_id], lr_str_or_none(r->request_id));
    rc |= put_k(d, k[K_model], lr_str_or_none(r->model));
    rc |= put_k(d, k[K_attempt], PyLong_FromLong(r->attempt));
    rc |= put_k(d, k[K_attempts], PyLong_FromLong(r->attempts));
    rc |= put_k(d, k[K_resends], PyLong_FromLong(r->resends));
    rc |= put_k(d, k[K_duration_ms], PyLong_FromLongLong((long long)r->duration_ms));
    rc |= put_k(d, k[K_total_ms], PyLong_FromLongLong((long long)r->total_ms));
    if (r->ok) {
        rc |= put_k(d, k[K_status], PyLong_FromLong(r->status));
        rc |= put_k(d, k[K_body], PyBytes_FromStringAndSize(r->body, (Py_ssize_t)r->body_len));
        rc |= put_k(d, k[K_usage], lr_usage_dict(st, &r->usage));
        rc |= put_k(d, k[K_response_model], lr_str_or_none(r->response_model));
        rc |= put_k(d, k[K_system_fingerprint], lr_str_or_none(r->system_fingerprint));
    } else {
        rc |= put_k(d, k[K_status], int_or_none(r->status, r->status > 0));
        rc |= put_k(d, k[K_kind], lr_str_or_none(llmretry_error_kind_name(r->kind)));
        rc |= put_k(d, k[K_reason], lr_str_or_none(llmretry_reason_name(r->reason)));
        rc |= put_k(d, k[K_message], lr_str_or_none(r->message));
        rc |= put_k(d, k[K_retry_after_ms], int_or_none((long long)r->retry_after_ms,
                                                         r->retry_after_ms >= 0));
        rc |= put_k(d, k[K_error_code], lr_str_or_none(r->error_code));
        rc |= put_k(d, k[K_body_preview], lr_str_or_none(r->body_preview));
    }
    if (rc) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* ---- Engine -------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    /* The lock keeps close() from freeing the engine under a submit; it is
     * never held while waiting. */
    pthread_mutex_t mu;
    llmretry_engine *engine;
    pid_t pid;                      /* the process that made the engine */
} EngineObject;

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "max_in_flight", "max_host_connections", NULL };
    int max_in_flight = 256, max_host_connections = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|ii:Engine", kwlist, &max_in_flight,
                                     &max_host_connections))
        return -1;
    if (self->engine) {
        PyErr_SetString(PyExc_RuntimeError, "Engine is already initialised");
        return -1;
    }
    llmretry_engine_options eo;
    llmretry_engine_options_defaults(&eo);
    eo.max_in_flight = max_in_flight;
    eo.max_host_connections = max_host_connections;
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_engine *e = NULL;
    llmretry_status st = llmretry_engine_new(&eo, &e, err, sizeof err);
    if (st != LLMRETRY_OK) {
        PyErr_SetString(st == LLMRETRY_EINVAL ? PyExc_ValueError : PyExc_RuntimeError, err);
        return -1;
    }
    pthread_mutex_lock(&self->mu);
    self->engine = e;
    self->pid = getpid();
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
    if (self->engine && getpid() != self->pid) {
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

/* Arguments converted for the core; Python objects they borrow from are
 * kept alive here until the call is submitted (the core copies them). */
typedef struct {
    llmretry_options o;
    Py_buffer body;
    int have_body;
    PyObject *headers_fast;
    const char **header_lines;
    int as_result;                  /* successes as the package's Result (call_value) */
} call_args;

static void call_args_release(call_args *a)
{
    if (a->have_body)
        PyBuffer_Release(&a->body);
    Py_XDECREF(a->headers_fast);
    PyMem_Free(a->header_lines);
}

static int parse_statuses(PyObject *seq, llmretry_options *o)
{
    if (seq == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(seq, "retry_statuses must be a sequence of ints");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int rc = 0;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "retry_statuses must not be empty (use max_retries=0 to never retry)");
        rc = -1;
    } else if (n > LLMRETRY_MAX_STATUSES) {
        PyErr_Format(PyExc_ValueError, "retry_statuses holds at most %d statuses (got %zd)",
                     LLMRETRY_MAX_STATUSES, n);
        rc = -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyLong_Check(item) || PyBool_Check(item)) {
            PyErr_Format(PyExc_TypeError, "retry_statuses[%zd] must be an int, not %.100s", i,
                         Py_TYPE(item)->tp_name);
            rc = -1;
            break;
        }
        long v = PyLong_AsLong(item);
        if (v == -1 && PyErr_Occurred())
            rc = -1;
        o->retry_statuses[i] = v < 0 || v > 100000 ? -1 : (int)v;   /* checked by the core */
    }
    if (rc == 0)
        o->n_retry_statuses = (size_t)n;
    Py_DECREF(fast);
    return rc;
}

static int parse_headers(PyObject *seq, call_args *a)
{
    if (seq == Py_None)
        return 0;
    a->headers_fast = PySequence_Fast(seq, "headers must be a sequence of \"Name: value\" strings");
    if (!a->headers_fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(a->headers_fast);
    a->header_lines = PyMem_Calloc((size_t)(n ? n : 1), sizeof *a->header_lines);
    if (!a->header_lines) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(a->headers_fast, i);
        if (!PyUnicode_Check(item)) {
            PyErr_Format(PyExc_TypeError, "headers[%zd] must be a str, not %.100s", i,
                         Py_TYPE(item)->tp_name);
            return -1;
        }
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(item, &len);
        if (!s)
            return -1;
        if ((size_t)len != strlen(s)) {
            PyErr_Format(PyExc_ValueError, "headers[%zd] must not contain NUL", i);
            return -1;
        }
        a->header_lines[i] = s;
    }
    a->o.headers = a->header_lines;
    a->o.n_headers = (size_t)n;
    return 0;
}

static int parse_call_args(PyObject *args, PyObject *kw, call_args *a,
                           PyObject **on_event, PyObject **validate)
{
    static char *kwlist[] = {
        "body", "model", "url", "base_url", "api_key", "timeout_ms", "max_retries",
        "base_delay_ms", "max_delay_ms", "jitter", "deadline_ms", "retry_mode",
        "retry_statuses", "max_retry_after_ms", "retry_invalid_response",
        "max_response_bytes", "headers", "request_id", "idempotency_key", "policy",
        "ca_file", "on_event", "validate", "event_mask", "as_result", NULL,
    };
    llmretry_options *o = &a->o;
    llmretry_options_defaults(o);
    long long timeout_ms = o->timeout_ms, base = o->base_delay_ms, cap = o->max_delay_ms;
    long long max_ra = o->max_retry_after_ms, max_bytes = o->max_response_bytes;
    int max_retries = o->max_retries, retry_invalid = 1;
    unsigned int event_mask = LLMRETRY_EVENTS_ALL;
    const char *jitter = "additive", *retry_mode = "safe";
    PyObject *deadline = Py_None, *statuses = Py_None, *headers = Py_None;
    *on_event = *validate = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|$zzzzLiLLsOsOLpLOzzzzOOIp:call", kwlist,
                                     &a->body, &o->model, &o->url, &o->base_url, &o->api_key,
                                     &timeout_ms, &max_retries, &base, &cap, &jitter, &deadline,
                                     &retry_mode, &statuses, &max_ra, &retry_invalid, &max_bytes,
                                     &headers, &o->request_id, &o->idempotency_key, &o->policy,
                                     &o->ca_file, on_event, validate, &event_mask,
                                     &a->as_result))
        return -1;
    a->have_body = 1;
    o->body = a->body.buf;
    o->body_len = (size_t)a->body.len;
    o->timeout_ms = timeout_ms;
    o->max_retries = max_retries;
    o->base_delay_ms = base;
    o->max_delay_ms = cap;
    o->max_retry_after_ms = max_ra;
    o->max_response_bytes = max_bytes;
    o->retry_invalid_response = retry_invalid;
    if (llmretry_jitter_parse(jitter, &o->jitter) != LLMRETRY_OK) {
        /* The value is not repeated: a secret pasted into the wrong
         * argument must not reach a traceback. */
        PyErr_SetString(PyExc_ValueError, "jitter must be one of additive, full, none");
        return -1;
    }
    if (llmretry_retry_mode_parse(retry_mode, &o->retry_mode) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, "retry_mode must be safe or unsafe");
        return -1;
    }
    if (deadline != Py_None) {
        if (!PyLong_Check(deadline) || PyBool_Check(deadline)) {
            PyErr_Format(PyExc_TypeError, "deadline_ms must be an int or None, not %.100s",
                         Py_TYPE(deadline)->tp_name);
            return -1;
        }
        long long d = PyLong_AsLongLong(deadline);
        if (d == -1 && PyErr_Occurred())
            return -1;
        if (d < 0) {
            PyErr_Format(PyExc_ValueError, "deadline_ms must be >= 0 or None (got %lld)", d);
            return -1;
        }
        o->deadline_ms = d;
    }
    for (PyObject **cb = on_event; cb; cb = cb == on_event ? validate : NULL) {
        if (*cb != Py_None && !PyCallable_Check(*cb)) {
            PyErr_Format(PyExc_TypeError, "%s must be callable or None",
                         cb == on_event ? "on_event" : "validate");
            return -1;
        }
    }
    o->events = *on_event != Py_None ? event_mask : 0;
    o->validate = *validate != Py_None;
    if (parse_statuses(statuses, o) < 0 || parse_headers(headers, a) < 0)
        return -1;
    return 0;
}

/* Deliver one event; 0 to go on, -1 to stop with the Python error set. An
 * Exception from the logger must not lose the call: it is reported and the
 * call goes on. Anything else (KeyboardInterrupt, SystemExit) stops it. */
static int deliver_event(const module_state *st, PyObject *on_event, llmretry_event *ev)
{
    PyObject *d = event_dict(st, ev);
    llmretry_event_free(ev);
    if (!d)
        return -1;
    PyObject *r = PyObject_CallOneArg(on_event, d);
    Py_DECREF(d);
    if (r) {
        Py_DECREF(r);
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyErr_WriteUnraisable(on_event);
    return 0;
}

static int deliver_validation(llmretry_call *c, PyObject *validate)
{
    const char *body;
    size_t len;
    if (llmretry_call_pending_body(c, &body, &len) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_RuntimeError, "validation requested without a pending body");
        return -1;
    }
    PyObject *b = PyBytes_FromStringAndSize(body, (Py_ssize_t)len);
    if (!b)
        return -1;
    PyObject *r = PyObject_CallOneArg(validate, b);
    Py_DECREF(b);
    if (!r)
        return -1;
    int rc = 0;
    if (r == Py_None) {
        llmretry_call_validated(c, 1, NULL);
    } else if (PyUnicode_Check(r)) {
        const char *msg = PyUnicode_AsUTF8(r);
        if (msg)
            llmretry_call_validated(c, 0, msg);
        else
            rc = -1;
    } else {
        PyErr_Format(PyExc_TypeError, "validate must return None or a reason str, not %.100s",
                     Py_TYPE(r)->tp_name);
        rc = -1;
    }
    Py_DECREF(r);
    return rc;
}

/* Who gets a call's events: the host's on_event, for the events it asked
 * for (the engine paces pools itself: nothing here watches for 429s). */
typedef struct {
    PyObject *on_event;
    unsigned mask;                  /* the events on_event asked for */
    const module_state *st;
} event_route;

static int route_event(event_route *rt, llmretry_event *ev)
{
    llmretry_event_type t = llmretry_event_type_of(ev);
    if (rt->on_event == Py_None || !(rt->mask & (1u << t))) {
        llmretry_event_free(ev);
        return 0;
    }
    return deliver_event(rt->st, rt->on_event, ev);
}

/* Deliver every item in the call's mailbox on this thread. 1 when the call
 * is done, 0 when the mailbox is empty, -1 with a Python error set. */
static int drain_mail(llmretry_call *c, event_route *rt, PyObject *validate)
{
    for (;;) {
        llmretry_event *ev;
        switch (llmretry_call_next(c, &ev)) {
        case LLMRETRY_MAIL_EVENT:
            if (route_event(rt, ev) < 0)
                return -1;
            break;
        case LLMRETRY_MAIL_VALIDATE:
            if (deliver_validation(c, validate) < 0)
                return -1;
            break;
        case LLMRETRY_MAIL_DONE:
            return 1;
        case LLMRETRY_MAIL_EMPTY:
            return 0;
        }
    }
}

/* After a wait: 0 to go on, -1 when Ctrl-C (or a stopping pool) must end
 * the wait, with the Python error set. */
static int check_interrupts(void)
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
static PyObject *call_value(const module_state *st, const llmretry_result *r,
                            PyObject *validate, int as_result)
{
    PyObject *v = NULL;
    int built = as_result && validate == Py_None ? lr_build_result(st, r, &v) : 0;
    return built == 0 ? result_dict(st, r) : v;
}

/* Wait for the call, delivering its mail on this thread. Returns its value
 * (call_value), or NULL with an exception set (the call is then cancelled). */
static PyObject *wait_call(llmretry_call *c, event_route *rt, PyObject *validate,
                           int as_result)
{
    for (;;) {
        int rc = drain_mail(c, rt, validate);
        if (rc > 0)
            return call_value(rt->st, llmretry_call_result(c), validate, as_result);
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

static PyObject *Engine_call(EngineObject *self, PyObject *args, PyObject *kw)
{
    call_args a;
    memset(&a, 0, sizeof a);
    PyObject *on_event, *validate;
    if (parse_call_args(args, kw, &a, &on_event, &validate) < 0) {
        call_args_release(&a);
        return NULL;
    }
    const module_state *mst = state_of(PyType_GetModule(Py_TYPE(self)));
    event_route rt = { on_event, a.o.events, mst };
    lr_pool *pool = lr_pool_current();
    if (pool) {
        /* In a batch pool: no call outlives the batch's deadline. */
        int64_t left = lr_pool_deadline_left(pool);
        if (left != LLMRETRY_NO_DEADLINE &&
            (a.o.deadline_ms == LLMRETRY_NO_DEADLINE || a.o.deadline_ms > left))
            a.o.deadline_ms = left;
    }
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_call *c = NULL;
    llmretry_status st = LLMRETRY_ESTATE;
    pthread_mutex_lock(&self->mu);
    if (self->engine) {
        /* A pool's calls pass its group's pacer on the engine thread. */
        if (pool)
            a.o.group = lr_pool_group(pool, self->engine);
        st = llmretry_engine_submit(self->engine, &a.o, 0, &c, err, sizeof err);
    } else {
        snprintf(err, sizeof err, "the engine is closed");
    }
    pthread_mutex_unlock(&self->mu);
    int as_result = a.as_result;
    call_args_release(&a);
    if (st != LLMRETRY_OK) {
        PyErr_SetString(st == LLMRETRY_EINVAL ? PyExc_ValueError
                        : st == LLMRETRY_ENOMEM ? PyExc_MemoryError : PyExc_RuntimeError, err);
        return NULL;
    }
    /* Keep the callables alive while Python code may drop its references. */
    Py_INCREF(on_event);
    Py_INCREF(validate);
    PyObject *r = wait_call(c, &rt, validate, as_result);
    Py_DECREF(on_event);
    Py_DECREF(validate);
    llmretry_call_free(c);
    return r;
}

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

typedef struct {
    PyObject *bodies, *models, *keys; /* sequences (PySequence_Fast); models, keys optional */
    Py_ssize_t n;
    llmretry_call **calls;          /* by index; NULL when not submitted or freed */
} batch;

static void batch_cancel_all(batch *b)
{
    for (Py_ssize_t i = 0; i < b->n; i++)
        if (b->calls[i]) {
            llmretry_call_free(b->calls[i]);       /* cancels when unfinished */
            b->calls[i] = NULL;
        }
}

/* What a batch adds up as its items finish, for the batch summary. */
typedef struct {
    long long attempts, retries, resends, prompt_tokens, completion_tokens, total_tokens;
} batch_totals;

static void totals_add(batch_totals *t, const llmretry_result *r)
{
    t->attempts += r->attempts;
    t->retries += r->attempts > 1 ? r->attempts - 1 : 0;
    t->resends += r->resends;
    if (r->ok && r->usage.present) {
        t->prompt_tokens += r->usage.prompt_tokens;
        t->completion_tokens += r->usage.completion_tokens;
        t->total_tokens += r->usage.total_tokens;
    }
}

/* Fill the caller's stats dict: the group's pacing and the totals so far. */
static int put_stats(PyObject *stats, llmretry_group *g, const batch_totals *t)
{
    llmretry_group_stats gs = { 0, 0, 0 };
    if (g)
        llmretry_group_stats_get(g, &gs);
    const struct { const char *name; long long v; } f[] = {
        { "pauses", gs.pauses }, { "halvings", gs.halvings }, { "window", gs.window },
        { "attempts", t->attempts }, { "retries", t->retries }, { "resends", t->resends },
        { "prompt_tokens", t->prompt_tokens }, { "completion_tokens", t->completion_tokens },
        { "total_tokens", t->total_tokens },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (put(stats, f[i].name, PyLong_FromLongLong(f[i].v)) < 0)
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

/* Submit item i of the batch; 0, or -1 with a Python error set. */
static int batch_submit(EngineObject *self, batch *b, llmretry_options *o, Py_ssize_t i)
{
    PyObject *body = PySequence_Fast_GET_ITEM(b->bodies, i);   /* bytes: batch_check */
    o->body = PyBytes_AS_STRING(body);
    o->body_len = (size_t)PyBytes_GET_SIZE(body);
    o->model = NULL;
    if (b->models) {
        PyObject *m = PySequence_Fast_GET_ITEM(b->models, i);
        if (m != Py_None && !(o->model = PyUnicode_AsUTF8(m)))
            return -1;
    }
    o->idempotency_key = NULL;
    if (b->keys) {
        PyObject *key = PySequence_Fast_GET_ITEM(b->keys, i);
        if (key != Py_None && !(o->idempotency_key = PyUnicode_AsUTF8(key)))
            return -1;
    }
    o->user_data = (void *)(intptr_t)i;
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = LLMRETRY_ESTATE;
    pthread_mutex_lock(&self->mu);
    if (self->engine)
        st = llmretry_engine_submit(self->engine, o, 0, &b->calls[i], err, sizeof err);
    else
        snprintf(err, sizeof err, "the engine is closed");
    pthread_mutex_unlock(&self->mu);
    if (st == LLMRETRY_OK)
        return 0;
    if (st == LLMRETRY_EINVAL)
        PyErr_Format(PyExc_ValueError, "bodies[%zd]: %s", i, err);
    else
        PyErr_SetString(st == LLMRETRY_ENOMEM ? PyExc_MemoryError : PyExc_RuntimeError, err);
    return -1;
}

static PyObject *Engine_call_many(EngineObject *self, PyObject *args, PyObject *kw_in)
{
    PyObject *bodies_arg;
    if (!PyArg_ParseTuple(args, "O:call_many", &bodies_arg))
        return NULL;
    PyObject *kw = kw_in ? PyDict_Copy(kw_in) : PyDict_New();
    if (!kw)
        return NULL;
    PyObject *models_arg = pop_kw(kw, "models", Py_None);
    PyObject *keys_arg = pop_kw(kw, "idempotency_keys", Py_None);
    PyObject *limit_arg = pop_kw(kw, "limit", NULL);
    PyObject *deadline_arg = pop_kw(kw, "batch_deadline_ms", Py_None);
    PyObject *adaptive_arg = pop_kw(kw, "adaptive", Py_True);
    PyObject *on_result = pop_kw(kw, "on_result", Py_None);
    PyObject *results_arg = pop_kw(kw, "results", Py_None);
    PyObject *stats_arg = pop_kw(kw, "stats", Py_None);
    batch b = { NULL, NULL, NULL, 0, NULL };
    batch_totals totals = { 0, 0, 0, 0, 0 };
    call_args a;
    memset(&a, 0, sizeof a);
    PyObject *on_event = Py_None, *validate = Py_None, *results = NULL, *out = NULL;
    llmretry_group *g = NULL;

    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    if (limit_arg) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(limit_arg, &overflow);
        if (v == -1 && PyErr_Occurred())
            goto done;
        if (overflow || v < 1 || v > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "limit must be between 1 and %d", INT_MAX);
            goto done;
        }
        go.limit = (int)v;
    }
    if (deadline_arg != Py_None) {
        int overflow = 0;
        go.deadline_ms = PyLong_AsLongLongAndOverflow(deadline_arg, &overflow);
        if (go.deadline_ms == -1 && PyErr_Occurred())
            goto done;
        if (overflow) {
            PyErr_SetString(PyExc_ValueError, "batch_deadline_ms is out of range (at most 2**63-1)");
            goto done;
        }
        if (go.deadline_ms < 0) {
            PyErr_Format(PyExc_ValueError, "batch_deadline_ms must be >= 0 or None (got %lld)",
                         (long long)go.deadline_ms);
            goto done;
        }
    }
    go.adaptive = PyObject_IsTrue(adaptive_arg);
    if (on_result != Py_None && !PyCallable_Check(on_result)) {
        PyErr_SetString(PyExc_TypeError, "on_result must be callable or None");
        goto done;
    }
    if (stats_arg != Py_None && !PyDict_Check(stats_arg)) {
        PyErr_SetString(PyExc_TypeError, "stats must be a dict or None");
        goto done;
    }
    PyObject *empty = Py_BuildValue("(y)", "");
    if (!empty)
        goto done;
    int bad = parse_call_args(empty, kw, &a, &on_event, &validate);
    Py_DECREF(empty);
    if (bad < 0)
        goto done;
    if (a.o.request_id || a.o.idempotency_key) {
        PyErr_SetString(PyExc_ValueError, a.o.request_id
                        ? "request_id cannot be shared by the calls of a batch"
                        : "idempotency_key cannot be shared by the calls of a batch");
        goto done;
    }
    {
        /* The options the calls share, checked once and named as such,
         * before any call: not as the first body's fault. */
        llmretry_options shared = a.o;
        char err[LLMRETRY_ERRBUF] = "";
        shared.body = "{}";
        shared.body_len = 2;
        if (llmretry_options_check(&shared, err, sizeof err) != LLMRETRY_OK) {
            PyErr_SetString(PyExc_ValueError, err);
            goto done;
        }
    }
    if (!(b.bodies = PySequence_Fast(bodies_arg, "bodies must be a sequence of bytes")))
        goto done;
    b.n = PySequence_Fast_GET_SIZE(b.bodies);
    if (models_arg != Py_None) {
        if (!(b.models = PySequence_Fast(models_arg, "models must be a sequence")))
            goto done;
        if (PySequence_Fast_GET_SIZE(b.models) != b.n) {
            PyErr_SetString(PyExc_ValueError, "models must be as long as bodies");
            goto done;
        }
    }
    if (keys_arg != Py_None) {
        /* One key per item: each item is its own call (all its attempts). */
        if (!(b.keys = PySequence_Fast(keys_arg, "idempotency_keys must be a sequence")))
            goto done;
        if (PySequence_Fast_GET_SIZE(b.keys) != b.n) {
            PyErr_SetString(PyExc_ValueError, "idempotency_keys must be as long as bodies");
            goto done;
        }
    }
    if (batch_check(&b) < 0)
        goto done;
    if (results_arg != Py_None) {
        /* The caller's list, filled in place: what finished before a Ctrl-C
         * stays there for the batch's record. */
        if (!PyList_Check(results_arg) || PyList_GET_SIZE(results_arg) != b.n) {
            PyErr_SetString(PyExc_ValueError, "results must be a list as long as bodies");
            goto done;
        }
        results = results_arg;
        Py_INCREF(results);
    } else if (!(results = PyList_New(b.n))) {
        goto done;
    }
    b.calls = PyMem_Calloc((size_t)(b.n ? b.n : 1), sizeof *b.calls);
    if (!b.calls) {
        PyErr_NoMemory();
        goto done;
    }
    char err[LLMRETRY_ERRBUF] = "";
    pthread_mutex_lock(&self->mu);
    llmretry_status st = self->engine ? llmretry_group_new(self->engine, &go, &g, err, sizeof err)
                                      : LLMRETRY_ESTATE;
    pthread_mutex_unlock(&self->mu);
    if (st != LLMRETRY_OK) {
        PyErr_SetString(st == LLMRETRY_EINVAL ? PyExc_ValueError : PyExc_RuntimeError,
                        st == LLMRETRY_ESTATE ? "the engine is closed" : err);
        goto done;
    }
    a.o.group = g;
    event_route rt = { on_event, a.o.events, state_of(PyType_GetModule(Py_TYPE(self))) };

    /* Keep the engine's queue ahead of the pacer without holding every
     * call record of a huge batch at once. */
    Py_ssize_t ahead = 4 * (Py_ssize_t)go.limit + 64, next = 0, finished = 0;
    while (finished < b.n) {
        while (next < b.n && next - finished < ahead)
            if (batch_submit(self, &b, &a.o, next++) < 0)
                goto done;
        llmretry_call *ready[64];
        size_t k = llmretry_group_poll(g, ready, 64);
        if (k == 0) {
            Py_BEGIN_ALLOW_THREADS
            llmretry_group_wait(g, WAKE_MS);
            Py_END_ALLOW_THREADS
            if (check_interrupts() < 0)
                goto done;
            continue;
        }
        for (size_t j = 0; j < k; j++) {
            Py_ssize_t i = (Py_ssize_t)(intptr_t)llmretry_call_user_data(ready[j]);
            int rc = drain_mail(ready[j], &rt, validate);
            if (rc < 0)
                goto done;
            if (rc == 0)
                continue;
            /* A Result, or an outcome dict for the package to turn into
             * an error (call_value). */
            const llmretry_result *r = llmretry_call_result(ready[j]);
            totals_add(&totals, r);
            PyObject *d = call_value(rt.st, r, validate, a.as_result);
            llmretry_call_free(ready[j]);
            b.calls[i] = NULL;
            finished++;
            if (!d)
                goto done;
            PyList_SetItem(results, i, d);      /* the caller's list may hold None */
            if (on_result != Py_None) {
                PyObject *r = PyObject_CallFunction(on_result, "nO", i, d);
                if (!r)
                    goto done;
                Py_DECREF(r);
            }
        }
    }
    out = results;
    Py_INCREF(out);
done:
    if (stats_arg != Py_None && g) {
        /* Also after Ctrl-C: the summary counts what ran. */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int bad = put_stats(stats_arg, g, &totals) < 0;
        if (et)
            PyErr_Restore(et, ev, tb);          /* the first error wins */
        else if (bad)
            Py_CLEAR(out);
    }
    if (b.calls) {
        batch_cancel_all(&b);
        PyMem_Free(b.calls);
    }
    llmretry_group_free(g);
    call_args_release(&a);
    Py_XDECREF(results);
    Py_XDECREF(b.bodies);
    Py_XDECREF(b.models);
    Py_XDECREF(b.keys);
    Py_DECREF(kw);
    return out;
}

static PyMethodDef Engine_methods[] = {
    { "call", (PyCFunction)(void (*)(void))Engine_call, METH_VARARGS | METH_KEYWORDS,
      "call(body, **options) -> dict: run one call to completion (see _llmretry.pyi)." },
    { "call_many", (PyCFunction)(void (*)(void))Engine_call_many, METH_VARARGS | METH_KEYWORDS,
      "call_many(bodies, *, models=None, limit=8, batch_deadline_ms=None, adaptive=True,\n"
      "          on_result=None, results=None, stats=None, **options) -> list: a batch\n"
      "          on the engine thread (see _llmretry.pyi)." },
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
    { Py_tp_doc, "Engine(max_in_flight=256, max_host_connections=0): an I/O thread and its "
                 "connection cache." },
    { 0, NULL },
};

static PyType_Spec Engine_spec = {
    .name = "llmretry._llmretry.Engine",
    .basicsize = sizeof(EngineObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Engine_slots,
};

/* ---- JSON helpers and the policy ----------------------------------------- */

static int utf8_of(PyObject *o, const char *what, const char **s, Py_ssize_t *len)
{
    if (PyUnicode_Check(o)) {
        *s = PyUnicode_AsUTF8AndSize(o, len);
        return *s ? 0 : -1;
    }
    if (PyBytes_Check(o)) {
        *s = PyBytes_AS_STRING(o);
        *len = PyBytes_GET_SIZE(o);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s must be str or bytes, not %.100s", what, Py_TYPE(o)->tp_name);
    return -1;
}

static PyObject *extract_json(PyObject *module, PyObject *text)
{
    (void)module;
    const char *s;
    Py_ssize_t len;
    if (utf8_of(text, "text", &s, &len) < 0)
        return NULL;
    size_t start, n;
    char err[LLMRETRY_ERRBUF];
    if (llmretry_extract_json(s, (size_t)len, &start, &n, err, sizeof err) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    return PyUnicode_DecodeUTF8(s + start, (Py_ssize_t)n, "strict");
}

static PyObject *assert_shape_json(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *kwlist[] = { "json_text", "shape_json", "path", NULL };
    PyObject *json, *shape;
    const char *path = "root";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|s:assert_shape_json", kwlist, &json, &shape,
                                     &path))
        return NULL;
    const char *js, *ss;
    Py_ssize_t jl, sl;
    if (utf8_of(json, "json_text", &js, &jl) < 0 || utf8_of(shape, "shape_json", &ss, &sl) < 0)
        return NULL;
    char err[LLMRETRY_ERRBUF];
    if (llmretry_assert_shape(js, (size_t)jl, ss, (size_t)sl, path, err, sizeof err) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *parse_retry_after(PyObject *module, PyObject *args)
{
    (void)module;
    const char *value;
    long long now;
    if (!PyArg_ParseTuple(args, "sL:parse_retry_after", &value, &now))
        return NULL;
    return PyLong_FromLongLong((long long)llmretry_parse_retry_after(value, now));
}

static PyMethodDef module_methods[] = {
    { "run_pool", (PyCFunction)(void (*)(void))lr_run_pool, METH_VARARGS | METH_KEYWORDS,
      "run_pool(items, limit, worker, return_exceptions=False, *, deadline_ms=None,\n"
      "         adaptive=True, on_result=None, stats=None) -> list (see _llmretry.pyi)." },
    { "extract_json", extract_json, METH_O,
      "extract_json(text) -> str: the JSON text inside model output." },
    { "assert_shape_json", (PyCFunction)(void (*)(void))assert_shape_json,
      METH_VARARGS | METH_KEYWORDS, "assert_shape_json(json_text, shape_json, path='root')." },
    { "_set_result_types", lr_set_result_types, METH_VARARGS,
      "_set_result_types(Result, Meta, scan_once, parse): the classes call_many builds." },
    { "parse_retry_after", parse_retry_after, METH_VARARGS,
      "parse_retry_after(value, now_unix_ms) -> int: ms, or -1 when not usable." },
    LR_PY_POLICY_METHODS
    { NULL, NULL, 0, NULL },
};

/* ---- the module ------------------------------------------------------------ */

static int module_exec(PyObject *m)
{
    module_state *st = state_of(m);
    st->engine_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &Engine_spec, NULL);
    if (!st->engine_type || PyModule_AddType(m, st->engine_type) < 0)
        return -1;
    st->pool_stop = PyErr_NewExceptionWithDoc(
        "llmretry._llmretry.PoolStop",
        "Raised inside a run_pool worker whose pool is stopping (Ctrl-C).",
        PyExc_BaseException, NULL);
    if (!st->pool_stop)
        return -1;
    Py_INCREF(st->pool_stop);
    if (PyModule_AddObject(m, "PoolStop", st->pool_stop) < 0) {
        Py_DECREF(st->pool_stop);
        return -1;
    }
#define MAKE_KEY(name) \
    if (!(st->keys[K_##name] = PyUnicode_InternFromString(#name))) \
        return -1;
    OUTCOME_KEYS(MAKE_KEY)
#undef MAKE_KEY
    st->not_started = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (!st->not_started)
        return -1;
    Py_INCREF(st->not_started);
    if (PyModule_AddObject(m, "NOT_STARTED", st->not_started) < 0) {
        Py_DECREF(st->not_started);
        return -1;
    }
    PyObject *names = PyTuple_New(6);
    if (!names)
        return -1;
    for (int t = 0; t < 6; t++) {
        PyObject *name = PyUnicode_FromString(llmretry_event_name((llmretry_event_type)t));
        if (!name) {
            Py_DECREF(names);
            return -1;
        }
        PyTuple_SET_ITEM(names, t, name);
    }
    if (PyModule_AddObject(m, "EVENT_NAMES", names) < 0) {
        Py_DECREF(names);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "EVENTS_ALL", LLMRETRY_EVENTS_ALL) < 0)
        return -1;
    return PyModule_AddStringConstant(m, "VERSION", LLMRETRY_VERSION);
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    module_state *st = state_of(m);
    Py_VISIT(st->engine_type);
    Py_VISIT(st->pool_stop);
    Py_VISIT(st->not_started);
    return lr_results_traverse(st, visit, arg);
}

static int module_clear(PyObject *m)
{
    module_state *st = state_of(m);
    Py_CLEAR(st->engine_type);
    Py_CLEAR(st->pool_stop);
    Py_CLEAR(st->not_started);
    lr_results_clear(st);
    for (int i = 0; i < K_COUNT; i++)
        Py_CLEAR(st->keys[i]);
    return 0;
}

static void module_free(void *m)
{
    module_clear((PyObject *)m);
}

static PyModuleDef_Slot module_slots[] = {
    { Py_mod_exec, (void *)module_exec },
#ifdef Py_mod_multiple_interpreters
    { Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED },
#endif
#ifdef Py_mod_gil
    /* State is in module state and objects; shared C data has its own locks. */
    { Py_mod_gil, Py_MOD_GIL_NOT_USED },
#endif
    { 0, NULL },
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "llmretry._llmretry",
    .m_doc = "The C core of llmretry (private: use the llmretry package).",
    .m_size = sizeof(module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__llmretry(void)
{
    return PyModuleDef_Init(&module_def);
}
