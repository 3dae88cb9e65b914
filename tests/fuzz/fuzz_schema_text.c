/* libFuzzer target, differential: the text validator (schema_text.c, the
 * engine's check of every answer, reading the text in place with
 * json_pull.c) against the tree validator (schema_validate.c, on cJSON's
 * parse of the same text), which it must equal.
 *
 * Input: split at its first NUL byte (else at half) into a schema and a
 * value, each copied to its own exact-size buffer (ASan sees any read past
 * the value: the text validator must stop at its length). When the schema
 * compiles:
 *   - both read the value as JSON: the same errors, to the byte, in the
 *     same order, the same truncation;
 *   - only the text validator reads it: cJSON stops at numbers longer
 *     than 63 characters, the one strict JSON it refuses; anything else
 *     is a bug;
 *   - only cJSON reads it (its leniencies: "01", "1.", control bytes and
 *     invalid UTF-8 in strings, a BOM, other blanks): then cJSON's own
 *     printing of the tree is strict JSON, which the text validator must
 *     read and judge as the tree validator judged the tree (unless the
 *     printing is not faithful: bytes that are not UTF-8 are printed as
 *     they are, an infinite number as null).
 * Build: tools/fuzz.sh. */
#include "schema.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>

#include "fuzz_util.h"

static lr_schema_errors tree_errs, text_errs;

static void same_errors(const char *what)
{
    if (tree_errs.n != text_errs.n || tree_errs.truncated != text_errs.truncated) {
        fprintf(stderr, "%s: tree %d errors (truncated %d), text %d (truncated %d)\n", what,
                tree_errs.n, tree_errs.truncated, text_errs.n, text_errs.truncated);
        for (int i = 0; i < tree_errs.n; i++)
            fprintf(stderr, "  tree %s: %s\n", tree_errs.e[i].path, tree_errs.e[i].message);
        for (int i = 0; i < text_errs.n; i++)
            fprintf(stderr, "  text %s: %s\n", text_errs.e[i].path, text_errs.e[i].message);
        fail("the text and tree validators disagree on the number of errors");
    }
    for (int i = 0; i < tree_errs.n; i++)
        if (strcmp(tree_errs.e[i].path, text_errs.e[i].path) ||
            strcmp(tree_errs.e[i].message, text_errs.e[i].message)) {
            fprintf(stderr, "%s: error %d: tree %s: %s; text %s: %s\n", what, i,
                    tree_errs.e[i].path, tree_errs.e[i].message, text_errs.e[i].path,
                    text_errs.e[i].message);
            fail("the text and tree validators disagree on an error");
        }
}

/* cJSON's parse of the whole text, as the engine's body check reads it:
 * one value, then JSON blanks only. */
static cJSON *parse_whole(const char *text, size_t len)
{
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (v && end)
        for (const char *p = end; p < text + len; p++)
            if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
                cJSON_Delete(v);
                return NULL;
            }
    return v;
}

static int has_long_number(const char *text, size_t len)
{
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        run = (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
                  ? run + 1 : 0;
        if (run >= 64)
            return 1;
    }
    return 0;
}

static int all_finite(const cJSON *x)
{
    if (cJSON_IsNumber(x) && !isfinite(x->valuedouble))
        return 0;
    for (const cJSON *c = x->child; c; c = c->next)
        if (!all_finite(c))
            return 0;
    return 1;
}

/* Valid UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF),
 * checked here independently of json_pull.c. */
static int valid_utf8(const unsigned char *s)
{
    while (*s) {
        unsigned c = *s, n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1
                            : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
        if (n == 9)
            return 0;
        unsigned cp = n ? c & (0x3F >> n) : c;
        for (unsigned i = 1; i <= n; i++) {
            if ((s[i] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        s += n + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t split = nul ? (size_t)(nul - data) : size / 2;
    size_t vstart = nul ? split + 1 : split;
    size_t vlen = size - vstart;
    char *schema_text = copy(data, split);
    char *value = copy(data + vstart, vlen);

    char err[256];
    lr_schema *s = lr_schema_compile_text(schema_text, split, err, sizeof err);
    if (s) {
        int t = lr_schema_validate_text(s, value, vlen, &text_errs);
        if (t < -1 || t > LR_SCHEMA_MAX_ERRORS || (t >= 0 && t != text_errs.n))
            fail("text validator's count");
        cJSON *tree = parse_whole(value, vlen);
        if (t >= 0 && tree) {
            lr_schema_validate(s, tree, &tree_errs);
            same_errors("the value");
        } else if (t >= 0 && !has_long_number(value, vlen)) {
            fail("the text validator read as JSON what cJSON does not, with no long number");
        } else if (t < 0 && tree && all_finite(tree)) {
            char *printed = cJSON_PrintUnformatted(tree);
            if (!printed)
                abort();
            int t2 = lr_schema_validate_text(s, printed, strlen(printed), &text_errs);
            if (t2 >= 0) {
                lr_schema_validate(s, tree, &tree_errs);
                same_errors("cJSON's printing of the value");
            } else if (valid_utf8((const unsigned char *)printed)) {
                fprintf(stderr, "printed: %s\n", printed);
                fail("the text validator refuses cJSON's own strict printing");
            }
            free(printed);
        }
        cJSON_Delete(tree);
        lr_schema_free(s);
    }
    free(schema_text);
    free(value);
    return 0;
}
