/* The option table (option_table.c): every option found by name, the
 * defaults it drives, the typed setters the shims use and their messages,
 * and the policy keys it marks. */
#include "harness.h"
#include "llmretry.h"

#include <stdlib.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int64_t field_int(const llmretry_options *o, const llmretry_option_info *opt)
{
    const char *p = (const char *)o + opt->offset;
    if (opt->size == sizeof(int64_t)) {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    int v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void test_lookup(void)
{
    size_t n = llmretry_option_count();
    CHECK(n >= 20);
    CHECK(llmretry_option_at(n) == NULL);
    CHECK(llmretry_option_find("timeout") == NULL);
    CHECK(llmretry_option_find(NULL) == NULL);
    for (size_t i = 0; i < n; i++) {
        const llmretry_option_info *opt = llmretry_option_at(i);
        CHECK(opt && opt->name && opt->builtin);
        CHECK_MSG(opt->doc && *opt->doc, "%s says not what it does", opt->name);
        CHECK(llmretry_option_find(opt->name) == opt);
        CHECK(opt->offset + opt->size <= sizeof(llmretry_options));
        if (opt->type == LLMRETRY_OPTTYPE_INT)
            CHECK_MSG(opt->range && opt->min <= opt->max, "%s has no range", opt->name);
        if (opt->type == LLMRETRY_OPTTYPE_ENUM)
            CHECK_MSG(opt->choices && opt->choices[0], "%s has no choices", opt->name);
    }
    /* The host-only fields are not options a caller names. */
    CHECK(llmretry_option_find("body") == NULL);
    CHECK(llmretry_option_find("group") == NULL);
    CHECK(llmretry_option_find("validate") == NULL);
}

/* The defaults are the table's built-in values, option by option. */
static void test_defaults_are_the_builtins(void)
{
    llmretry_options o;
    memset(&o, 0x5a, sizeof o);
    llmretry_options_defaults(&o);
    const llmretry_option_info *opt;
    for (size_t i = 0; (opt = llmretry_option_at(i)); i++) {
        const char *b = opt->builtin;
        switch (opt->type) {
        case LLMRETRY_OPTTYPE_INT:
            if (strcmp(b, "null") == 0)
                CHECK_INT(field_int(&o, opt), LLMRETRY_NO_DEADLINE);
            else
                CHECK_MSG(field_int(&o, opt) == strtoll(b, NULL, 10), "%s: %lld, builtin %s",
                          opt->name, (long long)field_int(&o, opt), b);
            break;
        case LLMRETRY_OPTTYPE_BOOL:
            CHECK_INT(field_int(&o, opt), strcmp(b, "true") == 0);
            break;
        case LLMRETRY_OPTTYPE_ENUM: {
            char want[64];
            snprintf(want, sizeof want, "\"%s\"", opt->choices[field_int(&o, opt)]);
            CHECK_STR(want, b);
            break;
        }
        case LLMRETRY_OPTTYPE_TEXT:
        case LLMRETRY_OPTTYPE_TARGETS:
        case LLMRETRY_OPTTYPE_SCHEMA: {
            const char *v;
            memcpy(&v, (const char *)&o + opt->offset, sizeof v);
            CHECK_MSG(v == NULL && strcmp(b, "null") == 0, "%s", opt->name);
            break;
        }
        case LLMRETRY_OPTTYPE_NUMBER: {
            double v;
            memcpy(&v, (const char *)&o + opt->offset, sizeof v);
            CHECK_MSG(v == strtod(b, NULL), "%s: %g, builtin %s", opt->name, v, b);
            break;
        }
        case LLMRETRY_OPTTYPE_STATUSES:
            CHECK_INT(o.n_retry_statuses, 0);
            break;
        case LLMRETRY_OPTTYPE_HEADERS:
            CHECK(o.headers == NULL && o.n_headers == 0);
            break;
        }
    }
}

static void expect_err(llmretry_status st, const char *err, const char *want)
{
    CHECK_MSG(st == LLMRETRY_EINVAL && strcmp(err, want) == 0, "got %s \"%s\", want \"%s\"",
              llmretry_status_name(st), err, want);
}

static void test_setters(void)
{
    llmretry_options o, before;
    char err[LLMRETRY_ERRBUF];
    llmretry_options_defaults(&o);

    CHECK_INT(llmretry_options_set_int(&o, "timeout_ms", 1234, err, sizeof err), LLMRETRY_OK);
    CHECK_INT(o.timeout_ms, 1234);
    CHECK_INT(llmretry_options_set_int(&o, "max_retries", 7, err, sizeof err), LLMRETRY_OK);
    CHECK_INT(o.max_retries, 7);
    CHECK_INT(llmretry_options_set_int(&o, "event_mask", 5, err, sizeof err), LLMRETRY_OK);
    CHECK_INT(o.events, 5);
    CHECK_INT(llmretry_options_set_int(&o, "deadline_ms", 0, err, sizeof err), LLMRETRY_OK);
    CHECK_INT(o.deadline_ms, 0);
    CHECK_INT(llmretry_options_set_bool(&o, "retry_invalid_response", 0, err, sizeof err),
              LLMRETRY_OK);
    CHECK_INT(o.retry_invalid_response, 0);
    CHECK_INT(llmretry_options_set_text(&o, "jitter", "full", err, sizeof err), LLMRETRY_OK);
    CHECK_INT(o.jitter, LLMRETRY_JITTER_FULL);
    CHECK_INT(llmretry_options_set_text(&o, "retry_mode", "unsafe", err, sizeof err),
              LLMRETRY_OK);
    CHECK_INT(o.retry_mode, LLMRETRY_RETRY_UNSAFE);
    const char *url = "http://127.0.0.1:1/v1/chat/completions";
    CHECK_INT(llmretry_options_set_text(&o, "url", url, err, sizeof err), LLMRETRY_OK);
    CHECK(o.url == url);                    /* borrowed, as documented */

    /* Refused values leave the options as they were. */
    memcpy(&before, &o, sizeof o);
    expect_err(llmretry_options_set_int(&o, "timeout_ms", 0, err, sizeof err), err,
               "timeout_ms must be > 0 (got 0)");
    expect_err(llmretry_options_set_int(&o, "max_retries", 101, err, sizeof err), err,
               "max_retries must be 0..100 (got 101)");
    expect_err(llmretry_options_set_int(&o, "deadline_ms", -1, err, sizeof err), err,
               "deadline_ms must be >= 0 (got -1)");
    expect_err(llmretry_options_set_int(&o, "event_mask", 256, err, sizeof err), err,
               "event_mask must be 0..255 (got 256)");
    expect_err(llmretry_options_set_int(&o, "url", 3, err, sizeof err), err,
               "url must be a string");
    expect_err(llmretry_options_set_text(&o, "timeout_ms", "5", err, sizeof err), err,
               "timeout_ms must be an integer");
    expect_err(llmretry_options_set_bool(&o, "jitter", 1, err, sizeof err), err,
               "jitter must be a string");
    expect_err(llmretry_options_set_int(&o, "timeout", 5, err, sizeof err), err,
               "unknown option 'timeout' (did you mean timeout_ms?)");
    /* A wrong enum value is never repeated: it could be a pasted secret. */
    expect_err(llmretry_options_set_text(&o, "jitter", "sk-SECRET", err, sizeof err), err,
               "jitter must be one of \"additive\", \"full\", \"none\" (got another string)");
    expect_err(llmretry_options_unset(&o, "timeout_ms", err, sizeof err), err,
               "timeout_ms must be an integer (got null)");
    CHECK(memcmp(&o, &before, sizeof o) == 0);

    /* Unset: back to "not given". */
    CHECK_INT(llmretry_options_unset(&o, "deadline_ms", err, sizeof err), LLMRETRY_OK);
    CHECK_INT(o.deadline_ms, LLMRETRY_NO_DEADLINE);
    CHECK_INT(llmretry_options_set_text(&o, "url", NULL, err, sizeof err), LLMRETRY_OK);
    CHECK(o.url == NULL);
    o.retry_statuses[0] = 503;
    o.n_retry_statuses = 1;
    CHECK_INT(llmretry_options_unset(&o, "retry_statuses", err, sizeof err), LLMRETRY_OK);
    CHECK_INT(o.n_retry_statuses, 0);

    /* What the setters build passes the whole check. */
    o.body = "{}";
    o.body_len = 2;
    CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_OK);
}

/* schema: JSON text of a schema, compiled when set, its mistakes named. */
static void test_schema_option(void)
{
    llmretry_options o;
    char err[LLMRETRY_ERRBUF];
    llmretry_options_defaults(&o);
    const char *s = "{\"type\":\"object\"}";
    CHECK_INT(llmretry_options_set_json(&o, "schema", s, err, sizeof err), LLMRETRY_OK);
    CHECK(o.schema == s);
    expect_err(llmretry_options_set_json(&o, "schema", "{\"oneOf\":[]}", err, sizeof err), err,
               "schema: unsupported keyword 'oneOf' at $ (supported: type, properties, required, "
               "additionalProperties, items, enum, const, anyOf, $ref, $defs, minimum, maximum, "
               "exclusiveMinimum, exclusiveMaximum, multipleOf, minItems, maxItems, minLength, "
               "maxLength, pattern)");
    CHECK(o.schema == s);
    expect_err(llmretry_options_set_json(&o, "schema", "{", err, sizeof err), err,
               "schema: schema is not valid JSON");
    expect_err(llmretry_options_set_text(&o, "schema", s, err, sizeof err), err,
               "schema must be a JSON Schema");
    CHECK_INT(llmretry_options_set_json(&o, "schema", NULL, err, sizeof err), LLMRETRY_OK);
    CHECK(o.schema == NULL);
    /* endpoint: an enum of the API paths, chat/completions by default. */
    CHECK_INT(o.endpoint, LLMRETRY_API_CHAT_COMPLETIONS);
    CHECK_INT(llmretry_options_set_text(&o, "endpoint", "embeddings", err, sizeof err), LLMRETRY_OK);
    CHECK_INT(o.endpoint, LLMRETRY_API_EMBEDDINGS);
    expect_err(llmretry_options_set_text(&o, "endpoint", "/v1/embeddings", err, sizeof err), err,
               "endpoint must be one of \"chat/completions\", \"completions\", \"embeddings\", "
               "\"responses\" (got another string)");
}

/* The policy keys are the table's POLICY options, in the table's order. */
static void test_policy_keys(void)
{
    static const char *const want[] = {
        "url", "base_url", "endpoint", "model", "timeout_ms", "max_retries", "base_delay_ms",
        "max_delay_ms",
        "jitter", "deadline_ms", "retry_mode", "retry_statuses", "max_retry_after_ms",
        "retry_invalid_response", "max_response_bytes", "idempotency_key", "rpm", "tpm",
        "retry_budget_ratio", "retry_budget_min", "breaker_failures", "breaker_cooldown_ms",
        "fallbacks",
    };
    for (size_t i = 0; i < N_OF(want); i++)
        CHECK_STR(llmretry_policy_key(i), want[i]);
    CHECK(llmretry_policy_key(N_OF(want)) == NULL);
    for (size_t i = 0; i < N_OF(want); i++)
        CHECK(llmretry_option_find(want[i])->flags & LLMRETRY_OPTFLAG_POLICY);
}

/* "Did you mean ...?": the name a typo, a unit left off or another
 * spelling most likely meant; none when it is not clear. */
static void test_suggest(void)
{
    static const char *const cases[][2] = {
        { "timeout", "timeout_ms" },          /* the unit left off */
        { "deadline", "deadline_ms" },
        { "maxRetries", "max_retries" },      /* another library's spelling */
        { "api-key", "api_key" },
        { "BASE_URL", "base_url" },
        { "retries", "max_retries" },
        { "max_retry", "max_retries" },       /* not max_retry_after_ms */
        { "cooldown", "breaker_cooldown_ms" },/* whole words of one name */
        { "max_retires", "max_retries" },     /* a transposition */
        { "retry_status", "retry_statuses" },
        { "breaker_cooldown", "breaker_cooldown_ms" },
        { "delay", NULL },                    /* base_delay_ms or max_delay_ms */
        { "key", NULL },                      /* api_key or idempotency_key */
        { "xyzzy", NULL },
        { "", NULL },
        { "timeout_ms", NULL },               /* known: nothing to suggest */
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        const char *got = llmretry_option_suggest(cases[i][0], NULL, 0);
        CHECK_MSG(cases[i][1] ? got && strcmp(got, cases[i][1]) == 0 : got == NULL,
                  "suggest(%s) = %s, want %s", cases[i][0], got ? got : "NULL",
                  cases[i][1] ? cases[i][1] : "NULL");
    }
    CHECK(llmretry_option_suggest(NULL, NULL, 0) == NULL);
    char long_name[200];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    CHECK(llmretry_option_suggest(long_name, NULL, 0) == NULL);
    /* A host's own names (Python's keywords). */
    static const char *const host[] = { "logger", "validate", "response_model", "timeout_ms" };
    CHECK_STR(llmretry_option_suggest("loger", host, N_OF(host)), "logger");
    CHECK_STR(llmretry_option_suggest("responseModel", host, N_OF(host)), "response_model");
    CHECK_STR(llmretry_option_suggest("timeout", host, N_OF(host)), "timeout_ms");
    CHECK(llmretry_option_suggest("max_retries", host, N_OF(host)) == NULL);
    /* The setters' message says it. */
    llmretry_options o;
    char err[LLMRETRY_ERRBUF];
    llmretry_options_defaults(&o);
    CHECK_INT(llmretry_options_set_int(&o, "timeout", 5, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, "unknown option 'timeout' (did you mean timeout_ms?)");
    CHECK_INT(llmretry_options_set_int(&o, "xyzzy", 5, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, "unknown option 'xyzzy'");
}

int main(void)
{
    test_lookup();
    test_suggest();
    test_defaults_are_the_builtins();
    test_setters();
    test_policy_keys();
    test_schema_option();
    return th_summary("option_table");
}
