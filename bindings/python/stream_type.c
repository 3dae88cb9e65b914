/* Engine.stream and the Stream type: one streaming call whose chunks the
 * host takes one at a time (options.stream_chunks). Taking the first chunk
 * is the commit point (docs/streaming.md): before it the engine retries a failed
 * attempt and drops its unread chunks; after it a failure ends the call as
 * stream_interrupted. Events and validation are delivered on the thread
 * that reads, like Engine.call's. The package's llmretry.stream_llm wraps
 * this in a context manager that parses the chunks. */
#include "binding.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    llmretry_call *call;
    const module_state *st;
    PyObject *on_event;             /* strong references, or Py_None */
    PyObject *validate;
    unsigned mask;
    int as_result;
    int done;                       /* the mailbox said DONE */
} StreamObject;

/* Start a call whose mailbox the host reads through a Stream object: with
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
    PyTypeObject *type = mst->stream_type;
    StreamObject *s = (StreamObject *)type->tp_alloc(type, 0);
    if (!s) {
        call_args_release(&a);
        return NULL;
    }
    s->st = mst;
    s->mask = a.o.events;
    s->as_result = a.as_result;
    s->on_event = Py_NewRef(on_event);
    s->validate = Py_NewRef(validate);
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
static PyObject *stream_step(StreamObject *s, int block)
{
    event_route rt = { s->on_event, s->mask, s->st };
    while (!s->done) {
        llmretry_event *ev;
        switch (llmretry_call_next(s->call, &ev)) {
        case LLMRETRY_MAIL_CHUNK: {
            size_t len = 0;
            const char *data = llmretry_chunk_data(ev, &len);
            const char *name = llmretry_chunk_event(ev);
            PyObject *out = Py_BuildValue("(zy#)", strcmp(name, "message") ? name : NULL, data,
                                          (Py_ssize_t)len);
            llmretry_event_free(ev);
            return out;
        }
        case LLMRETRY_MAIL_EVENT:
            if (route_event(&rt, ev) < 0)
                return NULL;
            break;
        case LLMRETRY_MAIL_VALIDATE:
            if (deliver_validation(s->call, s->validate) < 0)
                return NULL;
            break;
        case LLMRETRY_MAIL_DONE:
            s->done = 1;
            break;
        case LLMRETRY_MAIL_EMPTY:
            if (!block)
                Py_RETURN_FALSE;
            Py_BEGIN_ALLOW_THREADS
            llmretry_call_wait(s->call, WAKE_MS);
            Py_END_ALLOW_THREADS
            if (check_interrupts() < 0)
                return NULL;
            break;
        }
    }
    Py_RETURN_NONE;
}

/* next_chunk() -> (event, bytes), or None once the call is done. Blocks. */
static PyObject *Stream_next_chunk(StreamObject *s, PyObject *unused)
{
    (void)unused;
    return stream_step(s, 1);
}

/* try_chunk() -> (event, bytes) | None | False: next_chunk without waiting
 * (False: nothing now). For an event loop, after its channel named the call. */
static PyObject *Stream_try_chunk(StreamObject *s, PyObject *unused)
{
    (void)unused;
    return stream_step(s, 0);
}

/* outcome() -> the call's value (Engine.call's), once next_chunk said None. */
static PyObject *Stream_outcome(StreamObject *s, PyObject *unused)
{
    (void)unused;
    if (!s->done) {
        PyErr_SetString(PyExc_RuntimeError, "the stream has not ended: read it to the end first");
        return NULL;
    }
    return call_value(s->st, llmretry_call_result(s->call), s->validate, s->as_result);
}

/* response_head() -> bytes | None: a keep_response call's response head
 * (status line and header lines, as received) once a chunk was read or
 * the call is done; None before, or when it keeps none. */
static PyObject *Stream_response_head(StreamObject *s, PyObject *unused)
{
    (void)unused;
    size_t len = 0;
    const char *head = llmretry_call_response_head(s->call, &len);
    if (!head)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(head, (Py_ssize_t)len);
}

static PyObject *Stream_cancel(StreamObject *s, PyObject *unused)
{
    (void)unused;
    llmretry_call_cancel(s->call);
    Py_RETURN_NONE;
}

static PyObject *Stream_request_id(StreamObject *s, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(llmretry_call_request_id(s->call));
}

static PyObject *Stream_done(StreamObject *s, void *closure)
{
    (void)closure;
    return PyBool_FromLong(s->done);
}

static void Stream_dealloc(StreamObject *s)
{
    PyTypeObject *type = Py_TYPE(s);
    PyObject_GC_UnTrack(s);
    /* An unfinished call is cancelled; its unread mail is freed. */
    if (s->call)
        llmretry_call_free(s->call);
    Py_CLEAR(s->on_event);
    Py_CLEAR(s->validate);
    type->tp_free((PyObject *)s);
    Py_DECREF(type);
}

static int Stream_traverse(StreamObject *s, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(s));
    Py_VISIT(s->on_event);
    Py_VISIT(s->validate);
    return 0;
}

static int Stream_clear(StreamObject *s)
{
    Py_CLEAR(s->on_event);
    Py_CLEAR(s->validate);
    s->on_event = Py_NewRef(Py_None);
    s->validate = Py_NewRef(Py_None);
    return 0;
}

static PyMethodDef Stream_methods[] = {
    { "next_chunk", (PyCFunction)Stream_next_chunk, METH_NOARGS,
      "next_chunk() -> (event | None, bytes) | None: the next chunk; None at the end." },
    { "try_chunk", (PyCFunction)Stream_try_chunk, METH_NOARGS,
      "try_chunk() -> (event | None, bytes) | None | False: next_chunk() without waiting\n"
      "(False: nothing yet). A call that does not stream gives only None or False." },
    { "outcome", (PyCFunction)Stream_outcome, METH_NOARGS,
      "outcome() -> dict | Result: the finished call's value, as Engine.call's." },
    { "response_head", (PyCFunction)Stream_response_head, METH_NOARGS,
      "response_head() -> bytes | None: with keep_response, the response's status line and\n"
      "header lines as received, once a chunk was read or the call is done." },
    { "cancel", (PyCFunction)Stream_cancel, METH_NOARGS,
      "cancel(): stop the call; next_chunk() then reaches the end." },
    { NULL, NULL, 0, NULL },
};

static PyGetSetDef Stream_getset[] = {
    { "request_id", (getter)Stream_request_id, NULL, "The call's request id.", NULL },
    { "done", (getter)Stream_done, NULL, "True once next_chunk() returned None.", NULL },
    { NULL, NULL, NULL, NULL, NULL },
};

static PyType_Slot Stream_slots[] = {
    { Py_tp_dealloc, Stream_dealloc },
    { Py_tp_traverse, Stream_traverse },
    { Py_tp_clear, Stream_clear },
    { Py_tp_methods, Stream_methods },
    { Py_tp_getset, Stream_getset },
    { Py_tp_doc, "One streaming call (Engine.stream): read with next_chunk()." },
    { 0, NULL },
};

PyType_Spec Stream_spec = {
    .name = "llmretry._llmretry.Stream",
    .basicsize = sizeof(StreamObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = Stream_slots,
};
