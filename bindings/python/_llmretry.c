/* llmretry._llmretry: the CPython face of the C core.
 *
 * Everything here converts between Python and C and waits: arguments are
 * turned into llmretry_options before the GIL is released; the calling
 * thread then waits on the call's mailbox with the GIL released, waking
 * every 50 ms to run signal handlers (the model is CPython's
 * Modules/timemodule.c), and delivers events and validation requests to
 * Python code on this same thread. The public API is python/llmretry; this
 * module's contract is python/llmretry/_llmretry.pyi. */
#include "binding.h"
#include "json_encode.h"
#include "policies.h"
#include "results.h"

#include <cjson/cJSON.h>

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


module_state *lr_py_state_of(PyObject *module)
{
    return (module_state *)PyModule_GetState(module);
}

/* Set d[key] = v, stealing v; -1 (and v released) on failure. */
int lr_py_put(PyObject *d, const char *key, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* ---- JSON helpers and the policy ----------------------------------------- */

static int utf8_of(PyObject *o, const char *what, const char **s, Py_ssize_t *len)
{
    if (PyUnicode_Check(o)) {
        *s = PyUnicode_AsUTF8AndSize(o, len);
        return *s ? 0 : -1;
    }
    if (PyBytes_Check(o)) {
        *s = PyBytes_AS_STRING(o);
        *len = PyBytes_GET_SIZE(o);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s must be str or bytes, not %.100s", what, Py_TYPE(o)->tp_name);
    return -1;
}

static PyObject *extract_json(PyObject *module, PyObject *text)
{
    (void)module;
    const char *s;
    Py_ssize_t len;
    if (utf8_of(text, "text", &s, &len) < 0)
        return NULL;
    size_t start, n;
    char err[LLMRETRY_ERRBUF];
    if (llmretry_extract_json(s, (size_t)len, &start, &n, err, sizeof err) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    return PyUnicode_DecodeUTF8(s + start, (Py_ssize_t)n, "strict");
}

static PyObject *assert_shape_json(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *kwlist[] = { "json_text", "shape_json", "path", NULL };
    PyObject *json, *shape;
    const char *path = "root";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|s:assert_shape_json", kwlist, &json, &shape,
                                     &path))
        return NULL;
    const char *js, *ss;
    Py_ssize_t jl, sl;
    if (utf8_of(json, "json_text", &js, &jl) < 0 || utf8_of(shape, "shape_json", &ss, &sl) < 0)
        return NULL;
    char err[LLMRETRY_ERRBUF];
    if (llmretry_assert_shape(js, (size_t)jl, ss, (size_t)sl, path, err, sizeof err) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* schema_errors(schema_text, json_text) -> None (it matches) or the JSON
 * text of its errors; ValueError for a refused schema or text not JSON. */
static PyObject *schema_errors(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *schema, *json;
    if (!PyArg_ParseTuple(args, "OO:schema_errors", &schema, &json))
        return NULL;
    const char *ss, *js;
    Py_ssize_t sl, jl;
    if (utf8_of(schema, "schema", &ss, &sl) < 0 || utf8_of(json, "json_text", &js, &jl) < 0)
        return NULL;
    char err[LLMRETRY_ERRBUF], *errors = NULL;
    llmretry_status st;
    Py_BEGIN_ALLOW_THREADS
    st = llmretry_schema_validate(ss, (size_t)sl, js, (size_t)jl, &errors, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (st == LLMRETRY_ENOMEM)
        return PyErr_NoMemory();
    if (st != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    if (!errors)
        Py_RETURN_NONE;
    PyObject *out = PyUnicode_FromString(errors);
    llmretry_free(errors);
    return out;
}

static PyObject *parse_retry_after(PyObject *module, PyObject *args)
{
    (void)module;
    const char *value;
    long long now;
    if (!PyArg_ParseTuple(args, "sL:parse_retry_after", &value, &now))
        return NULL;
    return PyLong_FromLongLong((long long)llmretry_parse_retry_after(value, now));
}

/* estimate_tokens(url, body, count): the core's token estimate, each
 * prompt text counted by count(str) -> int (the host's tokenizer); None
 * when count fails (raises, or is not a non-negative int): the engine then
 * estimates. The exception is not kept: a tokenizer failing on some text
 * is not the call's error. */
typedef struct {
    PyObject *count;
} py_counter;

static int64_t count_text(const char *text, size_t len, void *ud)
{
    py_counter *pc = ud;
    PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
    PyObject *n = s ? PyObject_CallOneArg(pc->count, s) : NULL;
    Py_XDECREF(s);
    long long k = n && PyLong_Check(n) ? PyLong_AsLongLong(n) : -1;
    Py_XDECREF(n);
    if (PyErr_Occurred() || k < 0) {
        PyErr_Clear();
        return -1;
    }
    return (int64_t)k;
}

static PyObject *estimate_tokens(PyObject *module, PyObject *args)
{
    (void)module;
    const char *url, *body;
    Py_ssize_t len;
    py_counter pc;
    if (!PyArg_ParseTuple(args, "zy#O:estimate_tokens", &url, &body, &len, &pc.count))
        return NULL;
    int64_t n = llmretry_estimate_tokens(url, body, (size_t)len,
                                         pc.count == Py_None ? NULL : count_text, &pc);
    if (n < 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)n);
}

/* check_header(name, value, index): the core's rule for one extra header
 * (llmretry_check_header); ValueError with its message. */
static PyObject *check_header(PyObject *module, PyObject *args)
{
    (void)module;
    const char *name, *value;
    Py_ssize_t nl, vl, index;
    if (!PyArg_ParseTuple(args, "s#s#n:check_header", &name, &nl, &value, &vl, &index))
        return NULL;
    char err[LLMRETRY_ERRBUF];
    if (llmretry_check_header(name, (size_t)nl, value, (size_t)vl, (size_t)index, err,
                              sizeof err) != LLMRETRY_OK) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* stream_body(url, body, streamed): llmretry_stream_body, the body the
 * core sends for an object the host encoded; None when it is sent as is. */
static PyObject *stream_body(PyObject *module, PyObject *args)
{
    (void)module;
    const char *url, *body;
    Py_ssize_t len;
    int streamed;
    if (!PyArg_ParseTuple(args, "zy#p:stream_body", &url, &body, &len, &streamed))
        return NULL;
    size_t n = (size_t)len;
    char *out = llmretry_stream_body(url, body, &n, streamed);
    if (!out)
        Py_RETURN_NONE;
    PyObject *bytes = PyBytes_FromStringAndSize(out, (Py_ssize_t)n);
    llmretry_free(out);
    return bytes;
}

/* A str from the core's malloc'd text (freed here); MemoryError for NULL. */
static PyObject *str_of_core_text(char *text)
{
    if (!text)
        return PyErr_NoMemory();
    PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "surrogateescape");
    llmretry_free(text);
    return s;
}

/* url_join(base, path): llmretry_url_join, the engine's join of a base URL
 * and a path (before the base's query). */
static PyObject *url_join(PyObject *module, PyObject *args)
{
    (void)module;
    const char *base, *path;
    if (!PyArg_ParseTuple(args, "ss:url_join", &base, &path))
        return NULL;
    return str_of_core_text(llmretry_url_join(base, path));
}

/* url_shown(url): llmretry_url_shown, the URL without its user info and
 * query (each "***"), as the endpoint stats show it. */
static PyObject *url_shown(PyObject *module, PyObject *arg)
{
    (void)module;
    const char *url = PyUnicode_AsUTF8(arg);
    if (!url)
        return NULL;
    return str_of_core_text(llmretry_url_shown(url));
}

/* option_suggest(name, names): llmretry_option_suggest over names (a
 * sequence of str): the one name meant, or None. */
static PyObject *option_suggest(PyObject *module, PyObject *args)
{
    (void)module;
    const char *name;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "sO:option_suggest", &name, &names))
        return NULL;
    PyObject *seq = PySequence_Fast(names, "option_suggest: names must be a sequence of str");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char **texts = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof *texts);
    PyObject *out = NULL;
    if (!texts) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "option_suggest: names must be a sequence of str");
            goto done;
        }
        if (!(texts[i] = PyUnicode_AsUTF8(item)))
            goto done;
    }
    const char *meant = llmretry_option_suggest(name, texts, (size_t)n);
    out = meant ? PyUnicode_FromString(meant) : Py_NewRef(Py_None);
done:
    PyMem_Free(texts);
    Py_DECREF(seq);
    return out;
}

/* json_text_opens(data): llmretry_json_text_opens over bytes-like data. */
static PyObject *json_text_opens(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    int opens = llmretry_json_text_opens(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(opens);
}

/* text_quotes(text, body, secrets): llmretry_text_quotes of bytes-like text
 * and body, and a sequence of str secrets. */
static PyObject *text_quotes(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer text, body;
    PyObject *secrets;
    if (!PyArg_ParseTuple(args, "y*y*O:text_quotes", &text, &body, &secrets))
        return NULL;
    PyObject *fast = PySequence_Fast(secrets, "text_quotes(): secrets must be a sequence of str");
    const char **v = NULL;
    Py_ssize_t n = fast ? PySequence_Fast_GET_SIZE(fast) : 0;
    PyObject *out = NULL;
    if (fast && !(v = PyMem_Calloc((size_t)n + 1, sizeof *v)))
        PyErr_NoMemory();
    for (Py_ssize_t i = 0; v && i < n; i++) {
        v[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
        if (!v[i]) {
            PyErr_Format(PyExc_TypeError, "text_quotes(): secrets[%zd] must be a str", i);
            PyMem_Free(v);
            v = NULL;
        }
    }
    if (v)
        out = PyBool_FromLong(llmretry_text_quotes(text.buf, (size_t)text.len, body.buf,
                                                   (size_t)body.len, v, (size_t)n));
    PyMem_Free(v);
    Py_XDECREF(fast);
    PyBuffer_Release(&text);
    PyBuffer_Release(&body);
    return out;
}

/* body_fields(): llmretry_body_fields as a tuple of str. */
static PyObject *body_fields(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    const char *const *f = llmretry_body_fields();
    Py_ssize_t n = 0;
    while (f[n])
        n++;
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *s = PyUnicode_FromString(f[i]);
        if (!s) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, s);
    }
    return out;
}

static PyMethodDef module_methods[] = {
    { "run_pool", (PyCFunction)(void (*)(void))lr_run_pool, METH_VARARGS | METH_KEYWORDS,
      "run_pool(items, limit, worker, return_exceptions=False, *, deadline_ms=None,\n"
      "         adaptive=True, on_result=None, stats=None) -> list (see _llmretry.pyi)." },
    { "extract_json", extract_json, METH_O,
      "extract_json(text) -> str: the JSON text inside model output." },
    { "assert_shape_json", (PyCFunction)(void (*)(void))assert_shape_json,
      METH_VARARGS | METH_KEYWORDS, "assert_shape_json(json_text, shape_json, path='root')." },
    { "schema_errors", schema_errors, METH_VARARGS,
      "schema_errors(schema_text, json_text) -> None or the JSON text of its errors." },
    { "_set_result_types", lr_set_result_types, METH_VARARGS,
      "_set_result_types(Result, Meta, scan_once, parse): the classes call_many builds." },
    { "encode_json", lr_py_json_encode, METH_O,
      "encode_json(obj) -> bytes of json.dumps(obj, ensure_ascii=False, separators=(',', ':'),\n"
      "allow_nan=False), or None when json's encoder is to say (see json_encode.c)." },
    { "_json_decode", lr_py_json_decode, METH_O,
      "_json_decode(body) -> (value,) when the C decoder takes the body, else () (tests)." },
    { "_parse_body", lr_py_parse_body, METH_O,
      "_parse_body(body) -> Result.data of a 2xx body (ValueError: not JSON) (tests)." },
    { "_batch_tally", lr_py_batch_tally, METH_O,
      "_batch_tally(values) -> (finished, outcomes): how many values are not None, and\n"
      "the indices of the outcome dicts among them." },
    { "encode_bodies", lr_py_encode_bodies, METH_VARARGS,
      "encode_bodies(bodies, url, encode_one) -> [(bytes, model)]: a listed batch's bodies\n"
      "as sent; encode_one(index, body) for each exact dict the C encoder leaves, and\n"
      "every other body." },
    { "stream_body", stream_body, METH_VARARGS,
      "stream_body(url, body_bytes, streamed) -> bytes or None: the body the core sends\n"
      "for an object the host encoded (\"stream\": true when streamed, usage asked)." },
    { "url_join", url_join, METH_VARARGS,
      "url_join(base, path) -> str: the engine's join of a base URL and a path ('/files'):\n"
      "trailing slashes trimmed, the path before the base's query, no fragment." },
    { "judge_answer", (PyCFunction)(void (*)(void))lr_py_judge_answer,
      METH_VARARGS | METH_KEYWORDS,
      "judge_answer(status, answer, body, **options) -> Result | dict: what\n"
      "Engine.call(body, as_result=True, **options) gives had the server answered\n"
      "`status` with the bytes `answer` in its one attempt (a Batch API's result lines)." },
    { "text_quotes", text_quotes, METH_VARARGS,
      "text_quotes(text, body, secrets) -> bool: does a server's text quote the request\n"
      "body's messages or one of the secrets (the core's screen of an error's text)." },
    { "json_text_opens", json_text_opens, METH_O,
      "json_text_opens(data) -> bool: does a body's text open a JSON object (or array):\n"
      "'{' or '[' after white space (the core's check at submit)." },
    { "body_fields", body_fields, METH_NOARGS,
      "body_fields() -> tuple of str: the request body's own fields (model, messages, ...),\n"
      "which keywords name when they were meant for the body." },
    { "option_suggest", option_suggest, METH_VARARGS,
      "option_suggest(name, names) -> str or None: the one of names an unknown option name\n"
      "most likely meant (case, '_' and the '_ms' unit aside; whole words; a typo)." },
    { "url_shown", url_shown, METH_O,
      "url_shown(url) -> str: the URL with its user info and query each '***', no fragment\n"
      "(as endpoint_stats shows it)." },
    { "check_header", check_header, METH_VARARGS,
      "check_header(name, value, index): ValueError unless the core would send the header." },
    { "estimate_tokens", estimate_tokens, METH_VARARGS,
      "estimate_tokens(url, body_bytes, count) -> int or None: the tokens the body is\n"
      "charged against tpm, its prompt texts counted by count(str) -> int (None: the\n"
      "core's characters / 4); None when count fails." },
    { "parse_retry_after", parse_retry_after, METH_VARARGS,
      "parse_retry_after(value, now_unix_ms) -> int: ms, or -1 when not usable." },
    { "check_options", (PyCFunction)(void (*)(void))lr_py_check_options,
      METH_VARARGS | METH_KEYWORDS,
      "check_options(**keywords): ValueError/TypeError unless a batch's calls can share them." },
    { "options", lr_py_options, METH_NOARGS,
      "options() -> ((name, type, flags), ...): the core's call options." },
    { "describe", lr_py_describe, METH_NOARGS,
      "describe() -> dict: the core's option table, shapes and enumerations\n"
      "(what tools/gen_surface.py generates the typed surface from)." },
    LR_PY_POLICY_METHODS
    { NULL, NULL, 0, NULL },
};

/* ---- the module ------------------------------------------------------------ */

static int module_exec(PyObject *m)
{
    module_state *st = lr_py_state_of(m);
    st->engine_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &Engine_spec, NULL);
    if (!st->engine_type || PyModule_AddType(m, st->engine_type) < 0)
        return -1;
    struct { PyTypeObject **slot; PyType_Spec *spec; } types[] = {
        { &st->call_type, &Call_spec }, { &st->channel_type, &Channel_spec },
        { &st->group_type, &Group_spec }, { &st->batch_run_type, &BatchRun_spec },
        { &st->lazy_meta_type, &LazyMeta_spec },
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        *types[i].slot = (PyTypeObject *)PyType_FromModuleAndSpec(m, types[i].spec, NULL);
        if (!*types[i].slot || PyModule_AddType(m, *types[i].slot) < 0)
            return -1;
    }
    st->pool_stop = PyErr_NewExceptionWithDoc(
        "llmretry._llmretry.PoolStop",
        "Raised inside a run_pool worker whose pool is stopping (Ctrl-C).",
        PyExc_BaseException, NULL);
    if (!st->pool_stop)
        return -1;
    Py_INCREF(st->pool_stop);
    if (PyModule_AddObject(m, "PoolStop", st->pool_stop) < 0) {
        Py_DECREF(st->pool_stop);
        return -1;
    }
    if (lr_py_shapes_init(st) < 0)
        return -1;
    st->not_started = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (!st->not_started)
        return -1;
    Py_INCREF(st->not_started);
    if (PyModule_AddObject(m, "NOT_STARTED", st->not_started) < 0) {
        Py_DECREF(st->not_started);
        return -1;
    }
    PyObject *names = PyTuple_New(LLMRETRY_EV_CHUNK);    /* every event, in bit order */
    if (!names)
        return -1;
    for (int t = 0; t < LLMRETRY_EV_CHUNK; t++) {
        PyObject *name = PyUnicode_FromString(llmretry_event_name((llmretry_event_type)t));
        if (!name) {
            Py_DECREF(names);
            return -1;
        }
        PyTuple_SET_ITEM(names, t, name);
    }
    if (PyModule_AddObject(m, "EVENT_NAMES", names) < 0) {
        Py_DECREF(names);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "EVENTS_ALL", LLMRETRY_EVENTS_ALL) < 0)
        return -1;
    /* VERSION is the header this module was compiled with; CORE_VERSION and
     * LIBCURL_VERSION what the linked core and the loaded libcurl say. */
    if (PyModule_AddStringConstant(m, "CORE_VERSION", llmretry_version()) < 0
        || PyModule_AddStringConstant(m, "LIBCURL_VERSION", llmretry_libcurl_version()) < 0)
        return -1;
    return PyModule_AddStringConstant(m, "VERSION", LLMRETRY_VERSION);
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    module_state *st = lr_py_state_of(m);
    Py_VISIT(st->engine_type);
    Py_VISIT(st->call_type);
    Py_VISIT(st->channel_type);
    Py_VISIT(st->group_type);
    Py_VISIT(st->batch_run_type);
    Py_VISIT(st->lazy_meta_type);
    Py_VISIT(st->pool_stop);
    Py_VISIT(st->not_started);
    return lr_results_traverse(st, visit, arg);
}

static int module_clear(PyObject *m)
{
    module_state *st = lr_py_state_of(m);
    Py_CLEAR(st->engine_type);
    Py_CLEAR(st->call_type);
    Py_CLEAR(st->channel_type);
    Py_CLEAR(st->group_type);
    Py_CLEAR(st->batch_run_type);
    Py_CLEAR(st->lazy_meta_type);
    Py_CLEAR(st->pool_stop);
    Py_CLEAR(st->not_started);
    lr_results_clear(st);
    lr_py_shapes_clear(st);
    return 0;
}

static void module_free(void *m)
{
    module_clear((PyObject *)m);
}

static PyModuleDef_Slot module_slots[] = {
    { Py_mod_exec, (void *)module_exec },
#ifdef Py_mod_multiple_interpreters
    { Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED },
#endif
#ifdef Py_mod_gil
    /* State is in module state and objects; shared C data has its own locks. */
    { Py_mod_gil, Py_MOD_GIL_NOT_USED },
#endif
    { 0, NULL },
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "llmretry._llmretry",
    .m_doc = "The C core of llmretry (private: use the llmretry package).",
    .m_size = sizeof(module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__llmretry(void)
{
    return PyModuleDef_Init(&module_def);
}
