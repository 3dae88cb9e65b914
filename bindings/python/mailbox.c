/* The one mailbox reader of the Python binding: a call's items taken on
 * the host's thread, whoever holds the call (Engine.call's wait, a Call
 * read chunk by chunk or by an event loop, a batch's items). Events go to
 * the host's on_event, a 2xx body to its validator, a stream's chunks back
 * to the caller. The rule for a raising logger is the Lua module's
 * (lua/llmretry/mailbox.lua; tests/vectors/loggers/): its first error in a
 * call is reported, the call goes on, later errors of that call are not
 * reported. */
#include "binding.h"

#include <string.h>

/* The logger's first error in a call, to sys.unraisablehook (the logger's
 * exception, and a message naming the event and the request id, as Lua's
 * report does). The error is the current exception; it is cleared. */
static void report_logger_error(PyObject *ev)
{
    PyObject *et, *val, *tb;
    PyErr_Fetch(&et, &val, &tb);
    PyObject *name = ev ? PyDict_GetItemString(ev, "event") : NULL;
    PyObject *rid = ev ? PyDict_GetItemString(ev, "request_id") : NULL;
    PyObject *why = PyUnicode_FromFormat(
        "llmretry: the logger raised on %S (request_id=%S); the call goes on (later logger "
        "errors of this call are not reported)", name ? name : Py_None, rid ? rid : Py_None);
    if (!why)
        PyErr_Clear();              /* out of memory: the logger's error is still reported */
    PyErr_Restore(et, val, tb);
    PyErr_WriteUnraisable(why ? why : Py_None);
    Py_XDECREF(why);
}

/* One event to on_event, if it asked for this kind; 0 to go on, -1 to stop
 * with the Python error set. An Exception from the logger must not lose
 * the call (reported once per call, above); anything else
 * (KeyboardInterrupt, SystemExit) stops it. */
static int deliver_event(const mail_route *rt, llmretry_event *ev, int *reported)
{
    llmretry_event_type t = llmretry_event_type_of(ev);
    if (rt->on_event == Py_None || !(rt->mask & (1u << t))) {
        llmretry_event_free(ev);
        return 0;
    }
    PyObject *d = event_dict(rt->st, ev);
    llmretry_event_free(ev);
    if (!d)
        return -1;
    PyObject *r = PyObject_CallOneArg(rt->on_event, d);
    int rc = 0;
    if (r) {
        Py_DECREF(r);
    } else if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        rc = -1;
    } else if (*reported) {
        PyErr_Clear();
    } else {
        *reported = 1;
        report_logger_error(d);
    }
    Py_DECREF(d);
    return rc;
}

/* Answer a validation request with validate(body)'s verdict: None accepts,
 * a str is the reason to reject. */
static int deliver_validation(llmretry_call *c, PyObject *validate)
{
    const char *body;
    size_t len;
    if (llmretry_call_pending_body(c, &body, &len) != LLMRETRY_OK)
        return 0;   /* withdrawn: the call was cancelled meanwhile; its DONE follows */
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

/* A chunk as (event, bytes): event is None for plain `data:` chunks, else
 * the SSE event's name. */
static PyObject *chunk_tuple(llmretry_event *ev)
{
    size_t len = 0;
    const char *data = llmretry_chunk_data(ev, &len);
    const char *name = llmretry_chunk_event(ev);
    PyObject *out = Py_BuildValue("(zy#)", strcmp(name, "message") ? name : NULL, data,
                                  (Py_ssize_t)len);
    llmretry_event_free(ev);
    return out;
}

int lr_py_read_mail(llmretry_call *c, const mail_route *rt, int *reported, PyObject **chunk)
{
    for (;;) {
        llmretry_event *ev;
        switch (llmretry_call_next(c, &ev)) {
        case LLMRETRY_MAIL_CHUNK:
            if (!chunk) {
                llmretry_event_free(ev);    /* not asked for (stream_chunks is 0) */
                break;
            }
            *chunk = chunk_tuple(ev);
            return *chunk ? LR_PY_MAIL_CHUNK : -1;
        case LLMRETRY_MAIL_EVENT:
            if (deliver_event(rt, ev, reported) < 0)
                return -1;
            break;
        case LLMRETRY_MAIL_VALIDATE:
            if (deliver_validation(c, rt->validate) < 0)
                return -1;
            break;
        case LLMRETRY_MAIL_DONE:
            return LR_PY_MAIL_DONE;
        case LLMRETRY_MAIL_EMPTY:
            return LR_PY_MAIL_EMPTY;
        }
    }
}
