/* A listed batch's bodies encoded as the engine sends them, in one C loop.
 *
 * Why: call_many encodes every body on the calling thread before the
 * first call, and the package's per-item Python (_encode_batch_body and
 * _encode_body: two frames, isinstance, the C encoder, body.get, a tuple,
 * stream_body's search for "stream") cost ~7,600 instructions an item of
 * the ~36,000 call_many spent there (callgrind, N=2500 less N=500); the
 * same work here is the encoder's own and a dict lookup or two.
 *
 * Only an exact dict that json_encode.c takes is done here: its bytes,
 * its "model" when that is an exact str (what _encode_body keeps), and
 * llmretry_stream_body's form only when the dict has a "stream" key (the
 * core changes no body without one at its top level). Anything else (a
 * str or bytes body, a subclass, what the C encoder leaves to json's) goes
 * to the package's own function, so values and errors stay its own. */
#include "binding.h"
#include "json_encode.h"

/* A dict's encoded body into *payload and its model (borrowed) into
 * *model: 1; 0 when the C encoder leaves it; -1 with an error set. */
static int encode_dict(const module_state *st, PyObject *body, const char *url,
                       PyObject **payload_out, PyObject **model_out)
{
    PyObject *payload = lr_json_encode(body);
    if (!payload)
        return 0;
    PyObject *stream = PyDict_GetItemWithError(body, st->keys[K_stream]);
    if (!stream && PyErr_Occurred()) {
        Py_DECREF(payload);
        return -1;
    }
    if (stream) {
        size_t n = (size_t)PyBytes_GET_SIZE(payload);
        char *sent = llmretry_stream_body(url, PyBytes_AS_STRING(payload), &n, 0);
        if (sent) {
            Py_SETREF(payload, PyBytes_FromStringAndSize(sent, (Py_ssize_t)n));
            llmretry_free(sent);
            if (!payload)
                return -1;
        }
    }
    PyObject *model = PyDict_GetItemWithError(body, st->keys[K_model]);
    if (!model && PyErr_Occurred()) {
        Py_DECREF(payload);
        return -1;
    }
    *payload_out = payload;
    *model_out = model && PyUnicode_CheckExact(model) ? model : Py_None;
    return 1;
}

/* encode_bodies(bodies, url, encode_one) -> (payloads, models), two lists
 * (not a pair per item: a batch keeps them until it ends, and each pair
 * was one more allocation counted toward the cyclic GC's collections):
 * bodies is a list or tuple; encode_one(index, body) -> (bytes, model) is
 * called for each body not taken here (its errors propagate). */
PyObject *lr_py_encode_bodies(PyObject *module, PyObject *args)
{
    const module_state *st = lr_py_state_of(module);
    PyObject *bodies, *url_obj, *encode_one;
    if (!PyArg_ParseTuple(args, "OOO:encode_bodies", &bodies, &url_obj, &encode_one))
        return NULL;
    if (!PyList_Check(bodies) && !PyTuple_Check(bodies))
        return PyErr_Format(PyExc_TypeError, "bodies must be a list or tuple");
    const char *url = NULL;
    if (url_obj != Py_None && !(url = PyUnicode_AsUTF8(url_obj)))
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(bodies);
    PyObject *payloads = PyList_New(n), *models = PyList_New(n);
    if (!payloads || !models)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* A list may change under encode_one: each item read when its turn comes. */
        if (i >= PySequence_Fast_GET_SIZE(bodies)) {
            PyErr_SetString(PyExc_RuntimeError, "bodies changed size during encoding");
            goto fail;
        }
        PyObject *body = Py_NewRef(PySequence_Fast_GET_ITEM(bodies, i));
        PyObject *payload = NULL, *model = NULL;
        int rc = PyDict_CheckExact(body) ? encode_dict(st, body, url, &payload, &model) : 0;
        if (rc > 0) {
            Py_INCREF(model);       /* borrowed from the body, which goes now */
        } else if (rc == 0) {
            PyObject *index = PyLong_FromSsize_t(i), *pair = NULL;
            if (index) {
                PyObject *a[2] = { index, body };
                pair = PyObject_Vectorcall(encode_one, a, 2, NULL);
                Py_DECREF(index);
            }
            if (pair && (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2))
                PyErr_SetString(PyExc_TypeError, "encode_one must return (bytes, model)");
            else if (pair) {
                payload = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
                model = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
            }
            Py_XDECREF(pair);
        }
        Py_DECREF(body);
        if (!payload)
            goto fail;
        PyList_SET_ITEM(payloads, i, payload);
        PyList_SET_ITEM(models, i, model);
    }
    PyObject *out = PyTuple_Pack(2, payloads, models);
    Py_DECREF(payloads);
    Py_DECREF(models);
    return out;
fail:
    Py_XDECREF(payloads);
    Py_XDECREF(models);
    return NULL;
}
