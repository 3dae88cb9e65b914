/* Stream assembly (docs/streaming.md, "Assembly"): the chat.completion.chunk
 * objects of one streamed response, added in order, become one
 * chat.completion-shaped object, so a streamed call ends with the same kind
 * of body as a plain one. Pure: no I/O, no engine state, no locks; one
 * assembler per attempt, used by one thread. Private to the core.
 *
 * The result:
 *   {"id", "object": "chat.completion", "created", "model",
 *    "system_fingerprint" (only when a chunk had one),
 *    "choices": [{"index", "message": {"role", "content",
 *                 "reasoning_content"?, "reasoning"?, "refusal"?, "tool_calls"?},
 *                 "finish_reason", "logprobs"?}],   (sorted by index)
 *    "usage" (only when a chunk had one)}
 * The rules, each field of the wrong type being skipped as if absent:
 * - id, model (strings), created (a number), system_fingerprint: the first
 *   one seen (strings: the first non-empty one); null when none came.
 * - choices[i] by its integer "index" in 0..LR_ASM_MAX_CHOICES-1 (missing:
 *   0); any other index (negative, fractional, huge, not a number) drops
 *   that choice entry, so a hostile index cannot size an allocation.
 * - role: the first non-empty one, else "assistant".
 * - content, reasoning_content, reasoning, refusal: the string deltas
 *   concatenated. content is null when no string content came (as OpenAI
 *   answers a pure tool call), "" when only empty ones did; the others are
 *   left out when none came (OpenAI's "refusal": null is not kept). Other
 *   delta fields (audio, the legacy function_call, vendor extras) are left
 *   out: nothing here knows how to merge them.
 * - tool_calls by "index" in 0..LR_ASM_MAX_TOOL_CALLS-1, sorted, without
 *   the index (as in a chat.completion): id, type and function.name the
 *   first non-empty ones (type "function" when none came; id and name null),
 *   function.arguments concatenated ("" when none came). A tool call with
 *   no index (some gateways send each call whole, unindexed) is a new call
 *   when its id differs from the last call's id, else continues it.
 * - finish_reason: the last non-empty string, else null.
 * - logprobs: the arrays logprobs.content and logprobs.refusal concatenated;
 *   left out when no chunk had one.
 * - usage: the last usage object seen (OpenAI sends it alone, in a last
 *   chunk with no choices; some servers repeat a running total), raw.
 * - everything else (object, service_tier, llama.cpp's timings, a
 *   top-level error, which the SSE reader judges first) is ignored. */
#ifndef LR_ASSEMBLY_H
#define LR_ASSEMBLY_H

#include <stddef.h>
#include "llmretry/result.h"
#pragma GCC visibility push(hidden)

struct cJSON;

/* OpenAI allows n <= 128 and 128 tools; beyond, entries are ignored. */
#define LR_ASM_MAX_CHOICES 128
#define LR_ASM_MAX_TOOL_CALLS 128

typedef struct lr_asm lr_asm;

/* A new, empty assembler; NULL when out of memory. */
lr_asm *lr_asm_new(void);
void lr_asm_free(lr_asm *a);

/* Merge one chunk (a parsed data: payload; the assembler keeps no pointer
 * into it). Never fails on content: a chunk that is not an object, or
 * fields of unexpected types, are skipped. LLMRETRY_ENOMEM when an
 * allocation failed: the assembler stays valid (freeable, usable) but its
 * result misses part of this chunk, so the attempt should fail. */
llmretry_status lr_asm_add(lr_asm *a, const struct cJSON *chunk);

/* The assembled chat.completion as a new tree the caller owns (valid after
 * lr_asm_free), or NULL when out of memory. Does not change the assembler:
 * more chunks may follow. */
struct cJSON *lr_asm_result(const lr_asm *a);

/* The same as unformatted JSON text (malloc'd by cJSON's default hooks,
 * which the core keeps: free()), the form the engine hands hosts as a body
 * (llmretry_result.body, c->resp): printed straight from the assembler's
 * buffers, with no intermediate tree of copies. *len (if not NULL) gets its
 * length. NULL when out of memory. Text that was not UTF-8 in the chunks
 * stays so: the engine's body check (lr_parse_body) judges it like any
 * other body. Strings of chunks parsed by lr_sse_classify come out whole,
 * U+0000 included (sse.h, lr_sse_unmask). */
char *lr_asm_result_text(const lr_asm *a, size_t *len);

/* Figures for events and results while the stream runs, kept up to date by
 * lr_asm_add: reading them costs nothing. */
typedef struct lr_asm_stats {
    size_t chunks;               /* lr_asm_add calls, chunks of any shape */
    int finished;                /* 1 once a choice had a finish_reason */
    /* The counts of the last usage object (present = 0 until one came),
     * read as for a plain body (whole numbers 0..2^53, others 0). */
    llmretry_usage usage;
} lr_asm_stats;

/* Valid while a lives; changes as chunks are added. */
const lr_asm_stats *lr_asm_stats_of(const lr_asm *a);

#pragma GCC visibility pop
#endif
