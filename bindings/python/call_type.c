/* The Call type: one call in flight whose mailbox the host reads, started
 * by Engine.stream or by a Channel (an event loop's calls). A stream is a
 * call that yields chunks (options.stream_chunks): next_chunk() takes them
 * one at a time; a call that does not stream only ever reaches its end.
 * Taking the first chunk is the commit point (docs/streaming.md): before
 * it the engine retries a failed attempt and drops its unread chunks; after
 * it a failure ends the call as stream_interrupted. Events and validation
 * are delivered on the thread that reads (mailbox.c), like Engine.call's.
 * The package's llmretry.stream_llm wraps this in a context manager that
 * parses the chunks; its asyncio calls and streams are Calls too. */
#include "binding.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    llmretry_call *call;
    mail_route route;               /* its on_event and validate: strong references */
    int as_result;
    int done;                       /* the mailbox said DONE */
    int logger_reported;            /* lr_py_read_mail's */
} CallObject;

/* Start a call whose mailbox the host reads through a Call object: with
 * `stream`, chunk by chunk (options.stream_chunks); reporting to channel
 * `ch` when not NULL (an event loop's), inside group `g` when not NULL (a
 * pool's pacer). The call's user_data is the object (borrowed: freeing the
 * object frees the call, which takes it off its channel first). */
PyObject *lr_start_call(EngineObject *eng, PyObject *args, PyObject *kw, int stream,
                        llmretry_channel *ch, llmretry_group *g)
{
    call_args a;
    memset(&a, 0, sizeof a);
    PyObject *on_event, *validate;
    if (parse_call_args(args, kw, &a, &on_event, &validate) < 0) {
        call_args_release(&a);
        return NULL;
    }
    a.o.stream_chunks = stream;
    a.o.channel = ch;
    a.o.group = g;
    const module_state *mst = lr_py_state_of(PyType_GetModule(Py_TYPE(eng)));
    PyTypeObject *type = mst->call_type;
    CallObject *s = (CallObject *)type->tp_alloc(type, 0);
    if (!s) {
        call_args_release(&a);
        return NULL;
    }
    s->route = (mail_route){ Py_NewRef(on_event), a.o.events, mst, Py_NewRef(validate) };
    s->as_result = a.as_result;
    a.o.user_data = s;
    s->call = engine_submit(eng, &a);
    call_args_release(&a);
    if (!s->call) {
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

PyObject *lr_engine_stream(PyObject *self, PyObject *args, PyObject *kw)
{
    return lr_start_call((EngineObject *)self, args, kw, 1, NULL, NULL);
}

/* The next chunk as (event, bytes), None once the call is done, or (only
 * when !block) False while the mailbox is empty: event is None for plain
 * `data:` chunks, else the SSE event's name. Events and validation requests
 * met on the way are delivered here; a call that does not stream only ever
 * gives None or False (its mail pumped). Blocking waits release the GIL and
 * wake for Ctrl-C. */
static PyObject *call_step(CallObject *s, int block)
{
    while (!s->done) {
        PyObject *chunk = NULL;
        switch (lr_py_read_mail(s->call, &s->route, &s->logger_reported, &chunk)) {
        case LR_PY_MAIL_CHUNK:
            return chunk;
        case LR_PY_MAIL_DONE:
            s->done = 1;
            break;
        case LR_PY_MAIL_EMPTY:
            if (!block)
                Py_RETURN_FALSE;
            Py_BEGIN_ALLOW_THREADS
            llmretry_call_wait(s->call, WAKE_MS);
            Py_END_ALLOW_THREADS
            if (check_interrupts() < 0)
                return NULL;
            break;
        default:
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

/* next_chunk() -> (event, bytes), or None once the call is done. Blocks. */
static PyObject *Call_next_chunk(CallObject *s, PyObject *unused)
{
    (void)unused;
    return call_step(s, 1);
}

/* try_chunk() -> (event, bytes) | None | False: next_chunk without waiting
 * (False: nothing now). For an event loop, after its channel named the call. */
static PyObject *Call_try_chunk(CallObject *s, PyObject *unused)
{
    (void)unused;
    return call_step(s, 0);
}

/* outcome() -> the call's value (Engine.call's), once next_chunk said None. */
static PyObject *Call_outcome(CallObject *s, PyObject *unused)
{
    (void)unused;
    if (!s->done) {
        PyErr_SetString(PyExc_RuntimeError, "the stream has not ended: read it to the end first");
        return NULL;
    }
    return call_value(s->route.st, llmretry_call_result(s->call), s->route.validate,
                      s->as_result);
}

/* response_head() -> bytes | None: a keep_response call's response head
 * (status line and header lines, as received) once a chunk was read or
 * the call is done; None before, or when it keeps none. */
static PyObject *Call_response_head(CallObject *s, PyObject *unused)
{
    (void)unused;
    size_t len = 0;
    const char *head = llmretry_call_response_head(s->call, &len);
    if (!head)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(head, (Py_ssize_t)len);
}

static PyObject *Call_cancel(CallObject *s, PyObject *unused)
{
    (void)unused;
    llmretry_call_cancel(s->call);
    Py_RETURN_NONE;
}

static PyObject *Call_request_id(CallObject *s, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(llmretry_call_request_id(s->call));
}

static PyObject *Call_done(CallObject *s, void *closure)
{
    (void)closure;
    return PyBool_FromLong(s->done);
}

static void Call_dealloc(CallObject *s)
{
    PyTypeObject *type = Py_TYPE(s);
    PyObject_GC_UnTrack(s);
    /* An unfinished call is cancelled; its unread mail is freed. */
    if (s->call)
        llmretry_call_free(s->call);
    Py_CLEAR(s->route.on_event);
    Py_CLEAR(s->route.validate);
    type->tp_free((PyObject *)s);
    Py_DECREF(type);
}

static int Call_traverse(CallObject *s, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(s));
    Py_VISIT(s->route.on_event);
    Py_VISIT(s->route.validate);
    return 0;
}

static int Call_clear(CallObject *s)
{
    Py_CLEAR(s->route.on_event);
    Py_CLEAR(s->route.validate);
    s->route.on_event = Py_NewRef(Py_None);
    s->route.validate = Py_NewRef(Py_None);
    return 0;
}

static PyMethodDef Call_methods[] = {
    { "next_chunk", (PyCFunction)Call_next_chunk, METH_NOARGS,
      "next_chunk() -> (event | None, bytes) | None: the next chunk; None at the end." },
    { "try_chunk", (PyCFunction)Call_try_chunk, METH_NOARGS,
      "try_chunk() -> (event | None, bytes) | None | False: next_chunk() without waiting\n"
      "(False: nothing yet). A call that does not stream gives only None or False." },
    { "outcome", (PyCFunction)Call_outcome, METH_NOARGS,
      "outcome() -> dict | Result: the finished call's value, as Engine.call's." },
    { "response_head", (PyCFunction)Call_response_head, METH_NOARGS,
      "response_head() -> bytes | None: with keep_response, the response's status line and\n"
      "header lines as received, once a chunk was read or the call is done." },
    { "cancel", (PyCFunction)Call_cancel, METH_NOARGS,
      "cancel(): stop the call; next_chunk() then reaches the end." },
    { NULL, NULL, 0, NULL },
};

static PyGetSetDef Call_getset[] = {
    { "request_id", (getter)Call_request_id, NULL, "The call's request id.", NULL },
    { "done", (getter)Call_done, NULL, "True once next_chunk() returned None.", NULL },
    { NULL, NULL, NULL, NULL, NULL },
};

static PyType_Slot Call_slots[] = {
    { Py_tp_dealloc, Call_dealloc },
    { Py_tp_traverse, Call_traverse },
    { Py_tp_clear, Call_clear },
    { Py_tp_methods, Call_methods },
    { Py_tp_getset, Call_getset },
    { Py_tp_doc, "One call in flight whose mailbox the host reads (Engine.stream, Channel.call):\n"
                 "next_chunk() / try_chunk(), then outcome()." },
    { 0, NULL },
};

PyType_Spec Call_spec = {
    .name = "llmretry._llmretry.Call",
    .basicsize = sizeof(CallObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = Call_slots,
};
