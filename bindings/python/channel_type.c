/* Channel and Group: what an event loop (the package's asyncio surface)
 * needs of the engine. A Channel is one loop's view: the calls it starts
 * report their news to its file descriptor (watched with loop.add_reader)
 * and to nobody else, so two loops on one engine never take each other's
 * calls. ready() names the calls with news; the loop then reads each one's
 * mailbox without blocking (Call.try_chunk), so events, validators and
 * results are handled on the loop's thread. A Group is a pacer with no
 * reader of its own (group poll 0): calls started in it wait for its limit,
 * its 429 pauses and its deadline, and report to their channel. */
#include "binding.h"
#include "results.h"

#include <string.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    EngineObject *engine;           /* strong: submits go through its lock */
    llmretry_channel *ch;           /* NULL once closed */
    unsigned fork_gen;              /* llmretry_fork_generation() at creation */
} ChannelObject;

typedef struct {
    PyObject_HEAD
    llmretry_group *g;
    unsigned fork_gen;              /* llmretry_fork_generation() at creation */
} GroupObject;

static const module_state *mstate(PyObject *o)
{
    return lr_py_state_of(PyType_GetModule(Py_TYPE(o)));
}

/* ---- Channel -------------------------------------------------------------- */

PyObject *lr_engine_channel(PyObject *self, PyObject *unused)
{
    (void)unused;
    EngineObject *eng = (EngineObject *)self;
    PyTypeObject *type = mstate(self)->channel_type;
    char err[LLMRETRY_ERRBUF] = "the engine is closed";
    llmretry_channel *ch = NULL;
    llmretry_status st = LLMRETRY_ESTATE;
    pthread_mutex_lock(&eng->mu);
    if (eng->engine)
        st = llmretry_channel_new(eng->engine, &ch, err, sizeof err);
    pthread_mutex_unlock(&eng->mu);
    if (st != LLMRETRY_OK) {
        PyErr_SetString(st == LLMRETRY_ENOMEM ? PyExc_MemoryError : PyExc_RuntimeError, err);
        return NULL;
    }
    ChannelObject *c = (ChannelObject *)type->tp_alloc(type, 0);
    if (!c) {
        llmretry_channel_free(ch);
        return NULL;
    }
    c->engine = (EngineObject *)Py_NewRef(self);
    c->ch = ch;
    c->fork_gen = llmretry_fork_generation();
    return (PyObject *)c;
}

static int channel_open(ChannelObject *c)
{
    if (c->ch && c->fork_gen == llmretry_fork_generation())
        return 0;
    PyErr_SetString(PyExc_RuntimeError, c->ch ? "this channel belongs to the parent process"
                                              : "the channel is closed");
    return -1;
}

/* The group keyword (a Group or None), taken out of a copy of kw. */
static int take_group(PyObject **kw, llmretry_group **g)
{
    *g = NULL;
    PyObject *v = *kw ? PyDict_GetItemString(*kw, "group") : NULL;
    if (!v)
        return 0;
    PyObject *copy = PyDict_Copy(*kw);
    if (!copy)
        return -1;
    *kw = copy;                     /* the caller releases it */
    if (v != Py_None) {
        if (!PyObject_TypeCheck(v, mstate(v)->group_type)) {
            PyErr_Format(PyExc_TypeError, "group must be a Group or None, not %.100s",
                         Py_TYPE(v)->tp_name);
            return -1;
        }
        *g = ((GroupObject *)v)->g;
    }
    return PyDict_DelItemString(copy, "group");
}

static PyObject *channel_start(ChannelObject *c, PyObject *args, PyObject *kw, int stream)
{
    if (channel_open(c) < 0)
        return NULL;
    PyObject *kw_used = kw;
    llmretry_group *g = NULL;
    PyObject *out = NULL;
    if (take_group(&kw_used, &g) == 0)
        out = lr_start_call(c->engine, args, kw_used, stream, c->ch, g);
    if (kw_used != kw)
        Py_DECREF(kw_used);
    return out;
}

static PyObject *Channel_call(ChannelObject *c, PyObject *args, PyObject *kw)
{
    return channel_start(c, args, kw, 0);
}

static PyObject *Channel_stream(ChannelObject *c, PyObject *args, PyObject *kw)
{
    return channel_start(c, args, kw, 1);
}

/* ready() -> [Call, ...]: the calls with news since the last ready(). */
static PyObject *Channel_ready(ChannelObject *c, PyObject *unused)
{
    (void)unused;
    if (channel_open(c) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    llmretry_call *calls[64];
    size_t n;
    /* The GIL is held from the poll to the new references: no Call can be
     * freed (and its call taken off the list) in between. */
    while ((n = llmretry_channel_poll(c->ch, calls, 64)) > 0) {
        for (size_t i = 0; i < n; i++) {
            PyObject *s = llmretry_call_user_data(calls[i]);
            if (PyList_Append(out, s) < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
        if (n < 64)
            break;
    }
    return out;
}

static PyObject *Channel_fileno(ChannelObject *c, PyObject *unused)
{
    (void)unused;
    if (channel_open(c) < 0)
        return NULL;
    return PyLong_FromLong(llmretry_channel_fd(c->ch));
}

static void channel_close(ChannelObject *c)
{
    llmretry_channel *ch = c->ch;
    c->ch = NULL;
    /* In a forked child the channel is the parent's: left alone. Calls
     * still running keep it alive (their news then reaches nobody). */
    if (ch && c->fork_gen == llmretry_fork_generation())
        llmretry_channel_free(ch);
}

static PyObject *Channel_close(ChannelObject *c, PyObject *unused)
{
    (void)unused;
    channel_close(c);
    Py_RETURN_NONE;
}

static PyObject *Channel_closed(ChannelObject *c, void *unused)
{
    (void)unused;
    return PyBool_FromLong(c->ch == NULL);
}

static void Channel_dealloc(ChannelObject *c)
{
    PyTypeObject *type = Py_TYPE(c);
    channel_close(c);
    Py_CLEAR(c->engine);
    type->tp_free((PyObject *)c);
    Py_DECREF(type);
}

static PyMethodDef Channel_methods[] = {
    { "call", (PyCFunction)(void (*)(void))Channel_call, METH_VARARGS | METH_KEYWORDS,
      "call(body, *, group=None, **options) -> Call: start a call reporting here\n"
      "(read its mail with try_chunk(): None once done, then outcome())." },
    { "stream", (PyCFunction)(void (*)(void))Channel_stream, METH_VARARGS | METH_KEYWORDS,
      "stream(body, *, group=None, **options) -> Call: a streaming call reporting here." },
    { "ready", (PyCFunction)Channel_ready, METH_NOARGS,
      "ready() -> list[Call]: the calls with news since the last ready()." },
    { "fileno", (PyCFunction)Channel_fileno, METH_NOARGS,
      "fileno() -> int: readable while some call has news." },
    { "close", (PyCFunction)Channel_close, METH_NOARGS,
      "close(): stop reporting here (calls still running keep going). Idempotent." },
    { NULL, NULL, 0, NULL },
};

static PyGetSetDef Channel_getset[] = {
    { "closed", (getter)Channel_closed, NULL, "True once close() has run.", NULL },
    { NULL, NULL, NULL, NULL, NULL },
};

static PyType_Slot Channel_slots[] = {
    { Py_tp_dealloc, Channel_dealloc },
    { Py_tp_methods, Channel_methods },
    { Py_tp_getset, Channel_getset },
    { Py_tp_doc, "One event loop's view of an engine (Engine.channel())." },
    { 0, NULL },
};

PyType_Spec Channel_spec = {
    .name = "llmretry._llmretry.Channel",
    .basicsize = sizeof(ChannelObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = Channel_slots,
};

/* ---- Group ---------------------------------------------------------------- */

/* group(limit, deadline_ms=None, adaptive=True) -> Group: a pacer (poll 0). */
PyObject *lr_engine_group(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "limit", "deadline_ms", "adaptive", NULL };
    int limit = 0, adaptive = 1;
    PyObject *deadline = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|Op:group", kwlist, &limit, &deadline,
                                     &adaptive))
        return NULL;
    llmretry_group_options go;
    llmretry_group_options_defaults(&go);
    go.limit = limit;
    go.adaptive = adaptive;
    go.poll = 0;
    if (deadline != Py_None) {
        go.deadline_ms = PyLong_AsLongLong(deadline);
        if (go.deadline_ms == -1 && PyErr_Occurred())
            return NULL;
    }
    EngineObject *eng = (EngineObject *)self;
    char err[LLMRETRY_ERRBUF] = "the engine is closed";
    llmretry_group *g = NULL;
    llmretry_status st = LLMRETRY_ESTATE;
    pthread_mutex_lock(&eng->mu);
    if (eng->engine)
        st = llmretry_group_new(eng->engine, &go, &g, err, sizeof err);
    pthread_mutex_unlock(&eng->mu);
    if (st != LLMRETRY_OK) {
        PyErr_SetString(st == LLMRETRY_EINVAL ? PyExc_ValueError
                        : st == LLMRETRY_ENOMEM ? PyExc_MemoryError : PyExc_RuntimeError, err);
        return NULL;
    }
    PyTypeObject *type = mstate(self)->group_type;
    GroupObject *o = (GroupObject *)type->tp_alloc(type, 0);
    if (!o) {
        llmretry_group_free(g);
        return NULL;
    }
    o->g = g;
    o->fork_gen = llmretry_fork_generation();
    return (PyObject *)o;
}

/* stats() -> dict: the pacer's window, active, queued, ... (the core's group shape). */
static PyObject *Group_stats(GroupObject *o, PyObject *unused)
{
    (void)unused;
    llmretry_group_stats gs = { 0 };
    if (o->fork_gen == llmretry_fork_generation())
        llmretry_group_stats_get(o->g, &gs);
    return lr_py_shape_dict(mstate((PyObject *)o), LLMRETRY_SHAPE_GROUP, &gs);
}

static void Group_dealloc(GroupObject *o)
{
    PyTypeObject *type = Py_TYPE(o);
    if (o->g && o->fork_gen == llmretry_fork_generation())
        llmretry_group_free(o->g);      /* calls still in it keep it alive */
    type->tp_free((PyObject *)o);
    Py_DECREF(type);
}

static PyMethodDef Group_methods[] = {
    { "stats", (PyCFunction)Group_stats, METH_NOARGS,
      "stats() -> dict: window, active, queued, pauses, halvings." },
    { NULL, NULL, 0, NULL },
};

static PyType_Slot Group_slots[] = {
    { Py_tp_dealloc, Group_dealloc },
    { Py_tp_methods, Group_methods },
    { Py_tp_doc, "A batch pacer for calls started with group= (Engine.group())." },
    { 0, NULL },
};

PyType_Spec Group_spec = {
    .name = "llmretry._llmretry.Group",
    .basicsize = sizeof(GroupObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = Group_slots,
};
