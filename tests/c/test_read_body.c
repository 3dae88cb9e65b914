/* lr_read_body (response.c): a 2xx body judged and its usage, model and
 * fingerprint read in place, with no cJSON tree (issue 36: the tree was
 * built on the I/O thread only to be freed). Checked against the tree path
 * it replaced — lr_parse_body + lr_read_success — plus the strict grammar
 * every host's decoder has (json_pull.h): on thousands of bodies made by
 * changing one byte of, or cutting, answers that exercise each rule (first
 * of duplicate keys, escaped keys, \u0000 in a value, the Responses API's
 * usage, a usage without total, a byte-order mark, nesting).
 *
 * Every body is handed over in a buffer of exactly its length, so ASan
 * sees any read past the end. */
#include "harness.h"
#include "internal.h"
#include "json_pull.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

typedef struct {
    int rc;
    const char *why;
    llmretry_usage usage;
    char *model, *fingerprint;
    char tops[4];                  /* the kind of "error", "choices", "data" */
    int failed;                    /* "status" is "failed" */
    int error_choice;              /* a choice has finish_reason "error" */
} reading;

static const char *const TOPS[] = { "error", "choices", "data" };

/* A value's kind as its first byte says it: '{', '[', '"', 't', 'f',
 * 'n', '0' (a number); '-' when absent. */
static char kind_at(const char *v)
{
    return !v ? '-' : (*v == '-' || (*v >= '0' && *v <= '9')) ? '0' : *v;
}

static char kind_of(const cJSON *v)
{
    return !v ? '-' : cJSON_IsObject(v) ? '{' : cJSON_IsArray(v) ? '['
         : cJSON_IsString(v) ? '"' : cJSON_IsTrue(v) ? 't' : cJSON_IsFalse(v) ? 'f'
         : cJSON_IsNull(v) ? 'n' : '0';
}

static void reading_clear(reading *r)
{
    free(r->model);
    free(r->fingerprint);
}

/* The tree path, as outcome.c read a 2xx body before, and then the strict
 * grammar (cJSON takes "01", "1." and such; no host's decoder does). */
static void by_tree(const char *text, size_t n, reading *r)
{
    memset(r, 0, sizeof *r);
    cJSON *doc = lr_parse_body(text, n, &r->why);
    if (doc && !r->why) {
        lr_jp j;
        lr_jp_init(&j, text, n);
        if (n >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
            j.p += 3;
        int strict = lr_jp_skip(&j) == 0;
        lr_jp_ws(&j);
        if (strict && j.p == j.end) {
            lr_read_success(doc, &r->usage, &r->model, &r->fingerprint);
            for (int i = 0; i < 3; i++)
                r->tops[i] = kind_of(cJSON_GetObjectItemCaseSensitive(doc, TOPS[i]));
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(doc, "status");
            r->failed = cJSON_IsString(st) && strcmp(st->valuestring, "failed") == 0;
            const cJSON *ch, *choices = cJSON_GetObjectItemCaseSensitive(doc, "choices");
            if (cJSON_IsArray(choices))
                cJSON_ArrayForEach(ch, choices) {
                    const cJSON *fr = cJSON_IsObject(ch)
                        ? cJSON_GetObjectItemCaseSensitive(ch, "finish_reason") : NULL;
                    if (cJSON_IsString(fr) && strcmp(fr->valuestring, "error") == 0)
                        r->error_choice = 1;
                }
        } else {
            r->why = "is not JSON";
        }
    }
    r->rc = r->why ? -1 : 0;
    cJSON_Delete(doc);
}

static void in_place(const char *text, size_t n, reading *r)
{
    memset(r, 0, sizeof *r);
    lr_body_tops t;
    r->rc = lr_read_body(text, n, &r->why, &r->usage, &r->model, &r->fingerprint, &t);
    if (r->rc == 0) {
        const char *at[3] = { t.error, t.choices, t.data };
        for (int i = 0; i < 3; i++)
            r->tops[i] = kind_at(at[i]);
        r->failed = t.failed;
        r->error_choice = t.error_choice;
    }
}

static int same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static long compared;

/* One body, both ways: the same verdict, the same reason, the same fields. */
static void compare(const char *body, size_t n, const char *what)
{
    char *copy = malloc(n ? n : 1);
    if (!copy)
        abort();
    memcpy(copy, body, n);
    reading a, b;
    by_tree(copy, n, &a);
    in_place(copy, n, &b);
    int same = a.rc == b.rc && same_str(a.why, b.why) &&
               a.usage.present == b.usage.present &&
               a.usage.prompt_tokens == b.usage.prompt_tokens &&
               a.usage.completion_tokens == b.usage.completion_tokens &&
               a.usage.total_tokens == b.usage.total_tokens &&
               same_str(a.model, b.model) && same_str(a.fingerprint, b.fingerprint) &&
               strcmp(a.tops, b.tops) == 0 && a.error_choice == b.error_choice &&
               a.failed == b.failed;
    CHECK_MSG(same, "%s: tree rc=%d why=%s model=%s tops=%s%s usage=%lld/%lld/%lld; in place "
              "rc=%d why=%s model=%s tops=%s%s usage=%lld/%lld/%lld; body %.*s", what, a.rc,
              a.why ? a.why : "-", a.model ? a.model : "-", a.tops, a.error_choice ? "+e" : a.failed ? "+f" : "",
              (long long)a.usage.prompt_tokens,
              (long long)a.usage.completion_tokens, (long long)a.usage.total_tokens, b.rc,
              b.why ? b.why : "-", b.model ? b.model : "-", b.tops, b.error_choice ? "+e" : b.failed ? "+f" : "",
              (long long)b.usage.prompt_tokens,
              (long long)b.usage.completion_tokens, (long long)b.usage.total_tokens, (int)n, body);
    compared++;
    reading_clear(&a);
    reading_clear(&b);
    free(copy);
}

static const char *const BASES[] = {
    "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"gpt-4.1-mini\","
    "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"ok\"},"
    "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1,"
    "\"total_tokens\":13},\"system_fingerprint\":\"fp_1\"}",
    /* duplicates (the first counts), escaped keys, \u0000 cuts a value */
    " {\"mod\\u0065l\":\"m\\u0000x\",\"model\":\"second\",\"usage\":{\"total_tokens\":5,"
    "\"total_tokens\":6,\"prompt_tokens\":2.0,\"completion_tokens\":1e0},"
    "\"usage\":null,\"system_fingerprint\":\"f\\\"p\\n\\u00e9\\ud83d\\ude00\"}\r\n",
    /* the Responses API's usage, no total; UTF-8 in a string; deep nesting */
    "{\"output\":[{\"content\":[{\"text\":\"h\xc3\xa9llo \xe2\x82\xac\"}]}],\"usage\":"
    "{\"input_tokens\":9,\"output_tokens\":4},\"model\":5,\"x\":[[[[{\"a\":[true,false,null]}]]]]}",
    /* odd counts: negative, fractional, huge, strings */
    "{\"usage\":{\"prompt_tokens\":-1,\"completion_tokens\":0.5,\"total_tokens\":1e300,"
    "\"input_tokens\":\"3\"},\"system_fingerprint\":[],\"model\":\"\"}",
    /* what answer_error.c reads: an error, a status, data, choices empty;
     * duplicates and an escaped key */
    "{\"error\":{\"code\":502,\"message\":\"x\"},\"choices\":[],\"data\":null,"
    "\"st\\u0061tus\":\"f\\u0061iled\",\"status\":1,\"error\":\"second\"}",
    /* choices: finish_reason "error" escaped, cut by U+0000, in the second
     * of them, beside what is not a choice */
    "{\"choices\":[1,{\"finish_reason\":\"stop\"},[{\"finish_reason\":\"error\"}],"
    "{\"finish_reason\":\"\\u0065rror\",\"finish_reason\":\"x\"},"
    "{\"finish_reason\":\"error\\u0000!\"}]}",
    /* a byte-order mark, an empty object, not an object */
    "\xEF\xBB\xBF{\"model\":\"bom\"}",
    "{}",
    "[{\"model\":\"in a list\"}]",
};

int main(void)
{
    static const char repl[] = "\"\\{}[],: x0.e-1u\x01\x7f\xc3\xff";
    for (size_t b = 0; b < sizeof BASES / sizeof *BASES; b++) {
        const char *base = BASES[b];
        size_t n = strlen(base);
        compare(base, n, "as written");
        char *m = malloc(n + 1);
        if (!m)
            abort();
        for (size_t cut = 0; cut < n; cut++)
            compare(base, cut, "cut");
        for (size_t i = 0; i < n; i++)
            for (size_t r = 0; r < sizeof repl - 1; r++) {
                memcpy(m, base, n);
                m[i] = repl[r];
                compare(m, n, "one byte changed");
            }
        free(m);
    }
    /* The rule the tree path lacked: cJSON took these numbers, no host's
     * decoder does, so they are not a success (the body is retried). */
    static const char *const lenient[] = {
        "{\"created\":01}", "{\"created\":1.}", "{\"created\":1.e5}", "{\"a\":[-01]}",
    };
    for (size_t i = 0; i < sizeof lenient / sizeof *lenient; i++) {
        reading r;
        in_place(lenient[i], strlen(lenient[i]), &r);
        CHECK_MSG(r.rc == -1 && r.why && strcmp(r.why, "is not JSON") == 0, "%s taken", lenient[i]);
        reading_clear(&r);
    }
    /* Many choices side by side are no nesting: each one's depth is left
     * when it ends (an answer with n=300 is read, its last choice too). */
    {
        char *many = malloc(300 * 40 + 64);
        if (!many)
            abort();
        size_t len = (size_t)sprintf(many, "{\"choices\":[");
        for (int i = 0; i < 300; i++)
            len += (size_t)sprintf(many + len, "%s{\"index\":%d,\"finish_reason\":\"%s\"}",
                                   i ? "," : "", i, i == 299 ? "error" : "stop");
        len += (size_t)sprintf(many + len, "]}");
        compare(many, len, "300 choices");
        reading r;
        in_place(many, len, &r);
        CHECK_MSG(r.rc == 0 && r.error_choice, "300 choices: rc %d, error_choice %d", r.rc,
                  r.error_choice);
        reading_clear(&r);
        free(many);
    }
    /* nesting: at the limit, past it, past json_pull's own (1000) */
    static const int depths[] = { LLMRETRY_MAX_BODY_DEPTH, LLMRETRY_MAX_BODY_DEPTH + 1, 1001 };
    for (size_t d = 0; d < sizeof depths / sizeof *depths; d++) {
        int k = depths[d] - 1;      /* inside the top object */
        char *deep = malloc((size_t)k * 6 + 32);
        if (!deep)
            abort();
        size_t len = (size_t)sprintf(deep, "{\"model\":\"d\",\"x\":");
        for (int i = 0; i < k; i++)
            len += (size_t)sprintf(deep + len, "%s", i % 2 ? "{\"a\":" : "[");
        deep[len++] = '1';
        for (int i = k - 1; i >= 0; i--)
            deep[len++] = i % 2 ? '}' : ']';
        deep[len++] = '}';
        compare(deep, len, "deep");
        free(deep);
    }
    CHECK(compared > 10000);
    return th_summary("test_read_body");
}
