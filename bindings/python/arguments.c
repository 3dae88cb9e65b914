/* Call keywords to llmretry_options: types and conversions here, ranges and
 * rules in the core (llmretry_options_check, at submit). */
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

void call_args_release(call_args *a)
{
    if (a->have_body)
        PyBuffer_Release(&a->body);
    Py_XDECREF(a->headers_fast);
    PyMem_Free(a->header_lines);
}

static int parse_statuses(PyObject *seq, llmretry_options *o)
{
    char err[LLMRETRY_ERRBUF];
    if (seq == Py_None)
        return llmretry_options_unset(o, "retry_statuses", err, sizeof err) == LLMRETRY_OK ? 0 : -1;
    PyObject *fast = PySequence_Fast(seq, "retry_statuses must be a sequence of ints");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int *v = PyMem_Calloc((size_t)(n ? n : 1), sizeof *v);
    int rc = v ? 0 : (PyErr_NoMemory(), -1);
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyLong_Check(item) || PyBool_Check(item)) {
            PyErr_Format(PyExc_TypeError, "retry_statuses[%zd] must be an int, not %.100s", i,
                         Py_TYPE(item)->tp_name);
            rc = -1;
            break;
        }
        int overflow;
        long x = PyLong_AsLongAndOverflow(item, &overflow);
        if (x == -1 && PyErr_Occurred())
            rc = -1;
        /* Out of int's range is out of the statuses' too: the core says so. */
        v[i] = overflow || x > INT_MAX || x < INT_MIN ? INT_MIN : (int)x;
    }
    if (rc == 0 && llmretry_options_set_statuses(o, v, (size_t)n, err, sizeof err) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        rc = -1;
    }
    PyMem_Free(v);
    Py_DECREF(fast);
    return rc;
}

Py_ssize_t lr_py_header_lines(PyObject *seq, const char *what, PyObject **fast,
                               const char ***lines)
{
    *fast = PySequence_Fast(seq, "headers must be a sequence of \"Name: value\" strings");
    if (!*fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(*fast);
    *lines = PyMem_Calloc((size_t)(n ? n : 1), sizeof **lines);
    if (!*lines) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(*fast, i);
        if (!PyUnicode_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s[%zd] must be a str, not %.100s", what, i,
                         Py_TYPE(item)->tp_name);
            return -1;
        }
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(item, &len);
        if (!s)
            return -1;
        if ((size_t)len != strlen(s)) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] must not contain NUL", what, i);
            return -1;
        }
        (*lines)[i] = s;
    }
    return n;
}

static int parse_headers(PyObject *seq, call_args *a)
{
    if (seq == Py_None)
        return 0;
    Py_ssize_t n = lr_py_header_lines(seq, "headers", &a->headers_fast, &a->header_lines);
    if (n < 0)
        return -1;
    a->o.headers = a->header_lines;
    a->o.n_headers = (size_t)n;
    return 0;
}

/* A value of a TEXT or ENUM option: a str without NUL, or None (unset). */
static int set_text(llmretry_options *o, const llmretry_option_info *opt, PyObject *v)
{
    char err[LLMRETRY_ERRBUF];
    const char *text = NULL;
    if (v != Py_None) {
        Py_ssize_t len;
        if (!PyUnicode_Check(v)) {
            PyErr_Format(PyExc_TypeError, "%s must be a str or None, not %.100s", opt->name,
                         Py_TYPE(v)->tp_name);
            return -1;
        }
        if (!(text = PyUnicode_AsUTF8AndSize(v, &len)))
            return -1;
        if ((size_t)len != strlen(text)) {
            PyErr_Format(PyExc_ValueError, "%s must not contain NUL", opt->name);
            return -1;
        }
    }
    if (llmretry_options_set_text(o, opt->name, text, err, sizeof err) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        return -1;
    }
    return 0;
}

static int set_int(llmretry_options *o, const llmretry_option_info *opt, PyObject *v)
{
    char err[LLMRETRY_ERRBUF];
    if (v == Py_None && (opt->flags & LLMRETRY_OPTFLAG_NULLABLE))
        return llmretry_options_unset(o, opt->name, err, sizeof err) == LLMRETRY_OK ? 0 : -1;
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int%s, not %.100s", opt->name,
                     opt->flags & LLMRETRY_OPTFLAG_NULLABLE ? " or None" : "",
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s must be %s (got %S)", opt->name, opt->range, v);
        return -1;
    }
    if (llmretry_options_set_int(o, opt->name, n, err, sizeof err) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        return -1;
    }
    return 0;
}

/* One keyword by the core's option table: the conversion follows the type. */
static int set_option(call_args *a, const llmretry_option_info *opt, PyObject *v)
{
    switch (opt->type) {
    case LLMRETRY_OPTTYPE_TEXT:
    case LLMRETRY_OPTTYPE_ENUM:
        return set_text(&a->o, opt, v);
    case LLMRETRY_OPTTYPE_INT:
        return set_int(&a->o, opt, v);
    case LLMRETRY_OPTTYPE_BOOL: {
        char err[LLMRETRY_ERRBUF];
        int t = PyObject_IsTrue(v);
        if (t < 0)
            return -1;
        if (llmretry_options_set_bool(&a->o, opt->name, t, err, sizeof err) != LLMRETRY_OK) {
            PyErr_SetString(PyExc_ValueError, err);
            return -1;
        }
        return 0;
    }
    case LLMRETRY_OPTTYPE_STATUSES:
        return parse_statuses(v, &a->o);
    case LLMRETRY_OPTTYPE_HEADERS:
        return parse_headers(v, a);
    case LLMRETRY_OPTTYPE_NUMBER: {
        char err[LLMRETRY_ERRBUF];
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        if (llmretry_options_set_number(&a->o, opt->name, d, err, sizeof err) != LLMRETRY_OK) {
            PyErr_SetString(PyExc_ValueError, err);
            return -1;
        }
        return 0;
    }
    case LLMRETRY_OPTTYPE_TARGETS:
    case LLMRETRY_OPTTYPE_SCHEMA: {
        /* The client encoded the list (_options._targets) or the schema:
         * JSON text, which the kwargs keep alive until the submit copies it. */
        char err[LLMRETRY_ERRBUF];
        const char *json = NULL;
        if (v != Py_None && !PyUnicode_Check(v)) {
            PyErr_Format(PyExc_TypeError, "%s must be JSON text (a str) or None, not %.100s",
                         opt->name, Py_TYPE(v)->tp_name);
            return -1;
        }
        if (v != Py_None && !(json = PyUnicode_AsUTF8(v)))
            return -1;
        if (llmretry_options_set_json(&a->o, opt->name, json, err, sizeof err) != LLMRETRY_OK) {
            PyErr_SetString(PyExc_ValueError, err);
            return -1;
        }
        return 0;
    }
    }
    PyErr_Format(PyExc_SystemError, "option %s has an unknown type", opt->name);
    return -1;
}

/* Keywords of this binding, not options of the core. */
static int host_keyword(const char *name, PyObject *v, call_args *a, PyObject **on_event,
                        PyObject **validate)
{
    if (strcmp(name, "on_event") == 0) {
        *on_event = v;
    } else if (strcmp(name, "validate") == 0) {
        *validate = v;
    } else if (strcmp(name, "stream_usage") == 0 || strcmp(name, "stream_chunks") == 0) {
        int t = PyObject_IsTrue(v);
        if (t < 0)
            return -1;
        *(name[7] == 'u' ? &a->o.stream_usage : &a->o.stream_chunks) = t;
    } else if (strcmp(name, "keep_response") == 0) {
        /* The response as received, for llmretry.httpx (result "headers",
         * a failure's "body", Call.response_head()). */
        int t = PyObject_IsTrue(v);
        if (t < 0)
            return -1;
        a->o.keep_response = t;
    } else if (strcmp(name, "as_result") == 0) {
        int t = PyObject_IsTrue(v);
        if (t < 0)
            return -1;
        a->as_result = t;
    } else {
        return 0;
    }
    return 1;
}

int parse_call_args(PyObject *args, PyObject *kw, call_args *a,
                           PyObject **on_event, PyObject **validate)
{
    llmretry_options *o = &a->o;
    llmretry_options_defaults(o);
    *on_event = *validate = Py_None;
    if (!PyArg_ParseTuple(args, "y*:call", &a->body))
        return -1;
    a->have_body = 1;
    o->body = a->body.buf;
    o->body_len = (size_t)a->body.len;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (kw && PyDict_Next(kw, &pos, &key, &value)) {
        const char *name = PyUnicode_AsUTF8(key);
        if (!name)
            return -1;
        int host = host_keyword(name, value, a, on_event, validate);
        if (host < 0)
            return -1;
        if (host)
            continue;
        const llmretry_option_info *opt = llmretry_option_find(name);
        if (!opt) {
            PyErr_Format(PyExc_TypeError, "call() got an unexpected keyword argument '%s'",
                         name);
            return -1;
        }
        if (set_option(a, opt, value) < 0)
            return -1;
    }
    for (PyObject **cb = on_event; cb; cb = cb == on_event ? validate : NULL) {
        if (*cb != Py_None && !PyCallable_Check(*cb)) {
            PyErr_Format(PyExc_TypeError, "%s must be callable or None",
                         cb == on_event ? "on_event" : "validate");
            return -1;
        }
    }
    /* event_mask says which of on_event's events to make. */
    if (*on_event == Py_None)
        o->events = 0;
    o->validate = *validate != Py_None;
    return 0;
}

int check_shared_args(const call_args *a)
{
    /* The options the calls of a batch share, checked once and named as
     * such, before any call: not as the first body's fault. */
    const llmretry_option_info *opt;
    for (size_t i = 0; (opt = llmretry_option_at(i)); i++) {
        const char *v = NULL;
        if (!(opt->flags & LLMRETRY_OPTFLAG_PER_CALL) || opt->type != LLMRETRY_OPTTYPE_TEXT)
            continue;
        memcpy(&v, (const char *)&a->o + opt->offset, sizeof v);
        if (v) {
            PyErr_Format(PyExc_ValueError, "%s cannot be shared by the calls of a batch",
                         opt->name);
            return -1;
        }
    }
    llmretry_options shared = a->o;
    char err[LLMRETRY_ERRBUF] = "";
    shared.body = "{}";
    shared.body_len = 2;
    if (llmretry_options_check(&shared, err, sizeof err) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        return -1;
    }
    return 0;
}

PyObject *lr_py_check_options(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    call_args a;
    memset(&a, 0, sizeof a);
    PyObject *on_event, *validate;
    if (PyTuple_GET_SIZE(args)) {
        PyErr_SetString(PyExc_TypeError, "check_options() takes keyword arguments only");
        return NULL;
    }
    PyObject *empty = Py_BuildValue("(y)", "");
    if (!empty)
        return NULL;
    int rc = parse_call_args(empty, kw, &a, &on_event, &validate);
    Py_DECREF(empty);
    if (rc == 0)
        rc = check_shared_args(&a);
    call_args_release(&a);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

const char *lr_py_option_type_name(llmretry_option_type t)
{
    static const char *const types[] = { "", "text", "int", "bool", "enum", "statuses", "headers",
                                         "number", "targets", "schema" };
    return (unsigned)t < sizeof types / sizeof *types ? types[t] : "";
}

PyObject *lr_py_options(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    size_t n = llmretry_option_count();
    PyObject *out = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        const llmretry_option_info *opt = llmretry_option_at(i);
        PyObject *row = Py_BuildValue("(ssI)", opt->name, lr_py_option_type_name(opt->type),
                                      opt->flags);
        if (!row) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, (Py_ssize_t)i, row);
    }
    return out;
}
