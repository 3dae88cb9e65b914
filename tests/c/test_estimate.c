/* The token estimate's rule (llmretry_estimate_tokens), from the shared
 * vector tests/vectors/rules/token_estimates.json: the core's own count
 * (NULL counter: bytes / 4) and a host's tokenizer (here one token a word),
 * the same cases the Python suite runs through its binding. */
#include "harness.h"
#include "llmretry.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

/* A stand-in tokenizer: whitespace-separated words. */
static int64_t words(const char *text, size_t len, void *ud)
{
    int *calls = ud;
    (*calls)++;
    int64_t n = 0;
    int in_word = 0;
    for (size_t i = 0; i < len; i++) {
        int space = text[i] == ' ' || text[i] == '\t' || text[i] == '\n';
        n += !space && !in_word;
        in_word = !space;
    }
    return n;
}

static int64_t refuses(const char *text, size_t len, void *ud)
{
    (void)text, (void)len, (void)ud;
    return -1;
}

int main(void)
{
    size_t len;
    char *text = th_read_file(LLMRETRY_SOURCE_DIR "/tests/vectors/rules/token_estimates.json",
                              &len);
    cJSON *doc = text ? cJSON_ParseWithLength(text, len) : NULL;
    CHECK_MSG(doc != NULL, "token_estimates.json not read");
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(doc, "cases"), *c;
    CHECK(cJSON_GetArraySize(cases) >= 10);
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        const cJSON *url = cJSON_GetObjectItemCaseSensitive(c, "url");
        const cJSON *raw = cJSON_GetObjectItemCaseSensitive(c, "body_text");
        char *body = cJSON_IsString(raw) ? strdup(raw->valuestring)
                   : cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "body"));
        const char *u = cJSON_IsString(url) ? url->valuestring : NULL;
        int calls = 0;
        int64_t chars = llmretry_estimate_tokens(u, body, strlen(body), NULL, NULL);
        int64_t counted = llmretry_estimate_tokens(u, body, strlen(body), words, &calls);
        CHECK_MSG(chars == (int64_t)cJSON_GetObjectItemCaseSensitive(c, "chars")->valuedouble,
                  "%s: chars %lld", name, (long long)chars);
        CHECK_MSG(counted == (int64_t)cJSON_GetObjectItemCaseSensitive(c, "words")->valuedouble,
                  "%s: words %lld", name, (long long)counted);
        CHECK_MSG(calls > 0, "%s: the counter was not asked", name);
        /* A counter that fails: -1 (the host leaves the estimate to the core). */
        CHECK_MSG(llmretry_estimate_tokens(u, body, strlen(body), refuses, NULL) == -1, "%s", name);
        free(body);
    }
    cJSON_Delete(doc);
    free(text);
    return th_summary("test_estimate");
}
