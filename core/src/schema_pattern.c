/* JSON Schema's pattern (ECMA-262 syntax) as a POSIX extended regular
 * expression: the common escapes translated, the rest refused by name
 * (schema.h says which). Pure. */
#include "schema_tree.h"

#include <stdio.h>
#include <stdlib.h>

#define LR_PATTERN_MAX 1024
#define LR_PATTERN_MAX_TEXT "1024"
#define LR_REPEAT_MAX 255
#define LR_REPEAT_MAX_TEXT "255"

/* Is p an interval, {n}, {n,} or {n,m}? 1 (its length in *len), 0 when
 * not one, -1 when a count is above LR_REPEAT_MAX (regcomp would build
 * that many copies). */
static int interval(const char *p, size_t *len)
{
    size_t i = 1;
    long n = 0, m = 0;
    int digits = 0, comma = 0, too_big = 0;
    for (; p[i] && p[i] != '}'; i++) {
        if (p[i] == ',' && !comma && digits) {
            comma = 1;
            continue;
        }
        if (p[i] < '0' || p[i] > '9')
            return 0;
        long *v = comma ? &m : &n;
        *v = *v * 10 + (p[i] - '0');
        too_big |= *v > LR_REPEAT_MAX;
        if (*v > LR_REPEAT_MAX)
            *v = LR_REPEAT_MAX + 1;
        digits = 1;
    }
    if (p[i] != '}' || !digits)
        return 0;
    if (len)
        *len = i + 1;
    return too_big ? -1 : 1;
}

/* ECMA-262's common escapes to POSIX ERE (schema.h). 0, or -1 with *why. */
static int translate_pattern(const char *p, char *out, size_t cap, const char **why)
{
    size_t o = 0;
    int in_bracket = 0;
    /* After a quantifier: a '?' makes it lazy (dropped: the same matches
     * exist, greedy), another quantifier is refused (ECMA refuses a** too,
     * and glibc's regcomp takes exponential time over a run of them). */
    int after_quant = 0;
    if (strlen(p) > LR_PATTERN_MAX) {
        *why = "longer than " LR_PATTERN_MAX_TEXT " bytes";
        return -1;
    }
#define PUT(str, len) do { size_t l_ = (len); if (o + l_ + 1 > cap) { *why = "too long"; \
        return -1; } memcpy(out + o, (str), l_); o += l_; } while (0)
    for (size_t i = 0; p[i]; i++) {
        char c = p[i];
        int quant = !in_bracket && (c == '*' || c == '+' || c == '?' ||
                                    (c == '{' && interval(p + i, NULL)));
        if (quant && after_quant) {
            if (c != '?' || after_quant == 2) {
                *why = "a quantifier follows a quantifier";
                return -1;
            }
            after_quant = 2;           /* lazy */
            continue;
        }
        after_quant = 0;
        if (quant && c == '{') {
            size_t len = 0;
            if (interval(p + i, &len) < 0) {
                *why = "a repetition count above " LR_REPEAT_MAX_TEXT;
                return -1;
            }
            PUT(p + i, len);
            i += len - 1;
            after_quant = 1;
            continue;
        }
        if (quant) {
            PUT(&c, 1);
            after_quant = 1;
            continue;
        }
        if (c == '\\') {
            char e = p[++i];
            char lit[3] = { e, 0, 0 };
            const char *rep = NULL;
            if (e == 'n' || e == 't' || e == 'r') {
                lit[0] = e == 'n' ? '\n' : e == 't' ? '\t' : '\r';
                rep = lit;
            } else if (in_bracket) {
                /* Inside POSIX brackets a backslash is itself: classes
                 * become their ranges, punctuation is literal as is. */
                rep = e == 'd' ? "0-9" : e == 'w' ? "A-Za-z0-9_" : e == 's' ? "[:space:]"
                    : e && strchr(".*+?(){}|$/[", e) ? lit : NULL;
            } else {
                rep = e == 'd' ? "[0-9]" : e == 'D' ? "[^0-9]" : e == 'w' ? "[A-Za-z0-9_]"
                    : e == 'W' ? "[^A-Za-z0-9_]" : e == 's' ? "[[:space:]]"
                    : e == 'S' ? "[^[:space:]]" : NULL;
                if (!rep && e && strchr("-]/", e)) {
                    rep = lit;                      /* not special in ERE */
                } else if (!rep && e && strchr(".*+?(){}|$[^\\", e)) {
                    lit[0] = '\\';
                    lit[1] = e;
                    rep = lit;
                }
            }
            if (!e) {
                *why = "it ends with a lone backslash";
                return -1;
            }
            if (!rep) {
                *why = in_bracket ? "it uses an escape inside [...] that POSIX has no equivalent for"
                                  : "it uses an escape POSIX has no equivalent for (\\b, \\u, \\x, ...)";
                return -1;
            }
            PUT(rep, strlen(rep));
            continue;
        }
        if (in_bracket) {
            if (c == ']') {
                in_bracket = 0;
            } else if (c == '[' && p[i + 1] == ':') {
                const char *end = strstr(p + i + 2, ":]");
                if (end) {             /* a POSIX class, [:alpha:], as it is */
                    size_t l = (size_t)(end + 2 - (p + i));
                    PUT(p + i, l);
                    i += l - 1;
                    continue;
                }
            }
            PUT(&c, 1);
            continue;
        }
        if (c == '[') {
            in_bracket = 1;
            PUT("[", 1);
            if (p[i + 1] == '^')
                PUT(&p[++i], 1);
            if (p[i + 1] == ']')          /* literal first ], as POSIX reads it */
                PUT(&p[++i], 1);
            continue;
        }
        if (c == '(' && p[i + 1] == '?') {
            if (p[i + 2] != ':') {
                *why = "look-arounds and named groups are not POSIX";
                return -1;
            }
            i += 2;                    /* (?:x) -> (x) */
        } else if (c == '{') {
            PUT("\\{", 2);            /* no interval: a literal, as ECMA reads it */
            continue;
        }
        PUT(&c, 1);
    }
#undef PUT
    if (in_bracket) {
        *why = "a [ is not closed";
        return -1;
    }
    out[o] = '\0';
    return 0;
}

int lr_schema_pattern_compile(regex_t *re, const char *pattern, char *why, size_t whylen)
{
    size_t cap = strlen(pattern) * 12 + 16;    /* \S becomes 12 bytes */
    char *ere = malloc(cap);
    if (!ere) {
        snprintf(why, whylen, "out of memory");
        return -1;
    }
    const char *reason = NULL;
    int rc = translate_pattern(pattern, ere, cap, &reason);
    if (rc != 0) {
        snprintf(why, whylen, "%s", reason);
    } else if ((rc = regcomp(re, ere, REG_EXTENDED | REG_NOSUB)) != 0) {
        char msg[96];
        regerror(rc, re, msg, sizeof msg);
        snprintf(why, whylen, "not a POSIX extended regular expression: %s", msg);
        rc = -1;
    }
    free(ere);
    return rc;
}
