/* json_pull.h — strict JSON (RFC 8259) read in place, one value at a time,
 * in the manner of hiredis's read.c: no allocation, no tree, the caller
 * pulls what it wants (a string's span, a number's value) and skips the
 * rest. Pure, private to the core; schema_text.c validates an answer with
 * it without building the answer (fuzzed: tests/fuzz/fuzz_schema_text.c).
 *
 * Strict where cJSON is lenient, as every host's parser (Python's json,
 * the Lua bindings' decoder) is: only space, tab, LF and CR are blanks;
 * numbers are -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? ("01", "1.",
 * ".5" and "+1" are not); no raw control characters in strings; escapes
 * as RFC 8259 says, surrogates paired; raw bytes valid UTF-8 (no overlong
 * forms, no surrogates, nothing past U+10FFFF); no byte-order mark.
 * Nesting stops at LR_JP_MAX_DEPTH containers, cJSON's limit. */
#ifndef LLMRETRY_JSON_PULL_H
#define LLMRETRY_JSON_PULL_H

#include <stddef.h>
#pragma GCC visibility push(hidden)

#define LR_JP_MAX_DEPTH 1000

typedef struct lr_jp {
    const char *p;                 /* the next byte to read */
    const char *end;               /* one past the text */
    int depth;                     /* containers open */
    int max_depth;                 /* the most open at once so far */
} lr_jp;

/* A string as it stands in the text (between its quotes, escapes kept). */
typedef struct lr_jp_str {
    const char *raw;
    size_t len;
    size_t cps;                    /* its code points, up to a first \u0000 */
    int escaped;                   /* it holds an escape: raw is not its value */
} lr_jp_str;

/* The length of the UTF-8 sequence at s (n bytes left), 0 when invalid
 * (RFC 3629: no overlong forms, surrogates or code points above U+10FFFF,
 * as Python's decoder sees them). The one rule for every byte the core
 * calls UTF-8: strings read here, a 2xx body, an error's text. */
size_t lr_utf8_seq(const unsigned char *s, size_t n);

static inline void lr_jp_init(lr_jp *j, const char *text, size_t len)
{
    j->p = text;
    j->end = text + len;
    j->depth = 0;
    j->max_depth = 0;
}

static inline void lr_jp_ws(lr_jp *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
}

/* The next byte ('\0' at the end: no value starts with it). */
static inline char lr_jp_peek(const lr_jp *j)
{
    return j->p < j->end ? *j->p : '\0';
}

/* Each reads the value at p (blanks already skipped) and moves past it:
 * 0, or -1 when the text is not JSON there. */
int lr_jp_string(lr_jp *j, lr_jp_str *s);          /* p at '"' */
int lr_jp_number(lr_jp *j, double *d);             /* p at '-' or a digit; d NULL: checked only */
/* true, false or null: 1, 0 (true/false) or 2 (null) in *what. */
int lr_jp_literal(lr_jp *j, int *what);
/* Any value, containers and all, checked and not kept. */
int lr_jp_skip(lr_jp *j);
/* Into a container: p at '{' or '[' (-1 past LR_JP_MAX_DEPTH). */
int lr_jp_enter(lr_jp *j);
/* Out of a container: p at its closing '}' or ']'. */
static inline void lr_jp_leave(lr_jp *j)
{
    j->p++;
    j->depth--;
}
/* An object member's key and its colon, p at the key: 0 with the key in
 * *key and p at the value (blanks skipped). */
int lr_jp_member_key(lr_jp *j, lr_jp_str *key);

/* A string's value (escapes decoded) into out, NUL-terminated: at most
 * cap - 1 bytes of it, up to its first U+0000 (the value a C string holds,
 * as cJSON's valuestring does). Returns the length of that value (which
 * may be more than cap - 1: then out holds its start). The string must
 * have been read by lr_jp_string. */
size_t lr_jp_decode(const lr_jp_str *s, char *out, size_t cap);
/* All of a checked string's UTF-8, a \u0000 included (as a NUL byte), into
 * out, which holds s->len bytes (no escape is shorter than what it stands
 * for); its length. For hosts whose strings may hold NULs. */
size_t lr_jp_unescape(const lr_jp_str *s, char *out);

#pragma GCC visibility pop
#endif
