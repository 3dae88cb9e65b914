/* Table-driven tests of options defaults, llmretry_options_check and the
 * enum name/parse functions. */
#include "harness.h"
#include "llmretry.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static llmretry_options valid(void)
{
    llmretry_options o;
    llmretry_options_defaults(&o);
    o.body = "{}";
    o.body_len = 2;
    return o;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void test_defaults(void)
{
    llmretry_options o;
    char err[LLMRETRY_ERRBUF] = "";
    memset(&o, 0x5a, sizeof o);
    llmretry_options_defaults(&o);
    CHECK(o.url == NULL && o.base_url == NULL && o.api_key == NULL && o.body == NULL);
    CHECK(o.model == NULL && o.headers == NULL && o.request_id == NULL);
    CHECK(o.idempotency_key == NULL && o.policy == NULL && o.ca_file == NULL);
    CHECK_INT(o.body_len, 0);
    CHECK_INT(o.n_headers, 0);
    CHECK_INT(o.use_env_api_key, 1);
    CHECK_INT(o.timeout_ms, 60000);
    CHECK_INT(o.max_retries, 3);
    CHECK_INT(o.base_delay_ms, 800);
    CHECK_INT(o.max_delay_ms, 30000);
    CHECK_INT(o.jitter, LLMRETRY_JITTER_ADDITIVE);
    CHECK_INT(o.deadline_ms, LLMRETRY_NO_DEADLINE);
    CHECK_INT(o.retry_mode, LLMRETRY_RETRY_SAFE);
    CHECK_INT(o.n_retry_statuses, 0);
    CHECK_INT(o.retry_statuses[0], 0);
    CHECK_INT(o.retry_statuses[LLMRETRY_MAX_STATUSES - 1], 0);
    CHECK_INT(o.max_retry_after_ms, 120000);
    CHECK_INT(o.retry_invalid_response, 1);
    CHECK_INT(o.max_response_bytes, 32 * 1024 * 1024);
    CHECK_INT(o.validate, 0);
    CHECK_INT(o.events, LLMRETRY_EVENTS_ALL);
    llmretry_options_defaults(NULL); /* harmless */

    /* Defaults lack only the body. */
    CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_EINVAL);
    CHECK(starts_with(err, "body"));
    o = valid();
    CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_OK);
    CHECK_INT(llmretry_options_check(NULL, err, sizeof err), LLMRETRY_EINVAL);
    CHECK(starts_with(err, "options"));
}

/* Number-valued fields, set by name. */
static void set_number(llmretry_options *o, const char *field, long long v)
{
    if (!strcmp(field, "timeout_ms")) o->timeout_ms = v;
    else if (!strcmp(field, "max_retries")) o->max_retries = (int)v;
    else if (!strcmp(field, "base_delay_ms")) o->base_delay_ms = v;
    else if (!strcmp(field, "max_delay_ms")) o->max_delay_ms = v;
    else if (!strcmp(field, "deadline_ms")) o->deadline_ms = v;
    else if (!strcmp(field, "jitter")) o->jitter = (llmretry_jitter)v;
    else if (!strcmp(field, "retry_mode")) o->retry_mode = (llmretry_retry_mode)v;
    else if (!strcmp(field, "max_retry_after_ms")) o->max_retry_after_ms = v;
    else if (!strcmp(field, "max_response_bytes")) o->max_response_bytes = v;
    else if (!strcmp(field, "body_len")) o->body_len = (size_t)v;
    else if (!strcmp(field, "n_retry_statuses")) {
        for (size_t i = 0; i < LLMRETRY_MAX_STATUSES; i++)
            o->retry_statuses[i] = 503;
        o->n_retry_statuses = (size_t)v;
    } else
        th_fail(__FILE__, __LINE__, "unknown field %s", field);
}

static void test_numbers(void)
{
    /* want: NULL = OK, else the exact message (or a prefix ending in '*'). */
    static const struct { const char *field; long long v; const char *want; } t[] = {
        {"timeout_ms", 0, "timeout_ms must be > 0 (got 0)"},
        {"timeout_ms", -5, "timeout_ms must be > 0 (got -5)"},
        {"timeout_ms", 1, NULL},
        {"max_retries", -1, "max_retries must be 0..100 (got -1)"},
        {"max_retries", 0, NULL},
        {"max_retries", 100, NULL},
        {"max_retries", 101, "max_retries must be 0..100 (got 101)"},
        {"base_delay_ms", -1, "base_delay_ms must be >= 0 (got -1)"},
        {"base_delay_ms", 0, NULL},
        {"max_delay_ms", -1, "max_delay_ms must be >= 0 (got -1)"},
        {"max_delay_ms", 0, NULL},
        {"deadline_ms", -2, "deadline_ms*"},
        {"deadline_ms", -1, NULL},
        {"deadline_ms", 0, NULL},
        {"deadline_ms", 180000, NULL},
        {"jitter", 3, "jitter must be one of \"additive\", \"full\", \"none\" (got 3)"},
        {"jitter", -1, "jitter*"},
        {"jitter", LLMRETRY_JITTER_NONE, NULL},
        {"retry_mode", 2, "retry_mode must be one of \"safe\", \"unsafe\" (got 2)"},
        {"retry_mode", -1, "retry_mode*"},
        {"retry_mode", LLMRETRY_RETRY_UNSAFE, NULL},
        {"max_retry_after_ms", -1, "max_retry_after_ms must be >= 0 (got -1)"},
        {"max_retry_after_ms", 0, NULL},
        {"max_response_bytes", 0, "max_response_bytes must be > 0 (got 0)"},
        {"max_response_bytes", -1, "max_response_bytes*"},
        {"max_response_bytes", 1, NULL},
        {"n_retry_statuses", 64, NULL},
        {"n_retry_statuses", 65, "n_retry_statuses must be <= 64 (got 65)"},
        {"body_len", 0, "body*"},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        llmretry_options o = valid();
        char err[LLMRETRY_ERRBUF] = "";
        llmretry_status st;
        set_number(&o, t[i].field, t[i].v);
        st = llmretry_options_check(&o, err, sizeof err);
        if (!t[i].want) {
            CHECK_MSG(st == LLMRETRY_OK, "%s = %lld: want OK, got \"%s\"", t[i].field, t[i].v, err);
            continue;
        }
        size_t n = strlen(t[i].want);
        int match = t[i].want[n - 1] == '*' ? strncmp(err, t[i].want, n - 1) == 0
                                            : strcmp(err, t[i].want) == 0;
        CHECK_MSG(st == LLMRETRY_EINVAL && match, "%s = %lld: got %s \"%s\", want \"%s\"",
                  t[i].field, t[i].v, llmretry_status_name(st), err, t[i].want);
    }
}

static void set_string(llmretry_options *o, const char *field, const char *v)
{
    if (!strcmp(field, "url")) o->url = v;
    else if (!strcmp(field, "base_url")) o->base_url = v;
    else if (!strcmp(field, "api_key")) o->api_key = v;
    else if (!strcmp(field, "body")) o->body = v;
    else if (!strcmp(field, "request_id")) o->request_id = v;
    else if (!strcmp(field, "idempotency_key")) o->idempotency_key = v;
    else if (!strcmp(field, "ca_file")) o->ca_file = v;
    else
        th_fail(__FILE__, __LINE__, "unknown field %s", field);
}

static void test_strings(void)
{
    static const struct { const char *field; const char *v; int ok; } t[] = {
        {"url", NULL, 1},
        {"url", "http://127.0.0.1:8080/v1/chat/completions", 1},
        {"url", "", 0},
        {"url", "http://x/\r\nX-Evil: 1", 0},
        {"base_url", NULL, 1},
        {"base_url", "https://api.example.com/v1", 1},
        {"base_url", "", 0},
        {"base_url", "http://x\n", 0},
        {"api_key", NULL, 1},
        {"api_key", "sk-abc", 1},
        {"api_key", "sk-secret\r\nX-Evil: 1", 0},
        {"api_key", "sk-secret\x01", 0},
        {"body", NULL, 0},
        {"request_id", NULL, 1},
        {"request_id", "req-123_abc.DEF", 1},
        {"request_id", "a b", 1},
        {"request_id", "", 0},
        {"request_id", "a\r\nX-Evil: 1", 0},
        {"request_id", "a\nb", 0},
        {"request_id", "a\rb", 0},
        {"request_id", "a\tb", 0},
        {"request_id", "a\x01", 0},
        {"request_id", "a\x7f", 0},
        {"request_id", "caf\xc3\xa9", 0},
        {"idempotency_key", NULL, 1},
        {"idempotency_key", "key-1", 1},
        {"idempotency_key", "", 0},
        {"idempotency_key", "k\r\nX-Evil: 1", 0},
        {"idempotency_key", "k\x02", 0},
        {"ca_file", NULL, 1},
        {"ca_file", "/etc/ssl/certs/ca.pem", 1},
        {"ca_file", "", 0},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        llmretry_options o = valid();
        char err[LLMRETRY_ERRBUF] = "";
        llmretry_status st;
        set_string(&o, t[i].field, t[i].v);
        st = llmretry_options_check(&o, err, sizeof err);
        if (t[i].ok) {
            CHECK_MSG(st == LLMRETRY_OK, "%s #%zu: want OK, got \"%s\"", t[i].field, i, err);
        } else {
            CHECK_MSG(st == LLMRETRY_EINVAL && starts_with(err, t[i].field),
                      "%s #%zu: got %s \"%s\", want EINVAL naming the field", t[i].field, i,
                      llmretry_status_name(st), err);
        }
        /* The key must never appear in a message. */
        CHECK_MSG(strstr(err, "secret") == NULL, "message leaks the key: \"%s\"", err);
    }
}

/* request_id: up to LLMRETRY_REQUEST_ID_MAX bytes, longer refused (it
 * was cut silently at 63). */
static void test_request_id_length(void)
{
    char id[LLMRETRY_REQUEST_ID_MAX + 2];
    memset(id, 'r', sizeof id - 1);
    id[sizeof id - 1] = '\0';
    llmretry_options o = valid();
    char err[LLMRETRY_ERRBUF] = "";
    o.request_id = id;
    CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_STR(err, "request_id must be at most 256 bytes (got 257)");
    id[LLMRETRY_REQUEST_ID_MAX] = '\0';
    CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_OK);
}

static void test_headers(void)
{
    static const struct { const char *h[3]; size_t n; const char *want; } t[] = {
        {{"X-A: 1"}, 1, NULL},
        {{"X-A:1", "X-B: two words"}, 2, NULL},
        {{"X-A: a\tb"}, 1, NULL},
        {{"X-A: caf\xc3\xa9"}, 1, NULL},
        {{"X-A:"}, 1, NULL},
        {{"X-A: 1", NULL}, 2, "headers[1] must not be NULL"},
        {{"NoColon"}, 1, "headers[0] must look like \"Name: value\" (no ':')"},
        {{"X-A: 1\r\nX-B: 2"}, 1, "headers[0] must not contain CR or LF"},
        {{"X-A: 1", "X-B: 2\n"}, 2, "headers[1] must not contain CR or LF"},
        {{"X-A: 1\r"}, 1, "headers[0] must not contain CR or LF"},
        {{": v"}, 1, "headers[0] has an empty name"},
        {{"X A: v"}, 1, "headers[0] has an invalid character in its name"},
        {{"X(A): v"}, 1, "headers[0] has an invalid character in its name"},
        {{"X-A: a\x01"}, 1, "headers[0] must not contain control characters"},
        {{"X-A: a\x7f"}, 1, "headers[0] must not contain control characters"},
        {{"X-A: \t"}, 1, NULL},
        /* framing, and the ids that have their own options (issue 13) */
        {{"X-A: 1", "Content-Length: 5"}, 2, "headers[1] must not set Content-Length (libcurl sets it from the body)"},
        {{"content-length:5"}, 1, "headers[0] must not set Content-Length (libcurl sets it from the body)"},
        {{"TRANSFER-ENCODING: chunked"}, 1, "headers[0] must not set Transfer-Encoding (libcurl frames the body)"},
        {{"host: evil.example"}, 1, "headers[0] must not set Host (it comes from the URL)"},
        {{"x-client-request-id: r"}, 1, "headers[0] must not set X-Client-Request-Id (use request_id)"},
        {{"Idempotency-Key: k"}, 1, "headers[0] must not set Idempotency-Key (use idempotency_key)"},
        {{"Hostname: x", "Content-Lengths: 1"}, 2, NULL},
        {{"Authorization: Bearer mine"}, 1, NULL},   /* no api_key here */
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        llmretry_options o = valid();
        char err[LLMRETRY_ERRBUF] = "";
        llmretry_status st;
        o.headers = t[i].h;
        o.n_headers = t[i].n;
        st = llmretry_options_check(&o, err, sizeof err);
        if (!t[i].want)
            CHECK_MSG(st == LLMRETRY_OK, "headers #%zu: want OK, got \"%s\"", i, err);
        else
            CHECK_MSG(st == LLMRETRY_EINVAL && strcmp(err, t[i].want) == 0,
                      "headers #%zu: got %s \"%s\", want \"%s\"", i, llmretry_status_name(st),
                      err, t[i].want);
    }
    {
        /* Never two Authorization headers. */
        static const char *const auth[] = {"X-A: 1", "authorization: Bearer other"};
        llmretry_options o = valid();
        char err[LLMRETRY_ERRBUF] = "";
        o.api_key = "sk-secret-key";
        o.headers = auth;
        o.n_headers = 2;
        CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_EINVAL);
        CHECK_STR(err, "headers[1] must not set Authorization when api_key is set");
        o.api_key = "";
        CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_OK);
    }
    {
        llmretry_options o = valid();
        char err[LLMRETRY_ERRBUF] = "";
        o.n_headers = 2;
        CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_EINVAL);
        CHECK_STR(err, "headers must not be NULL when n_headers is 2");
        o.n_headers = 0;
        CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_OK);
    }
}

static void test_retry_statuses(void)
{
    static const struct { int s[3]; size_t n; const char *want; } t[] = {
        {{503}, 1, NULL},
        {{100, 599}, 2, NULL},
        {{99}, 1, "retry_statuses[0] must be an HTTP status, 100..599 (got 99)"},
        {{600}, 1, "retry_statuses[0] must be an HTTP status, 100..599 (got 600)"},
        {{503, 0}, 2, "retry_statuses[1] must be an HTTP status, 100..599 (got 0)"},
        {{503, 429, -1}, 3, "retry_statuses[2] must be an HTTP status, 100..599 (got -1)"},
        {{0, 0, 0}, 0, NULL}, /* n == 0: the default set, entries unused */
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        llmretry_options o = valid();
        char err[LLMRETRY_ERRBUF] = "";
        llmretry_status st;
        memcpy(o.retry_statuses, t[i].s, sizeof t[i].s);
        o.n_retry_statuses = t[i].n;
        st = llmretry_options_check(&o, err, sizeof err);
        if (!t[i].want)
            CHECK_MSG(st == LLMRETRY_OK, "retry_statuses #%zu: want OK, got \"%s\"", i, err);
        else
            CHECK_MSG(st == LLMRETRY_EINVAL && strcmp(err, t[i].want) == 0,
                      "retry_statuses #%zu: got %s \"%s\", want \"%s\"", i,
                      llmretry_status_name(st), err, t[i].want);
    }
}

static void test_errbuf(void)
{
    llmretry_options o = valid();
    char small[8];
    char untouched[4] = "abc";
    o.timeout_ms = -5;
    CHECK_INT(llmretry_options_check(&o, NULL, 0), LLMRETRY_EINVAL);
    CHECK_INT(llmretry_options_check(&o, NULL, 100), LLMRETRY_EINVAL);
    CHECK_INT(llmretry_options_check(&o, small, sizeof small), LLMRETRY_EINVAL);
    CHECK_STR(small, "timeout");
    CHECK_INT(llmretry_options_check(&o, untouched, 0), LLMRETRY_EINVAL);
    CHECK_STR(untouched, "abc");
}

static void test_names(void)
{
    static const struct { llmretry_status s; const char *name; } st[] = {
        {LLMRETRY_OK, "ok"}, {LLMRETRY_EINVAL, "einval"}, {LLMRETRY_ENOMEM, "enomem"},
        {LLMRETRY_ESTATE, "estate"}, {LLMRETRY_ETIMEDOUT, "etimedout"},
        {LLMRETRY_EINTERNAL, "einternal"}, {(llmretry_status)99, "unknown"},
    };
    static const struct { llmretry_error_kind k; const char *name; } kinds[] = {
        {LLMRETRY_ERR_HTTP_STATUS, "http_status"}, {LLMRETRY_ERR_TIMEOUT, "timeout"},
        {LLMRETRY_ERR_NETWORK, "network"}, {LLMRETRY_ERR_INVALID_RESPONSE, "invalid_response"},
        {LLMRETRY_ERR_DEADLINE_EXCEEDED, "deadline_exceeded"}, {LLMRETRY_ERR_CANCELLED, "cancelled"},
        {LLMRETRY_ERR_RESPONSE_TOO_LARGE, "response_too_large"},
    };
    static const struct { llmretry_giveup_reason r; const char *name; } reasons[] = {
        {LLMRETRY_REASON_RETRIES_EXHAUSTED, "retries_exhausted"},
        {LLMRETRY_REASON_NOT_RETRYABLE, "not_retryable"}, {LLMRETRY_REASON_DEADLINE, "deadline"},
        {LLMRETRY_REASON_RETRY_AFTER_TOO_LONG, "retry_after_too_long"},
        {LLMRETRY_REASON_UNSAFE_MODE, "unsafe_mode"}, {LLMRETRY_REASON_CANCELLED, "cancelled"},
    };
    static const struct { llmretry_delay_source s; const char *name; } sources[] = {
        {LLMRETRY_DELAY_BACKOFF, "backoff"}, {LLMRETRY_DELAY_RETRY_AFTER, "retry_after"},
        {LLMRETRY_DELAY_RATELIMIT_RESET, "ratelimit_reset"},
    };
    static const struct { const char *s; int ok; llmretry_jitter j; } jit[] = {
        {"additive", 1, LLMRETRY_JITTER_ADDITIVE}, {"full", 1, LLMRETRY_JITTER_FULL},
        {"none", 1, LLMRETRY_JITTER_NONE}, {"Additive", 0, 0}, {"", 0, 0}, {"full ", 0, 0},
        {"equal", 0, 0},
    };
    static const struct { const char *s; int ok; llmretry_retry_mode m; } modes[] = {
        {"safe", 1, LLMRETRY_RETRY_SAFE}, {"unsafe", 1, LLMRETRY_RETRY_UNSAFE},
        {"SAFE", 0, 0}, {"", 0, 0}, {"never", 0, 0},
    };

    for (size_t i = 0; i < N_OF(st); i++)
        CHECK_STR(llmretry_status_name(st[i].s), st[i].name);
    for (size_t i = 0; i < N_OF(kinds); i++)
        CHECK_STR(llmretry_error_kind_name(kinds[i].k), kinds[i].name);
    CHECK(llmretry_error_kind_name(LLMRETRY_ERR_NONE) == NULL);
    CHECK(llmretry_error_kind_name((llmretry_error_kind)99) == NULL);
    for (size_t i = 0; i < N_OF(reasons); i++)
        CHECK_STR(llmretry_reason_name(reasons[i].r), reasons[i].name);
    CHECK(llmretry_reason_name(LLMRETRY_REASON_NONE) == NULL);
    CHECK(llmretry_reason_name((llmretry_giveup_reason)99) == NULL);
    for (size_t i = 0; i < N_OF(sources); i++)
        CHECK_STR(llmretry_delay_source_name(sources[i].s), sources[i].name);
    CHECK(llmretry_delay_source_name((llmretry_delay_source)99) == NULL);

    for (size_t i = 0; i < N_OF(jit); i++) {
        llmretry_jitter j = (llmretry_jitter)42;
        llmretry_status s = llmretry_jitter_parse(jit[i].s, &j);
        CHECK_MSG(s == (jit[i].ok ? LLMRETRY_OK : LLMRETRY_EINVAL), "jitter_parse(\"%s\")", jit[i].s);
        if (jit[i].ok) {
            CHECK_INT(j, jit[i].j);
            CHECK_STR(llmretry_jitter_name(j), jit[i].s);
        } else {
            CHECK_INT(j, 42); /* untouched on error */
        }
    }
    CHECK_INT(llmretry_jitter_parse(NULL, &(llmretry_jitter){0}), LLMRETRY_EINVAL);
    CHECK_INT(llmretry_jitter_parse("full", NULL), LLMRETRY_EINVAL);
    CHECK(llmretry_jitter_name((llmretry_jitter)99) == NULL);

    for (size_t i = 0; i < N_OF(modes); i++) {
        llmretry_retry_mode m = (llmretry_retry_mode)42;
        llmretry_status s = llmretry_retry_mode_parse(modes[i].s, &m);
        CHECK_MSG(s == (modes[i].ok ? LLMRETRY_OK : LLMRETRY_EINVAL), "retry_mode_parse(\"%s\")",
                  modes[i].s);
        if (modes[i].ok) {
            CHECK_INT(m, modes[i].m);
            CHECK_STR(llmretry_retry_mode_name(m), modes[i].s);
        } else {
            CHECK_INT(m, 42);
        }
    }
    CHECK_INT(llmretry_retry_mode_parse(NULL, &(llmretry_retry_mode){0}), LLMRETRY_EINVAL);
    CHECK_INT(llmretry_retry_mode_parse("safe", NULL), LLMRETRY_EINVAL);
    CHECK(llmretry_retry_mode_name((llmretry_retry_mode)99) == NULL);
}

int main(void)
{
    test_defaults();
    test_numbers();
    test_strings();
    test_headers();
    test_request_id_length();
    test_retry_statuses();
    test_errbuf();
    test_names();
    return th_summary("options");
}
