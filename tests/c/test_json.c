/* Tests of llmretry_extract_json and llmretry_assert_shape (core/src/json.c).
 *
 * Every input is copied into a buffer of exactly its length, without a
 * trailing NUL, so that AddressSanitizer catches any read past text_len. */
#include "harness.h"
#include "llmretry.h"

#include <stdlib.h>

/* A copy of s[0, n) with no NUL after it (malloc(0) may return NULL). */
static char *exact_copy(const char *s, size_t n)
{
    char *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memcpy(p, s, n);
    return p;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Is s well-formed UTF-8 (no truncated or stray sequences)? */
static int utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t need = *p < 0x80 ? 0 : *p >= 0xF0 ? 3 : *p >= 0xE0 ? 2 : *p >= 0xC0 ? 1 : 99;
        if (need == 99)
            return 0;
        p++;
        for (size_t i = 0; i < need; i++, p++)
            if ((*p & 0xC0) != 0x80)
                return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ */
/* extract_json                                                       */
/* ------------------------------------------------------------------ */

typedef struct extract_case {
    const char *name;
    const char *text;
    size_t len;       /* 0 = strlen(text) */
    const char *want; /* the JSON span expected; NULL = EINVAL */
    const char *err;  /* with EINVAL: how the message starts */
} extract_case;

#define NO_JSON "no JSON object or array found in the text"
#define BAD_FENCE "fenced block is not valid JSON: "

static const extract_case extract_cases[] = {
    /* Fences. */
    {"fence tagged json", "Here you go:\n```json\n{\"a\": 1}\n```\nThanks!", 0, "{\"a\": 1}", NULL},
    {"fence tagged JSON, no newline", "```JSON{\"a\":1}```", 0, "{\"a\":1}", NULL},
    {"fence tagged Json with spaces", "```Json  \t\n  {\"a\": [1, 2]}  \n```", 0, "{\"a\": [1, 2]}", NULL},
    {"fence without tag", "Result:\n```\n[1, 2, 3]\n```", 0, "[1, 2, 3]", NULL},
    {"fence on one line", "see ```json {\"k\": \"v\"} ``` ok", 0, "{\"k\": \"v\"}", NULL},
    {"fence holding a bare scalar", "```json\n42\n```", 0, "42", NULL},
    {"first fence not JSON, second is", "```\nnot json\n```\nthen\n```json\n{\"b\": 2}\n```", 0,
     "{\"b\": 2}", NULL},
    {"python fence skipped for the json one",
     "```python\nprint({1: 2})\n```\n```json\n{\"ok\": true}\n```", 0, "{\"ok\": true}", NULL},
    {"fence wins over earlier prose object", "{\"early\": 1}\n```json\n{\"late\": 2}\n```", 0,
     "{\"late\": 2}", NULL},
    {"bad fence, object in the prose after", "```json\n{oops}\n```\nActually: {\"a\": 1}", 0,
     "{\"a\": 1}", NULL},
    {"unterminated fence, JSON still found", "```json\n{\"a\": 1}\n", 0, "{\"a\": 1}", NULL},
    {"fence with CRLF", "```json\r\n{\"a\": 1}\r\n```\r\n", 0, "{\"a\": 1}", NULL},
    {"``` inside a string breaks the fence, prose scan finds it",
     "```json\n{\"md\": \"use ``` fences\"}\n```", 0, "{\"md\": \"use ``` fences\"}", NULL},
    {"UTF-8 around a fence", "好的：\n```json\n{\"城市\": \"北京\"}\n```\n😀", 0,
     "{\"城市\": \"北京\"}", NULL},

    /* The whole text. */
    {"bare object", "{\"a\": [1, 2, {\"b\": null}]}", 0, "{\"a\": [1, 2, {\"b\": null}]}", NULL},
    {"bare object with whitespace", "  \n\t{\"a\": 1}\n  ", 0, "{\"a\": 1}", NULL},
    {"bare array", "[]", 0, "[]", NULL},
    {"bare number", "42", 0, "42", NULL},
    {"bare negative float", " -1.5e3 ", 0, "-1.5e3", NULL},
    {"bare string", "\"x\"", 0, "\"x\"", NULL},
    {"bare true", "true", 0, "true", NULL},
    {"bare null", "null", 0, "null", NULL},
    {"BOM before the object", "\xEF\xBB\xBF{\"a\": 1}", 0, "{\"a\": 1}", NULL},
    {"BOM before a scalar", "\xEF\xBB\xBF" "7", 0, "7", NULL},
    {"len shorter than the buffer", "{\"a\":1}XYZ", 7, "{\"a\":1}", NULL},

    /* Objects and arrays in prose. */
    {"prose around", "Sure! Here is the JSON: {\"a\": 1}. Let me know.", 0, "{\"a\": 1}", NULL},
    {"braces inside strings", "Result: {\"msg\": \"use } and { freely\", \"n\": [1]} done", 0,
     "{\"msg\": \"use } and { freely\", \"n\": [1]}", NULL},
    {"brackets inside strings", "x [\"]\", \"[[\"] y", 0, "[\"]\", \"[[\"]", NULL},
    {"escaped quotes", "x {\"q\": \"she said \\\"}\\\" ok\"} y", 0,
     "{\"q\": \"she said \\\"}\\\" ok\"}", NULL},
    {"escaped backslash ends the string", "a {\"p\": \"C:\\\\\"} b", 0, "{\"p\": \"C:\\\\\"}", NULL},
    {"unicode escapes", "v: {\"s\": \"\\u00e9\\ud83d\\ude00\"}!", 0,
     "{\"s\": \"\\u00e9\\ud83d\\ude00\"}", NULL},
    {"Chinese and emoji around", "结果如下：{\"名字\": \"张三\", \"emoji\": \"😀\"} 🎉谢谢", 0,
     "{\"名字\": \"张三\", \"emoji\": \"😀\"}", NULL},
    {"nested", "data: {\"a\": {\"b\": {\"c\": [[1], [2, {\"d\": []}]]}}} end", 0,
     "{\"a\": {\"b\": {\"c\": [[1], [2, {\"d\": []}]]}}}", NULL},
    {"first candidate fails, later one parses", "Use {braces} for sets. Data: {\"a\": 1}", 0,
     "{\"a\": 1}", NULL},
    {"object inside a failed outer span", "{not json {\"a\": 1}}", 0, "{\"a\": 1}", NULL},
    {"array comes first", "list [1, 2] and {\"a\": 1}", 0, "[1, 2]", NULL},
    {"bracketed prose that happens to be JSON", "see [1] and {\"k\": \"v\"}", 0, "[1]", NULL},
    {"mismatched brackets skipped", "{\"a\": [1, 2} then [3]", 0, "[3]", NULL},
    {"two values: the first", "{\"a\": 1} {\"b\": 2}", 0, "{\"a\": 1}", NULL},
    {"embedded NUL before the JSON", "abc\0{\"a\": 1}", 12, "{\"a\": 1}", NULL},
    {"unclosed prose brace, then JSON", "the set {1, 2 and {\"a\": 1}", 0, "{\"a\": 1}", NULL},
    {"number then prose is not JSON", "42 is the answer, {\"a\": 1}", 0, "{\"a\": 1}", NULL},

    /* No JSON at all. */
    {"empty text", "", 0, NULL, NO_JSON " (the text is empty)"},
    {"whitespace only", "  \n\t ", 0, NULL, NO_JSON " (the text is empty)"},
    {"prose only", "I cannot help with that.", 0, NULL, NO_JSON},
    {"number with prose", "42 is the answer", 0, NULL, NO_JSON},
    {"trailing comma", "{\"a\": 1,}", 0, NULL, NO_JSON},
    {"single quotes", "{'a': 1}", 0, NULL, NO_JSON},
    {"unterminated string", "{\"a\": \"unterminated } } }", 0, NULL, NO_JSON},
    {"unclosed object, inner array found", "Here: {\"a\": [1, 2]", 0, "[1, 2]", NULL},
    {"unterminated fence", "```json\n{\"a\": ", 0, NULL, NO_JSON " (a ``` fence is unterminated)"},
    {"invalid fence", "```json\n{a: 1}\n```", 0, NULL, BAD_FENCE "parse error at byte "},
    {"empty fence", "``````", 0, NULL, BAD_FENCE "the block is empty"},
    {"empty tagged fence", "```json\n```", 0, NULL, BAD_FENCE "the block is empty"},
    {"first bad fence reported", "```\n[1,\n```\n```\n{x}\n```", 0, NULL, BAD_FENCE},
    {"lone brackets", "} ] [ {", 0, NULL, NO_JSON},
    {"unclosed object", "Here: {\"a\": 1, \"b\": ", 0, NULL, NO_JSON},
};

static void test_extract_table(void)
{
    for (size_t i = 0; i < sizeof extract_cases / sizeof *extract_cases; i++) {
        const extract_case *c = &extract_cases[i];
        size_t n = c->len ? c->len : strlen(c->text);
        char *text = exact_copy(c->text, n);
        char err[LLMRETRY_ERRBUF] = "";
        size_t start = 999, len = 999;
        llmretry_status st = llmretry_extract_json(text, n, &start, &len, err, sizeof err);
        if (c->want != NULL) {
            CHECK_MSG(st == LLMRETRY_OK, "%s: status %d (%s)", c->name, (int)st, err);
            if (st == LLMRETRY_OK) {
                size_t want_len = strlen(c->want);
                CHECK_MSG(start <= n && len <= n - start, "%s: span %zu+%zu outside %zu", c->name,
                          start, len, n);
                CHECK_MSG(len == want_len && start + len <= n &&
                              memcmp(text + start, c->want, want_len) == 0,
                          "%s: got \"%.*s\", want \"%s\"", c->name, (int)(start + len <= n ? len : 0),
                          text + start, c->want);
            }
        } else {
            CHECK_MSG(st == LLMRETRY_EINVAL, "%s: status %d, want EINVAL", c->name, (int)st);
            CHECK_MSG(starts_with(err, c->err), "%s: message \"%s\", want \"%s...\"", c->name, err,
                      c->err);
        }
        free(text);
    }
}

static void test_extract_args(void)
{
    char err[LLMRETRY_ERRBUF];
    size_t start, len;

    CHECK_INT(llmretry_extract_json("{}", 2, NULL, &len, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, "start and len must not be NULL");
    CHECK_INT(llmretry_extract_json("{}", 2, &start, NULL, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_INT(llmretry_extract_json(NULL, 5, &start, &len, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, "text is NULL but text_len is 5");
    CHECK_INT(llmretry_extract_json(NULL, 0, &start, &len, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, NO_JSON " (the text is empty)");

    /* No error buffer, or a tiny one. */
    CHECK_INT(llmretry_extract_json("nope", 4, &start, &len, NULL, 0), LLMRETRY_EINVAL);
    CHECK_INT(llmretry_extract_json("nope", 4, &start, &len, NULL, 100), LLMRETRY_EINVAL);
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    CHECK_INT(llmretry_extract_json("nope", 4, &start, &len, tiny, 1), LLMRETRY_EINVAL);
    CHECK_INT(tiny[0], '\0');
    CHECK_INT(tiny[1], 'x');
    CHECK_INT(llmretry_extract_json("nope", 4, &start, &len, tiny, sizeof tiny), LLMRETRY_EINVAL);
    CHECK_STR(tiny, "no JSON");

    /* Success leaves err alone and needs none. */
    CHECK_INT(llmretry_extract_json("[1]", 3, &start, &len, NULL, 0), LLMRETRY_OK);
    CHECK_INT(start, 0);
    CHECK_INT(len, 3);
}

/* Deep and adversarial inputs stay correct and finish. */
static void test_extract_large(void)
{
    size_t start, len;
    char err[LLMRETRY_ERRBUF];

    /* Inside prose, values nest up to 128 levels (bare JSON goes deeper). */
    for (size_t depth = 127; depth <= 129; depth++) {
        char deep[3 + 2 * 129 + 2];
        memcpy(deep, "ok ", 3);
        memset(deep + 3, '[', depth);
        memset(deep + 3 + depth, ']', depth);
        memcpy(deep + 3 + 2 * depth, " .", 2);
        size_t n = 3 + 2 * depth + 2;
        char *text = exact_copy(deep, n);
        llmretry_status st = llmretry_extract_json(text, n, &start, &len, err, sizeof err);
        CHECK_INT(st, LLMRETRY_OK);
        if (depth <= 128) {
            CHECK_INT(start, 3);
            CHECK_INT(len, 2 * depth);
        } else {
            /* Too deep from the first '[': the next one starts a value of
             * 128 levels, and that is the first that can be read. */
            CHECK_INT(start, 4);
            CHECK_INT(len, 2 * 128);
        }
        free(text);
        /* The same value as the whole text. */
        st = llmretry_extract_json(deep + 3, 2 * depth, &start, &len, err, sizeof err);
        CHECK_INT(st, LLMRETRY_OK);
        CHECK_INT(len, 2 * depth);
    }

    /* Half a megabyte of '[', of '{"a":' and of deep invalid blocks:
     * bounded work, not quadratic. */
    size_t n = 512 * 1024;
    char *text = malloc(n);
    CHECK(text != NULL);
    if (text == NULL)
        return;
    int64_t t0 = th_now_ms();
    memset(text, '[', n);
    CHECK_INT(llmretry_extract_json(text, n, &start, &len, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, NO_JSON);
    for (size_t i = 0; i + 5 <= n; i += 5)
        memcpy(text + i, "{\"a\":", 5);
    CHECK_INT(llmretry_extract_json(text, n, &start, &len, err, sizeof err), LLMRETRY_EINVAL);
    size_t k = 0;
    while (k + 300 < n) {
        memset(text + k, '[', 120);
        text[k + 120] = 'x';
        memset(text + k + 121, ']', 120);
        k += 241;
    }
    memset(text + k, ' ', n - k);
    CHECK_INT(llmretry_extract_json(text, n, &start, &len, err, sizeof err), LLMRETRY_EINVAL);
    /* Quadratic work on 512 KiB is ~10^11 steps: hours. The bound only has
     * to tell that apart, on a loaded machine under ASan too (26 s was
     * seen there with 4 C tests at once beside other suites). */
    int64_t took = th_now_ms() - t0;
    CHECK_MSG(took < 120000, "adversarial scans took %lld ms", (long long)took);

    /* A large valid object at the end of long prose. */
    memset(text, 'a', n);
    memcpy(text + n - 9, "{\"k\": 1}", 8);
    text[n - 1] = '.';
    CHECK_INT(llmretry_extract_json(text, n, &start, &len, err, sizeof err), LLMRETRY_OK);
    CHECK_INT(start, n - 9);
    CHECK_INT(len, 8);
    free(text);
}

/* ------------------------------------------------------------------ */
/* assert_shape                                                       */
/* ------------------------------------------------------------------ */

typedef struct shape_case {
    const char *name;
    const char *json;
    const char *shape;
    const char *root; /* root_path; NULL = "root" */
    const char *err;  /* NULL = OK; else the whole message */
} shape_case;

#define ALL_TYPES "{\"s\": \"string\", \"n\": \"number\", \"b\": \"boolean\", \"a\": \"array\", \"o\": \"object\"}"
#define TYPE_HINT " (expected string, number, boolean, array or object)"
#define NOT_SHAPE "expected a type name, an object or a one-element array"
#define ONE_ELEMENT "an array shape must have exactly one element"

static const shape_case shape_cases[] = {
    /* Leaves. */
    {"all types", "{\"s\": \"x\", \"n\": 1.5, \"b\": false, \"a\": [], \"o\": {}}", ALL_TYPES, NULL, NULL},
    {"zero, negative and true", "{\"s\": \" \", \"n\": -0, \"b\": true, \"a\": [null], \"o\": {\"x\": null}}",
     ALL_TYPES, NULL, NULL},
    {"extra keys are fine", "{\"name\": \"a\", \"other\": [1, 2], \"more\": null}",
     "{\"name\": \"string\"}", NULL, NULL},
    {"empty shape accepts any object", "{\"a\": 1}", "{}", NULL, NULL},
    {"empty string", "{\"name\": \"\"}", "{\"name\": \"string\"}", NULL,
     "invalid response at root.name: expected string"},
    {"missing key", "{\"other\": \"x\"}", "{\"name\": \"string\"}", NULL,
     "invalid response at root.name: expected string"},
    {"keys are case-sensitive", "{\"Name\": \"x\"}", "{\"name\": \"string\"}", NULL,
     "invalid response at root.name: expected string"},
    {"null string", "{\"s\": null}", "{\"s\": \"string\"}", NULL, "invalid response at root.s: expected string"},
    {"null number", "{\"n\": null}", "{\"n\": \"number\"}", NULL, "invalid response at root.n: expected number"},
    {"null boolean", "{\"b\": null}", "{\"b\": \"boolean\"}", NULL, "invalid response at root.b: expected boolean"},
    {"null array", "{\"a\": null}", "{\"a\": \"array\"}", NULL, "invalid response at root.a: expected array"},
    {"null object", "{\"o\": null}", "{\"o\": \"object\"}", NULL, "invalid response at root.o: expected object"},
    {"number as string", "{\"n\": \"3\"}", "{\"n\": \"number\"}", NULL, "invalid response at root.n: expected number"},
    {"boolean as number", "{\"b\": 0}", "{\"b\": \"boolean\"}", NULL, "invalid response at root.b: expected boolean"},
    {"boolean as string", "{\"b\": \"true\"}", "{\"b\": \"boolean\"}", NULL,
     "invalid response at root.b: expected boolean"},
    {"string as number", "{\"s\": 5}", "{\"s\": \"string\"}", NULL, "invalid response at root.s: expected string"},
    {"array as object", "{\"a\": {}}", "{\"a\": \"array\"}", NULL, "invalid response at root.a: expected array"},
    {"object as array", "{\"o\": []}", "{\"o\": \"object\"}", NULL, "invalid response at root.o: expected object"},
    {"first failing key in shape order", "{}", "{\"b\": \"number\", \"a\": \"string\"}", NULL,
     "invalid response at root.b: expected number"},

    /* Nested objects. */
    {"nested ok", "{\"user\": {\"name\": \"a\", \"id\": 1}}", "{\"user\": {\"name\": \"string\", \"id\": \"number\"}}",
     NULL, NULL},
    {"nested leaf", "{\"user\": {\"name\": 5}}", "{\"user\": {\"name\": \"string\"}}", NULL,
     "invalid response at root.user.name: expected string"},
    {"nested object missing", "{}", "{\"user\": {\"name\": \"string\"}}", NULL,
     "invalid response at root.user: expected object"},
    {"nested object is a string", "{\"user\": \"bob\"}", "{\"user\": {\"name\": \"string\"}}", NULL,
     "invalid response at root.user: expected object"},
    {"three levels", "{\"a\": {\"b\": {\"c\": true}}}", "{\"a\": {\"b\": {\"c\": \"number\"}}}", NULL,
     "invalid response at root.a.b.c: expected number"},
    {"root is an array", "[1]", "{\"a\": \"string\"}", NULL, "invalid response at root: expected object"},
    {"root is a string", "\"x\"", "{\"a\": \"string\"}", NULL, "invalid response at root: expected object"},
    {"root is null", "null", "{}", NULL, "invalid response at root: expected object"},

    /* Arrays of shapes. */
    {"array of strings ok", "{\"tags\": [\"a\", \"b\"]}", "{\"tags\": [\"string\"]}", NULL, NULL},
    {"empty array ok", "{\"tags\": []}", "{\"tags\": [\"string\"]}", NULL, NULL},
    {"array of strings, third empty", "{\"tags\": [\"a\", \"b\", \"\"]}", "{\"tags\": [\"string\"]}", NULL,
     "invalid response at root.tags[2]: expected string"},
    {"array of objects", "{\"items\": [{\"name\": \"a\"}, {\"name\": \"b\"}, {\"name\": 7}]}",
     "{\"items\": [{\"name\": \"string\"}]}", NULL, "invalid response at root.items[2].name: expected string"},
    {"array element not an object", "{\"items\": [{\"name\": \"a\"}, 3]}", "{\"items\": [{\"name\": \"string\"}]}",
     NULL, "invalid response at root.items[1]: expected object"},
    {"array shape, object value", "{\"items\": {}}", "{\"items\": [\"number\"]}", NULL,
     "invalid response at root.items: expected array"},
    {"array shape, missing", "{}", "{\"items\": [\"number\"]}", NULL,
     "invalid response at root.items: expected array"},
    {"nested arrays", "{\"m\": [[1, 2], [3, \"x\"]]}", "{\"m\": [[\"number\"]]}", NULL,
     "invalid response at root.m[1][1]: expected number"},
    {"root array shape", "[1, 2, \"3\"]", "[\"number\"]", NULL, "invalid response at root[2]: expected number"},
    {"root type name", "[1]", "\"array\"", NULL, NULL},
    {"root type name fails", "{}", "\"array\"", NULL, "invalid response at root: expected array"},
    {"index past 9", "[1,1,1,1,1,1,1,1,1,1,1,true]", "[\"number\"]", NULL,
     "invalid response at root[11]: expected number"},

    /* root_path. */
    {"custom root path", "{\"name\": \"\"}", "{\"name\": \"string\"}", "response",
     "invalid response at response.name: expected string"},
    {"custom root path, root wrong", "[]", "{}", "data", "invalid response at data: expected object"},
    {"empty root path means root", "{}", "{\"a\": \"number\"}", "", "invalid response at root.a: expected number"},
    {"unicode keys", "{\"名字\": \"\"}", "{\"名字\": \"string\"}", NULL,
     "invalid response at root.名字: expected string"},

    /* The data is not JSON. */
    {"truncated data", "{\"a\":", "{}", NULL, "invalid response at root: not valid JSON"},
    {"trailing garbage", "{} x", "{}", NULL, "invalid response at root: not valid JSON"},
    {"two values", "{} {}", "{}", NULL, "invalid response at root: not valid JSON"},
    {"empty data", "", "{}", NULL, "invalid response at root: not valid JSON"},
    {"whitespace data", "  \n", "{}", NULL, "invalid response at root: not valid JSON"},
    {"fenced data", "```json\n{}\n```", "{}", NULL, "invalid response at root: not valid JSON"},
    {"bad data, custom root", "nope", "{}", "resp", "invalid response at resp: not valid JSON"},
    {"whitespace around data is fine", "\n {\"a\": 1} \r\n", "{\"a\": \"number\"}", NULL, NULL},

    /* Mistakes in the shape are reported as such, before any data check. */
    {"unknown type", "{\"x\": \"a\"}", "{\"x\": \"strng\"}", NULL,
     "invalid shape at root.x: unknown type \"strng\"" TYPE_HINT},
    {"type names are case-sensitive", "{\"x\": \"a\"}", "{\"x\": \"String\"}", NULL,
     "invalid shape at root.x: unknown type \"String\"" TYPE_HINT},
    {"null is not a type", "{\"x\": null}", "{\"x\": \"null\"}", NULL,
     "invalid shape at root.x: unknown type \"null\"" TYPE_HINT},
    {"empty type name", "{}", "{\"x\": \"\"}", NULL, "invalid shape at root.x: unknown type \"\"" TYPE_HINT},
    {"unknown type under an empty array", "{\"items\": []}", "{\"items\": [{\"n\": \"nubmer\"}]}", NULL,
     "invalid shape at root.items[].n: unknown type \"nubmer\"" TYPE_HINT},
    {"shape error beats data error", "not json", "{\"a\": {\"b\": \"bool\"}}", NULL,
     "invalid shape at root.a.b: unknown type \"bool\"" TYPE_HINT},
    {"shape error after a failing key", "{}", "{\"a\": \"number\", \"b\": \"numbr\"}", NULL,
     "invalid shape at root.b: unknown type \"numbr\"" TYPE_HINT},
    {"two-element array shape", "{\"x\": []}", "{\"x\": [\"string\", \"number\"]}", NULL,
     "invalid shape at root.x: " ONE_ELEMENT},
    {"empty array shape", "{\"x\": []}", "{\"x\": []}", NULL, "invalid shape at root.x: " ONE_ELEMENT},
    {"number in shape", "{\"x\": 5}", "{\"x\": 5}", NULL, "invalid shape at root.x: " NOT_SHAPE},
    {"null in shape", "{\"x\": null}", "{\"x\": null}", NULL, "invalid shape at root.x: " NOT_SHAPE},
    {"boolean in shape", "{}", "{\"x\": true}", NULL, "invalid shape at root.x: " NOT_SHAPE},
    {"root shape a number", "{}", "1", "resp", "invalid shape at resp: " NOT_SHAPE},
    {"shape not JSON", "{}", "{\"x\": string}", NULL, "invalid shape: not valid JSON (parse error at byte 6)"},
    {"empty shape text", "{}", "", NULL, "invalid shape: not valid JSON (parse error at byte 0)"},
};

static void test_shape_table(void)
{
    for (size_t i = 0; i < sizeof shape_cases / sizeof *shape_cases; i++) {
        const shape_case *c = &shape_cases[i];
        size_t jn = strlen(c->json), sn = strlen(c->shape);
        char *json = exact_copy(c->json, jn), *shape = exact_copy(c->shape, sn);
        char err[LLMRETRY_ERRBUF] = "";
        llmretry_status st = llmretry_assert_shape(json, jn, shape, sn, c->root, err, sizeof err);
        if (c->err == NULL) {
            CHECK_MSG(st == LLMRETRY_OK, "%s: status %d (%s)", c->name, (int)st, err);
        } else {
            CHECK_MSG(st == LLMRETRY_EINVAL, "%s: status %d, want EINVAL", c->name, (int)st);
            CHECK_MSG(strcmp(err, c->err) == 0, "%s: message \"%s\", want \"%s\"", c->name, err, c->err);
        }
        free(json);
        free(shape);
    }
}

/* Build a shape nested `levels` objects deep ({"a": {"a": ... "number"}})
 * and data to match. */
static char *nested(int levels, const char *leaf)
{
    size_t n = (size_t)levels * 7 + strlen(leaf) + (size_t)levels + 1;
    char *s = malloc(n), *p = s;
    if (s == NULL)
        exit(2);
    for (int i = 0; i < levels; i++)
        p += sprintf(p, "{\"a\": ");
    p += sprintf(p, "%s", leaf);
    for (int i = 0; i < levels; i++)
        *p++ = '}';
    *p = '\0';
    return s;
}

static void test_shape_depth(void)
{
    char err[LLMRETRY_ERRBUF] = "";

    /* 64 levels of objects around a leaf: the leaf sits at depth 64. */
    char *shape = nested(64, "\"number\""), *json = nested(64, "1");
    CHECK_INT(llmretry_assert_shape(json, strlen(json), shape, strlen(shape), NULL, err, sizeof err),
              LLMRETRY_OK);
    free(json);
    json = nested(64, "\"one\"");
    CHECK_INT(llmretry_assert_shape(json, strlen(json), shape, strlen(shape), NULL, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK(starts_with(err, "invalid response at root.a.a.a."));
    CHECK(strstr(err, ": expected number") != NULL);
    free(json);
    free(shape);

    shape = nested(65, "\"number\"");
    json = nested(65, "1");
    CHECK_INT(llmretry_assert_shape(json, strlen(json), shape, strlen(shape), NULL, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK(starts_with(err, "invalid shape at root.a.a."));
    CHECK(strstr(err, "nested more than 64 levels deep") != NULL);
    /* The full message fits a bigger buffer. */
    char big[1024];
    llmretry_assert_shape(json, strlen(json), shape, strlen(shape), NULL, big, sizeof big);
    CHECK_STR(big + strlen(big) - strlen(".a: nested more than 64 levels deep"),
              ".a: nested more than 64 levels deep");
    free(json);
    free(shape);

    /* Deep arrays count too. */
    char arr[200];
    size_t n = 0;
    for (int i = 0; i < 70; i++)
        arr[n++] = '[';
    memcpy(arr + n, "\"number\"", 8);
    n += 8;
    for (int i = 0; i < 70; i++)
        arr[n++] = ']';
    CHECK_INT(llmretry_assert_shape("[]", 2, arr, n, NULL, err, sizeof err), LLMRETRY_EINVAL);
    CHECK(starts_with(err, "invalid shape at root[][][]"));

    /* Very deep data under a shallow shape is fine: only the shape is walked. */
    json = nested(500, "1");
    CHECK_INT(llmretry_assert_shape(json, strlen(json), "{\"a\": \"object\"}", 15, NULL, err, sizeof err),
              LLMRETRY_OK);
    free(json);
}

static void test_shape_messages(void)
{
    char err[LLMRETRY_ERRBUF];
    const char *shape = "{\"user\": {\"name\": \"string\"}}";
    const char *json = "{\"user\": {\"name\": 5}}";
    const char *full = "invalid response at root.user.name: expected string";

    /* Truncation at every size keeps a NUL-terminated prefix and never
     * writes past errlen. */
    for (size_t len = 1; len <= strlen(full) + 2; len++) {
        char buf[80];
        memset(buf, '#', sizeof buf);
        CHECK_INT(llmretry_assert_shape(json, strlen(json), shape, strlen(shape), NULL, buf, len),
                  LLMRETRY_EINVAL);
        size_t got = strnlen(buf, sizeof buf);
        size_t want = len - 1 < strlen(full) ? len - 1 : strlen(full);
        CHECK_MSG(got == want && strncmp(buf, full, want) == 0, "errlen %zu: \"%s\"", len, buf);
        CHECK_MSG(buf[len] == '#', "errlen %zu: wrote past the buffer", len);
    }
    CHECK_INT(llmretry_assert_shape(json, strlen(json), shape, strlen(shape), NULL, NULL, 0), LLMRETRY_EINVAL);
    CHECK_INT(llmretry_assert_shape(json, strlen(json), shape, strlen(shape), NULL, NULL, 64), LLMRETRY_EINVAL);

    /* Cutting inside a multi-byte character drops the partial character. */
    const char *ushape = "{\"名字名字名字\": \"string\"}";
    const char *ujson = "{}";
    const char *ufull = "invalid response at root.名字名字名字: expected string";
    for (size_t len = 20; len <= strlen(ufull) + 1; len++) {
        char buf[80];
        CHECK_INT(llmretry_assert_shape(ujson, 2, ushape, strlen(ushape), NULL, buf, len), LLMRETRY_EINVAL);
        CHECK_MSG(utf8_valid(buf), "errlen %zu: invalid UTF-8", len);
        CHECK_MSG(strncmp(buf, ufull, strlen(buf)) == 0, "errlen %zu: \"%s\"", len, buf);
        CHECK_MSG(strlen(buf) + 3 >= len - 1, "errlen %zu: cut too much", len);
    }
    CHECK_INT(llmretry_assert_shape(ujson, 2, ushape, strlen(ushape), NULL, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, ufull);

    /* Values never reach the message. */
    const char *secret = "{\"token\": \"hunter2\", \"n\": \"sk-123\"}";
    CHECK_INT(llmretry_assert_shape(secret, strlen(secret), "{\"token\": \"number\"}", 19, NULL, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK(strstr(err, "hunter2") == NULL);
    CHECK_STR(err, "invalid response at root.token: expected number");
    const char *bad = "{\"token\": \"hunter2\" oops";
    CHECK_INT(llmretry_assert_shape(bad, strlen(bad), "{}", 2, NULL, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, "invalid response at root: not valid JSON");

    /* Lengths are honoured: text past json_len/shape_len is not read. */
    const char *longer = "{\"a\": 1}{\"junk\"";
    CHECK_INT(llmretry_assert_shape(longer, 8, "{\"a\": \"number\"}garbage", 15, NULL, err, sizeof err),
              LLMRETRY_OK);

    /* NULL arguments. */
    CHECK_INT(llmretry_assert_shape(NULL, 0, "{}", 2, NULL, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, "invalid response at root: not valid JSON");
    CHECK_INT(llmretry_assert_shape("{}", 2, NULL, 0, NULL, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, "invalid shape: shape is NULL");

    /* A very long root path is cut, not overflowed. */
    char root[2000];
    memset(root, 'r', sizeof root - 1);
    root[sizeof root - 1] = '\0';
    CHECK_INT(llmretry_assert_shape("{}", 2, "{\"a\": \"number\"}", 15, root, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_INT(strlen(err), sizeof err - 1);
    CHECK(starts_with(err, "invalid response at rrrr"));
}

int main(void)
{
    test_extract_table();
    test_extract_args();
    test_extract_large();
    test_shape_table();
    test_shape_depth();
    test_shape_messages();
    return th_summary("json");
}
