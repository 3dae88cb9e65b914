/* schema.h — JSON Schema validation of answers (docs/structured-outputs.md),
 * private to the core. Pure, in the manner of sse.c: no I/O, no globals,
 * fuzzed (tests/fuzz/fuzz_schema.c).
 *
 * A schema is compiled once (lr_schema_compile: every keyword checked, every
 * $ref resolved, every pattern compiled) and then validates any number of
 * values, from any thread (a compiled schema is read-only). The subset is
 * what OpenAI's strict mode accepts:
 *
 *   type (a name or an array of names, "null" among them), properties,
 *   required, additionalProperties (a boolean or a schema), items (one
 *   schema), enum, const, anyOf, $ref / $defs / definitions (local
 *   references "#..." as JSON pointers, recursion allowed), minimum,
 *   maximum, exclusiveMinimum, exclusiveMaximum (numbers), multipleOf,
 *   minItems, maxItems, minLength, maxLength (in code points), pattern.
 *   Annotations are ignored: title, description, default, examples,
 *   $schema, $id, $comment, format (as JSON Schema 2020-12 does by
 *   default), deprecated, readOnly, writeOnly, strict. The schemas true
 *   and false are accepted too.
 *
 * Any other keyword (oneOf, allOf, not, patternProperties, ...) or a
 * malformed one is a compile error naming it and its place in the schema
 * ("unsupported keyword 'oneOf' at $.properties.x"): it would otherwise be
 * silently unchecked.
 *
 * pattern is a POSIX extended regular expression (regcomp REG_EXTENDED),
 * searched (not anchored) as JSON Schema says, with the common ECMA-262
 * escapes \d \D \w \W \s \S translated (inside and outside brackets). A
 * pattern POSIX cannot compile, or one using other ECMA-only syntax (look-
 * arounds, lazy quantifiers, \b), is a compile error.
 *
 * Validation reports at most LR_SCHEMA_MAX_ERRORS errors, each a JSON path
 * into the value ("$.items[2].price", keys that are not identifiers as
 * $["a b"]) and a message that never quotes the value (it is a model's
 * answer; the schema's own words may appear). Bounded whatever the value:
 * nesting past LR_SCHEMA_MAX_DEPTH is an error, not a deeper stack, and
 * every validation has a budget of steps, so a $ref cycle that makes no
 * progress or an anyOf that would explode ends with an error too. */
#ifndef LLMRETRY_SCHEMA_H
#define LLMRETRY_SCHEMA_H

#include <stddef.h>
#pragma GCC visibility push(hidden)

struct cJSON;

#define LR_SCHEMA_MAX_ERRORS 20
/* Deepest nesting of a value (arrays and objects) that is validated, and
 * of a schema that is compiled. */
#define LR_SCHEMA_MAX_DEPTH 256
/* Schema applications one validation may make (each value checked against
 * each schema that applies to it counts one). */
#define LR_SCHEMA_MAX_STEPS 1000000
#define LR_SCHEMA_PATH_MAX 192
#define LR_SCHEMA_MESSAGE_MAX 160

typedef struct lr_schema lr_schema;

typedef struct lr_schema_error {
    char path[LR_SCHEMA_PATH_MAX];
    char message[LR_SCHEMA_MESSAGE_MAX];
} lr_schema_error;

typedef struct lr_schema_errors {
    int n;                         /* errors in e[] */
    int truncated;                 /* more were found than e[] holds */
    lr_schema_error e[LR_SCHEMA_MAX_ERRORS];
} lr_schema_errors;

/* Compile a schema (a cJSON tree, copied: the caller keeps its own).
 * NULL with a message in err (naming the keyword and its path) when the
 * schema is malformed or uses an unsupported keyword, or when out of
 * memory ("out of memory"). */
lr_schema *lr_schema_compile(const struct cJSON *schema, char *err, size_t errlen);
/* The same from JSON text ("schema is not valid JSON" when it is not). */
lr_schema *lr_schema_compile_text(const char *json, size_t len, char *err, size_t errlen);
/* A compiled schema is read-only, so calls and threads may share one:
 * lr_schema_ref takes a reference, lr_schema_free drops one (the last
 * frees it). */
lr_schema *lr_schema_ref(lr_schema *s);
void lr_schema_free(lr_schema *s);

/* Validate `value`: 0 when it matches, else the number of errors in
 * out (at least 1; out->truncated when there were more). */
int lr_schema_validate(const lr_schema *s, const struct cJSON *value, lr_schema_errors *out);

/* Validate JSON text in place (schema_text.c: no tree built; the engine
 * checks answers so): -1 when the text is not one JSON value (strict
 * RFC 8259, json_pull.h; blanks around it allowed), else as
 * lr_schema_validate, with the same errors. */
int lr_schema_validate_text(const lr_schema *s, const char *text, size_t len,
                            lr_schema_errors *out);

/* The errors as JSON text, [{"path": ..., "message": ...}, ...]
 * (malloc'd; NULL when out of memory). */
char *lr_schema_errors_json(const lr_schema_errors *errs);

#pragma GCC visibility pop
#endif
