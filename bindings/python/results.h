/* A successful call's outcome as the package's Result, built in C.
 *
 * The package registers its Result and Meta classes and its JSON parser
 * once (_set_result_types); a batch then turns each success into a Result
 * without a dict in between or a Python function per item. */
#ifndef LLMRETRY_PY_RESULTS_H
#define LLMRETRY_PY_RESULTS_H

#include "pool.h"

/* _set_result_types(Result, Meta, scan_once, parse): see results.c. */
PyObject *lr_set_result_types(PyObject *module, PyObject *args);

/* _json_decode(bytes), _parse_body(bytes): the body parsers, for the tests. */
PyObject *lr_py_json_decode(PyObject *module, PyObject *arg);
PyObject *lr_py_parse_body(PyObject *module, PyObject *arg);

/* 1 with *out a new Result, 0 when r is not a success this module can build
 * (no types registered, or a body Python's JSON parser refuses: the caller
 * makes the outcome dict and the package says why), -1 on error. */
int lr_build_result(const module_state *st, const llmretry_result *r, PyObject **out);

/* A C string from the core as str (bad UTF-8 replaced), or None for NULL. */
PyObject *lr_str_or_none(const char *s);

/* shapes.c: the core's shapes as Python values (a null value is None). */
PyObject *lr_py_field_value(const module_state *st, const llmretry_field *f);
PyObject *lr_py_shape_dict(const module_state *st, llmretry_shape s, const void *obj);
int lr_py_shape_into(const module_state *st, PyObject *d, llmretry_shape s, const void *obj);
/* A finished call that is not built as a Result: the outcome dict. */
PyObject *lr_py_outcome(const module_state *st, const llmretry_result *r);
int lr_py_shapes_init(module_state *st);
void lr_py_shapes_clear(module_state *st);

int lr_results_traverse(const module_state *st, visitproc visit, void *arg);
void lr_results_clear(module_state *st);

#endif
