/* A successful call's outcome as the package's Result, built in C.
 *
 * Why in C: a batch of 20,000 calls builds 20,000 Results on the one
 * thread that also waits for the engine; an outcome dict, a Python parse
 * function and a Meta built by setters cost that thread more than the
 * engine spends on the whole request. Here the body's bytes go straight
 * to Python values (json_decode.c: the core's pull reader, keys kept
 * across bodies; json's C scanner only for what it leaves, so values and
 * errors stay json.loads') and the fields into Meta's and Result's slots,
 * through the slots' own descriptors (Meta is a frozen dataclass: its
 * __setattr__ refuses, its slot descriptors are how dataclasses set them
 * too). Meta's fields are the core's meta shape (llmretry/shapes.h),
 * walked in order. */
#include "results.h"

#include "json_decode.h"

#include <stddef.h>
#include <string.h>

/* Result.meta is a property over _meta, which holds a LazyMeta until read. */
static const char *const RESULT_FIELDS[LR_RESULT_FIELDS] = { "data", "_meta" };

/* The slot descriptor `name` of `type`, or NULL with TypeError. */
static PyObject *slot_descriptor(PyObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d && !PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%.100s.%s is not a __slots__ field",
                     ((PyTypeObject *)type)->tp_name, name);
        Py_CLEAR(d);
    }
    return d;
}

/* _set_result_types(Result, Meta, scan_once, parse): register the classes
 * lr_build_result makes (both with __slots__ naming their fields: Meta one
 * per field of the core's meta shape, or TypeError), json's scanner and the
 * package's parse(bytes) for bodies the scanner refuses. */
PyObject *lr_set_result_types(PyObject *module, PyObject *args)
{
    PyObject *result_type, *meta_type, *scan, *parse;
    if (!PyArg_ParseTuple(args, "O!O!OO:_set_result_types", &PyType_Type, &result_type,
                          &PyType_Type, &meta_type, &scan, &parse))
        return NULL;
    if (!PyCallable_Check(scan) || !PyCallable_Check(parse)) {
        PyErr_SetString(PyExc_TypeError, "scan_once and parse must be callable");
        return NULL;
    }
    PyObject *rf[LR_RESULT_FIELDS] = { NULL }, *mf[LR_SHAPE_MAX_FIELDS] = { NULL };
    int ok = 1;
    for (int i = 0; ok && i < LR_RESULT_FIELDS; i++)
        ok = (rf[i] = slot_descriptor(result_type, RESULT_FIELDS[i])) != NULL;
    size_t n_meta = llmretry_shape_field_count(LLMRETRY_SHAPE_META);
    for (size_t i = 0; ok && i < n_meta; i++)
        ok = (mf[i] = slot_descriptor(
                  meta_type, llmretry_shape_field_info(LLMRETRY_SHAPE_META, i)->name)) != NULL;
    if (!ok) {
        for (int i = 0; i < LR_RESULT_FIELDS; i++)
            Py_XDECREF(rf[i]);
        for (int i = 0; i < LR_SHAPE_MAX_FIELDS; i++)
            Py_XDECREF(mf[i]);
        return NULL;
    }
    module_state *st = (module_state *)PyModule_GetState(module);
    lr_results_clear(st);
    st->key_cache = lr_key_cache_new();     /* NULL: bodies go to json's scanner */
    Py_INCREF(result_type);
    Py_INCREF(meta_type);
    Py_INCREF(scan);
    Py_INCREF(parse);
    st->result_type = (PyTypeObject *)result_type;
    st->meta_type = (PyTypeObject *)meta_type;
    st->scan_once = scan;
    st->parse = parse;
    memcpy(st->result_fields, rf, sizeof rf);
    memcpy(st->meta_fields, mf, sizeof mf);
    Py_RETURN_NONE;
}

/* Untrack the dicts of a freshly parsed value that hold only atomic values
 * (numbers, strings, None, such dicts): what the cyclic GC does itself to
 * the dicts it visits, done before it has to. A dict tracks itself again
 * when a container is put into it, so this is safe; lists cannot, so they
 * stay tracked. Returns whether `v` is now untracked. A response's message
 * and usage objects are such dicts; a batch keeps thousands alive. */
static int untrack_atomic(PyObject *v, int depth)
{
    if (!PyObject_GC_IsTracked(v))
        return 1;
    if (depth > 32)
        return 0;
    if (PyList_CheckExact(v)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++)
            untrack_atomic(PyList_GET_ITEM(v, i), depth + 1);
        return 0;
    }
    if (!PyDict_CheckExact(v))
        return 0;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    int atomic = 1;
    while (PyDict_Next(v, &pos, &key, &value))
        atomic &= untrack_atomic(value, depth + 1);     /* JSON keys are str */
    if (atomic)
        PyObject_GC_UnTrack(v);
    return atomic;
}

static int is_json_space(Py_UCS4 ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/* The body parsed as JSON: new reference, or NULL with the error set (a
 * ValueError for what is not UTF-8 JSON). json_decode.c first; what it
 * leaves goes to json's scanner, as before it: whitespace around the value
 * is skipped here, as json.loads does; anything else goes to the package's
 * parser, whose ValueError says what is wrong. */
static PyObject *parse_body(const module_state *st, const char *body, size_t len)
{
    PyObject *value = lr_json_decode(st->key_cache, body, len);
    if (value)
        return value;
    PyObject *text = PyUnicode_DecodeUTF8(body, (Py_ssize_t)len, NULL);
    if (!text)
        return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), start = 0;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    while (start < n && is_json_space(PyUnicode_READ(kind, data, start)))
        start++;
    PyObject *index = PyLong_FromSsize_t(start);
    PyObject *pair = NULL;
    if (index) {
        PyObject *args[2] = { text, index };
        pair = PyObject_Vectorcall(st->scan_once, args, 2, NULL);
        Py_DECREF(index);
    }
    if (pair && PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
        Py_ssize_t end = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
        while (end >= 0 && end < n && is_json_space(PyUnicode_READ(kind, data, end)))
            end++;
        if (end == n) {
            value = PyTuple_GET_ITEM(pair, 0);
            Py_INCREF(value);
            untrack_atomic(value, 0);
        }
    }
    Py_DECREF(text);
    /* A RecursionError too: cJSON accepted up to 1000 levels, the scanner
     * recurses out earlier; the package's parser says so as a ValueError. */
    if (!value && (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_StopIteration) ||
                   PyErr_ExceptionMatches(PyExc_ValueError) ||
                   PyErr_ExceptionMatches(PyExc_RecursionError))) {
        PyErr_Clear();
        PyObject *b = PyBytes_FromStringAndSize(body, (Py_ssize_t)len);
        if (b) {
            value = PyObject_CallOneArg(st->parse, b);
            Py_DECREF(b);
        }
    }
    Py_XDECREF(pair);
    return value;
}

/* For the tests (tests/python/test_json_decode.py), which hold both paths
 * to json.loads. _json_decode(bytes) -> (value,) when json_decode.c takes
 * the body, () when it leaves it to json's scanner; _parse_body(bytes) ->
 * Result.data of such a body (ValueError when Python's parser refuses it). */
PyObject *lr_py_json_decode(PyObject *module, PyObject *arg)
{
    const module_state *st = PyModule_GetState(module);
    if (!PyBytes_Check(arg))
        return PyErr_Format(PyExc_TypeError, "_json_decode wants bytes");
    PyObject *v = lr_json_decode(st->key_cache, PyBytes_AS_STRING(arg),
                                 (size_t)PyBytes_GET_SIZE(arg));
    if (!v)
        return PyTuple_New(0);
    PyObject *t = PyTuple_Pack(1, v);
    Py_DECREF(v);
    return t;
}

PyObject *lr_py_parse_body(PyObject *module, PyObject *arg)
{
    const module_state *st = PyModule_GetState(module);
    if (!PyBytes_Check(arg))
        return PyErr_Format(PyExc_TypeError, "_parse_body wants bytes");
    if (!st->scan_once)
        return PyErr_Format(PyExc_RuntimeError, "no parser registered");
    return parse_body(st, PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg));
}

/* Set the slot behind descriptor d of obj, stealing v. */
static int set_slot(PyObject *d, PyObject *obj, PyObject *v)
{
    if (!v)
        return -1;
    int rc = Py_TYPE(d)->tp_descr_set(d, obj, v);
    Py_DECREF(v);
    return rc;
}

PyObject *lr_str_or_none(const char *s)
{
    if (!s)
        Py_RETURN_NONE;
    /* Server text may be anything: never fail on bad UTF-8. */
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

/* Meta from a source of the core's meta fields, in the shape's order. */
typedef int (*meta_field_fn)(const void *src, size_t i, llmretry_field *f);

static PyObject *build_meta(const module_state *st, const void *src, meta_field_fn field)
{
    PyObject *m = st->meta_type->tp_alloc(st->meta_type, 0);
    if (!m)
        return NULL;
    /* Each value is made only if the ones before were set: nothing leaks. */
    llmretry_field f;
    for (size_t i = 0; field(src, i, &f) == 0; i++) {
        if (set_slot(st->meta_fields[i], m, lr_py_field_value(st, &f)) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    /* A frozen Meta holding ints, strs, None and a fresh dict of ints is in
     * no reference cycle, so the cyclic GC need not visit it: the rule
     * CPython applies to tuples of atomic values. A batch keeps one Meta
     * per item alive, and every GC pass would walk them all. */
    PyObject_GC_UnTrack(m);
    return m;
}

static int result_meta_field(const void *r, size_t i, llmretry_field *f)
{
    return llmretry_shape_field(LLMRETRY_SHAPE_META, r, i, f);
}

/* ---- LazyMeta: a success's Meta, built when first read ---------------------
 *
 * Why: a batch of 20,000 calls whose caller reads only result.data (most
 * do) built 20,000 Metas, on the thread that also waits for the engine:
 * 16 slots, four strs and two usage dicts each, and three of the ~10
 * objects per item whose allocation sets off the cyclic GC. A LazyMeta is one allocation holding the
 * values (ints, the strings' bytes, the usages) and no Python object, so
 * the GC neither counts nor visits it; Result.meta calls it once, on first
 * read, and keeps the Meta it returns. */

#define LAZY_USAGES 2               /* usage fields of the meta shape (more: built at once) */

typedef struct {
    PyObject_VAR_HEAD               /* ob_size: the bytes of text */
    size_t n;                       /* fields, in the meta shape's order */
    unsigned char type[LR_SHAPE_MAX_FIELDS];
    /* An int's value; a string's offset in text; a usage's index in usage. */
    int64_t i[LR_SHAPE_MAX_FIELDS];
    llmretry_usage usage[LAZY_USAGES];
    char text[1];                   /* the strings, each NUL-terminated */
} LazyMetaObject;

static int lazy_meta_field(const void *src, size_t i, llmretry_field *f)
{
    const LazyMetaObject *z = src;
    if (i >= z->n)
        return -1;
    memset(f, 0, sizeof *f);
    f->type = (llmretry_field_type)z->type[i];
    if (f->type == LLMRETRY_FIELD_STRING)
        f->s = z->text + z->i[i];
    else if (f->type == LLMRETRY_FIELD_USAGE)
        f->usage = &z->usage[z->i[i]];
    else
        f->i = z->i[i];
    return 0;
}

/* The LazyMeta of r's meta, or NULL: with an error set when out of
 * memory, without one when a field is of a kind it does not keep (then
 * the caller builds the Meta now). */
static PyObject *new_lazy_meta(const module_state *st, const llmretry_result *r)
{
    /* The fields read once (each read walks the shape's table) and the
     * strings' lengths taken once: this runs for every success. */
    llmretry_field fs[LR_SHAPE_MAX_FIELDS + 1];
    size_t lens[LR_SHAPE_MAX_FIELDS];
    size_t n = 0, text = 0, usages = 0;
    for (; llmretry_shape_field(LLMRETRY_SHAPE_META, r, n, &fs[n]) == 0; n++) {
        if (n >= LR_SHAPE_MAX_FIELDS)
            return NULL;
        llmretry_field *f = &fs[n];
        if (f->type == LLMRETRY_FIELD_STRING && !f->s)
            f->type = LLMRETRY_FIELD_NULL;  /* as lr_str_or_none reads it */
        if (f->type == LLMRETRY_FIELD_STRING)
            text += (lens[n] = strlen(f->s) + 1);
        else if (f->type == LLMRETRY_FIELD_USAGE && ++usages > LAZY_USAGES)
            return NULL;
        else if (f->type != LLMRETRY_FIELD_INT && f->type != LLMRETRY_FIELD_BOOL &&
                 f->type != LLMRETRY_FIELD_NULL && f->type != LLMRETRY_FIELD_USAGE)
            return NULL;            /* a list, JSON: not kept here */
    }
    LazyMetaObject *z = (LazyMetaObject *)st->lazy_meta_type->tp_alloc(
        st->lazy_meta_type, (Py_ssize_t)text);
    if (!z)
        return NULL;
    z->n = n;
    size_t at = 0, u = 0;
    for (size_t i = 0; i < n; i++) {
        const llmretry_field *f = &fs[i];
        z->type[i] = (unsigned char)f->type;
        z->i[i] = f->i;
        if (f->type == LLMRETRY_FIELD_STRING) {
            memcpy(z->text + at, f->s, lens[i]);
            z->i[i] = (int64_t)at;
            at += lens[i];
        } else if (f->type == LLMRETRY_FIELD_USAGE) {
            z->usage[u] = *f->usage;
            z->i[i] = (int64_t)u++;
        }
    }
    return (PyObject *)z;
}

/* LazyMeta() -> Meta: a new Meta of the values (Result.meta keeps it). */
static PyObject *LazyMeta_call(PyObject *self, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "LazyMeta() takes no arguments");
        return NULL;
    }
    const module_state *st = PyType_GetModuleState(Py_TYPE(self));
    if (!st || !st->meta_type) {
        PyErr_SetString(PyExc_RuntimeError, "no Meta class registered");
        return NULL;
    }
    return build_meta(st, self, lazy_meta_field);
}

/* LazyMeta.pick(indices) -> tuple: the values of the meta shape's fields at
 * `indices` (a tuple of ints: their places in Meta.__slots__), each as the
 * Meta would hold it, without building the Meta or keeping anything.
 * Why: llmretry.otel reads a dozen fields of every result of a batch,
 * and building a Meta for it (16 slots, four strings, two usage dicts,
 * dropped at once) cost the calling thread more than the reads. */
static PyObject *LazyMeta_pick(PyObject *self, PyObject *arg)
{
    if (!PyTuple_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "pick() wants a tuple of field indices");
        return NULL;
    }
    const module_state *st = PyType_GetModuleState(Py_TYPE(self));
    if (!st)
        return NULL;
    const LazyMetaObject *z = (const LazyMetaObject *)self;
    Py_ssize_t n = PyTuple_GET_SIZE(arg);
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t j = 0; out && j < n; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(arg, j));
        if (i == -1 && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        llmretry_field f;
        if (i < 0 || lazy_meta_field(z, (size_t)i, &f) != 0) {
            PyErr_Format(PyExc_IndexError, "no meta field %zd", i);
            Py_CLEAR(out);
            break;
        }
        PyObject *v = lr_py_field_value(st, &f);
        if (!v)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, j, v);
    }
    return out;
}

static void LazyMeta_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *LazyMeta_reduce(PyObject *self, PyObject *unused)
{
    (void)unused;
    (void)self;
    PyErr_SetString(PyExc_TypeError, "a LazyMeta is not pickled: pickle Result.meta");
    return NULL;
}

static PyMethodDef LazyMeta_methods[] = {
    { "__reduce__", LazyMeta_reduce, METH_NOARGS, NULL },
    { "pick", LazyMeta_pick, METH_O,
      "pick(indices) -> tuple: the values of the fields at those places of Meta.__slots__." },
    { NULL, NULL, 0, NULL },
};

static PyType_Slot LazyMeta_slots[] = {
    { Py_tp_dealloc, LazyMeta_dealloc },
    { Py_tp_call, LazyMeta_call },
    { Py_tp_methods, LazyMeta_methods },
    { Py_tp_doc, "A success's Meta values, built into a Meta when Result.meta is first read." },
    { 0, NULL },
};

PyType_Spec LazyMeta_spec = {
    .name = "llmretry._llmretry.LazyMeta",
    .basicsize = offsetof(LazyMetaObject, text),
    .itemsize = 1,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = LazyMeta_slots,
};

int lr_build_result(const module_state *st, const llmretry_result *r, PyObject **out)
{
    *out = NULL;
    if (!r->ok || !st->result_type)
        return 0;
    /* raw_response: the answer's bytes as text (a file's JSON Lines); bytes
     * that are not UTF-8 read as U+FFFD, as the answer is not the caller's. */
    PyObject *data = r->raw_response
                   ? PyUnicode_DecodeUTF8(r->body, (Py_ssize_t)r->body_len, "replace")
                   : parse_body(st, r->body, r->body_len);
    if (!data) {
        /* RecursionError: the parser itself could not be called this deep. */
        if (!PyErr_ExceptionMatches(PyExc_ValueError) &&
            !PyErr_ExceptionMatches(PyExc_RecursionError))
            return -1;
        PyErr_Clear();          /* the package makes the error, from the outcome dict */
        return 0;
    }
    PyObject *meta = new_lazy_meta(st, r);
    if (!meta && !PyErr_Occurred())
        meta = build_meta(st, r, result_meta_field);
    PyObject *res = meta ? st->result_type->tp_alloc(st->result_type, 0) : NULL;
    if (!res) {
        Py_DECREF(data);
        Py_XDECREF(meta);
        return -1;
    }
    if (set_slot(st->result_fields[0], res, data) < 0) {
        Py_DECREF(meta);
        Py_DECREF(res);
        return -1;
    }
    if (set_slot(st->result_fields[1], res, meta) < 0) {
        Py_DECREF(res);
        return -1;
    }
    *out = res;
    return 1;
}

int lr_results_traverse(const module_state *st, visitproc visit, void *arg)
{
    Py_VISIT(st->result_type);
    Py_VISIT(st->meta_type);
    Py_VISIT(st->scan_once);
    Py_VISIT(st->parse);
    for (int i = 0; i < LR_RESULT_FIELDS; i++)
        Py_VISIT(st->result_fields[i]);
    for (int i = 0; i < LR_SHAPE_MAX_FIELDS; i++)
        Py_VISIT(st->meta_fields[i]);
    return 0;
}

void lr_results_clear(module_state *st)
{
    Py_CLEAR(st->result_type);
    Py_CLEAR(st->meta_type);
    Py_CLEAR(st->scan_once);
    Py_CLEAR(st->parse);
    for (int i = 0; i < LR_RESULT_FIELDS; i++)
        Py_CLEAR(st->result_fields[i]);
    for (int i = 0; i < LR_SHAPE_MAX_FIELDS; i++)
        Py_CLEAR(st->meta_fields[i]);
    lr_key_cache_free(st->key_cache);
    st->key_cache = NULL;
}
