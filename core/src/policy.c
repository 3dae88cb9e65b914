/* The retry policy of docs/reliability.md as pure functions: header parsers, backoff
 * and the decision after a failed attempt. The clock (now_unix_ms) and the
 * random source (u01) are arguments so every case can be tested exactly. */
#include "llmretry.h"

#include <string.h>

/* A server wait above ~31.7 years is a bug or an attack, not a schedule.
 * Such waits saturate here (docs/reliability.md rule 6: a number too big to
 * represent is "too long", not "unparseable"), which also keeps all
 * arithmetic far from overflow. */
#define ABSURD_MS LLMRETRY_MAX_WAIT_MS
#define ABSURD_NS (ABSURD_MS * 1000000)
#define MS_PER_DAY INT64_C(86400000)

/* ------------------------------------------------------------------ */
/* Lexing helpers                                                      */
/* ------------------------------------------------------------------ */

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Header values may carry optional whitespace (RFC 9110 §5.6.3 OWS). */
static void trim(const char *s, const char **b, const char **e)
{
    const char *end = s + strlen(s);
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *b = s;
    *e = end;
}

static int lit(const char **p, const char *end, const char *s)
{
    size_t n = strlen(s);
    if ((size_t)(end - *p) < n || memcmp(*p, s, n) != 0)
        return 0;
    *p += n;
    return 1;
}

/* Index of the name in `names` that *p starts with, or -1. */
static int match_name(const char **p, const char *end, const char *const *names, int count)
{
    for (int i = 0; i < count; i++)
        if (lit(p, end, names[i]))
            return i;
    return -1;
}

/* Exactly n digits. */
static int digits(const char **p, const char *end, int n, int *out)
{
    int v = 0;
    if (end - *p < n)
        return 0;
    for (int i = 0; i < n; i++) {
        if (!is_digit((*p)[i]))
            return 0;
        v = v * 10 + ((*p)[i] - '0');
    }
    *p += n;
    *out = v;
    return 1;
}

/* 1*DIGIT ["." 1*DIGIT], kept as text so it can be scaled exactly. */
typedef struct decimal {
    uint64_t ip;      /* saturates above 1e18: anything that big is absurd */
    const char *frac;
    size_t flen;
} decimal;

static int read_decimal(const char **pp, const char *end, decimal *d)
{
    const char *p = *pp;
    if (p == end || !is_digit(*p))
        return 0;
    d->ip = 0;
    for (; p < end && is_digit(*p); p++)
        if (d->ip <= UINT64_C(1000000000000000000))
            d->ip = d->ip * 10 + (uint64_t)(*p - '0');
    d->frac = NULL;
    d->flen = 0;
    if (p < end && *p == '.') {
        p++;
        d->frac = p;
        while (p < end && is_digit(*p))
            p++;
        d->flen = (size_t)(p - d->frac);
        if (d->flen == 0)
            return 0;
    }
    *pp = p;
    return 1;
}

/* ceil(d * unit), or -1 above limit. The fraction is folded in from its
 * last digit up, keeping an integer quotient and a "remainder was nonzero"
 * flag: exact for any number of digits, unlike a double. */
static int64_t scale_decimal(const decimal *d, int64_t unit, int64_t limit)
{
    int64_t q = 0;
    int rem = 0;
    if (d->ip > (uint64_t)(limit / unit))
        return -1;
    for (size_t i = d->flen; i-- > 0;) {
        int64_t num = (d->frac[i] - '0') * unit + q;
        rem = rem || num % 10 != 0;
        q = num / 10;
    }
    q += rem;
    if (q > limit - (int64_t)d->ip * unit)
        return -1;
    return (int64_t)d->ip * unit + q;
}

/* A whole header value that is one decimal number, as ms (> 0) or -1. */
static int64_t parse_number_ms(const char *value, int64_t ms_per_unit)
{
    const char *p, *end;
    decimal d;
    int64_t v;
    if (!value)
        return -1;
    trim(value, &p, &end);
    if (!read_decimal(&p, end, &d) || p != end)
        return -1;
    v = scale_decimal(&d, ms_per_unit, ABSURD_MS);
    if (v < 0)
        return ABSURD_MS;           /* above the limit: saturate */
    return v > 0 ? v : -1;
}

/* ------------------------------------------------------------------ */
/* HTTP-date (RFC 9110 §5.6.7)                                         */
/* ------------------------------------------------------------------ */

static const char *const wkday_short[7] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
static const char *const wkday_long[7] = {"Monday", "Tuesday", "Wednesday", "Thursday",
                                          "Friday", "Saturday", "Sunday"};
static const char *const month_names[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

static int is_leap(int64_t y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int days_in_month(int64_t y, int m)
{
    static const int dim[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m == 2 && is_leap(y) ? 29 : dim[m - 1];
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
 * algorithm): no timegm(), no TZ, no locale. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    int64_t era, yoe, doy, doe;
    y -= m <= 2;
    era = (y >= 0 ? y : y - 399) / 400;
    yoe = y - era * 400;
    doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* The civil year containing day z (days since 1970-01-01). */
static int64_t year_from_days(int64_t z)
{
    int64_t era, doe, yoe, doy, mp;
    z += 719468;
    era = (z >= 0 ? z : z - 146096) / 146097;
    doe = z - era * 146097;
    yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    mp = (5 * doy + 2) / 153;
    return yoe + era * 400 + (mp >= 10);
}

/* RFC 9110 §5.6.7: a two-digit year more than 50 years in the future is
 * the most recent past year with those digits. Read as the sliding window
 * (now-50, now+50], compared by year. */
static int64_t expand_two_digit_year(int yy, int64_t now_unix_ms)
{
    int64_t days = now_unix_ms / MS_PER_DAY - (now_unix_ms % MS_PER_DAY < 0);
    int64_t now_year = year_from_days(days);
    int64_t y = now_year - ((now_year % 100) + 100) % 100 + yy;
    if (y > now_year + 50)
        y -= 100;
    else if (y <= now_year - 50)
        y += 100;
    return y;
}

static int parse_time(const char **p, const char *end, int *h, int *mi, int *s)
{
    return digits(p, end, 2, h) && lit(p, end, ":") && digits(p, end, 2, mi) &&
           lit(p, end, ":") && digits(p, end, 2, s);
}

/* Unix ms of an HTTP-date in any of its three forms, or -1. The weekday
 * must be a real name but is not checked against the date, as in most
 * HTTP stacks. Names are case-sensitive ("HTTP-date is case sensitive"). */
static int64_t parse_http_date(const char *p, const char *end, int64_t now_unix_ms)
{
    int day, mon, hh, mm, ss, yv;
    int64_t year;

    if (match_name(&p, end, wkday_long, 7) >= 0) {
        /* rfc850-date: Sunday, 06-Nov-94 08:49:37 GMT */
        if (!lit(&p, end, ", ") || !digits(&p, end, 2, &day) || !lit(&p, end, "-") ||
            (mon = match_name(&p, end, month_names, 12)) < 0 || !lit(&p, end, "-") ||
            !digits(&p, end, 2, &yv) || !lit(&p, end, " ") || !parse_time(&p, end, &hh, &mm, &ss) ||
            !lit(&p, end, " GMT"))
            return -1;
        year = expand_two_digit_year(yv, now_unix_ms);
    } else if (match_name(&p, end, wkday_short, 7) >= 0) {
        if (lit(&p, end, ", ")) {
            /* IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT */
            if (!digits(&p, end, 2, &day) || !lit(&p, end, " ") ||
                (mon = match_name(&p, end, month_names, 12)) < 0 || !lit(&p, end, " ") ||
                !digits(&p, end, 4, &yv) || !lit(&p, end, " ") ||
                !parse_time(&p, end, &hh, &mm, &ss) || !lit(&p, end, " GMT"))
                return -1;
        } else {
            /* asctime-date: Sun Nov  6 08:49:37 1994 */
            if (!lit(&p, end, " ") || (mon = match_name(&p, end, month_names, 12)) < 0 ||
                !lit(&p, end, " ") ||
                !(lit(&p, end, " ") ? digits(&p, end, 1, &day) : digits(&p, end, 2, &day)) ||
                !lit(&p, end, " ") || !parse_time(&p, end, &hh, &mm, &ss) ||
                !lit(&p, end, " ") || !digits(&p, end, 4, &yv))
                return -1;
        }
        year = yv;
    } else {
        return -1;
    }
    if (p != end)
        return -1;
    mon += 1;
    /* second 60 is a leap second (RFC 9110 time-of-day allows it). */
    if (year < 1970 || year > 9999 || day < 1 || day > days_in_month(year, mon) || hh > 23 ||
        mm > 59 || ss > 60)
        return -1;
    return ((days_from_civil(year, mon, day) * 24 + hh) * 60 + mm) * 60000 + (int64_t)ss * 1000;
}

/* ------------------------------------------------------------------ */
/* Public parsers                                                      */
/* ------------------------------------------------------------------ */

int64_t llmretry_parse_retry_after(const char *value, int64_t now_unix_ms)
{
    const char *p, *end;
    int64_t at;
    if (!value)
        return -1;
    trim(value, &p, &end);
    if (p < end && is_digit(*p))
        return parse_number_ms(value, 1000);
    at = parse_http_date(p, end, now_unix_ms);
    /* at - now cannot overflow once now is known to be within ABSURD of at. */
    if (at < 0 || now_unix_ms >= at)
        return -1;
    if (now_unix_ms < at - ABSURD_MS)
        return ABSURD_MS;
    return at - now_unix_ms;
}

int64_t llmretry_parse_retry_after_ms(const char *value)
{
    return parse_number_ms(value, 1);
}

/* A Go time.Duration unit, in ns; 0 when unknown. Two-letter units first
 * so "ms" is not read as "m". */
static int64_t read_unit(const char **p, const char *end)
{
    static const struct { const char *name; int64_t ns; } units[] = {
        {"ns", 1}, {"us", 1000}, {"\xc2\xb5s", 1000} /* U+00B5 */, {"\xce\xbcs", 1000} /* U+03BC */,
        {"ms", 1000000}, {"s", INT64_C(1000000000)}, {"m", INT64_C(60000000000)},
        {"h", INT64_C(3600000000000)},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (lit(p, end, units[i].name))
            return units[i].ns;
    return 0;
}

int64_t llmretry_parse_reset_duration(const char *value)
{
    const char *p, *end;
    int64_t ns = 0;
    if (!value)
        return -1;
    trim(value, &p, &end);
    if (p == end)
        return -1;
    while (p < end) {
        decimal d;
        int64_t unit, v;
        if (!read_decimal(&p, end, &d) || (unit = read_unit(&p, end)) == 0)
            return -1;
        /* Too big to add up: saturated, once the rest is known to parse. */
        if (ns < ABSURD_NS && (v = scale_decimal(&d, unit, ABSURD_NS - ns)) >= 0)
            ns += v;
        else
            ns = ABSURD_NS;
    }
    /* Sub-millisecond waits round up so "250us" still waits. */
    return ns > 0 ? (ns + 999999) / 1000000 : -1;
}

/* ------------------------------------------------------------------ */
/* Backoff, statuses, timeouts                                         */
/* ------------------------------------------------------------------ */

/* floor(u01 * x) with u01 clamped into [0, 1), so the result is in [0, x). */
static int64_t scale_random(int64_t x, double u01)
{
    double v;
    if (x <= 0 || !(u01 > 0.0)) /* also catches NaN */
        return 0;
    v = u01 * (double)x;
    if (!(v < (double)x))
        return x - 1;
    return (int64_t)v;
}

int64_t llmretry_backoff_ms(llmretry_jitter jitter, int64_t base_ms, int64_t cap_ms, int n,
                            double u01)
{
    int64_t exp, add;
    if (base_ms < 0)
        base_ms = 0;
    if (cap_ms < 0)
        cap_ms = 0;
    /* Doubling stops at the cap, so any n costs at most 63 steps. */
    exp = base_ms < cap_ms ? base_ms : cap_ms;
    for (int i = 0; i < n && exp > 0 && exp < cap_ms; i++)
        exp = exp > cap_ms / 2 ? cap_ms : exp * 2;
    switch (jitter) {
    case LLMRETRY_JITTER_FULL:
        return scale_random(exp, u01);
    case LLMRETRY_JITTER_NONE:
        return exp;
    case LLMRETRY_JITTER_ADDITIVE:
    default:
        add = scale_random(base_ms, u01);
        return exp > INT64_MAX - add ? INT64_MAX : exp + add;
    }
}

int llmretry_status_retryable(const llmretry_options *o, int status)
{
    if (o && o->n_retry_statuses > 0) {
        size_t n = o->n_retry_statuses < LLMRETRY_MAX_STATUSES ? o->n_retry_statuses
                                                               : LLMRETRY_MAX_STATUSES;
        for (size_t i = 0; i < n; i++)
            if (o->retry_statuses[i] == status)
                return 1;
        return 0;
    }
    return status == 408 || status == 429 ||
           (status >= 500 && status <= 599 && status != 501 && status != 505);
}

/* A deadline already passed gives 0: the engine must not start an attempt. */
int64_t llmretry_attempt_timeout_ms(int64_t timeout_ms, int64_t deadline_left_ms)
{
    if (deadline_left_ms == LLMRETRY_NO_DEADLINE)
        return timeout_ms;
    if (deadline_left_ms < 0)
        deadline_left_ms = 0;
    return timeout_ms < deadline_left_ms ? timeout_ms : deadline_left_ms;
}

/* ------------------------------------------------------------------ */
/* The decision                                                        */
/* ------------------------------------------------------------------ */

static int ieq(const char *p, const char *end, const char *s)
{
    size_t n = strlen(s);
    if ((size_t)(end - p) != n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i] >= 'A' && p[i] <= 'Z' ? (char)(p[i] - 'A' + 'a') : p[i];
        if (c != s[i])
            return 0;
    }
    return 1;
}

/* x-should-retry: 1, 0, or -1 when absent or not a boolean. */
static int should_retry(const char *v)
{
    const char *p, *end;
    if (!v)
        return -1;
    trim(v, &p, &end);
    if (ieq(p, end, "true"))
        return 1;
    if (ieq(p, end, "false"))
        return 0;
    return -1;
}

static llmretry_decision stop(llmretry_decision d, llmretry_giveup_reason why)
{
    d.retry = 0;
    d.reason = why;
    return d;
}

/* Rules 1-7 of docs/reliability.md, first match wins. Precedence choices:
 * - DEADLINE_EXCEEDED joins rule 1: nothing can follow it, and "deadline"
 *   tells the caller which budget to raise.
 * - Rule 5 comes before 6: with no attempts left the reason is
 *   retries_exhausted even when the server asked for a too-long wait,
 *   because we would not have retried anyway.
 * - Rule 6 comes before 7: a too-long server wait reports
 *   retry_after_too_long even if it also passes the deadline.
 * retry_after_ms is filled whatever the outcome so the final error can say
 * what the server asked for; delay_ms/delay_source are filled once computed
 * (rules 6-7), else 0/backoff. */
llmretry_decision llmretry_decide(const llmretry_options *o, const llmretry_failure *f,
                                  int attempt, int64_t now_unix_ms, int64_t deadline_left_ms,
                                  double u01)
{
    llmretry_decision d = {0, 0, LLMRETRY_DELAY_BACKOFF, LLMRETRY_REASON_NONE, -1};
    llmretry_options defaults;
    int retryable, sr;
    int64_t server = -1;

    if (!o) {
        llmretry_options_defaults(&defaults);
        o = &defaults;
    }
    if (!f)
        return stop(d, LLMRETRY_REASON_NOT_RETRYABLE);

    d.retry_after_ms = llmretry_parse_retry_after_ms(f->retry_after_ms);
    if (d.retry_after_ms < 0)
        d.retry_after_ms = llmretry_parse_retry_after(f->retry_after, now_unix_ms);

    /* 1 */
    if (f->kind == LLMRETRY_ERR_CANCELLED)
        return stop(d, LLMRETRY_REASON_CANCELLED);
    if (f->fatal || f->kind == LLMRETRY_ERR_RESPONSE_TOO_LARGE)
        return stop(d, LLMRETRY_REASON_NOT_RETRYABLE);
    if (f->kind == LLMRETRY_ERR_DEADLINE_EXCEEDED)
        return stop(d, LLMRETRY_REASON_DEADLINE);
    /* 2 */
    if (o->retry_mode == LLMRETRY_RETRY_UNSAFE && !f->never_connected)
        return stop(d, LLMRETRY_REASON_UNSAFE_MODE);
    /* 3 */
    if (f->status == 429 && f->error_code && strcmp(f->error_code, "insufficient_quota") == 0)
        return stop(d, LLMRETRY_REASON_NOT_RETRYABLE);
    /* 4, 5: whenever the server sent x-should-retry it decides, whatever
     * the kind of failure. */
    sr = should_retry(f->should_retry);
    switch (f->kind) {
    case LLMRETRY_ERR_TIMEOUT: case LLMRETRY_ERR_NETWORK: retryable = 1; break;
    case LLMRETRY_ERR_HTTP_STATUS: retryable = llmretry_status_retryable(o, f->status); break;
    case LLMRETRY_ERR_INVALID_RESPONSE: retryable = o->retry_invalid_response != 0; break;
    default: retryable = 0; break;
    }
    if (sr >= 0)
        retryable = sr;
    if (!retryable)
        return stop(d, LLMRETRY_REASON_NOT_RETRYABLE);
    if (attempt >= o->max_retries)
        return stop(d, LLMRETRY_REASON_RETRIES_EXHAUSTED);
    /* 6 */
    if (d.retry_after_ms > 0) {
        server = d.retry_after_ms;
        d.delay_source = LLMRETRY_DELAY_RETRY_AFTER;
    } else if (f->status == 429) {
        /* Either limit may be the one hit: wait for the later reset. */
        int64_t req = llmretry_parse_reset_duration(f->ratelimit_reset_requests);
        int64_t tok = llmretry_parse_reset_duration(f->ratelimit_reset_tokens);
        server = req > tok ? req : tok;
        if (server > 0)
            d.delay_source = LLMRETRY_DELAY_RATELIMIT_RESET;
    }
    if (server > 0) {
        d.delay_ms = server;
        if (server > o->max_retry_after_ms)
            return stop(d, LLMRETRY_REASON_RETRY_AFTER_TOO_LONG);
    } else {
        d.delay_ms = llmretry_backoff_ms(o->jitter, o->base_delay_ms, o->max_delay_ms,
                                         attempt > 0 ? attempt : 0, u01);
    }
    /* 7: waiting until (or past) the deadline could only end in a
     * deadline error, so stop now with the last real error. */
    if (deadline_left_ms != LLMRETRY_NO_DEADLINE && d.delay_ms >= deadline_left_ms)
        return stop(d, LLMRETRY_REASON_DEADLINE);
    d.retry = 1;
    return d;
}
