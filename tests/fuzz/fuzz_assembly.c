/* libFuzzer target for the stream assembler (core/src/assembly.c): any
 * sequence of chunks, one JSON text per line, must assemble without a
 * crash or a leak, and its two result forms (tree, text) must agree.
 * Chunks are parsed as the engine parses them (lr_sse_classify, which
 * masks U+0000 and U+001F: sse.h), so the tree's text is compared after
 * the same unmasking the text form gets. */
#include "assembly.h"
#include "sse.h"
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    lr_asm *a = lr_asm_new();
    size_t i = 0;
    while (i < n) {
        const uint8_t *e = memchr(d + i, '\n', n - i);
        size_t l = e ? (size_t)(e - (d + i)) : n - i;
        lr_sse_payload p;
        cJSON *c = NULL;
        if (lr_sse_classify(NULL, (const char *)d + i, l, &p, &c) == 0 && c)
            lr_asm_add(a, c);
        lr_sse_payload_clear(&p);
        cJSON_Delete(c);
        i += l + 1;
    }
    cJSON *r = lr_asm_result(a);
    char *t = lr_asm_result_text(a, NULL);
    char *t2 = r ? cJSON_PrintUnformatted(r) : NULL;
    if (t2)
        lr_sse_unmask(t2, strlen(t2));
    if (t && t2 && strcmp(t, t2) != 0) abort();   /* both forms agree */
    free(t); free(t2); cJSON_Delete(r);
    lr_asm_free(a);
    return 0;
}
