/* libFuzzer target: JSON Schema compile and validation (core/src/schema*.c)
 * on arbitrary schemas and answers (an answer is server data; a schema is
 * the caller's, but may come from anywhere).
 *
 * Input: split at its first NUL byte (else at half) into a schema and a
 * value, each copied to its own exact-size buffer. A schema that does not
 * compile must say why (a NUL-terminated message); one that compiles
 * validates the value (when it parses) twice: the same errors both times
 * (a compiled schema is read-only), at most LR_SCHEMA_MAX_ERRORS, each
 * path starting with "$" and each message non-empty, and the errors' JSON
 * must parse back to as many objects. Build: tools/fuzz.sh. */
#include "schema.h"

#include <cjson/cJSON.h>
#include <stdint.h>

#include "fuzz_util.h"

static lr_schema_errors a, b;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t split = nul ? (size_t)(nul - data) : size / 2;
    size_t vstart = nul ? split + 1 : split;
    char *schema_text = copy(data, split);
    char *value_text = copy(data + vstart, size - vstart);

    char err[256];
    memset(err, 'x', sizeof err);
    lr_schema *s = lr_schema_compile_text(schema_text, split, err, sizeof err);
    if (!s) {
        if (!memchr(err, '\0', sizeof err) || err[0] == '\0')
            fail("a schema that does not compile says why");
    } else {
        cJSON *v = cJSON_ParseWithLength(value_text, size - vstart);
        if (v) {
            int n = lr_schema_validate(s, v, &a);
            int m = lr_schema_validate(s, v, &b);
            if (n != m || n != a.n || n < 0 || n > LR_SCHEMA_MAX_ERRORS)
                fail("error count");
            if (a.truncated && n != LR_SCHEMA_MAX_ERRORS)
                fail("truncated before the list was full");
            for (int i = 0; i < n; i++) {
                if (a.e[i].path[0] != '$' || !a.e[i].message[0])
                    fail("an error without a path or a message");
                if (strcmp(a.e[i].path, b.e[i].path) || strcmp(a.e[i].message, b.e[i].message))
                    fail("two validations disagree");
            }
            char *json = lr_schema_errors_json(&a);
            cJSON *back = json ? cJSON_Parse(json) : NULL;
            if (!back || cJSON_GetArraySize(back) != n)
                fail("errors JSON does not parse back");
            cJSON_Delete(back);
            free(json);
            cJSON_Delete(v);
        }
        lr_schema_free(s);
    }
    free(schema_text);
    free(value_text);
    return 0;
}
