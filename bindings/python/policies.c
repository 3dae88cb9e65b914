/* Named policies: thin wrappers over the core's loader (core/src/policies.c).
 * Errors are ValueError with the core's message, word for word what the Lua
 * binding says for the same document. */
#include "policies.h"

#include "llmretry.h"

/* Room for a file's path, the policy, the key and the list of known keys. */
#define POLICY_ERRBUF 1024

static PyObject *raise_from(llmretry_status st, const char *err)
{
    if (st == LLMRETRY_ENOMEM)
        return PyErr_NoMemory();
    PyErr_SetString(PyExc_ValueError, err[0] ? err : llmretry_status_name(st));
    return NULL;
}

PyObject *lr_py_parse_policies(PyObject *module, PyObject *args)
{
    (void)module;
    const char *text, *source = NULL;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "s#|z:parse_policies", &text, &len, &source))
        return NULL;
    char err[POLICY_ERRBUF] = "";
    llmretry_policies *p = NULL;
    llmretry_status st;
    Py_BEGIN_ALLOW_THREADS
    st = llmretry_policies_parse(text, (size_t)len, source, &p, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (st != LLMRETRY_OK)
        return raise_from(st, err);
    size_t n = llmretry_policies_count(p);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        const char *name = llmretry_policies_name(p, i);
        char *json = llmretry_policies_get_json(p, name);
        PyObject *item = json ? Py_BuildValue("(ss)", name, json) : PyErr_NoMemory();
        llmretry_free(json);
        if (!item) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    llmretry_policies_free(p);
    return out;
}

PyObject *lr_py_resolve_policy(PyObject *module, PyObject *args)
{
    (void)module;
    const char *pol = NULL, *ex = NULL, *def = NULL;
    Py_ssize_t plen = 0, elen = 0, dlen = 0;
    if (!PyArg_ParseTuple(args, "z#z#z#:resolve_policy", &pol, &plen, &ex, &elen, &def, &dlen))
        return NULL;
    char err[POLICY_ERRBUF] = "", *out = NULL;
    llmretry_policies *p = NULL;
    llmretry_status st = LLMRETRY_OK;
    if (pol) {
        /* One policy's checked settings, as a document of one policy. */
        PyObject *doc = PyUnicode_FromFormat("{\"p\":%s}", pol);
        if (!doc)
            return NULL;
        Py_ssize_t len;
        const char *text = PyUnicode_AsUTF8AndSize(doc, &len);
        st = text ? llmretry_policies_parse(text, (size_t)len, NULL, &p, err, sizeof err)
                  : LLMRETRY_ENOMEM;
        Py_DECREF(doc);
        if (!text)
            return NULL;
    }
    if (st == LLMRETRY_OK)
        st = llmretry_policies_resolve(p, pol ? "p" : NULL, ex, (size_t)elen, def, (size_t)dlen,
                                       &out, err, sizeof err);
    llmretry_policies_free(p);
    if (st != LLMRETRY_OK)
        return raise_from(st, err);
    PyObject *res = PyUnicode_FromString(out);
    llmretry_free(out);
    return res;
}

PyObject *lr_py_check_policy_value(PyObject *module, PyObject *args)
{
    (void)module;
    const char *key, *json;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "ss#:check_policy_value", &key, &json, &len))
        return NULL;
    char err[POLICY_ERRBUF] = "";
    llmretry_status st = llmretry_policy_check_value(key, json, (size_t)len, err, sizeof err);
    if (st != LLMRETRY_OK)
        return raise_from(st, err);
    Py_RETURN_NONE;
}

PyObject *lr_py_policy_keys(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    size_t n = 0;
    while (llmretry_policy_key(n))
        n++;
    PyObject *out = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *k = PyUnicode_FromString(llmretry_policy_key(i));
        if (!k) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, (Py_ssize_t)i, k);
    }
    return out;
}
