/* Named policies in the core (core/src/policies.c): the shared cases of
 * tests/policies/errors.json word for word, tests/policies/bad.json,
 * examples/policies.json resolving to tests/policies/resolved.json, and the
 * precedence explicit > policy > client defaults > built-in. */
#include "harness.h"
#include "llmretry.h"

#include <cJSON.h>
#include <stdlib.h>

static cJSON *read_json(const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", LLMRETRY_SOURCE_DIR, rel);
    size_t len;
    char *text = th_read_file(path, &len);
    cJSON *doc = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    CHECK_MSG(doc != NULL, "could not read %s", rel);
    return doc;
}

static llmretry_status parse_value(const cJSON *v, const char *source, llmretry_policies **p,
                                   char *err, size_t errlen)
{
    char *text = cJSON_PrintUnformatted(v);
    llmretry_status st = llmretry_policies_parse(text, strlen(text), source, p, err, errlen);
    free(text);
    return st;
}

static void test_shared_errors(void)
{
    cJSON *doc = read_json("tests/policies/errors.json");
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "cases")) {
        char err[LLMRETRY_ERRBUF] = "", want[LLMRETRY_ERRBUF + 32];
        llmretry_policies *p = NULL;
        const char *msg = cJSON_GetObjectItem(c, "error")->valuestring;
        CHECK_INT(parse_value(cJSON_GetObjectItem(c, "text"), NULL, &p, err, sizeof err),
                  LLMRETRY_EINVAL);
        CHECK_STR(err, msg);
        CHECK(p == NULL);
        CHECK_MSG(!strstr(err, "SECRET"), "a refused value is repeated: %s", err);
        /* From a file, the message starts with its name. */
        CHECK_INT(parse_value(cJSON_GetObjectItem(c, "text"), "p.json", &p, err, sizeof err),
                  LLMRETRY_EINVAL);
        snprintf(want, sizeof want, "p.json: %s", msg);
        CHECK_STR(err, want);
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "accepted")) {
        char err[LLMRETRY_ERRBUF] = "";
        llmretry_policies *p = NULL;
        CHECK_MSG(parse_value(cJSON_GetObjectItem(c, "text"), NULL, &p, err, sizeof err) ==
                  LLMRETRY_OK, "refused (%s): %s", cJSON_GetObjectItem(c, "why")->valuestring, err);
        llmretry_policies_free(p);
    }
    cJSON_Delete(doc);
}

static void test_bad_cases(void)
{
    cJSON *doc = read_json("tests/policies/bad.json");
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(doc, "cases")) {
        char err[LLMRETRY_ERRBUF] = "";
        llmretry_policies *p = NULL;
        CHECK_INT(parse_value(cJSON_GetObjectItem(c, "text"), "bad.json", &p, err, sizeof err),
                  LLMRETRY_EINVAL);
        const cJSON *w;
        cJSON_ArrayForEach(w, cJSON_GetObjectItem(c, "must_contain"))
            CHECK_MSG(strstr(err, w->valuestring), "'%s' lacks '%s'", err, w->valuestring);
    }
    cJSON_Delete(doc);
}

static void test_text_errors(void)
{
    char err[LLMRETRY_ERRBUF];
    llmretry_policies *p = NULL;
    const char *broken = "{\n  \"fast\": {\"timeout_ms\": 5000,}\n}";
    CHECK_INT(llmretry_policies_parse(broken, strlen(broken), "p.json", &p, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK_MSG(strncmp(err, "p.json: not valid JSON (line 2", 30) == 0, "%s", err);
    const char *twice = "{\"a\": {\"timeout_ms\": 1}, \"a\": {}}";
    CHECK_INT(llmretry_policies_parse(twice, strlen(twice), NULL, &p, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK_STR(err, "policy 'a' is defined twice");
    const char *key_twice = "{\"a\": {\"timeout_ms\": 1, \"timeout_ms\": 2}}";
    CHECK_INT(llmretry_policies_parse(key_twice, strlen(key_twice), NULL, &p, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK_STR(err, "policy 'a': timeout_ms is set twice");
    const char *trailing = "{} {}";
    CHECK_INT(llmretry_policies_parse(trailing, strlen(trailing), NULL, &p, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK_MSG(strstr(err, "not valid JSON") != NULL, "%s", err);
}

/* examples/policies.json resolves to tests/policies/resolved.json. */
static void test_resolved(void)
{
    char path[512], err[LLMRETRY_ERRBUF] = "";
    size_t len;
    snprintf(path, sizeof path, "%s/examples/policies.json", LLMRETRY_SOURCE_DIR);
    char *text = th_read_file(path, &len);
    llmretry_policies *p = NULL;
    CHECK_MSG(text && llmretry_policies_parse(text, len, "policies.json", &p, err, sizeof err) ==
              LLMRETRY_OK, "examples/policies.json: %s", err);
    free(text);
    cJSON *want = read_json("tests/policies/resolved.json");
    const cJSON *w;
    size_t n = 0;
    cJSON_ArrayForEach(w, cJSON_GetObjectItem(want, "resolved")) {
        char *got = NULL;
        CHECK_INT(llmretry_policies_resolve(p, w->string, NULL, 0, NULL, 0, &got, err, sizeof err),
                  LLMRETRY_OK);
        cJSON *g = got ? cJSON_Parse(got) : NULL;
        CHECK_MSG(g && cJSON_Compare(g, w, 1), "policy %s resolved to %s", w->string,
                  got ? got : err);
        /* The same keys in the same order. */
        const cJSON *a = g ? g->child : NULL, *b = w->child;
        while (a && b && strcmp(a->string, b->string) == 0) {
            a = a->next;
            b = b->next;
        }
        CHECK_MSG(!a && !b, "policy %s: keys out of order", w->string);
        cJSON_Delete(g);
        llmretry_free(got);
        n++;
    }
    CHECK_INT(n, llmretry_policies_count(p));
    CHECK_STR(llmretry_policies_name(p, 0), "autocomplete");
    CHECK(llmretry_policies_name(p, n) == NULL);
    char *own = llmretry_policies_get_json(p, "support_summary");
    CHECK_STR(own, "{\"timeout_ms\":20000,\"max_retries\":3}");
    llmretry_free(own);
    CHECK(llmretry_policies_get_json(p, "nope") == NULL);
    cJSON_Delete(want);
    llmretry_policies_free(p);
}

static void test_precedence(void)
{
    char err[LLMRETRY_ERRBUF] = "", *got = NULL;
    const char *doc = "{\"fast\": {\"timeout_ms\": 5000, \"max_retries\": 1, \"deadline_ms\": null}}";
    llmretry_policies *p = NULL;
    CHECK_INT(llmretry_policies_parse(doc, strlen(doc), NULL, &p, err, sizeof err), LLMRETRY_OK);
    const char *ex = "{\"timeout_ms\": 100, \"deadline_ms\": null, \"headers\": {\"X\": \"y\"}}";
    const char *def = "{\"timeout_ms\": 7, \"max_retries\": 9, \"base_delay_ms\": 5, "
                      "\"deadline_ms\": 1000}";
    CHECK_INT(llmretry_policies_resolve(p, "fast", ex, strlen(ex), def, strlen(def), &got, err,
                                        sizeof err), LLMRETRY_OK);
    cJSON *g = got ? cJSON_Parse(got) : NULL;
    /* explicit > policy > client defaults > built-in; the policy's null
     * unsets the client's deadline; an explicit null is "not given". */
    CHECK_INT(cJSON_GetObjectItem(g, "timeout_ms")->valuedouble, 100);
    CHECK_INT(cJSON_GetObjectItem(g, "max_retries")->valuedouble, 1);
    CHECK_INT(cJSON_GetObjectItem(g, "base_delay_ms")->valuedouble, 5);
    CHECK_INT(cJSON_GetObjectItem(g, "max_delay_ms")->valuedouble, 30000);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(g, "deadline_ms")));
    CHECK(cJSON_GetObjectItem(g, "headers") == NULL);
    cJSON_Delete(g);
    llmretry_free(got);
    /* No policy: defaults over built-ins. */
    CHECK_INT(llmretry_policies_resolve(p, NULL, NULL, 0, def, strlen(def), &got, err, sizeof err),
              LLMRETRY_OK);
    g = got ? cJSON_Parse(got) : NULL;
    CHECK_INT(cJSON_GetObjectItem(g, "deadline_ms")->valuedouble, 1000);
    cJSON_Delete(g);
    llmretry_free(got);
    CHECK_INT(llmretry_policies_resolve(p, "slow", NULL, 0, NULL, 0, &got, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK_STR(err, "unknown policy 'slow' (known: 'fast')");
    const char *bad = "{\"max_retries\": 1000}";
    CHECK_INT(llmretry_policies_resolve(p, "fast", bad, strlen(bad), NULL, 0, &got, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK_STR(err, "max_retries must be 0..100 (got 1000)");
    CHECK(got == NULL);
    llmretry_policies_free(p);
}

/* The endpoint's two keys come from one layer: the highest that names one. */
static char *endpoint_of(const llmretry_policies *p, const char *name, const char *ex,
                         const char *def)
{
    char err[LLMRETRY_ERRBUF] = "", *got = NULL, *out = NULL;
    CHECK_INT(llmretry_policies_resolve(p, name, ex, ex ? strlen(ex) : 0, def,
                                        def ? strlen(def) : 0, &got, err, sizeof err),
              LLMRETRY_OK);
    cJSON *g = got ? cJSON_Parse(got) : NULL;
    const cJSON *u = cJSON_GetObjectItem(g, "url"), *b = cJSON_GetObjectItem(g, "base_url");
    char buf[300];
    snprintf(buf, sizeof buf, "url=%s base_url=%s", cJSON_IsString(u) ? u->valuestring : "-",
             cJSON_IsString(b) ? b->valuestring : "-");
    out = strdup(buf);
    cJSON_Delete(g);
    llmretry_free(got);
    return out;
}

static void test_endpoint(void)
{
    char err[LLMRETRY_ERRBUF] = "";
    const char *doc = "{\"p\": {\"base_url\": \"http://policy/v1\"}, \"q\": {\"timeout_ms\": 5}, "
                      "\"u\": {\"url\": \"http://policy/v1/embeddings\"}}";
    llmretry_policies *p = NULL;
    CHECK_INT(llmretry_policies_parse(doc, strlen(doc), NULL, &p, err, sizeof err), LLMRETRY_OK);
    const char *def_both = "{\"url\": \"http://default/x\", \"base_url\": \"http://d/v1\"}";
    static const struct { const char *pol, *ex, *def, *want; } t[] = {
        { "p", NULL, NULL, "url=- base_url=http://policy/v1" },
        /* The policy's base_url beats a client's url. */
        { "p", NULL, "{\"url\": \"http://default/x\"}", "url=- base_url=http://policy/v1" },
        /* A call's url or base_url beats the policy's. */
        { "p", "{\"url\": \"http://call/x\"}", NULL, "url=http://call/x base_url=-" },
        { "p", "{\"base_url\": \"http://call/v1\"}", NULL, "url=- base_url=http://call/v1" },
        /* A call's base_url beats a client's url (not just the policy's). */
        { "q", "{\"base_url\": \"http://call/v1\"}", "{\"url\": \"http://default/x\"}",
          "url=- base_url=http://call/v1" },
        { NULL, "{\"base_url\": \"http://call/v1\"}", "{\"url\": \"http://default/x\"}",
          "url=- base_url=http://call/v1" },
        /* A policy without one leaves the client's; null is "not given". */
        { "q", "{\"url\": null}", "{\"url\": \"http://default/x\"}", "url=http://default/x base_url=-" },
        { NULL, NULL, NULL, "url=- base_url=-" },
        /* A policy may name a whole URL (issue 32): it beats a client's
         * base_url, and a call's base_url beats it. */
        { "u", NULL, NULL, "url=http://policy/v1/embeddings base_url=-" },
        { "u", NULL, "{\"base_url\": \"http://d/v1\"}", "url=http://policy/v1/embeddings base_url=-" },
        { "u", "{\"base_url\": \"http://call/v1\"}", NULL, "url=- base_url=http://call/v1" },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char *got = endpoint_of(p, t[i].pol, t[i].ex, t[i].def);
        CHECK_MSG(got && strcmp(got, t[i].want) == 0, "case %zu: %s, want %s", i, got, t[i].want);
        free(got);
    }
    char *got = endpoint_of(p, "q", NULL, def_both);
    CHECK_STR(got, "url=http://default/x base_url=http://d/v1");
    free(got);
    llmretry_policies_free(p);
}

static void test_check_value(void)
{
    char err[LLMRETRY_ERRBUF];
    CHECK_INT(llmretry_policy_check_value("jitter", "\"full\"", 6, err, sizeof err), LLMRETRY_OK);
    CHECK_INT(llmretry_policy_check_value("timeout_ms", "-5", 2, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, "timeout_ms must be > 0 (got -5)");
    CHECK_INT(llmretry_policy_check_value("nope", "1", 1, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_MSG(strncmp(err, "unknown key 'nope' (known: url, base_url,", 41) == 0, "%s", err);
    size_t n = 0;
    while (llmretry_policy_key(n))
        n++;
    CHECK_INT(n, 23);
    /* The endpoint is a policy key with the option's choices. */
    CHECK_INT(llmretry_policy_check_value("endpoint", "\"embeddings\"", 12, err, sizeof err),
              LLMRETRY_OK);
    CHECK_INT(llmretry_policy_check_value("endpoint", "\"embedding\"", 11, err, sizeof err),
              LLMRETRY_EINVAL);
    CHECK_STR(err, "endpoint must be one of \"chat/completions\", \"completions\", \"embeddings\", "
                   "\"responses\" (got another string)");
}

int main(void)
{
    test_shared_errors();
    test_bad_cases();
    test_text_errors();
    test_resolved();
    test_precedence();
    test_endpoint();
    test_check_value();
    return th_summary("test_policies");
}
