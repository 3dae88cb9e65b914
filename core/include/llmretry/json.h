/* llmretry/json.h — jSON helpers shared by the bindings.
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_JSON_H
#define LLMRETRY_JSON_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* JSON helpers shared by the bindings.                                */
/* ------------------------------------------------------------------ */

/* Find the JSON value in model output: a ```json (or ```) fenced block,
 * bare JSON, or the first parseable object/array surrounded by prose.
 * On success *start and *len delimit the JSON text inside `text` and OK is
 * returned; EINVAL (with a message) when there is none. */
llmretry_status llmretry_extract_json(const char *text, size_t text_len,
                                      size_t *start, size_t *len,
                                      char *err, size_t errlen);

/* assert_shape on JSON text: `shape` is JSON too, where a string leaf names
 * the expected type ("string" = non-empty string, "number", "boolean",
 * "array", "object"), an object maps keys to shapes, and a one-element
 * array means "an array whose every element has this shape". OK, or
 * EINVAL with a message naming the path (e.g. "root.items[2].name"). */
llmretry_status llmretry_assert_shape(const char *json, size_t json_len,
                                      const char *shape, size_t shape_len,
                                      const char *root_path,
                                      char *err, size_t errlen);

/* JSON text against a JSON Schema (the subset of docs/structured-outputs.md),
 * as the engine checks answers: the schema is compiled once (the last few
 * are kept by their text). OK with *errors NULL when it matches, OK with
 * *errors the malloc'd JSON text of [{"path", "message"}, ...] (at most 20;
 * free it with llmretry_free) when it does not, or EINVAL with a message
 * when the schema is refused (naming the keyword and its path) or the text
 * is not JSON. */
llmretry_status llmretry_schema_validate(const char *schema, size_t schema_len,
                                         const char *json, size_t json_len, char **errors,
                                         char *err, size_t errlen);

/* Does a request body's text open a JSON object (or an array, for the
 * server to judge): '{' or '[' after white space? The engine refuses any
 * other JSON body at submit, before a parse (a prompt passed as the body);
 * a host may check first, to say it in its own words. */
int llmretry_json_text_opens(const char *text, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_JSON_H */
