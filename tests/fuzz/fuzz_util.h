/* What every fuzz target needs: a loud abort on a broken invariant, and
 * the input copied to a buffer of exactly its size (so ASan sees any read
 * past it; libFuzzer's own buffer may be larger). */
#ifndef LLMRETRY_FUZZ_UTIL_H
#define LLMRETRY_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "invariant broken: %s\n", what);
    abort();
}

static char *copy(const uint8_t *data, size_t n)
{
    char *p = malloc(n ? n : 1);
    if (!p)
        abort();
    if (n)
        memcpy(p, data, n);
    return p;
}

#endif
