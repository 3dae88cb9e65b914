/* Strict JSON read in place (json_pull.h): strings, numbers, literals,
 * whole values skipped. Pure, allocation-free; every read is bounded by
 * the text's end (the text need not be NUL-terminated). */
#include "json_pull.h"

#include <locale.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int hex4(const unsigned char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if ((c | 32) >= 'a' && (c | 32) <= 'f') d = (c | 32) - 'a' + 10;
        else return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

/* A \u escape at p (p at the 'u'), a surrogate pair taken whole: its code
 * point and the bytes it spans, or 0 when malformed. */
static size_t unicode_escape(const unsigned char *p, const unsigned char *end, unsigned *cp)
{
    unsigned u, lo;
    if (end - p < 5 || hex4(p + 1, &u) != 0)
        return 0;
    if (u >= 0xDC00 && u <= 0xDFFF)
        return 0;                  /* a low surrogate alone */
    if (u < 0xD800 || u > 0xDBFF) {
        *cp = u;
        return 5;
    }
    if (end - p < 11 || p[5] != '\\' || p[6] != 'u' || hex4(p + 7, &lo) != 0 ||
        lo < 0xDC00 || lo > 0xDFFF)
        return 0;
    *cp = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
    return 11;
}

/* Length of the UTF-8 sequence at s (n bytes left), 0 when invalid:
 * overlong forms, surrogates and code points above U+10FFFF included
 * (RFC 3629), as Python's decoder sees them. */
size_t lr_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;              /* no UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

int lr_jp_string(lr_jp *j, lr_jp_str *s)
{
    const unsigned char *p = (const unsigned char *)j->p + 1;
    const unsigned char *end = (const unsigned char *)j->end;
    size_t cps = 0;
    int escaped = 0, cut = 0;      /* cut: a \u0000 was met, count no more */
    s->raw = (const char *)p;
    for (;;) {
        const unsigned char *run = p;
        /* Eight bytes at a time while none is special (a control byte, a
         * quote, a backslash or a byte of a multi-byte character): each
         * term sets a byte's high bit when it may be one (a borrow may
         * set it for a plain byte too: then the byte loop looks). */
        while (end - p >= 8) {
            uint64_t x;
            memcpy(&x, p, 8);
            const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
            uint64_t quote = x ^ (ones * '"'), slash = x ^ (ones * '\\');
            uint64_t special = ((x - ones * 0x20) | (quote - ones) | (slash - ones) | x) & highs;
            if (special) {
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                /* The first flagged byte is special (a borrow only flags
                 * bytes after one): straight to it. */
                p += __builtin_ctzll(special) / 8;
#endif
                break;
            }
            p += 8;
        }
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
            p++;
        if (!cut)
            cps += (size_t)(p - run);
        if (p >= end)
            return -1;
        unsigned c = *p;
        if (c == '"')
            break;
        if (c < 0x20)
            return -1;
        size_t n;
        if (c == '\\') {
            escaped = 1;
            if (p + 1 >= end)
                return -1;
            switch (p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                n = 2;
                break;
            case 'u': {
                unsigned cp;
                if (!(n = unicode_escape(p + 1, end, &cp)))
                    return -1;
                n += 1;
                cut |= cp == 0;
                break;
            }
            default:
                return -1;
            }
        } else if (!(n = lr_utf8_seq(p, (size_t)(end - p)))) {
            return -1;
        }
        p += n;
        if (!cut)
            cps++;
    }
    s->len = (size_t)(p - (const unsigned char *)s->raw);
    s->cps = cps;
    s->escaped = escaped;
    j->p = (const char *)p + 1;
    return 0;
}

/* strtod with '.' whatever the locale (as cJSON does: a host may have set
 * LC_NUMERIC to a locale whose decimal point is ','). */
static double parse_double(const char *s, size_t n)
{
    char local[64], *buf = n < sizeof local ? local : malloc(n + 1);
    if (!buf)
        return 0.0 / 0.0;          /* NaN: no type, no range matches it */
    memcpy(buf, s, n);
    buf[n] = '\0';
    char point = localeconv()->decimal_point[0];
    if (point != '.')
        for (size_t i = 0; i < n; i++)
            if (buf[i] == '.')
                buf[i] = point;
    double d = strtod(buf, NULL);
    if (buf != local)
        free(buf);
    return d;
}

/* Most numbers in answers have few digits: their value is m * 10^e with m
 * and 10^|e| exact in a double (m < 2^53, |e| <= 22), and one multiply or
 * divide of exact doubles is rounded once, correctly: the double strtod
 * gives (Clinger's fast path), without its cost. -1 for the others. The
 * number [digits, end) is already known to be well-formed. */
static int fast_double(const char *digits, const char *end, int neg, double *d)
{
    static const double POW10[] = {
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
        1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
    };
    uint64_t m = 0;
    int n_digits = 0, frac = 0, in_frac = 0;
    const char *p = digits;
    for (; p < end && *p != 'e' && *p != 'E'; p++) {
        if (*p == '.') {
            in_frac = 1;
            continue;
        }
        if (m == 0 && *p == '0') {     /* leading zeros add no digit */
            frac += in_frac;
            continue;
        }
        if (++n_digits > 15)
            return -1;
        m = m * 10 + (uint64_t)(*p - '0');
        frac += in_frac;
    }
    long e = 0;
    if (p < end) {                     /* the exponent */
        int eneg = *++p == '-';
        p += *p == '-' || *p == '+';
        for (; p < end; p++) {
            e = e * 10 + (*p - '0');
            if (e > 1000)
                return -1;
        }
        e = eneg ? -e : e;
    }
    e -= frac;
    double v = (double)m;
    if (m == 0)
        v = 0.0;
    else if (e >= 0 && e <= 22)
        v *= POW10[e];
    else if (e < 0 && e >= -22)
        v /= POW10[-e];
    else
        return -1;
    *d = neg ? -v : v;
    return 0;
}

int lr_jp_number(lr_jp *j, double *d)
{
    const char *s = j->p, *p = s, *end = j->end;
    int neg = p < end && *p == '-';
    p += neg;
    const char *digits = p;
    if (p < end && *p == '0')
        p++;
    else if (p < end && *p >= '1' && *p <= '9')
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    else
        return -1;
    if (p < end && *p == '.') {
        const char *f = ++p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == f)
            return -1;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        const char *e = p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == e)
            return -1;
    }
    if (d && fast_double(digits, p, neg, d) != 0)
        *d = parse_double(s, (size_t)(p - s));
    j->p = p;
    return 0;
}

int lr_jp_literal(lr_jp *j, int *what)
{
    static const struct { const char *text; size_t len; int what; } LIT[] = {
        { "true", 4, 1 }, { "false", 5, 0 }, { "null", 4, 2 },
    };
    for (size_t i = 0; i < 3; i++)
        if ((size_t)(j->end - j->p) >= LIT[i].len && memcmp(j->p, LIT[i].text, LIT[i].len) == 0) {
            j->p += LIT[i].len;
            *what = LIT[i].what;
            return 0;
        }
    return -1;
}

int lr_jp_enter(lr_jp *j)
{
    if (j->depth >= LR_JP_MAX_DEPTH)
        return -1;
    if (++j->depth > j->max_depth)
        j->max_depth = j->depth;
    j->p++;
    return 0;
}

/* A scalar at p: read and dropped. */
static int skip_scalar(lr_jp *j)
{
    char c = lr_jp_peek(j);
    if (c == '"') {
        lr_jp_str s;
        return lr_jp_string(j, &s);
    }
    if (c == '-' || (c >= '0' && c <= '9'))
        return lr_jp_number(j, NULL);
    int what;
    return lr_jp_literal(j, &what);
}

int lr_jp_member_key(lr_jp *j, lr_jp_str *key)
{
    if (lr_jp_peek(j) != '"' || lr_jp_string(j, key) != 0)
        return -1;
    lr_jp_ws(j);
    if (lr_jp_peek(j) != ':')
        return -1;
    j->p++;
    lr_jp_ws(j);
    return 0;
}

int lr_jp_skip(lr_jp *j)
{
    /* Iterative, so a deep value costs no stack: which containers are open
     * (above the caller's) is one bit each, set for an object. */
    unsigned char objects[(LR_JP_MAX_DEPTH + 7) / 8];
    const int base = j->depth;
    lr_jp_str key;                 /* a member's, not kept */
    lr_jp_ws(j);
    for (;;) {
        char c = lr_jp_peek(j);
        if (c == '{' || c == '[') {
            int level = j->depth - base;
            if (lr_jp_enter(j) != 0)
                return -1;
            if (c == '{')
                objects[level / 8] |= (unsigned char)(1u << (level % 8));
            else
                objects[level / 8] &= (unsigned char)~(1u << (level % 8));
            lr_jp_ws(j);
            if (lr_jp_peek(j) == (c == '{' ? '}' : ']')) {
                lr_jp_leave(j);
            } else {
                if (c == '{' && lr_jp_member_key(j, &key) != 0)
                    return -1;
                continue;          /* the first member's value */
            }
        } else if (skip_scalar(j) != 0) {
            return -1;
        }
        /* After a value: the container's next member, or its end. */
        for (;;) {
            if (j->depth == base)
                return 0;
            int level = j->depth - base - 1;
            int object = objects[level / 8] >> (level % 8) & 1;
            lr_jp_ws(j);
            c = lr_jp_peek(j);
            if (c == (object ? '}' : ']')) {
                lr_jp_leave(j);
                continue;
            }
            if (c != ',')
                return -1;
            j->p++;
            lr_jp_ws(j);
            if (object && lr_jp_member_key(j, &key) != 0)
                return -1;
            break;
        }
    }
}

/* The UTF-8 a string stands for, into out (cap bytes: what does not fit
 * is counted, not written). A \u0000 ends it where C strings are wanted
 * (nul_ends); otherwise it is one byte like any other. */
static size_t unescape(const lr_jp_str *s, char *out, size_t cap, int nul_ends)
{
    const unsigned char *p = (const unsigned char *)s->raw, *end = p + s->len;
    size_t n = 0;
#define PUT(b) do { if (n + 1 < cap) out[n] = (char)(b); n++; } while (0)
    while (p < end) {
        unsigned c = *p;
        if (c != '\\') {
            PUT(c);
            p++;
            continue;
        }
        unsigned cp;
        switch (p[1]) {
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': break;
        default: cp = p[1]; break;   /* " \ / */
        }
        if (p[1] != 'u') {
            PUT(cp);
            p += 2;
            continue;
        }
        p += 1 + unicode_escape(p + 1, end, &cp);
        if (cp == 0 && nul_ends)
            break;                     /* where a C string ends */
        if (cp < 0x80) {
            PUT(cp);
        } else if (cp < 0x800) {
            PUT(0xC0 | cp >> 6);
            PUT(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            PUT(0xE0 | cp >> 12);
            PUT(0x80 | (cp >> 6 & 0x3F));
            PUT(0x80 | (cp & 0x3F));
        } else {
            PUT(0xF0 | cp >> 18);
            PUT(0x80 | (cp >> 12 & 0x3F));
            PUT(0x80 | (cp >> 6 & 0x3F));
            PUT(0x80 | (cp & 0x3F));
        }
    }
#undef PUT
    return n;
}

size_t lr_jp_decode(const lr_jp_str *s, char *out, size_t cap)
{
    size_t n = unescape(s, out, cap, 1);
    if (cap)
        out[n < cap ? n : cap - 1] = '\0';
    return n;
}

size_t lr_jp_unescape(const lr_jp_str *s, char *out)
{
    return unescape(s, out, s->len, 0);
}
