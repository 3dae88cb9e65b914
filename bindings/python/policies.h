/* Named policies for the Python package: the core checks and resolves them
 * (core/src/policies.c); llmretry/_policies.py turns mappings and TOML into
 * JSON text and calls these. */
#ifndef LLMRETRY_PY_POLICIES_H
#define LLMRETRY_PY_POLICIES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* parse_policies(json_text, source=None) -> [(name, settings_json), ...] */
PyObject *lr_py_parse_policies(PyObject *module, PyObject *args);
/* resolve_policy(settings_json, explicit_json, defaults_json) -> str */
PyObject *lr_py_resolve_policy(PyObject *module, PyObject *args);
/* check_policy_value(key, value_json) -> None, or ValueError */
PyObject *lr_py_check_policy_value(PyObject *module, PyObject *args);
/* policy_keys() -> tuple of str */
PyObject *lr_py_policy_keys(PyObject *module, PyObject *unused);

#define LR_PY_POLICY_METHODS \
    { "parse_policies", lr_py_parse_policies, METH_VARARGS, \
      "parse_policies(json_text, source=None) -> [(name, settings_json)]: checked." }, \
    { "resolve_policy", lr_py_resolve_policy, METH_VARARGS, \
      "resolve_policy(settings_json, explicit_json, defaults_json) -> every key's JSON." }, \
    { "check_policy_value", lr_py_check_policy_value, METH_VARARGS, \
      "check_policy_value(key, value_json): ValueError when the policy rules refuse it." }, \
    { "policy_keys", lr_py_policy_keys, METH_NOARGS, \
      "policy_keys() -> the policy keys, in the order resolve_policy lists them." },

#endif
