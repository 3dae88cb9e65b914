/* A 2xx body's JSON straight from its bytes to Python values (json_decode.c). */
#ifndef LLMRETRY_PY_JSON_DECODE_H
#define LLMRETRY_PY_JSON_DECODE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

/* Recently seen object keys, kept across bodies (module_state.key_cache). */
typedef struct lr_key_cache lr_key_cache;

lr_key_cache *lr_key_cache_new(void);     /* NULL: out of memory (no error set) */
void lr_key_cache_free(lr_key_cache *c);  /* NULL is fine */

/* The value json.loads makes of the UTF-8 text (a new reference), or NULL
 * with no error set when this decoder does not take the text (not JSON,
 * nested past its limit, a number json refuses, out of memory): the caller
 * then parses it the way it did before, which says why. `cache` may be NULL. */
PyObject *lr_json_decode(lr_key_cache *cache, const char *text, size_t len);

#endif
