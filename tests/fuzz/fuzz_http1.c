/* libFuzzer target for the HTTP/1.1 response parser (core/src/http1.c),
 * which reads what any server sends to an io_loop "host" engine: any
 * bytes, fed in pieces whose sizes come from the input too, must parse
 * without a crash, a leak or a read past what was given; the parser takes
 * no more than it is given, never hands on more body than it took, and
 * once it stops (done, error, aborted) takes nothing more. The same bytes
 * fed whole must end in the same state with the same body, and a body its
 * sink refuses is never complete. */
#include "http1.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t body, head;
    int refuse_after;       /* the body callback takes fewer bytes past this */
} sink;

static size_t on_head(char *d, size_t s, size_t n, void *ud)
{
    (void)d;
    ((sink *)ud)->head += s * n;
    return s * n;
}

static size_t on_body(char *d, size_t s, size_t n, void *ud)
{
    sink *k = ud;
    (void)d;
    if (k->refuse_after >= 0 && k->body + s * n > (size_t)k->refuse_after)
        return 0;
    k->body += s * n;
    return s * n;
}

static void run(const uint8_t *d, size_t n, const uint8_t *pieces, size_t np, int refuse,
                lr_http1 *p, sink *k)
{
    memset(k, 0, sizeof *k);
    k->refuse_after = refuse;
    lr_http1_init(p, on_head, on_body, k);
    size_t pos = 0, i = 0;
    while (pos < n) {
        size_t piece = np ? (size_t)pieces[i++ % np] + 1 : n - pos;
        if (piece > n - pos)
            piece = n - pos;
        lr_h1_state before = p->state;
        size_t took = lr_http1_feed(p, (const char *)d + pos, piece);
        if (took > piece)
            abort();
        if ((before == LR_H1_DONE || before == LR_H1_ERROR) && took != 0)
            abort();
        pos += took;
        if (took < piece)
            break;
    }
    if (k->body > pos)
        abort();
    lr_http1_eof(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    /* The first byte: how many piece sizes follow (0-7); then those sizes. */
    if (n == 0)
        return 0;
    size_t np = d[0] & 7;
    int refuse = (d[0] & 8) ? (int)(d[0] >> 4) * 16 : -1;
    if (n < 1 + np)
        return 0;
    const uint8_t *pieces = d + 1;
    const uint8_t *body = d + 1 + np;
    size_t len = n - 1 - np;
    lr_http1 a, b;
    sink ka, kb;
    run(body, len, pieces, np, refuse, &a, &ka);
    run(body, len, NULL, 0, refuse, &b, &kb);
    /* In pieces or whole, the same response; a body the sink refuses
     * (as max_response_bytes does) stops both, wherever the piece ended. */
    if (a.aborted != b.aborted || (a.aborted && (a.state == LR_H1_DONE || b.state == LR_H1_DONE)))
        abort();
    if (!a.aborted && (a.state != b.state || a.status != b.status || ka.body != kb.body ||
                       a.keep_alive != b.keep_alive))
        abort();
    lr_http1_free(&a);
    lr_http1_free(&b);
    return 0;
}
