/* A request body to the bytes json's encoder makes of it (json_encode.c). */
#ifndef LLMRETRY_PY_JSON_ENCODE_H
#define LLMRETRY_PY_JSON_ENCODE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
 * allow_nan=False).encode(obj).encode("utf-8") as a new bytes, or NULL with
 * no error set when obj is not one this takes (the caller then uses json). */
PyObject *lr_json_encode(PyObject *obj);

/* encode_json(obj) -> bytes or None (the module function). */
PyObject *lr_py_json_encode(PyObject *module, PyObject *obj);

#endif
