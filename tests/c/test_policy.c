/* Table-driven tests of the pure policy functions (docs/reliability.md). The clock
 * and the random number are injected, so every expectation is exact. */
#include "harness.h"
#include "llmretry.h"

#include <limits.h>
#include <math.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Sun, 06 Nov 1994 08:49:37 GMT, the example date of RFC 9110. */
#define NOW94 INT64_C(784111777000)
/* Sat, 01 Jun 2024 12:00:00 GMT */
#define NOW24 INT64_C(1717243200000)
#define NO_DL LLMRETRY_NO_DEADLINE

static void test_retry_after(void)
{
    static const struct { const char *v; int64_t now; int64_t want; } t[] = {
        /* delay-seconds, decimals allowed, rounded up to whole ms */
        {"1", NOW94, 1000},
        {"120", NOW94, 120000},
        {"1.5", NOW94, 1500},
        {"0.001", NOW94, 1},
        {"0.0001", NOW94, 1},
        {"1.0005", NOW94, 1001},
        {"1.000000000000000000000000001", NOW94, 1001},
        {"007", NOW94, 7000},
        {" 5 ", NOW94, 5000},
        {"\t5\t", NOW94, 5000},
        {"0", NOW94, -1},
        {"0.0", NOW94, -1},
        {"000", NOW94, -1},
        {"-1", NOW94, -1},
        {"-0.5", NOW94, -1},
        {"+1", NOW94, -1},
        {"", NOW94, -1},
        {"   ", NOW94, -1},
        {"inf", NOW94, -1},
        {"Infinity", NOW94, -1},
        {"nan", NOW94, -1},
        {"1e400", NOW94, -1},
        {"1e3", NOW94, -1},
        {"0x10", NOW94, -1},
        {"5s", NOW94, -1},
        {"5 5", NOW94, -1},
        {"1.", NOW94, -1},
        {".5", NOW94, -1},
        {"1,5", NOW94, -1},
        /* more than 1e12 ms saturates there (docs/reliability.md rule 6: too long, not garbage) */
        {"1000000000", NOW94, LLMRETRY_MAX_WAIT_MS},
        {"999999999.9999", NOW94, LLMRETRY_MAX_WAIT_MS},
        {"1000000000.0001", NOW94, LLMRETRY_MAX_WAIT_MS},
        {"1000000001", NOW94, LLMRETRY_MAX_WAIT_MS},
        {"100000000000000000000000000", NOW94, LLMRETRY_MAX_WAIT_MS}, /* 10^26 */
        {"1000000001.5x", NOW94, -1},
        {"99999999999999999999999999", NOW94, LLMRETRY_MAX_WAIT_MS},
        /* IMF-fixdate */
        {"Sun, 06 Nov 1994 08:49:37 GMT", NOW94 - 30000, 30000},
        {"Sun, 06 Nov 1994 08:49:37 GMT", NOW94 - 1, 1},
        {"Sun, 06 Nov 1994 08:49:37 GMT", NOW94, -1},
        {"Sun, 06 Nov 1994 08:49:37 GMT", NOW94 + 1000, -1},
        {"  Sun, 06 Nov 1994 08:49:37 GMT\t", NOW94 - 30000, 30000},
        {"Wed, 06 Nov 2024 08:49:37 GMT", NOW94, INT64_C(946771200000)},
        {"Sun, 06 Nov 2094 08:49:37 GMT", NOW94, LLMRETRY_MAX_WAIT_MS}, /* 100 years: saturates */
        {"Thu, 29 Feb 2024 00:00:00 GMT", INT64_C(1709164740000), 60000},
        {"Wed, 29 Feb 2023 00:00:00 GMT", NOW94, -1},
        {"Sun, 31 Nov 1994 08:49:37 GMT", NOW94 - 30000, -1},
        {"Sun, 32 Nov 1994 08:49:37 GMT", NOW94 - 30000, -1},
        {"Sun, 00 Nov 1994 08:49:37 GMT", NOW94 - 30000, -1},
        {"Sun, 6 Nov 1994 08:49:37 GMT", NOW94 - 30000, -1},
        {"Sun, 06 Nov 1994 08:49:60 GMT", NOW94 - 30000, 53000}, /* leap second */
        {"Sun, 06 Nov 1994 24:00:00 GMT", NOW94 - 30000, -1},
        {"Sun, 06 Nov 1994 08:60:00 GMT", NOW94 - 30000, -1},
        {"Sun, 06 Nov 1994 08:49:61 GMT", NOW94 - 30000, -1},
        {"Sun, 06 Nov 1994 8:49:37 GMT", NOW94 - 30000, -1},
        {"Sun, 06 Nov 1994 08:49 GMT", NOW94 - 30000, -1},
        {"Sun, 06 Nov 1994 08:49:37", NOW94 - 30000, -1},
        {"Sun, 06 Nov 1994 08:49:37 UTC", NOW94 - 30000, -1},
        {"Sun, 06 Nov 1994 08:49:37 +0000", NOW94 - 30000, -1},
        {"Sun, 06 Nov 1994 08:49:37 GMTx", NOW94 - 30000, -1},
        {"Sun,  06 Nov 1994 08:49:37 GMT", NOW94 - 30000, -1},
        {"Sun, 06 Foo 1994 08:49:37 GMT", NOW94 - 30000, -1},
        {"Abc, 06 Nov 1994 08:49:37 GMT", NOW94 - 30000, -1},
        {"sun, 06 nov 1994 08:49:37 gmt", NOW94 - 30000, -1},
        {"Sunday, 06 Nov 1994 08:49:37 GMT", NOW94 - 30000, -1},
        {"Wed, 31 Dec 1969 23:59:59 GMT", -10000, -1}, /* year < 1970 */
        {"Fri, 31 Dec 9999 23:59:59 GMT", INT64_C(253402300799000) - 5000, 5000},
        {"Fri, 31 Dec 9999 23:59:59 GMT", NOW24, LLMRETRY_MAX_WAIT_MS}, /* saturates */
        {"Sun, 06 Nov 1994 08:49:37 GMT", INT64_MIN, LLMRETRY_MAX_WAIT_MS},
        {"Sun, 06 Nov 1994 08:49:37 GMT", INT64_MAX, -1},
        /* rfc850-date */
        {"Sunday, 06-Nov-94 08:49:37 GMT", NOW94 - 30000, 30000},
        {"Sunday, 06-Nov-94 08:49:37 GMT", NOW94, -1},
        {"Saturday, 01-Jun-24 12:00:30 GMT", NOW24, 30000},
        {"Saturday, 01-Jan-00 00:00:00 GMT", INT64_C(946684740000), 60000}, /* 00 -> 2000 */
        {"Friday, 01-Jan-00 00:00:00 GMT", INT64_C(4102444740000), 60000},  /* 00 -> 2100 */
        {"Saturday, 01-Jun-2024 12:00:30 GMT", NOW24, -1},
        {"Sunday, 06-Nov-94 08:49:37", NOW94 - 30000, -1},
        {"Sunday, 06 Nov 94 08:49:37 GMT", NOW94 - 30000, -1},
        {"Sundae, 06-Nov-94 08:49:37 GMT", NOW94 - 30000, -1},
        {"Sun, 06-Nov-94 08:49:37 GMT", NOW94 - 30000, -1},
        {"Sunday, 31-Feb-94 08:49:37 GMT", NOW94 - 30000, -1},
        /* asctime-date */
        {"Sun Nov  6 08:49:37 1994", NOW94 - 30000, 30000},
        {"Sun Nov 06 08:49:37 1994", NOW94 - 30000, 30000},
        {"Sun Nov  6 08:49:37 1994", NOW94, -1},
        {" Sun Nov  6 08:49:37 1994 ", NOW94 - 30000, 30000},
        {"Sat Jun  1 12:00:30 2024", NOW24, 30000},
        {"Sun Nov 6 08:49:37 1994", NOW94 - 30000, -1},
        {"Sun Nov  6 08:49:37 94", NOW94 - 30000, -1},
        {"Sun Nov  6 08:49:37 1994 GMT", NOW94 - 30000, -1},
        {"Sun Nov  6 25:49:37 1994", NOW94 - 30000, -1},
        {"Xyz Nov  6 08:49:37 1994", NOW94 - 30000, -1},
        {"Sun Now  6 08:49:37 1994", NOW94 - 30000, -1},
        {"Sun Nov 31 08:49:37 1994", NOW94 - 30000, -1},
        {"Thu Jan  1 00:00:00 1969", NOW94 - 30000, -1},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        int64_t got = llmretry_parse_retry_after(t[i].v, t[i].now);
        CHECK_MSG(got == t[i].want, "parse_retry_after(\"%s\", %lld) = %lld, want %lld", t[i].v,
                  (long long)t[i].now, (long long)got, (long long)t[i].want);
    }
    CHECK_INT(llmretry_parse_retry_after(NULL, NOW94), -1);
}

static void test_retry_after_ms(void)
{
    static const struct { const char *v; int64_t want; } t[] = {
        {"1500", 1500}, {"1", 1}, {"1.5", 2}, {"0.1", 1}, {" 20 ", 20}, {"0", -1},
        {"0.0", -1}, {"-5", -1}, {"abc", -1}, {"", -1}, {"nan", -1}, {"inf", -1},
        {"1e3", -1}, {"20ms", -1}, {"1000000000000", LLMRETRY_MAX_WAIT_MS},
        {"1000000000001", LLMRETRY_MAX_WAIT_MS}, {"99999999999999999999999", LLMRETRY_MAX_WAIT_MS},
        {"99999999999999999999999x", -1},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        int64_t got = llmretry_parse_retry_after_ms(t[i].v);
        CHECK_MSG(got == t[i].want, "parse_retry_after_ms(\"%s\") = %lld, want %lld", t[i].v,
                  (long long)got, (long long)t[i].want);
    }
    CHECK_INT(llmretry_parse_retry_after_ms(NULL), -1);
}

static void test_reset_duration(void)
{
    static const struct { const char *v; int64_t want; } t[] = {
        {"1s", 1000}, {"6m0s", 360000}, {"20ms", 20}, {"1h2m3.5s", 3723500}, {"0.5s", 500},
        {"1.5m", 90000}, {"1h", 3600000}, {"1s1s", 2000}, {" 1s ", 1000}, {"250us", 1},
        {"250\xc2\xb5s", 1}, {"250\xce\xbcs", 1}, {"1500us", 2}, {"999999ns", 1},
        {"1000000ns", 1}, {"1000000ns1ns", 2}, {"0.0001ms", 1}, {"277777h", INT64_C(999997200000)},
        {"0s", -1}, {"0", -1}, {"0ms0s", -1}, {"5", -1}, {"s", -1}, {"1x", -1}, {"-1s", -1},
        {"+1s", -1}, {"1 s", -1}, {"1S", -1}, {"1.s", -1}, {".5s", -1}, {"1s ms", -1}, {"", -1},
        {"inf", -1}, {"277778h", LLMRETRY_MAX_WAIT_MS}, {"9999999999999999999999h", LLMRETRY_MAX_WAIT_MS},
        {"277777h1h", LLMRETRY_MAX_WAIT_MS}, {"277778h1x", -1}, {"9999999999999999999999hh", -1},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        int64_t got = llmretry_parse_reset_duration(t[i].v);
        CHECK_MSG(got == t[i].want, "parse_reset_duration(\"%s\") = %lld, want %lld", t[i].v,
                  (long long)got, (long long)t[i].want);
    }
    CHECK_INT(llmretry_parse_reset_duration(NULL), -1);
}

static void test_backoff(void)
{
    enum { A = LLMRETRY_JITTER_ADDITIVE, F = LLMRETRY_JITTER_FULL, N = LLMRETRY_JITTER_NONE };
    static const struct { int j; int64_t base, cap; int n; double u; int64_t want; } t[] = {
        {A, 800, 30000, 0, 0.0, 800},
        {A, 800, 30000, 0, 0.5, 1200},
        {A, 800, 30000, 0, 0.999999, 1599},
        {A, 800, 30000, 1, 0.0, 1600},
        {A, 800, 30000, 2, 0.0, 3200},
        {A, 800, 30000, 5, 0.0, 25600},
        {A, 800, 30000, 6, 0.0, 30000},        /* capped */
        {A, 800, 30000, 6, 0.999999, 30799},   /* jitter goes on top of the cap */
        {A, 800, 30000, 1000, 0.0, 30000},
        {A, 800, 30000, INT_MAX, 0.5, 30400},
        {A, 800, 30000, -1, 0.0, 800},         /* negative n is the first retry */
        {A, 800, 500, 0, 0.5, 900},            /* cap below base */
        {A, 0, 30000, INT_MAX, 0.9, 0},
        {A, 800, 30000, 0, 1.0, 1599},         /* u01 clamped into [0, 1) */
        {A, 800, 30000, 0, 1.5, 1599},
        {A, 800, 30000, 0, -0.5, 800},
        {A, INT64_MAX, INT64_MAX, 0, 0.999999, INT64_MAX}, /* saturates */
        {F, 800, 30000, 0, 0.0, 0},
        {F, 800, 30000, 0, 0.5, 400},
        {F, 800, 30000, 0, 0.999999, 799},
        {F, 800, 30000, 3, 0.5, 3200},
        {F, 800, 30000, 10, 0.5, 15000},
        {F, 800, 30000, 100, 0.999999, 29999},
        {F, 800, 30000, 0, 1.0, 799},
        {F, 800, 30000, 0, -1.0, 0},
        {F, 1, INT64_MAX, 200, 0.999999999, INT64_C(9223372027631404032)},
        {N, 800, 30000, 0, 0.7, 800},
        {N, 800, 30000, 3, 0.7, 6400},
        {N, 800, 30000, 100, 0.0, 30000},
        {N, 800, 500, 0, 0.0, 500},
        {N, 800, 0, 3, 0.0, 0},
        {N, 1, INT64_MAX, 62, 0.0, INT64_C(4611686018427387904)},
        {N, 1, INT64_MAX, 63, 0.0, INT64_MAX},
        {N, 1, INT64_MAX, INT_MAX, 0.0, INT64_MAX},
        {N, -5, 30000, 3, 0.0, 0},             /* negative inputs count as 0 */
        {N, 800, -5, 3, 0.0, 0},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        int64_t got = llmretry_backoff_ms((llmretry_jitter)t[i].j, t[i].base, t[i].cap, t[i].n, t[i].u);
        CHECK_MSG(got == t[i].want, "backoff_ms(%s, %lld, %lld, %d, %g) = %lld, want %lld",
                  llmretry_jitter_name((llmretry_jitter)t[i].j), (long long)t[i].base,
                  (long long)t[i].cap, t[i].n, t[i].u, (long long)got, (long long)t[i].want);
    }
    CHECK_INT(llmretry_backoff_ms(LLMRETRY_JITTER_FULL, 800, 30000, 0, NAN), 0);
    CHECK_INT(llmretry_backoff_ms(LLMRETRY_JITTER_ADDITIVE, 800, 30000, 0, NAN), 800);
    /* Whatever u01 is, full jitter stays in [0, min(cap, base*2^n)). */
    for (int k = 0; k <= 1000; k++) {
        int64_t v = llmretry_backoff_ms(LLMRETRY_JITTER_FULL, 800, 30000, 4, k / 1000.0);
        CHECK_MSG(v >= 0 && v < 12800, "full jitter u01=%g gave %lld", k / 1000.0, (long long)v);
    }
}

static void test_status_retryable(void)
{
    static const struct { int status, def, custom; } t[] = {
        {408, 1, 0}, {429, 1, 0}, {500, 1, 0}, {501, 0, 0}, {502, 1, 0}, {503, 1, 1},
        {504, 1, 0}, {505, 0, 0}, {599, 1, 0}, {400, 0, 1}, {404, 0, 0}, {409, 0, 0},
        {499, 0, 0}, {200, 0, 0}, {600, 0, 0}, {0, 0, 0}, {-1, 0, 0},
    };
    llmretry_options def, custom;
    llmretry_options_defaults(&def);
    llmretry_options_defaults(&custom);
    custom.retry_statuses[0] = 400;
    custom.retry_statuses[1] = 503;
    custom.n_retry_statuses = 2;
    for (size_t i = 0; i < N_OF(t); i++) {
        CHECK_MSG(llmretry_status_retryable(&def, t[i].status) == t[i].def,
                  "default set: status %d retryable should be %d", t[i].status, t[i].def);
        CHECK_MSG(llmretry_status_retryable(NULL, t[i].status) == t[i].def,
                  "NULL options: status %d retryable should be %d", t[i].status, t[i].def);
        CHECK_MSG(llmretry_status_retryable(&custom, t[i].status) == t[i].custom,
                  "custom set: status %d retryable should be %d", t[i].status, t[i].custom);
    }
}

static void test_attempt_timeout(void)
{
    static const struct { int64_t timeout, left, want; } t[] = {
        {60000, NO_DL, 60000}, {60000, 5000, 5000}, {60000, 90000, 60000},
        {100, 100, 100}, {60000, 0, 0}, {60000, -5, 0}, {60000, INT64_MAX, 60000},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        int64_t got = llmretry_attempt_timeout_ms(t[i].timeout, t[i].left);
        CHECK_MSG(got == t[i].want, "attempt_timeout_ms(%lld, %lld) = %lld, want %lld",
                  (long long)t[i].timeout, (long long)t[i].left, (long long)got,
                  (long long)t[i].want);
    }
}

/* Option presets for the decision table. */
enum { P_DEF, P_UNSAFE, P_NO_INVALID, P_CUSTOM, P_NONE, P_FULL, P_MAXRA0, P_NORETRY };

static llmretry_options preset(int p)
{
    llmretry_options o;
    llmretry_options_defaults(&o);
    switch (p) {
    case P_UNSAFE: o.retry_mode = LLMRETRY_RETRY_UNSAFE; break;
    case P_NO_INVALID: o.retry_invalid_response = 0; break;
    case P_CUSTOM: o.retry_statuses[0] = 400; o.n_retry_statuses = 1; break;
    case P_NONE: o.jitter = LLMRETRY_JITTER_NONE; break;
    case P_FULL: o.jitter = LLMRETRY_JITTER_FULL; break;
    case P_MAXRA0: o.max_retry_after_ms = 0; break;
    case P_NORETRY: o.max_retries = 0; break;
    default: break;
    }
    return o;
}

#define HTTP(s) .kind = LLMRETRY_ERR_HTTP_STATUS, .status = (s)
#define KIND(k) .kind = LLMRETRY_ERR_##k
#define RETRY(delay, src, ra) 1, delay, LLMRETRY_DELAY_##src, LLMRETRY_REASON_NONE, ra
#define STOP(reason, ra) 0, 0, LLMRETRY_DELAY_BACKOFF, LLMRETRY_REASON_##reason, ra
#define STOP_AT(reason, delay, src, ra) 0, delay, LLMRETRY_DELAY_##src, LLMRETRY_REASON_##reason, ra

static void test_decide(void)
{
    static const struct {
        const char *name;
        int preset;
        llmretry_failure f;
        int attempt;
        int64_t left;
        double u01;
        int retry;
        int64_t delay;
        llmretry_delay_source src;
        llmretry_giveup_reason reason;
        int64_t ra;
    } t[] = {
        /* rule 1 */
        {"cancelled", P_DEF, {KIND(CANCELLED)}, 0, NO_DL, 0, STOP(CANCELLED, -1)},
        {"cancelled beats should-retry", P_DEF, {KIND(CANCELLED), .should_retry = "true"}, 0, NO_DL, 0, STOP(CANCELLED, -1)},
        {"cancelled beats unsafe", P_UNSAFE, {KIND(CANCELLED)}, 0, NO_DL, 0, STOP(CANCELLED, -1)},
        {"fatal", P_DEF, {KIND(NETWORK), .fatal = 1}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"fatal beats should-retry", P_DEF, {KIND(NETWORK), .fatal = 1, .should_retry = "true"}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"fatal beats unsafe", P_UNSAFE, {KIND(NETWORK), .fatal = 1}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"too large", P_DEF, {KIND(RESPONSE_TOO_LARGE), .status = 200}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"deadline exceeded", P_DEF, {KIND(DEADLINE_EXCEEDED)}, 0, NO_DL, 0, STOP(DEADLINE, -1)},
        {"deadline exceeded beats unsafe", P_UNSAFE, {KIND(DEADLINE_EXCEEDED)}, 0, NO_DL, 0, STOP(DEADLINE, -1)},
        {"deadline exceeded beats should-retry", P_DEF, {KIND(DEADLINE_EXCEEDED), .should_retry = "true"}, 0, NO_DL, 0, STOP(DEADLINE, -1)},
        /* rule 2 */
        {"unsafe timeout", P_UNSAFE, {KIND(TIMEOUT)}, 0, NO_DL, 0, STOP(UNSAFE_MODE, -1)},
        {"unsafe 503", P_UNSAFE, {HTTP(503)}, 0, NO_DL, 0, STOP(UNSAFE_MODE, -1)},
        {"unsafe beats not retryable", P_UNSAFE, {HTTP(400)}, 0, NO_DL, 0, STOP(UNSAFE_MODE, -1)},
        {"unsafe beats exhausted", P_UNSAFE, {KIND(TIMEOUT)}, 3, NO_DL, 0, STOP(UNSAFE_MODE, -1)},
        {"unsafe beats quota", P_UNSAFE, {HTTP(429), .error_code = "insufficient_quota"}, 0, NO_DL, 0, STOP(UNSAFE_MODE, -1)},
        {"unsafe beats should-retry", P_UNSAFE, {HTTP(503), .should_retry = "true"}, 0, NO_DL, 0, STOP(UNSAFE_MODE, -1)},
        {"unsafe never connected", P_UNSAFE, {KIND(NETWORK), .never_connected = 1}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"unsafe never connected exhausted", P_UNSAFE, {KIND(NETWORK), .never_connected = 1}, 3, NO_DL, 0, STOP(RETRIES_EXHAUSTED, -1)},
        {"safe connected", P_DEF, {KIND(NETWORK)}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        /* rule 3 */
        {"quota", P_DEF, {HTTP(429), .error_code = "insufficient_quota"}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"quota beats should-retry", P_DEF, {HTTP(429), .error_code = "insufficient_quota", .should_retry = "true"}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"quota keeps retry-after", P_DEF, {HTTP(429), .error_code = "insufficient_quota", .retry_after = "5"}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, 5000)},
        {"429 rate limit code", P_DEF, {HTTP(429), .error_code = "rate_limit_exceeded"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"quota code on 503", P_DEF, {HTTP(503), .error_code = "insufficient_quota"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        /* rule 4 */
        {"should-retry true on 400", P_DEF, {HTTP(400), .should_retry = "true"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"should-retry TRUE padded", P_DEF, {HTTP(400), .should_retry = " TRUE\t"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"should-retry false on 503", P_DEF, {HTTP(503), .should_retry = "false"}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"should-retry False padded", P_DEF, {HTTP(503), .should_retry = " False "}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"should-retry yes ignored", P_DEF, {HTTP(503), .should_retry = "yes"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"should-retry empty ignored", P_DEF, {HTTP(400), .should_retry = ""}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"should-retry false on timeout", P_DEF, {KIND(TIMEOUT), .should_retry = "false"}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"should-retry true on invalid", P_NO_INVALID, {KIND(INVALID_RESPONSE), .status = 200, .should_retry = "true"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"should-retry true on 501", P_DEF, {HTTP(501), .should_retry = "true"}, 1, NO_DL, 0, RETRY(1600, BACKOFF, -1)},
        {"should-retry true exhausted", P_DEF, {HTTP(400), .should_retry = "true"}, 3, NO_DL, 0, STOP(RETRIES_EXHAUSTED, -1)},
        /* rule 5 */
        {"timeout", P_DEF, {KIND(TIMEOUT)}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"network attempt 2", P_DEF, {KIND(NETWORK)}, 2, NO_DL, 0, RETRY(3200, BACKOFF, -1)},
        {"timeout exhausted", P_DEF, {KIND(TIMEOUT)}, 3, NO_DL, 0, STOP(RETRIES_EXHAUSTED, -1)},
        {"timeout past exhausted", P_DEF, {KIND(TIMEOUT)}, 7, NO_DL, 0, STOP(RETRIES_EXHAUSTED, -1)},
        {"max_retries 0", P_NORETRY, {KIND(TIMEOUT)}, 0, NO_DL, 0, STOP(RETRIES_EXHAUSTED, -1)},
        {"503 attempt 1", P_DEF, {HTTP(503)}, 1, NO_DL, 0, RETRY(1600, BACKOFF, -1)},
        {"500", P_DEF, {HTTP(500)}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"408", P_DEF, {HTTP(408)}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"429", P_DEF, {HTTP(429)}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"501", P_DEF, {HTTP(501)}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"505", P_DEF, {HTTP(505)}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"400", P_DEF, {HTTP(400)}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"404", P_DEF, {HTTP(404)}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"400 last attempt is not_retryable", P_DEF, {HTTP(400)}, 3, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"custom 400", P_CUSTOM, {HTTP(400)}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"custom 503", P_CUSTOM, {HTTP(503)}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"invalid response", P_DEF, {KIND(INVALID_RESPONSE), .status = 200}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"invalid response off", P_NO_INVALID, {KIND(INVALID_RESPONSE), .status = 200}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"kind none", P_DEF, {KIND(NONE)}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, -1)},
        {"400 keeps retry-after", P_DEF, {HTTP(400), .retry_after = "5"}, 0, NO_DL, 0, STOP(NOT_RETRYABLE, 5000)},
        {"exhausted beats too long", P_DEF, {HTTP(503), .retry_after = "600"}, 3, NO_DL, 0, STOP(RETRIES_EXHAUSTED, 600000)},
        {"exhausted beats deadline", P_DEF, {KIND(TIMEOUT)}, 3, 0, 0, STOP(RETRIES_EXHAUSTED, -1)},
        /* rule 6 */
        {"retry-after seconds", P_DEF, {HTTP(503), .retry_after = "5"}, 0, NO_DL, 0, RETRY(5000, RETRY_AFTER, 5000)},
        {"retry-after decimal", P_DEF, {HTTP(503), .retry_after = "1.5"}, 0, NO_DL, 0, RETRY(1500, RETRY_AFTER, 1500)},
        {"retry-after no jitter", P_DEF, {HTTP(503), .retry_after = "2"}, 1, NO_DL, 0.999, RETRY(2000, RETRY_AFTER, 2000)},
        {"retry-after above max_delay", P_DEF, {HTTP(503), .retry_after = "45"}, 0, NO_DL, 0, RETRY(45000, RETRY_AFTER, 45000)},
        {"retry-after-ms wins", P_DEF, {HTTP(503), .retry_after = "5", .retry_after_ms = "250"}, 0, NO_DL, 0, RETRY(250, RETRY_AFTER, 250)},
        {"retry-after-ms garbage", P_DEF, {HTTP(503), .retry_after = "5", .retry_after_ms = "soon"}, 0, NO_DL, 0, RETRY(5000, RETRY_AFTER, 5000)},
        {"retry-after-ms zero", P_DEF, {HTTP(503), .retry_after = "5", .retry_after_ms = "0"}, 0, NO_DL, 0, RETRY(5000, RETRY_AFTER, 5000)},
        {"retry-after-ms alone", P_DEF, {HTTP(429), .retry_after_ms = "1234.5"}, 0, NO_DL, 0, RETRY(1235, RETRY_AFTER, 1235)},
        {"retry-after zero", P_DEF, {HTTP(503), .retry_after = "0"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"retry-after negative", P_DEF, {HTTP(503), .retry_after = "-3"}, 1, NO_DL, 0, RETRY(1600, BACKOFF, -1)},
        {"retry-after garbage", P_DEF, {HTTP(503), .retry_after = "later"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"retry-after date", P_DEF, {HTTP(503), .retry_after = "Sun, 06 Nov 1994 08:50:07 GMT"}, 0, NO_DL, 0, RETRY(30000, RETRY_AFTER, 30000)},
        {"retry-after past date", P_DEF, {HTTP(503), .retry_after = "Sun, 06 Nov 1994 08:49:07 GMT"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"retry-after at max", P_DEF, {HTTP(503), .retry_after = "120"}, 0, NO_DL, 0, RETRY(120000, RETRY_AFTER, 120000)},
        {"retry-after just above max", P_DEF, {HTTP(503), .retry_after = "120.001"}, 0, NO_DL, 0, STOP_AT(RETRY_AFTER_TOO_LONG, 120001, RETRY_AFTER, 120001)},
        {"retry-after too long", P_DEF, {HTTP(429), .retry_after = "600"}, 0, NO_DL, 0, STOP_AT(RETRY_AFTER_TOO_LONG, 600000, RETRY_AFTER, 600000)},
        {"retry-after 1000000001 s", P_DEF, {HTTP(503), .retry_after = "1000000001"}, 0, NO_DL, 0, STOP_AT(RETRY_AFTER_TOO_LONG, LLMRETRY_MAX_WAIT_MS, RETRY_AFTER, LLMRETRY_MAX_WAIT_MS)},
        {"retry-after 10^26 s", P_DEF, {HTTP(429), .retry_after = "100000000000000000000000000"}, 0, NO_DL, 0, STOP_AT(RETRY_AFTER_TOO_LONG, LLMRETRY_MAX_WAIT_MS, RETRY_AFTER, LLMRETRY_MAX_WAIT_MS)},
        {"retry-after-ms 10^26", P_DEF, {HTTP(429), .retry_after_ms = "100000000000000000000000000"}, 0, NO_DL, 0, STOP_AT(RETRY_AFTER_TOO_LONG, LLMRETRY_MAX_WAIT_MS, RETRY_AFTER, LLMRETRY_MAX_WAIT_MS)},
        {"reset 10^22 h", P_DEF, {HTTP(429), .ratelimit_reset_requests = "9999999999999999999999h"}, 0, NO_DL, 0, STOP_AT(RETRY_AFTER_TOO_LONG, LLMRETRY_MAX_WAIT_MS, RATELIMIT_RESET, -1)},
        {"retry-after year 9999", P_DEF, {HTTP(503), .retry_after = "Fri, 31 Dec 9999 23:59:59 GMT"}, 0, NO_DL, 0, STOP_AT(RETRY_AFTER_TOO_LONG, LLMRETRY_MAX_WAIT_MS, RETRY_AFTER, LLMRETRY_MAX_WAIT_MS)},
        {"max_retry_after 0", P_MAXRA0, {HTTP(429), .retry_after = "1"}, 0, NO_DL, 0, STOP_AT(RETRY_AFTER_TOO_LONG, 1000, RETRY_AFTER, 1000)},
        {"max_retry_after 0 no header", P_MAXRA0, {HTTP(429)}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"reset: larger wins", P_DEF, {HTTP(429), .ratelimit_reset_requests = "1s", .ratelimit_reset_tokens = "6s"}, 0, NO_DL, 0, RETRY(6000, RATELIMIT_RESET, -1)},
        {"reset: requests only", P_DEF, {HTTP(429), .ratelimit_reset_requests = "2s"}, 0, NO_DL, 0, RETRY(2000, RATELIMIT_RESET, -1)},
        {"reset: tokens only", P_DEF, {HTTP(429), .ratelimit_reset_tokens = "20ms"}, 0, NO_DL, 0, RETRY(20, RATELIMIT_RESET, -1)},
        {"reset: one garbage", P_DEF, {HTTP(429), .ratelimit_reset_requests = "x", .ratelimit_reset_tokens = "3s"}, 0, NO_DL, 0, RETRY(3000, RATELIMIT_RESET, -1)},
        {"reset: unusable", P_DEF, {HTTP(429), .ratelimit_reset_requests = "0s", .ratelimit_reset_tokens = "x"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"reset: too long", P_DEF, {HTTP(429), .ratelimit_reset_tokens = "6m0s"}, 0, NO_DL, 0, STOP_AT(RETRY_AFTER_TOO_LONG, 360000, RATELIMIT_RESET, -1)},
        {"reset: only on 429", P_DEF, {HTTP(503), .ratelimit_reset_requests = "5s"}, 0, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        {"retry-after beats reset", P_DEF, {HTTP(429), .retry_after = "3", .ratelimit_reset_requests = "10s"}, 0, NO_DL, 0, RETRY(3000, RETRY_AFTER, 3000)},
        {"bad retry-after falls to reset", P_DEF, {HTTP(429), .retry_after = "0", .ratelimit_reset_requests = "10s"}, 0, NO_DL, 0, RETRY(10000, RATELIMIT_RESET, -1)},
        {"additive jitter", P_DEF, {HTTP(503)}, 1, NO_DL, 0.5, RETRY(2000, BACKOFF, -1)},
        {"no jitter", P_NONE, {HTTP(503)}, 2, NO_DL, 0.9, RETRY(3200, BACKOFF, -1)},
        {"full jitter", P_FULL, {HTTP(503)}, 1, NO_DL, 0.5, RETRY(800, BACKOFF, -1)},
        {"negative attempt", P_DEF, {HTTP(503)}, -1, NO_DL, 0, RETRY(800, BACKOFF, -1)},
        /* rule 7 */
        {"deadline far", P_DEF, {KIND(TIMEOUT)}, 0, 10000, 0, RETRY(800, BACKOFF, -1)},
        {"deadline just after wait", P_DEF, {KIND(TIMEOUT)}, 0, 801, 0, RETRY(800, BACKOFF, -1)},
        {"wait ends at deadline", P_DEF, {KIND(TIMEOUT)}, 0, 800, 0, STOP_AT(DEADLINE, 800, BACKOFF, -1)},
        {"deadline now", P_DEF, {KIND(TIMEOUT)}, 0, 0, 0, STOP_AT(DEADLINE, 800, BACKOFF, -1)},
        {"deadline passed", P_DEF, {KIND(TIMEOUT)}, 0, -5, 0, STOP_AT(DEADLINE, 800, BACKOFF, -1)},
        {"deadline vs jitter", P_DEF, {KIND(TIMEOUT)}, 0, 1000, 0.5, STOP_AT(DEADLINE, 1200, BACKOFF, -1)},
        {"deadline vs retry-after", P_DEF, {HTTP(503), .retry_after = "5"}, 0, 4000, 0, STOP_AT(DEADLINE, 5000, RETRY_AFTER, 5000)},
        {"deadline vs reset", P_DEF, {HTTP(429), .ratelimit_reset_requests = "5s"}, 0, 5000, 0, STOP_AT(DEADLINE, 5000, RATELIMIT_RESET, -1)},
        {"too long beats deadline", P_DEF, {HTTP(503), .retry_after = "600"}, 0, 1000, 0, STOP_AT(RETRY_AFTER_TOO_LONG, 600000, RETRY_AFTER, 600000)},
        {"no deadline long wait", P_DEF, {HTTP(503), .retry_after = "100"}, 0, NO_DL, 0, RETRY(100000, RETRY_AFTER, 100000)},
    };
    for (size_t i = 0; i < N_OF(t); i++) {
        llmretry_options o = preset(t[i].preset);
        llmretry_decision d = llmretry_decide(&o, &t[i].f, t[i].attempt, NOW94, t[i].left, t[i].u01);
        CHECK_MSG(d.retry == t[i].retry && d.delay_ms == t[i].delay && d.delay_source == t[i].src &&
                      d.reason == t[i].reason && d.retry_after_ms == t[i].ra,
                  "decide \"%s\": got retry=%d delay=%lld source=%s reason=%s retry_after=%lld; "
                  "want retry=%d delay=%lld source=%s reason=%s retry_after=%lld",
                  t[i].name, d.retry, (long long)d.delay_ms, llmretry_delay_source_name(d.delay_source),
                  d.reason ? llmretry_reason_name(d.reason) : "none", (long long)d.retry_after_ms,
                  t[i].retry, (long long)t[i].delay, llmretry_delay_source_name(t[i].src),
                  t[i].reason ? llmretry_reason_name(t[i].reason) : "none", (long long)t[i].ra);
    }

    /* NULL options mean the defaults; a NULL failure is never retried. */
    {
        llmretry_failure f = {KIND(TIMEOUT)};
        llmretry_decision d = llmretry_decide(NULL, &f, 0, NOW94, NO_DL, 0.0);
        CHECK_INT(d.retry, 1);
        CHECK_INT(d.delay_ms, 800);
        d = llmretry_decide(NULL, &f, 3, NOW94, NO_DL, 0.0);
        CHECK_INT(d.reason, LLMRETRY_REASON_RETRIES_EXHAUSTED);
        d = llmretry_decide(NULL, NULL, 0, NOW94, NO_DL, 0.0);
        CHECK_INT(d.retry, 0);
        CHECK_INT(d.reason, LLMRETRY_REASON_NOT_RETRYABLE);
        CHECK_INT(d.retry_after_ms, -1);
    }
    /* A whole call under the defaults: three backoffs, then exhausted. */
    {
        llmretry_options o = preset(P_NONE);
        llmretry_failure f = {HTTP(502)};
        static const int64_t want[] = {800, 1600, 3200};
        for (int a = 0; a < 3; a++) {
            llmretry_decision d = llmretry_decide(&o, &f, a, NOW94, NO_DL, 0.0);
            CHECK_MSG(d.retry && d.delay_ms == want[a], "attempt %d: retry=%d delay=%lld", a,
                      d.retry, (long long)d.delay_ms);
        }
        CHECK_INT(llmretry_decide(&o, &f, 3, NOW94, NO_DL, 0.0).reason,
                  LLMRETRY_REASON_RETRIES_EXHAUSTED);
    }
}

int main(void)
{
    test_retry_after();
    test_retry_after_ms();
    test_reset_duration();
    test_backoff();
    test_status_retryable();
    test_attempt_timeout();
    test_decide();
    return th_summary("policy");
}
