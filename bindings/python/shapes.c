/* Every map the core hands to Python, built by walking the core's own
 * description of it (llmretry/shapes.h, and events' fields): events,
 * outcomes, meta, errors, targets, usage, endpoint and group stats. No
 * field is named here; a null value is None. Keys are interned once. */
#include "binding.h"
#include "results.h"

#include <string.h>

/* The value of one field: a new reference, or NULL with the error set. */
PyObject *lr_py_field_value(const module_state *st, const llmretry_field *f)
{
    switch (f->type) {
    case LLMRETRY_FIELD_INT: return PyLong_FromLongLong((long long)f->i);
    case LLMRETRY_FIELD_BOOL: return PyBool_FromLong(f->i != 0);
    case LLMRETRY_FIELD_STRING: return lr_str_or_none(f->s);
    case LLMRETRY_FIELD_USAGE: return lr_py_shape_dict(st, LLMRETRY_SHAPE_USAGE, f->usage);
    case LLMRETRY_FIELD_JSON: {
        /* Core-made JSON (validation errors): the package's parser reads it. */
        PyObject *b = PyBytes_FromString(f->s);
        if (!b || !st->parse)
            return b;
        PyObject *v = PyObject_CallOneArg(st->parse, b);
        Py_DECREF(b);
        return v;
    }
    case LLMRETRY_FIELD_LIST: {
        PyObject *list = PyList_New((Py_ssize_t)f->list.n);
        for (size_t i = 0; list && i < f->list.n; i++) {
            const void *item = (const char *)f->list.items + i * f->list.size;
            PyObject *d = lr_py_shape_dict(st, (llmretry_shape)f->list.shape, item);
            if (!d)
                Py_CLEAR(list);
            else
                PyList_SET_ITEM(list, (Py_ssize_t)i, d);
        }
        return list;
    }
    default: Py_RETURN_NONE;
    }
}

int lr_py_shape_into(const module_state *st, PyObject *d, llmretry_shape s, const void *obj)
{
    llmretry_field f;
    for (size_t i = 0; llmretry_shape_field(s, obj, i, &f) == 0; i++) {
        PyObject *v = lr_py_field_value(st, &f);
        int rc = v ? PyDict_SetItem(d, st->shape_keys[s][i], v) : -1;
        Py_XDECREF(v);
        if (rc < 0)
            return -1;
    }
    return 0;
}

PyObject *lr_py_shape_dict(const module_state *st, llmretry_shape s, const void *obj)
{
    PyObject *d = PyDict_New();
    if (d && lr_py_shape_into(st, d, s, obj) < 0)
        Py_CLEAR(d);
    return d;
}

/* The event as a dict (its fields depend on the event: not interned). */
PyObject *event_dict(const module_state *st, const llmretry_event *ev)
{
    PyObject *d = PyDict_New();
    llmretry_field f;
    for (size_t i = 0; d && llmretry_event_field(ev, i, &f) == 0; i++) {
        PyObject *v = lr_py_field_value(st, &f);
        if (!v || PyDict_SetItemString(d, f.name, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* Set d[key] = bytes(p[:n]). */
static int put_bytes(PyObject *d, PyObject *key, const char *p, size_t n)
{
    PyObject *v = PyBytes_FromStringAndSize(p, (Py_ssize_t)n);
    int rc = v ? PyDict_SetItem(d, key, v) : -1;
    Py_XDECREF(v);
    return rc;
}

/* A finished call as the package reads it: "ok", then a success's meta
 * fields or a failure's error fields (and a failed stream's progress),
 * "body" (a success's; a broken stream's partial chat.completion or, with
 * keep_response, the failure's response) and "headers" (keep_response). */
PyObject *lr_py_outcome(const module_state *st, const llmretry_result *r)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    int rc = PyDict_SetItem(d, st->keys[K_ok], r->ok ? Py_True : Py_False);
    if (!rc)
        rc = lr_py_shape_into(st, d, r->ok ? LLMRETRY_SHAPE_META : LLMRETRY_SHAPE_ERROR, r);
    if (!rc && !r->ok && r->stream)
        rc = lr_py_shape_into(st, d, LLMRETRY_SHAPE_STREAM, r);
    if (!rc && (r->ok || r->body))
        rc = put_bytes(d, st->keys[K_body], r->body, r->body_len);
    if (!rc && r->headers)
        rc = put_bytes(d, st->keys[K_headers], r->headers, r->headers_len);
    if (rc)
        Py_CLEAR(d);
    return d;
}

int lr_py_shapes_init(module_state *st)
{
#define MAKE_KEY(name) \
    if (!(st->keys[K_##name] = PyUnicode_InternFromString(#name))) \
        return -1;
    OUTCOME_KEYS(MAKE_KEY)
#undef MAKE_KEY
    for (int s = 0; s < LLMRETRY_SHAPE_COUNT; s++) {
        size_t n = llmretry_shape_field_count((llmretry_shape)s);
        if (n > LR_SHAPE_MAX_FIELDS) {
            PyErr_Format(PyExc_RuntimeError, "the core's %s shape has %zu fields: raise "
                         "LR_SHAPE_MAX_FIELDS", llmretry_shape_name((llmretry_shape)s), n);
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            const char *name = llmretry_shape_field_info((llmretry_shape)s, i)->name;
            if (!(st->shape_keys[s][i] = PyUnicode_InternFromString(name)))
                return -1;
        }
    }
    return 0;
}

void lr_py_shapes_clear(module_state *st)
{
    for (int i = 0; i < K_COUNT; i++)
        Py_CLEAR(st->keys[i]);
    for (int s = 0; s < LLMRETRY_SHAPE_COUNT; s++)
        for (int i = 0; i < LR_SHAPE_MAX_FIELDS; i++)
            Py_CLEAR(st->shape_keys[s][i]);
}
