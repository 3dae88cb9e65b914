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

/* Append v to list, stealing it; -1 on failure. */
static int lr_py_put_list(PyObject *list, PyObject *v)
{
    int rc = v ? PyList_Append(list, v) : -1;
    Py_XDECREF(v);
    return rc;
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

/* ---- describe(): the tables themselves, for the generator ------------------ */

static PyObject *names_of(const char *(*name)(int))
{
    PyObject *list = PyList_New(0);
    const char *n;
    for (int i = 1; list && (n = name(i)); i++) {
        PyObject *s = PyUnicode_FromString(n);
        if (!s || PyList_Append(list, s) < 0)
            Py_CLEAR(list);
        Py_XDECREF(s);
    }
    PyObject *t = list ? PyList_AsTuple(list) : NULL;
    Py_XDECREF(list);
    return t;
}

static const char *kind_name(int i) { return llmretry_error_kind_name((llmretry_error_kind)i); }
static const char *reason_name(int i) { return llmretry_reason_name((llmretry_giveup_reason)i); }
static const char *stream_reason_name(int i)
{
    return llmretry_stream_reason_name((llmretry_stream_reason)i);
}

static PyObject *option_row(const llmretry_option_info *o)
{
    PyObject *choices = PyList_New(0);
    for (const char *const *c = o->choices; choices && c && *c; c++) {
        PyObject *s = PyUnicode_FromString(*c);
        if (!s || PyList_Append(choices, s) < 0)
            Py_CLEAR(choices);
        Py_XDECREF(s);
    }
    if (!choices)
        return NULL;
    return Py_BuildValue("{s:s,s:s,s:I,s:s,s:z,s:L,s:L,s:N,s:s}", "name", o->name,
                         "type", lr_py_option_type_name(o->type), "flags", o->flags,
                         "builtin", o->builtin, "range", o->range, "min", (long long)o->min,
                         "max", (long long)o->max, "choices", choices, "doc", o->doc);
}

static PyObject *shape_rows(llmretry_shape s)
{
    static const char *const types[] = { "null", "int", "str", "usage", "bool", "list", "json" };
    size_t n = llmretry_shape_field_count(s);
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; t && i < n; i++) {
        const llmretry_field_info *f = llmretry_shape_field_info(s, i);
        PyObject *row = Py_BuildValue(
            "{s:s,s:s,s:O,s:z,s:s}", "name", f->name, "type", types[f->type],
            "nullable", f->nullable ? Py_True : Py_False, "items",
            f->type == LLMRETRY_FIELD_LIST ? llmretry_shape_name((llmretry_shape)f->list_shape)
                                           : NULL,
            "doc", f->doc);
        if (!row)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, (Py_ssize_t)i, row);
    }
    return t;
}

PyObject *lr_py_describe(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *d = PyDict_New(), *options = PyList_New(0), *shapes = PyDict_New();
    int ok = d && options && shapes;
    const llmretry_option_info *o;
    for (size_t i = 0; ok && (o = llmretry_option_at(i)); i++)
        ok = lr_py_put_list(options, option_row(o)) == 0;
    for (int s = 0; ok && s < LLMRETRY_SHAPE_COUNT; s++) {
        PyObject *rows = shape_rows((llmretry_shape)s);
        ok = rows && PyDict_SetItemString(shapes, llmretry_shape_name((llmretry_shape)s), rows) == 0;
        Py_XDECREF(rows);
    }
    ok = ok && lr_py_put(d, "options", Py_NewRef(options)) == 0 &&
         lr_py_put(d, "shapes", Py_NewRef(shapes)) == 0 &&
         lr_py_put(d, "error_kinds", names_of(kind_name)) == 0 &&
         lr_py_put(d, "reasons", names_of(reason_name)) == 0 &&
         lr_py_put(d, "stream_reasons", names_of(stream_reason_name)) == 0;
    Py_XDECREF(options);
    Py_XDECREF(shapes);
    if (!ok)
        Py_CLEAR(d);
    return d;
}
