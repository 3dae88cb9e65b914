/* Clocks, randomness and request ids. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <sys/random.h>    /* getentropy */
#endif
#include <time.h>

int64_t lr_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t lr_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* getentropy: the kernel's CSPRNG on Linux (glibc 2.25+), macOS and the
 * BSDs alike, at most 256 bytes a call. */
static int fill_random(void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len > 0) {
        size_t n = len < 256 ? len : 256;
        if (getentropy(p, n) != 0)
            return -1;      /* callers fall back, never block */
        p += n;
        len -= n;
    }
    return 0;
}

llmretry_status llmretry_uuid4(char out[37])
{
    return out && lr_uuid4(out) == 0 ? LLMRETRY_OK : LLMRETRY_EINTERNAL;
}

/* Random bytes for ids, taken from the kernel 256 at a time: one
 * getentropy() per 16 ids instead of a system call per call. Each thread
 * has its own; a fork's child (llmretry_fork_generation) drops what it
 * inherited, so parent and child never hand out the same bytes. */
static _Thread_local struct {
    unsigned char bytes[256];
    size_t left;                    /* unused, at the end of bytes */
    unsigned fork_generation;
} id_pool;

static int random_for_id(unsigned char *out, size_t len)
{
    unsigned gen = llmretry_fork_generation();
    if (id_pool.left < len || id_pool.fork_generation != gen) {
        if (fill_random(id_pool.bytes, sizeof id_pool.bytes) != 0)
            return -1;
        id_pool.left = sizeof id_pool.bytes;
        id_pool.fork_generation = gen;
    }
    unsigned char *p = id_pool.bytes + sizeof id_pool.bytes - id_pool.left;
    memcpy(out, p, len);
    explicit_bzero(p, len);         /* handed out once */
    id_pool.left -= len;
    return 0;
}

int lr_uuid4(char out[37])
{
    unsigned char b[16];
    if (random_for_id(b, sizeof b) != 0)
        return -1;
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);   /* version 4 */
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);   /* RFC 4122 variant */
    static const char hex[] = "0123456789abcdef";
    char *o = out;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *o++ = '-';
        *o++ = hex[b[i] >> 4];
        *o++ = hex[b[i] & 15];
    }
    *o = '\0';
    return 0;
}

uint64_t lr_rng_seed(void)
{
    uint64_t s = 0;
    if (fill_random(&s, sizeof s) != 0 || s == 0)
        s = (uint64_t)lr_mono_ms() * 0x9E3779B97F4A7C15ull + 1;
    return s;
}

double lr_rng_next01(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    /* 53 random bits give a uniform double in [0, 1). */
    return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

char *lr_strdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

char *lr_printf_alloc(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return lr_strdup(buf);
}

char *lr_strndup(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* Append n bytes, keeping a NUL after them. Allocates even for n == 0, so
 * data != NULL records that the field came (content "" is not null). */
int lr_buf_add(lr_buf *b, const char *s, size_t n)
{
    if (!b->data || b->cap - b->len <= n) {
        if (n > SIZE_MAX / 2 - b->len)
            return -1;
        size_t cap = b->cap ? b->cap : 16;
        while (cap <= b->len + n)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

void lr_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void llmretry_free(void *p)
{
    free(p);
}
