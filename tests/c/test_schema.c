/* Tests of JSON Schema validation (core/src/schema*.c) beyond the shared
 * vectors of tests/vectors/schema/: every keyword of the subset, the
 * compile errors, paths, the error cap, and the bounds that keep a hostile
 * answer or schema from looping or blowing the stack. */
#include "harness.h"
#include "llmretry.h"
#include "schema.h"

#include <cJSON.h>
#include <stdlib.h>

static lr_schema_errors errs, text_errs;

/* The text validator (schema_text.c) gives what the tree's gave. */
static void check_same_errors(const lr_schema_errors *tree, int n, const lr_schema_errors *text,
                              int m, const char *value)
{
    CHECK_MSG(m == n, "%s: %d errors from the tree, %d from the text", value, n, m);
    CHECK_MSG(tree->truncated == text->truncated, "%s: truncated differs", value);
    for (int i = 0; i < n && i < m; i++) {
        CHECK_STR(text->e[i].path, tree->e[i].path);
        CHECK_STR(text->e[i].message, tree->e[i].message);
    }
}

/* Validate value against schema (both JSON text), as a tree and as text
 * (the same errors); the number of errors, or -1 when the schema does not
 * compile. */
static int run(const char *schema, const char *value)
{
    char err[512];
    lr_schema *s = lr_schema_compile_text(schema, strlen(schema), err, sizeof err);
    if (!s) {
        th_fail(__FILE__, __LINE__, "schema %s: %s", schema, err);
        return -1;
    }
    cJSON *v = cJSON_Parse(value);
    CHECK_MSG(v != NULL, "value %s is not JSON", value);
    int n = lr_schema_validate(s, v, &errs);
    int m = lr_schema_validate_text(s, value, strlen(value), &text_errs);
    check_same_errors(&errs, n, &text_errs, m, value);
    cJSON_Delete(v);
    lr_schema_free(s);
    return n;
}

/* The compile error of a schema ("" when it compiles). */
static const char *compile_error(const char *schema)
{
    static char err[512];
    err[0] = '\0';
    lr_schema *s = lr_schema_compile_text(schema, strlen(schema), err, sizeof err);
    if (s) {
        lr_schema_free(s);
        return "";
    }
    return err;
}

#define CHECK_ERR(schema, value, want_path, want_msg) do { \
    int n_ = run(schema, value); \
    CHECK_MSG(n_ >= 1, "%s against %s: expected an error, got %d", value, schema, n_); \
    if (n_ >= 1) { CHECK_STR(errs.e[0].path, want_path); \
        CHECK_MSG(strstr(errs.e[0].message, want_msg) != NULL, "message \"%s\" lacks \"%s\"", \
                  errs.e[0].message, want_msg); } } while (0)
#define CHECK_OK(schema, value) do { int n_ = run(schema, value); \
    CHECK_MSG(n_ == 0, "%s against %s: %d errors, first %s: %s", value, schema, n_, \
              n_ > 0 ? errs.e[0].path : "", n_ > 0 ? errs.e[0].message : ""); } while (0)
#define CHECK_COMPILE_ERR(schema, part) do { const char *e_ = compile_error(schema); \
    CHECK_MSG(e_[0] && strstr(e_, part) != NULL, "compile %s: \"%s\" lacks \"%s\"", schema, \
              e_, part); } while (0)

static void test_types(void)
{
    CHECK_OK("{\"type\":\"string\"}", "\"x\"");
    CHECK_ERR("{\"type\":\"string\"}", "1", "$", "expected string");
    CHECK_OK("{\"type\":\"integer\"}", "3");
    CHECK_OK("{\"type\":\"integer\"}", "3.0");
    CHECK_ERR("{\"type\":\"integer\"}", "3.5", "$", "expected integer");
    CHECK_OK("{\"type\":\"number\"}", "3");
    CHECK_ERR("{\"type\":\"number\"}", "\"3\"", "$", "expected number");
    CHECK_OK("{\"type\":[\"string\",\"null\"]}", "null");
    CHECK_ERR("{\"type\":[\"string\",\"null\"]}", "true", "$", "expected string or null");
    CHECK_OK("{\"type\":\"boolean\"}", "false");
    CHECK_OK("{}", "[1,{\"a\":null}]");
    CHECK_OK("true", "1");
    CHECK_ERR("false", "1", "$", "schema is false");
}

static void test_objects(void)
{
    const char *s = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                    "\"age\":{\"type\":\"integer\",\"minimum\":0}},"
                    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
    CHECK_OK(s, "{\"name\":\"a\",\"age\":3}");
    CHECK_ERR(s, "{\"name\":\"a\"}", "$.age", "required property is missing");
    CHECK_ERR(s, "{\"name\":\"a\",\"age\":-1}", "$.age", "must be >= 0");
    CHECK_ERR(s, "{\"name\":\"a\",\"age\":1,\"x y\":2}", "$[\"x y\"]", "not allowed");
    CHECK_ERR(s, "[]", "$", "expected object");
    /* Every error, in order: members first, then the missing ones. */
    CHECK_INT(run(s, "{\"name\":1,\"extra\":true}"), 3);
    CHECK_STR(errs.e[0].path, "$.name");
    CHECK_STR(errs.e[1].path, "$.extra");
    CHECK_STR(errs.e[2].path, "$.age");
    /* additionalProperties as a schema; required names that are no property. */
    CHECK_OK("{\"additionalProperties\":{\"type\":\"integer\"}}", "{\"a\":1,\"b\":2}");
    CHECK_ERR("{\"additionalProperties\":{\"type\":\"integer\"}}", "{\"a\":1,\"b\":\"x\"}",
              "$.b", "expected integer");
    CHECK_ERR("{\"required\":[\"z\"]}", "{\"a\":1}", "$.z", "missing");
    /* A key that would break a path is escaped, and a long one cut. */
    CHECK_ERR("{\"additionalProperties\":false}", "{\"a\\\"]\\n\":1}", "$[\"a\\\"]\\u000a\"]",
              "not allowed");
    char value[400];
    snprintf(value, sizeof value, "{\"%0200d\":1}", 0);
    CHECK_INT(run("{\"additionalProperties\":false}", value), 1);
    CHECK(strlen(errs.e[0].path) < 80 && strstr(errs.e[0].path, "...\"]"));
}

static void test_arrays_strings_numbers(void)
{
    const char *s = "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":"
                    "{\"price\":{\"type\":\"number\"}},\"required\":[\"price\"]},"
                    "\"minItems\":1,\"maxItems\":3}";
    CHECK_OK(s, "[{\"price\":1.5}]");
    CHECK_ERR(s, "[{\"price\":1},{\"price\":2},{\"price\":\"3\"}]", "$[2].price",
              "expected number");
    CHECK_ERR(s, "[]", "$", "at least 1 items");
    CHECK_ERR(s, "[{\"price\":1},{\"price\":1},{\"price\":1},{\"price\":1}]", "$", "at most 3");
    /* Lengths count code points: "héé" is 3, not 5 bytes. */
    CHECK_OK("{\"maxLength\":3,\"minLength\":3}", "\"h\xc3\xa9\xc3\xa9\"");
    CHECK_ERR("{\"maxLength\":2}", "\"h\xc3\xa9\xc3\xa9\"", "$", "at most 2 characters");
    CHECK_ERR("{\"minLength\":4}", "\"abc\"", "$", "at least 4 characters");
    CHECK_OK("{\"maximum\":5,\"exclusiveMinimum\":0}", "5");
    CHECK_ERR("{\"exclusiveMinimum\":0}", "0", "$", "must be > 0");
    CHECK_ERR("{\"exclusiveMaximum\":10}", "10", "$", "must be < 10");
    CHECK_ERR("{\"maximum\":5}", "5.5", "$", "must be <= 5");
    CHECK_OK("{\"multipleOf\":0.1}", "0.3");
    CHECK_OK("{\"multipleOf\":5}", "-15");
    CHECK_ERR("{\"multipleOf\":5}", "7", "$", "multiple of 5");
    /* Keywords of another type do not apply. */
    CHECK_OK("{\"minLength\":5,\"minimum\":3,\"minItems\":2}", "{}");
}

static void test_enum_const_pattern(void)
{
    CHECK_OK("{\"enum\":[\"a\",1,null]}", "1.0");
    CHECK_ERR("{\"enum\":[\"a\",\"b\"]}", "\"c\"", "$", "must be one of [\"a\",\"b\"]");
    CHECK_OK("{\"const\":{\"k\":[1,2]}}", "{\"k\":[1,2]}");
    CHECK_ERR("{\"const\":\"x\"}", "\"y\"", "$", "must be \"x\"");
    CHECK_OK("{\"pattern\":\"^[a-z]+\\\\d{2}$\"}", "\"ab12\"");
    CHECK_ERR("{\"pattern\":\"^[a-z]+\\\\d{2}$\"}", "\"ab1\"", "$", "does not match the pattern");
    CHECK_OK("{\"pattern\":\"b\"}", "\"abc\"");                /* a search, not anchored */
    CHECK_OK("{\"pattern\":\"^\\\\w+@[\\\\w.]+$\"}", "\"a_b@x.org\"");
    CHECK_ERR("{\"pattern\":\"^\\\\S+$\"}", "\"a b\"", "$", "pattern");
    CHECK_OK("{\"pattern\":\"^(?:ab)+?$\"}", "\"abab\"");
    CHECK_OK("{\"pattern\":\"^\\\\.\\\\/[-a]$\"}", "\"./-\"");
    CHECK_COMPILE_ERR("{\"pattern\":\"(?=a)\"}", "look-arounds");
    CHECK_COMPILE_ERR("{\"pattern\":\"\\\\bx\"}", "escape");
    CHECK_COMPILE_ERR("{\"pattern\":\"[a\"}", "pattern at $.pattern");
    CHECK_OK("{\"pattern\":\"^a{2,3}?b{2}$\"}", "\"aaabb\"");
    CHECK_OK("{\"pattern\":\"^x{$\"}", "\"x{\"");          /* no interval: literal */
    CHECK_COMPILE_ERR("{\"pattern\":\"a++\"}", "a quantifier follows a quantifier");
    CHECK_COMPILE_ERR("{\"pattern\":\"a*??\"}", "a quantifier follows a quantifier");
    CHECK_COMPILE_ERR("{\"pattern\":\"(a{0,1000})\"}", "repetition count above 255");
}

static void test_any_of_and_refs(void)
{
    /* pydantic's Optional[Model]: one branch of the value's type reports. */
    const char *s = "{\"$defs\":{\"Item\":{\"type\":\"object\",\"properties\":{\"n\":"
                    "{\"type\":\"integer\"}},\"required\":[\"n\"]}},"
                    "\"anyOf\":[{\"$ref\":\"#/$defs/Item\"},{\"type\":\"null\"}]}";
    CHECK_OK(s, "null");
    CHECK_OK(s, "{\"n\":1}");
    CHECK_ERR(s, "{\"n\":\"1\"}", "$.n", "expected integer");
    CHECK_ERR(s, "3", "$", "none of the anyOf");
    /* Recursion: a tree of nodes. */
    const char *tree = "{\"$ref\":\"#/$defs/Node\",\"$defs\":{\"Node\":{\"type\":\"object\","
                       "\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
                       "\"items\":{\"$ref\":\"#/$defs/Node\"}}},\"required\":[\"v\"],"
                       "\"additionalProperties\":false}}}";
    CHECK_OK(tree, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]}]}");
    CHECK_ERR(tree, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":\"3\"}]}]}",
              "$.kids[0].kids[0].v", "expected integer");
    CHECK_OK("{\"definitions\":{\"a~b/c\":{\"type\":\"string\"}},"
             "\"$ref\":\"#/definitions/a~0b~1c\"}", "\"s\"");
    CHECK_OK("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", "[[[]]]");
}

static void test_compile_errors(void)
{
    CHECK_COMPILE_ERR("{\"oneOf\":[{}]}", "unsupported keyword 'oneOf' at $");
    CHECK_COMPILE_ERR("{\"properties\":{\"x\":{\"allOf\":[]}}}",
                      "unsupported keyword 'allOf' at $.properties.x");
    CHECK_COMPILE_ERR("{\"$defs\":{\"D\":{\"not\":{}}}}", "'not' at $.$defs.D");
    CHECK_COMPILE_ERR("{\"type\":\"strin\"}", "unknown type");
    CHECK_COMPILE_ERR("{\"type\":[]}", "empty");
    CHECK_COMPILE_ERR("{\"required\":\"a\"}", "required at $.required");
    CHECK_COMPILE_ERR("{\"items\":[{}]}", "tuples");
    CHECK_COMPILE_ERR("{\"minItems\":-1}", "non-negative integer");
    CHECK_COMPILE_ERR("{\"minLength\":1.5}", "non-negative integer");
    CHECK_COMPILE_ERR("{\"multipleOf\":0}", "greater than 0");
    CHECK_COMPILE_ERR("{\"exclusiveMinimum\":true}", "must be a number");
    CHECK_COMPILE_ERR("{\"enum\":[]}", "non-empty");
    CHECK_COMPILE_ERR("{\"anyOf\":{}}", "anyOf at $.anyOf");
    CHECK_COMPILE_ERR("{\"properties\":{\"a\":3}}", "the schema at $.properties.a");
    CHECK_COMPILE_ERR("{\"$ref\":\"other.json#/x\"}", "only local references");
    CHECK_COMPILE_ERR("{\"$ref\":\"#/$defs/missing\"}", "does not resolve");
    CHECK_COMPILE_ERR("[]", "must be an object or a boolean");
    CHECK_COMPILE_ERR("{\"pattern\":\"a\",\"pattern\":\"b\"}", "'pattern' appears twice at $");
    CHECK_COMPILE_ERR("{", "not valid JSON");
    /* Cycles that never reach a smaller value are refused, not looped on. */
    CHECK_COMPILE_ERR("{\"$ref\":\"#\"}", "$ref cycle");
    CHECK_COMPILE_ERR("{\"$defs\":{\"A\":{\"$ref\":\"#/$defs/B\"},\"B\":{\"anyOf\":"
                      "[{\"$ref\":\"#/$defs/A\"}]}},\"$ref\":\"#/$defs/A\"}", "$ref cycle");
    /* Annotations are fine. */
    CHECK_STR(compile_error("{\"title\":\"T\",\"description\":\"d\",\"default\":1,"
                            "\"format\":\"date-time\",\"$schema\":\"x\",\"strict\":true}"), "");
}

/* A value nested far deeper than anything is validated: an error, no crash
 * (built by hand: cJSON's parser stops at 1000 levels). */
static void test_depth_and_budget(void)
{
    char err[256];
    lr_schema *s = lr_schema_compile_text("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", 41,
                                          err, sizeof err);
    CHECK(s != NULL);
    cJSON *root = cJSON_CreateArray(), *at = root;
    for (int i = 0; i < 100000; i++) {
        cJSON *next = cJSON_CreateArray();
        cJSON_AddItemToArray(at, next);
        at = next;
    }
    CHECK_INT(lr_schema_validate(s, root, &errs), 1);
    CHECK(strstr(errs.e[0].message, "nested too deep") != NULL);
    lr_schema_free(s);
    /* cJSON_Delete recurses too: take it apart from the top. */
    while (root) {
        cJSON *child = cJSON_DetachItemFromArray(root, 0);
        cJSON_Delete(root);
        root = child;
    }

    /* anyOf whose branches each fail deep down: exponential without the
     * step budget, which ends it with an error. */
    const char *blow = "{\"anyOf\":[{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}},"
                       "{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"minItems\":0},"
                       "{\"type\":\"integer\"}]}";
    s = lr_schema_compile_text(blow, strlen(blow), err, sizeof err);
    CHECK(s != NULL);
    char deep[200];
    int d = 60, n = 0;
    for (int i = 0; i < d; i++)
        deep[n++] = '[';
    deep[n++] = '"';
    deep[n++] = '"';
    for (int i = 0; i < d; i++)
        deep[n++] = ']';
    deep[n] = '\0';
    cJSON *v = cJSON_Parse(deep);
    CHECK_INT(lr_schema_validate(s, v, &errs) >= 1, 1);
    int stopped = 0;
    for (int i = 0; i < errs.n; i++)
        stopped |= strstr(errs.e[i].message, "too many steps") != NULL;
    CHECK(stopped);
    cJSON_Delete(v);
    lr_schema_free(s);
}

/* A compiled schema is shared by reference: the last free frees it. */
static void test_references(void)
{
    char err[64];
    lr_schema *s = lr_schema_compile_text("{\"type\":\"string\"}", 17, err, sizeof err);
    CHECK(s != NULL && lr_schema_ref(s) == s);
    lr_schema_free(s);
    cJSON *v = cJSON_CreateString("x");
    CHECK_INT(lr_schema_validate(s, v, &errs), 0);       /* still alive: valgrind says so */
    cJSON_Delete(v);
    lr_schema_free(s);
}

static void test_error_cap_and_json(void)
{
    char value[2000];
    int n = sprintf(value, "[");
    for (int i = 0; i < 30; i++)
        n += sprintf(value + n, "%s\"x\"", i ? "," : "");
    strcpy(value + n, "]");
    CHECK_INT(run("{\"items\":{\"type\":\"integer\"}}", value), LR_SCHEMA_MAX_ERRORS);
    CHECK_INT(errs.truncated, 1);
    CHECK_STR(errs.e[19].path, "$[19]");
    CHECK_INT(run("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}",
                  "{\"a\":1}"), 1);
    char *json = lr_schema_errors_json(&errs);
    CHECK_STR(json, "[{\"path\":\"$.a\",\"message\":\"expected string\"}]");
    free(json);
}

/* The public entry point: the engine's check on JSON texts. */
static void test_public_api(void)
{
    char err[LLMRETRY_ERRBUF], *out = (char *)1;
    const char *s = "{\"type\":\"object\",\"required\":[\"a\"]}";
    CHECK_INT(llmretry_schema_validate(s, strlen(s), "{\"a\":1}", 7, &out, err, sizeof err),
              LLMRETRY_OK);
    CHECK(out == NULL);
    CHECK_INT(llmretry_schema_validate(s, strlen(s), "{}", 2, &out, err, sizeof err), LLMRETRY_OK);
    CHECK_STR(out, "[{\"path\":\"$.a\",\"message\":\"required property is missing\"}]");
    llmretry_free(out);
    CHECK_INT(llmretry_schema_validate("{\"not\":{}}", 10, "{}", 2, &out, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK(strstr(err, "schema: unsupported keyword 'not' at $") != NULL && out == NULL);
    CHECK_INT(llmretry_schema_validate(s, strlen(s), "{", 1, &out, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK_STR(err, "json is not valid JSON");
}

/* The text validator reads strict JSON (json_pull.h): what cJSON let
 * through and no host's parser reads is "not JSON" (-1). */
static int text_verdict(const char *schema, const char *value, size_t len)
{
    char err[256];
    lr_schema *s = lr_schema_compile_text(schema, strlen(schema), err, sizeof err);
    CHECK_MSG(s != NULL, "schema %s: %s", schema, err);
    int n = s ? lr_schema_validate_text(s, value, len, &text_errs) : -2;
    lr_schema_free(s);
    return n;
}

#define CHECK_NOT_JSON(value) CHECK_MSG(text_verdict("{}", value, strlen(value)) == -1, \
                                        "%s was read as JSON", value)
#define CHECK_JSON(value) CHECK_MSG(text_verdict("{}", value, strlen(value)) == 0, \
                                    "%s was not read as JSON", value)

static void test_text_strict_json(void)
{
    const char *bad[] = {
        "", "  ", "01", "-01", "1.", ".5", "+1", "-", "1e", "1e+", "0x10", "[1,]", "{\"a\":1,}",
        "[1 2]", "{\"a\" 1}", "{\"a\"}", "{1:2}", "{'a':1}", "\"a\x01\"", "\"\xff\"",
        "\"\xc0\x80\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xe2\x82\"",
        "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\\x\"", "\"\\u12g4\"",
        "\xef\xbb\xbf{}", "{} x", "{}{}", "\f{}", "nul", "tru", "[", "{", "\"abc", "[[]",
        "{\"a\":[}]", "NaN", "Infinity", "-Infinity", "[1]]", "\"\\\"", "1 2",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_NOT_JSON(bad[i]);
    const char *good[] = {
        " {} \n", "-0", "0", "1E+2", "0.5e-3", "-12.50", "\"\\ud83d\\ude00\"", "\"\xf0\x9f\x98\x80\"",
        "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "[]", "[ ]", "{ }", "[null,true,false]", "\t\r\n1\t\r\n",
        "{\"\":{\"\":[]}}", "\"\\u0000\"",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        CHECK_JSON(good[i]);
    /* The text ends at its length, not at a NUL: "12" cut to "1". */
    CHECK_INT(text_verdict("{\"maximum\":5}", "12", 1), 0);
    CHECK_INT(text_verdict("{\"maximum\":5}", "12", 2), 1);
    CHECK_INT(text_verdict("{}", "[1,2]", 4), -1);
    /* Nesting: cJSON's limit of 1000 containers, past which it is not JSON. */
    static char deep[2100];
    for (int depth = 999; depth <= 1001; depth++) {
        int n = 0;
        for (int i = 0; i < depth; i++)
            deep[n++] = '[';
        for (int i = 0; i < depth; i++)
            deep[n++] = ']';
        deep[n] = '\0';
        cJSON *tree = cJSON_Parse(deep);
        int verdict = text_verdict("{\"items\":{}}", deep, (size_t)n);
        CHECK_MSG((tree != NULL) == (verdict == 0), "%d levels: cJSON %s, text %d", depth,
                  tree ? "reads it" : "does not", verdict);
        CHECK_INT(verdict, depth <= 1000 ? 0 : -1);
        /* A recursive schema stops at LR_SCHEMA_MAX_DEPTH, with the tree's error. */
        verdict = text_verdict("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", deep, (size_t)n);
        if (depth <= 1000) {
            CHECK_INT(verdict, 1);
            CHECK(strstr(text_errs.e[0].message, "nested too deep") != NULL);
        } else {
            CHECK_INT(verdict, -1);
        }
        cJSON_Delete(tree);
    }
}

/* What the text validator meets that a tree hides: escapes in keys and
 * strings, repeated keys, number forms; each against the tree's errors
 * (run() compares them). */
static void test_text_edge_cases(void)
{
    const char *ab = "{\"properties\":{\"ab\":{\"type\":\"string\"},\"\xc3\xa9\":{\"type\":\"integer\"}},"
                     "\"additionalProperties\":false}";
    CHECK_ERR(ab, "{\"a\\u0062\":1}", "$.ab", "expected string");
    CHECK_ERR(ab, "{\"\\u00e9\":\"x\"}", "$[\"\xc3\xa9\"]", "expected integer");
    CHECK_ERR(ab, "{\"a\\nb\":1}", "$[\"a\\u000ab\"]", "not allowed");
    CHECK_OK(ab, "{\"\\u00E9\":1,\"\\u0061b\":\"\"}");
    /* A key cut at \u0000, as a C string: "ab\u0000x" is "ab". */
    CHECK_ERR(ab, "{\"ab\\u0000x\":1}", "$.ab", "expected string");
    /* Repeated keys: each checked, as a tree keeps each. */
    CHECK_INT(run("{\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{\"a\":1,\"a\":\"x\",\"a\":[]}"),
              2);
    CHECK_STR(errs.e[1].path, "$.a");
    CHECK_INT(run("{\"additionalProperties\":false,\"required\":[\"b\"]}",
                  "{\"a\":1,\"a\":2}"), 3);
    CHECK_OK("{\"required\":[\"b\\u00e9\"]}", "{\"a\":1,\"b\\u00e9\":2}");
    CHECK_OK("{\"required\":[\"b\xc3\xa9\"]}", "{\"a\":1,\"b\\u00e9\":2}");
    CHECK_ERR("{\"required\":[\"b\"]}", "{\"a\":{\"b\":1},\"c\":[\"b\"]}", "$.b", "missing");
    /* Numbers: integral values are integers whatever their form. */
    CHECK_OK("{\"type\":\"integer\"}", "1.0");
    CHECK_OK("{\"type\":\"integer\"}", "1e2");
    CHECK_OK("{\"type\":\"integer\"}", "-0");
    CHECK_OK("{\"type\":\"integer\"}", "123456789012345678901234567890");
    CHECK_ERR("{\"type\":\"integer\"}", "1.5", "$", "expected integer");
    CHECK_ERR("{\"type\":\"integer\"}", "1e400", "$", "expected integer");
    CHECK_OK("{\"type\":\"number\",\"minimum\":0}", "1e400");
    CHECK_ERR("{\"maximum\":1e300}", "1e400", "$", "must be <=");
    CHECK_OK("{\"enum\":[1,2.5,\"x\"]}", "2.50");
    CHECK_OK("{\"enum\":[100]}", "1E2");
    CHECK_OK("{\"const\":0}", "-0.0");
    CHECK_OK("{\"multipleOf\":0.01}", "0.07");
    CHECK_OK("{\"minimum\":0.1}", "0.10000000000000001");
    /* Strings: escapes decoded for enum, const, lengths and patterns. */
    CHECK_OK("{\"enum\":[\"a\\\"b\",\"\xc3\xa9\"]}", "\"a\\\"b\"");
    CHECK_OK("{\"enum\":[\"a\\\"b\",\"\xc3\xa9\"]}", "\"\\u00e9\"");
    CHECK_ERR("{\"enum\":[\"ab\"]}", "\"a\\u0062c\"", "$", "must be one of");
    CHECK_OK("{\"const\":\"ab\"}", "\"ab\\u0000c\"");          /* cut at \u0000 */
    CHECK_OK("{\"maxLength\":1}", "\"\\ud83d\\ude00\"");       /* one code point */
    CHECK_ERR("{\"maxLength\":1}", "\"\\n\\t\"", "$", "at most 1");
    CHECK_OK("{\"maxLength\":2}", "\"ab\\u0000cdef\"");
    CHECK_OK("{\"pattern\":\"^a\\nb$\"}", "\"a\\nb\"");
    CHECK_ERR("{\"pattern\":\"^[a-z]+$\"}", "\"ab\\u0031\"", "$", "pattern");
    char longval[2000];
    int n = sprintf(longval, "\"");
    for (int i = 0; i < 300; i++)
        n += sprintf(longval + n, "\\u0041");
    sprintf(longval + n, "\"");
    CHECK_OK("{\"pattern\":\"^A+$\",\"minLength\":300,\"maxLength\":300}", longval);
    CHECK_ERR("{\"pattern\":\"^A+B$\"}", longval, "$", "pattern");
    /* Containers in enum and const; anyOf over containers, rewound. */
    CHECK_OK("{\"enum\":[[1,{\"a\":null}],{}]}", "[1.0,{\"a\":null}]");
    CHECK_ERR("{\"enum\":[[1,{\"a\":null}],{}]}", "[1,{\"a\":0}]", "$", "must be one of");
    CHECK_OK("{\"anyOf\":[{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
             "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}]}", "[1,2,3]");
    CHECK_ERR("{\"anyOf\":[{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
              "{\"type\":\"object\"}]}", "[\"a\",2,\"c\"]", "$[1]", "expected string");
    CHECK_ERR("{\"type\":\"object\",\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"required\":[\"x\"]}},"
              "\"properties\":{\"y\":{\"type\":\"null\"}}}", "{\"y\":1}", "$.x", "missing");
    CHECK_INT(errs.n, 2);
    CHECK_ERR("{\"items\":{\"type\":\"integer\"},\"maxItems\":1}", "[\"a\",\"b\"]", "$",
              "at most 1 items");
    CHECK_STR(errs.e[1].path, "$[0]");
}

int main(void)
{
    test_types();
    test_objects();
    test_arrays_strings_numbers();
    test_enum_const_pattern();
    test_any_of_and_refs();
    test_compile_errors();
    test_depth_and_budget();
    test_error_cap_and_json();
    test_references();
    test_public_api();
    test_text_strict_json();
    test_text_edge_cases();
    return th_summary("test_schema");
}
