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

int parse_call_args(PyObject *args, PyObject *kw, call_args *a,
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
