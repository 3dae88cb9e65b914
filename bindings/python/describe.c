/* describe(): the core's tables whole (its options, the shapes it hands
 * over, its error kinds and reasons), for tools/gen_surface.py, which
 * writes Python's typed surface and docs/reliability.md's table from them. */
#include "binding.h"

/* Append v to list, stealing it; -1 on failure. */
static int put_list(PyObject *list, PyObject *v)
{
    int rc = v ? PyList_Append(list, v) : -1;
    Py_XDECREF(v);
    return rc;
}

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
        ok = put_list(options, option_row(o)) == 0;
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
