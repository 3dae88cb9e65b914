/* A request's token estimate (llmretry_estimate_tokens): the one rule the
 * engine charges tpm by and hosts with a tokenizer call with their counter
 * (Python's tiktoken), so that the texts counted and the completion's
 * bound are the same whoever counts. */
#include "internal.h"

#include <cjson/cJSON.h>
#include <string.h>

/* A completion's tokens when the body does not bound them. */
#define DEFAULT_COMPLETION_TOKENS 256

/* Sums the prompt's tokens (count's, or its bytes when count is NULL). */
typedef struct {
    llmretry_token_counter count;
    void *ud;
    int64_t total;
    int failed;
} tally;

static void add_text(tally *t, const char *s)
{
    size_t n = strlen(s);
    if (!t->count) {
        t->total += (int64_t)n;
        return;
    }
    int64_t k = t->failed ? -1 : t->count(s, n, t->ud);
    if (k < 0)
        t->failed = 1;
    else
        t->total += k;
}

static void add_texts(tally *t, const cJSON *v)
{
    if (cJSON_IsString(v)) {
        add_text(t, v->valuestring);
        return;
    }
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        /* content parts ({"type": "text", "text": ...}), messages, inputs */
        const cJSON *item;
        cJSON_ArrayForEach(item, v) {
            if (cJSON_IsString(item) && item->string &&
                strcmp(item->string, "text") != 0 && strcmp(item->string, "content") != 0)
                continue;           /* "role", "type", "name": not the prompt */
            add_texts(t, item);
        }
    }
}

static int64_t completion_bound(const cJSON *doc)
{
    static const char *const names[] = { "max_completion_tokens", "max_tokens",
                                         "max_output_tokens" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, names[i]);
        if (cJSON_IsNumber(v) && v->valuedouble >= 0)
            return v->valuedouble > 1e12 ? (int64_t)1e12 : (int64_t)v->valuedouble;
    }
    return -1;
}

int64_t lr_estimate_tokens(const char *url, const char *body, size_t len,
                           llmretry_token_counter count, void *ud, int64_t *limit)
{
    tally t = { count, ud, 0, 0 };
    int64_t bound = -1;
    cJSON *doc = body ? cJSON_ParseWithLength(body, len) : NULL;
    if (doc) {
        static const char *const prompt_keys[] = { "messages", "input", "prompt" };
        for (size_t i = 0; i < sizeof prompt_keys / sizeof prompt_keys[0]; i++)
            add_texts(&t, cJSON_GetObjectItemCaseSensitive(doc, prompt_keys[i]));
        /* Embeddings have no completion: their cost is their input. */
        bound = url && lr_url_path_ends(url, "/embeddings") ? 0 : completion_bound(doc);
        cJSON_Delete(doc);
    } else if (count && body) {
        t.total = count(body, len, ud);
        t.failed = t.total < 0;
    } else {
        t.total = (int64_t)len;
    }
    if (limit)
        *limit = bound;
    if (t.failed)
        return -1;
    int64_t prompt = count ? t.total : (t.total + 3) / 4;
    return prompt + (bound >= 0 ? bound : DEFAULT_COMPLETION_TOKENS);
}

int64_t llmretry_estimate_tokens(const char *url, const char *body, size_t len,
                                 llmretry_token_counter count, void *ud)
{
    return lr_estimate_tokens(url, body, len, count, ud, NULL);
}
