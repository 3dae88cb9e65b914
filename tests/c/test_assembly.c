/* Stream assembly (core/src/assembly.c): every rule of assembly.h on small
 * hand-written streams, the shared vectors of tests/vectors/assembly/, the
 * caps on hostile indexes, and a 100k-chunk stream that would take minutes
 * if concatenation copied the string per chunk. */
#include "harness.h"
#include "assembly.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define VECTOR_DIR LLMRETRY_SOURCE_DIR "/tests/vectors/assembly"

static llmretry_status add_text(lr_asm *a, const char *json)
{
    cJSON *chunk = cJSON_Parse(json);
    CHECK_MSG(chunk != NULL, "test chunk does not parse: %s", json);
    llmretry_status st = lr_asm_add(a, chunk);
    cJSON_Delete(chunk);
    return st;
}

/* Add each chunk text, checking none fails. */
static void feed(lr_asm *a, const char *const *chunks)
{
    for (; *chunks; chunks++)
        CHECK_INT(add_text(a, *chunks), LLMRETRY_OK);
}

/* Both result forms must equal want, structurally. */
static int result_matches(const lr_asm *a, const cJSON *want, const char *what)
{
    cJSON *tree = lr_asm_result(a);
    size_t len = 0;
    char *text = lr_asm_result_text(a, &len);
    cJSON *parsed = text ? cJSON_Parse(text) : NULL;
    int ok = tree && parsed && cJSON_Compare(tree, want, 1) && cJSON_Compare(parsed, want, 1);
    CHECK_MSG(ok, "%s: assembled result differs", what);
    CHECK_MSG(text && len == strlen(text), "%s: result_text length", what);
    if (!ok) {
        char *w = cJSON_PrintUnformatted(want), *g = cJSON_PrintUnformatted(tree);
        fprintf(stderr, "  want %s\n  tree %s\n  text %s\n", w, g ? g : "(null)",
                text ? text : "(null)");
        free(w);
        free(g);
    }
    cJSON_Delete(tree);
    cJSON_Delete(parsed);
    free(text);
    return ok;
}

static void expect(const lr_asm *a, const char *want_json, const char *what)
{
    cJSON *want = cJSON_Parse(want_json);
    CHECK_MSG(want != NULL, "%s: expected JSON does not parse", what);
    if (want)
        result_matches(a, want, what);
    cJSON_Delete(want);
}

/* The message of choice 0 of the current result, printed (malloc'd). */
static char *message0(const lr_asm *a)
{
    cJSON *r = lr_asm_result(a);
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
    char *s = c ? cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "message")) : NULL;
    cJSON_Delete(r);
    return s;
}

#define TOP "\"id\":\"x\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\""
#define C(delta) "{\"id\":\"x\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":" delta "}]}"

/* ---- the shared vectors ------------------------------------------------ */

static int by_name(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

static void run_vector(const char *file)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", VECTOR_DIR, file);
    char *text = th_read_file(path, NULL);
    cJSON *v = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name");
    const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(v, "chunks");
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(v, "expected");
    CHECK_MSG(cJSON_IsObject(v), "%s: not a JSON object", file);
    CHECK_MSG(cJSON_IsString(name) && strlen(name->valuestring) + 5 == strlen(file) &&
              strncmp(name->valuestring, file, strlen(name->valuestring)) == 0,
              "%s: name must be the file name without .json", file);
    CHECK_MSG(cJSON_IsArray(chunks) && cJSON_IsObject(want), "%s: chunks/expected", file);
    for (const cJSON *k = v ? v->child : NULL; k; k = k->next)
        CHECK_MSG(!strcmp(k->string, "name") || !strcmp(k->string, "description") ||
                  !strcmp(k->string, "chunks") || !strcmp(k->string, "expected"),
                  "%s: unknown key %s", file, k->string);
    lr_asm *a = lr_asm_new();
    const cJSON *c;
    cJSON_ArrayForEach(c, chunks) {
        CHECK_MSG(cJSON_IsObject(c), "%s: every chunk is an object", file);
        CHECK_INT(lr_asm_add(a, c), LLMRETRY_OK);
    }
    CHECK_INT(lr_asm_stats_of(a)->chunks, cJSON_GetArraySize(chunks));
    if (want) {
        int ok = result_matches(a, want, file);
        fprintf(stderr, "%-32s %s\n", file, ok ? "ok" : "FAILED");
        /* finished and usage agree with what the body says. */
        int finished = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(want, "choices"))
            finished |= cJSON_IsString(cJSON_GetObjectItem(c, "finish_reason"));
        CHECK_INT(lr_asm_stats_of(a)->finished, finished);
        const cJSON *u = cJSON_GetObjectItem(want, "usage");
        CHECK_INT(lr_asm_stats_of(a)->usage.present, u != NULL);
        if (u)
            CHECK_INT(lr_asm_stats_of(a)->usage.total_tokens,
                      cJSON_GetObjectItem(u, "total_tokens")->valuedouble);
    }
    lr_asm_free(a);
    cJSON_Delete(v);
}

static void test_vectors(void)
{
    DIR *d = opendir(VECTOR_DIR);
    CHECK_MSG(d != NULL, "cannot open %s", VECTOR_DIR);
    char *names[256];
    size_t n = 0;
    for (struct dirent *de; d && (de = readdir(d)) && n < 256;) {
        size_t l = strlen(de->d_name);
        if (l > 5 && strcmp(de->d_name + l - 5, ".json") == 0)
            names[n++] = strdup(de->d_name);
    }
    if (d)
        closedir(d);
    qsort(names, n, sizeof *names, by_name);
    CHECK_MSG(n >= 10, "found %zu assembly vectors, expected at least 10", n);
    for (size_t i = 0; i < n; i++) {
        run_vector(names[i]);
        free(names[i]);
    }
}

/* ---- the rules, one by one --------------------------------------------- */

static void test_empty_and_defaults(void)
{
    lr_asm *a = lr_asm_new();
    CHECK(a != NULL);
    CHECK_INT(lr_asm_stats_of(a)->chunks, 0);
    CHECK_INT(lr_asm_stats_of(a)->finished, 0);
    CHECK_INT(lr_asm_stats_of(a)->usage.present, 0);
    expect(a, "{\"id\":null,\"object\":\"chat.completion\",\"created\":null,\"model\":null,"
              "\"choices\":[]}", "no chunks");
    lr_asm_free(a);
    lr_asm_free(NULL);
}

static void test_content_null_or_empty(void)
{
    lr_asm *a = lr_asm_new();
    feed(a, (const char *const[]){C("{\"role\":\"assistant\"}"), C("{\"content\":null}"), NULL});
    char *m = message0(a);
    CHECK_STR(m, "{\"role\":\"assistant\",\"content\":null}");
    free(m);
    feed(a, (const char *const[]){C("{\"content\":\"\"}"), NULL});
    m = message0(a);
    CHECK_STR(m, "{\"role\":\"assistant\",\"content\":\"\"}");
    free(m);
    lr_asm_free(a);
}

static void test_role(void)
{
    lr_asm *a = lr_asm_new();
    /* No role: assistant. An empty one is no role; the first real one stays. */
    feed(a, (const char *const[]){C("{\"content\":\"a\"}"), NULL});
    char *m = message0(a);
    CHECK_STR(m, "{\"role\":\"assistant\",\"content\":\"a\"}");
    free(m);
    feed(a, (const char *const[]){C("{\"role\":\"\"}"), C("{\"role\":\"tool\"}"),
                                  C("{\"role\":\"user\",\"content\":\"b\"}"), NULL});
    m = message0(a);
    CHECK_STR(m, "{\"role\":\"tool\",\"content\":\"ab\"}");
    free(m);
    lr_asm_free(a);
}

static void test_text_fields(void)
{
    lr_asm *a = lr_asm_new();
    feed(a, (const char *const[]){
        C("{\"reasoning\":\"r1\",\"reasoning_content\":\"rc1\",\"refusal\":null}"),
        C("{\"reasoning\":\"r2\",\"reasoning_content\":\"rc2\",\"content\":\"c\"}"),
        C("{\"refusal\":\"no\",\"audio\":{\"id\":\"a\"},\"function_call\":{\"name\":\"f\"},"
          "\"x_vendor\":\"dropped\"}"),
        NULL});
    char *m = message0(a);
    CHECK_STR(m, "{\"role\":\"assistant\",\"content\":\"c\",\"reasoning_content\":\"rc1rc2\","
                 "\"reasoning\":\"r1r2\",\"refusal\":\"no\"}");
    free(m);
    lr_asm_free(a);
}

static void test_finish_reason(void)
{
    lr_asm *a = lr_asm_new();
    const char *fin = "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":%s}]}";
    char buf[128];
    snprintf(buf, sizeof buf, fin, "null");
    CHECK_INT(add_text(a, buf), LLMRETRY_OK);
    snprintf(buf, sizeof buf, fin, "\"\"");
    CHECK_INT(add_text(a, buf), LLMRETRY_OK);
    CHECK_INT(lr_asm_stats_of(a)->finished, 0);
    snprintf(buf, sizeof buf, fin, "\"length\"");
    CHECK_INT(add_text(a, buf), LLMRETRY_OK);
    CHECK_INT(lr_asm_stats_of(a)->finished, 1);
    snprintf(buf, sizeof buf, fin, "\"stop\"");
    CHECK_INT(add_text(a, buf), LLMRETRY_OK);
    snprintf(buf, sizeof buf, fin, "null");         /* null does not undo it */
    CHECK_INT(add_text(a, buf), LLMRETRY_OK);
    expect(a, "{\"id\":null,\"object\":\"chat.completion\",\"created\":null,\"model\":null,"
              "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":null},"
              "\"finish_reason\":\"stop\"}]}", "last finish_reason");
    lr_asm_free(a);
}

static void test_top_level_first_seen(void)
{
    lr_asm *a = lr_asm_new();
    feed(a, (const char *const[]){
        "{\"id\":null,\"model\":\"\",\"created\":null,\"system_fingerprint\":null,\"choices\":[]}",
        "{\"id\":\"first\",\"model\":\"m1\",\"created\":1700000000,\"system_fingerprint\":\"fp1\"}",
        "{\"id\":\"second\",\"model\":\"m2\",\"created\":1800000000,\"system_fingerprint\":\"fp2\","
        "\"object\":\"something.else\",\"service_tier\":\"flex\",\"timings\":{}}",
        NULL});
    expect(a, "{\"id\":\"first\",\"object\":\"chat.completion\",\"created\":1700000000,"
              "\"model\":\"m1\",\"system_fingerprint\":\"fp1\",\"choices\":[]}", "first seen");
    lr_asm_free(a);
}

static void test_usage(void)
{
    lr_asm *a = lr_asm_new();
    feed(a, (const char *const[]){"{\"usage\":null}", "{\"usage\":[1,2]}", NULL});
    CHECK_INT(lr_asm_stats_of(a)->usage.present, 0);
    /* A running total (vLLM continuous_usage_stats): the last one stands.
     * Counts are read as for a plain body: a fraction or negative is 0. */
    feed(a, (const char *const[]){
        "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"total_tokens\":6}}",
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2.5,"
        "\"total_tokens\":-7,\"extra\":{\"k\":[1]}}}",
        "{\"usage\":null}", NULL});
    const llmretry_usage *u = &lr_asm_stats_of(a)->usage;
    CHECK_INT(u->present, 1);
    CHECK_INT(u->prompt_tokens, 5);
    CHECK_INT(u->completion_tokens, 0);
    CHECK_INT(u->total_tokens, 0);
    expect(a, "{\"id\":null,\"object\":\"chat.completion\",\"created\":null,\"model\":null,"
              "\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2.5,"
              "\"total_tokens\":-7,\"extra\":{\"k\":[1]}}}", "last usage, raw");
    lr_asm_free(a);
}

static void test_not_objects(void)
{
    lr_asm *a = lr_asm_new();
    const char *odd[] = {"42", "\"text\"", "[{\"choices\":[]}]", "null", "true",
                         "{\"choices\":{\"0\":{}}}", "{\"choices\":[null,[],\"x\",{\"delta\":[]}]}",
                         NULL};
    feed(a, odd);
    CHECK_INT(lr_asm_add(a, NULL), LLMRETRY_OK);
    CHECK_INT(lr_asm_stats_of(a)->chunks, 8);                  /* every call counts */
    /* {"delta": []}: a choice entry without an index is choice 0. */
    expect(a, "{\"id\":null,\"object\":\"chat.completion\",\"created\":null,\"model\":null,"
              "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":null},"
              "\"finish_reason\":null}]}", "non-objects skipped");
    lr_asm_free(a);
}

static void test_tool_calls(void)
{
    lr_asm *a = lr_asm_new();
    feed(a, (const char *const[]){
        /* call 1 before call 0; later pieces with empty or other ids, types
         * and names do not replace the first ones. */
        C("{\"tool_calls\":[{\"index\":1,\"id\":\"c1\",\"type\":\"function\","
          "\"function\":{\"name\":\"f1\",\"arguments\":\"[1\"}}]}"),
        C("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\"}}]}"),
        C("{\"tool_calls\":[{\"index\":1,\"id\":\"\",\"type\":\"other\",\"function\":"
          "{\"name\":\"f9\",\"arguments\":\"]\"}},{\"index\":0,\"id\":\"c0\","
          "\"function\":{\"arguments\":\"}\"}}]}"),
        /* a call of which nothing but its index came */
        C("{\"tool_calls\":[{\"index\":3}]}"),
        /* pieces without index continue the last call touched */
        C("{\"tool_calls\":[{\"function\":{\"arguments\":\"x\"}},"
          "{\"id\":\"c3\",\"function\":{\"name\":\"f3\"}}]}"),
        NULL});
    char *m = message0(a);
    CHECK_STR(m, "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
                 "{\"id\":\"c0\",\"type\":\"function\",\"function\":{\"name\":null,\"arguments\":\"{}\"}},"
                 "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f1\",\"arguments\":\"[1]\"}},"
                 "{\"id\":\"c3\",\"type\":\"function\",\"function\":{\"name\":\"f3\",\"arguments\":\"x\"}}]}");
    free(m);
    /* An unindexed call with a new id is a new call after the highest. */
    feed(a, (const char *const[]){
        C("{\"tool_calls\":[{\"id\":\"c4\",\"function\":{\"name\":\"f4\",\"arguments\":\"4\"}}]}"),
        NULL});
    cJSON *r = lr_asm_result(a);
    const cJSON *calls = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(
        cJSON_GetObjectItem(r, "choices"), 0), "message"), "tool_calls");
    CHECK_INT(cJSON_GetArraySize(calls), 4);
    CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 3), "id")), "c4");
    cJSON_Delete(r);
    lr_asm_free(a);

    /* function of the wrong type: the call exists, nothing of it is read. */
    a = lr_asm_new();
    feed(a, (const char *const[]){
        C("{\"tool_calls\":[{\"index\":0,\"function\":[{\"name\":\"n\",\"arguments\":\"a\"}]},"
          "{\"index\":0,\"function\":\"f\",\"id\":7,\"type\":[]}]}"),
        NULL});
    m = message0(a);
    CHECK_STR(m, "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":null,"
                 "\"type\":\"function\",\"function\":{\"name\":null,\"arguments\":\"\"}}]}");
    free(m);
    lr_asm_free(a);
}

static void test_logprobs(void)
{
    lr_asm *a = lr_asm_new();
    const char *lp = "{\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":%s}]}";
    const char *parts[] = {"null", "[1]", "{\"content\":{\"a\":1}}", "{\"content\":[{\"t\":\"a\"}]}",
                           "{\"refusal\":[{\"t\":\"r\"}],\"content\":null}",
                           "{\"content\":[{\"t\":\"b\"},{\"t\":\"c\"}],\"refusal\":[]}", NULL};
    for (int i = 0; parts[i]; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, lp, parts[i]);
        CHECK_INT(add_text(a, buf), LLMRETRY_OK);
    }
    expect(a, "{\"id\":null,\"object\":\"chat.completion\",\"created\":null,\"model\":null,"
              "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":null},"
              "\"finish_reason\":null,\"logprobs\":{\"content\":[{\"t\":\"a\"},{\"t\":\"b\"},"
              "{\"t\":\"c\"}],\"refusal\":[{\"t\":\"r\"}]}}]}", "logprobs concatenated");
    lr_asm_free(a);
}

/* Indexes: 0..127 address a slot, anything else is dropped. */
static void test_caps(void)
{
    lr_asm *a = lr_asm_new();
    char buf[256];
    const char *bad[] = {"128", "-1", "1.5", "1e9", "-0.5", "1e300", "\"1\"", "true", "{}", NULL};
    for (int i = 0; bad[i]; i++) {
        snprintf(buf, sizeof buf, "{\"choices\":[{\"index\":%s,\"delta\":{\"content\":\"no\"}}]}",
                 bad[i]);
        CHECK_INT(add_text(a, buf), LLMRETRY_OK);
        snprintf(buf, sizeof buf, "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":"
                 "[{\"index\":%s,\"id\":\"bad\"}]}}]}", bad[i]);
        CHECK_INT(add_text(a, buf), LLMRETRY_OK);
    }
    cJSON *r = lr_asm_result(a);
    const cJSON *choices = cJSON_GetObjectItem(r, "choices");
    CHECK_INT(cJSON_GetArraySize(choices), 1);       /* only the index-0 tool chunks */
    CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(choices, 0), "message"),
                              "tool_calls") == NULL);
    cJSON_Delete(r);
    CHECK_INT(add_text(a, "{\"choices\":[{\"index\":127,\"delta\":{\"tool_calls\":"
                          "[{\"index\":127,\"id\":\"last\"}]}}]}"), LLMRETRY_OK);
    r = lr_asm_result(a);
    choices = cJSON_GetObjectItem(r, "choices");
    CHECK_INT(cJSON_GetArraySize(choices), 2);
    const cJSON *c127 = cJSON_GetArrayItem(choices, 1);
    CHECK_INT(cJSON_GetObjectItem(c127, "index")->valuedouble, 127);
    CHECK_INT(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(c127, "message"),
                                                     "tool_calls")), 1);
    cJSON_Delete(r);
    lr_asm_free(a);

    /* Unindexed calls with ever new ids stop at the cap too. */
    a = lr_asm_new();
    for (int i = 0; i < LR_ASM_MAX_TOOL_CALLS + 50; i++) {
        snprintf(buf, sizeof buf, C("{\"tool_calls\":[{\"id\":\"id%d\"}]}"), i);
        CHECK_MSG(add_text(a, buf) == LLMRETRY_OK, "unindexed call %d", i);
    }
    r = lr_asm_result(a);
    const cJSON *calls = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(
        cJSON_GetObjectItem(r, "choices"), 0), "message"), "tool_calls");
    CHECK_INT(cJSON_GetArraySize(calls), LR_ASM_MAX_TOOL_CALLS);
    cJSON_Delete(r);
    lr_asm_free(a);
}

/* An assembler lives as long as its stream is open (1,000 open streams
 * hold 1,000 of them): the slots for choices and tool calls grow as their
 * indexes come instead of being allocated for LR_ASM_MAX_CHOICES up front
 * (1 KiB each). Indexes out of order and with gaps still come out sorted. */
static void test_footprint(void)
{
    lr_asm *a = lr_asm_new();
    size_t size = malloc_usable_size(a);
    CHECK_MSG(size < 256, "an empty assembler takes %zu bytes", size);
    lr_asm_free(a);

    a = lr_asm_new();
    const char *chunks[] = {
        "{\"choices\":[{\"index\":5,\"delta\":{\"content\":\"five\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"zero\"}}]}",
        "{\"choices\":[{\"index\":2,\"delta\":{\"tool_calls\":[{\"index\":3,"
        "\"id\":\"c3\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
        "{\"index\":1,\"id\":\"c1\"}]}}]}",
        NULL};
    feed(a, chunks);
    expect(a, "{\"id\":null,\"object\":\"chat.completion\",\"created\":null,\"model\":null,"
              "\"choices\":["
              "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"zero\"},"
              "\"finish_reason\":null},"
              "{\"index\":2,\"message\":{\"role\":\"assistant\",\"content\":null,"
              "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
              "{\"name\":null,\"arguments\":\"\"}},"
              "{\"id\":\"c3\",\"type\":\"function\",\"function\":"
              "{\"name\":\"f\",\"arguments\":\"{}\"}}]},\"finish_reason\":null},"
              "{\"index\":5,\"message\":{\"role\":\"assistant\",\"content\":\"five\"},"
              "\"finish_reason\":null}]}",
           "choices and tool calls out of order, with gaps");
    lr_asm_free(a);
}

/* 100k one-character deltas into three fields: amortised growth keeps this
 * linear (a copy per chunk would move ~15 GB). No timing is asserted. */
static void test_many_tiny_chunks(void)
{
    enum { N = 100000 };
    lr_asm *a = lr_asm_new();
    char *want = malloc(N + 1);
    cJSON *chunk = cJSON_Parse("{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\","
                               "\"reasoning_content\":\"\",\"tool_calls\":[{\"index\":0,"
                               "\"function\":{\"arguments\":\"\"}}]}}]}");
    cJSON *delta = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(chunk, "choices"),
                                                          0), "delta");
    cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(delta, "tool_calls"),
                                                       0), "function");
    int failed = 0;
    for (int i = 0; i < N; i++) {
        char s[2] = {(char)('a' + i % 26), 0};
        want[i] = s[0];
        cJSON_ReplaceItemInObject(delta, "content", cJSON_CreateString(s));
        cJSON_ReplaceItemInObject(delta, "reasoning_content", cJSON_CreateString(s));
        cJSON_ReplaceItemInObject(fn, "arguments", cJSON_CreateString(s));
        failed |= lr_asm_add(a, chunk) != LLMRETRY_OK;
    }
    want[N] = '\0';
    CHECK(!failed);
    CHECK_INT(lr_asm_stats_of(a)->chunks, N);
    cJSON *r = lr_asm_result(a);
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0),
                                         "message");
    const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(m, "content"));
    const char *reasoning = cJSON_GetStringValue(cJSON_GetObjectItem(m, "reasoning_content"));
    const char *args = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(m, "tool_calls"), 0), "function"), "arguments"));
    CHECK(content && strlen(content) == N && strcmp(content, want) == 0);
    CHECK(reasoning && strcmp(reasoning, want) == 0);
    CHECK(args && strcmp(args, want) == 0);
    size_t len = 0;
    char *text = lr_asm_result_text(a, &len);
    CHECK(text && len > 3 * (size_t)N && strstr(text, want) != NULL);
    free(text);
    cJSON_Delete(r);
    cJSON_Delete(chunk);
    free(want);
    lr_asm_free(a);
}

/* The tree is the caller's (it outlives the assembler), the assembler is
 * not changed by making it, and chunks may follow a result. */
static void test_result_ownership(void)
{
    lr_asm *a = lr_asm_new();
    feed(a, (const char *const[]){C("{\"content\":\"one\"}"), NULL});
    cJSON *first = lr_asm_result(a);
    char *t1 = lr_asm_result_text(a, NULL);
    feed(a, (const char *const[]){C("{\"content\":\" two\"}"), NULL});
    char *t2 = lr_asm_result_text(a, NULL);
    lr_asm_free(a);
    cJSON *want1 = cJSON_Parse("{" TOP ",\"choices\":[{\"index\":0,\"message\":{\"role\":"
                               "\"assistant\",\"content\":\"one\"},\"finish_reason\":null}]}");
    CHECK(cJSON_Compare(first, want1, 1));
    cJSON *p1 = cJSON_Parse(t1);
    CHECK(cJSON_Compare(p1, want1, 1));
    CHECK(t2 && strstr(t2, "\"content\":\"one two\"") != NULL);
    cJSON_Delete(p1);
    cJSON_Delete(want1);
    cJSON_Delete(first);
    free(t1);
    free(t2);
}

int main(void)
{
    test_vectors();
    test_empty_and_defaults();
    test_content_null_or_empty();
    test_role();
    test_text_fields();
    test_finish_reason();
    test_top_level_first_seen();
    test_usage();
    test_not_objects();
    test_tool_calls();
    test_logprobs();
    test_caps();
    test_footprint();
    test_many_tiny_chunks();
    test_result_ownership();
    return th_summary("test_assembly");
}
