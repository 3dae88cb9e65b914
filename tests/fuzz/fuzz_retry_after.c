/* libFuzzer target: the Retry-After / retry-after-ms / x-ratelimit-reset-*
 * parsers of policy.c on arbitrary header values.
 *
 * Invariants: every parser returns -1 or a wait in (0, 1e12] ms, never
 * reads past the value's NUL, and never overflows (UBSan). The HTTP-date
 * path is run both at a fixed "now" and at a "now" taken from the input
 * (any int64, including the extremes), since the two-digit-year window and
 * the at - now subtraction depend on it. Build: tools/fuzz.sh. */
#include "llmretry.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ABSURD_MS INT64_C(1000000000000)
/* 2023-11-14T22:13:20Z: a realistic wall clock. */
#define FIXED_NOW INT64_C(1700000000000)

static void check(const char *what, const char *value, int64_t now, int64_t r)
{
    if (r == -1 || (r > 0 && r <= ABSURD_MS))
        return;
    fprintf(stderr, "%s(\"%s\", now=%lld) = %lld: not -1 nor in (0, 1e12]\n", what, value,
            (long long)now, (long long)r);
    abort();
}

/* The value as an exact-size NUL-terminated heap copy, so ASan sees any
 * read past the terminator. */
static char *cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *v = cstr(data, size);
    check("parse_retry_after", v, FIXED_NOW, llmretry_parse_retry_after(v, FIXED_NOW));
    check("parse_retry_after", v, 0, llmretry_parse_retry_after(v, 0));
    check("parse_retry_after_ms", v, 0, llmretry_parse_retry_after_ms(v));
    check("parse_reset_duration", v, 0, llmretry_parse_reset_duration(v));
    free(v);

    /* First 8 bytes: a clock; the rest: the value. */
    if (size >= 8) {
        uint64_t u = 0;
        for (int i = 0; i < 8; i++)
            u = u << 8 | data[i];
        int64_t now;
        memcpy(&now, &u, sizeof now);
        char *w = cstr(data + 8, size - 8);
        check("parse_retry_after", w, now, llmretry_parse_retry_after(w, now));
        free(w);
    }

    /* NULL is a documented input ("absent header"). */
    if (size == 0) {
        check("parse_retry_after", "(null)", FIXED_NOW, llmretry_parse_retry_after(NULL, FIXED_NOW));
        check("parse_retry_after_ms", "(null)", 0, llmretry_parse_retry_after_ms(NULL));
        check("parse_reset_duration", "(null)", 0, llmretry_parse_reset_duration(NULL));
    }
    return 0;
}
