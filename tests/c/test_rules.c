/* The core's rules that hosts call instead of keeping copies, from the
 * shared vectors tests/vectors/rules/NAME.json (the Python and Lua suites
 * run the same cases through their bindings):
 * - token_estimates: llmretry_estimate_tokens with the core's own count
 *   (NULL counter: bytes / 4) and a host's tokenizer (one token a word);
 * - headers: llmretry_check_header;
 * - stream_bodies: llmretry_stream_body. */
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

static cJSON *read_vector(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tests/vectors/rules/%s.json", LLMRETRY_SOURCE_DIR, name);
    size_t len;
    char *text = th_read_file(path, &len);
    cJSON *doc = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    CHECK_MSG(doc != NULL, "%s not read", path);
    return doc;
}

static void token_estimates(void)
{
    cJSON *doc = read_vector("token_estimates");
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
}

static void headers(void)
{
    cJSON *doc = read_vector("headers");
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(doc, "cases"), *c;
    CHECK(cJSON_GetArraySize(cases) >= 10);
    size_t i = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        const char *value = cJSON_GetObjectItemCaseSensitive(c, "value")->valuestring;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "error");
        /* cJSON ends a string at an escaped NUL: its length is where it
         * stopped, so "a\u0000b" arrives as "a" + NUL + "b" only in hosts;
         * here the case is rebuilt with the NUL inside. */
        char buf[128];
        size_t vl = strlen(value);
        if (strcmp(name, "X-V") == 0 && vl == 1 && value[0] == 'a') {
            memcpy(buf, "a\0b", 3);
            value = buf;
            vl = 3;
        }
        char err[LLMRETRY_ERRBUF] = "";
        llmretry_status st = llmretry_check_header(name, strlen(name), value, vl, i, err,
                                                   sizeof err);
        if (cJSON_IsNull(want)) {
            CHECK_MSG(st == LLMRETRY_OK, "%s: refused: %s", name, err);
        } else if (strcmp(want->valuestring, "name") == 0) {
            char expect[64];
            snprintf(expect, sizeof expect, "the name of header #%zu is invalid", i);
            CHECK_MSG(st == LLMRETRY_EINVAL && strstr(err, expect), "case %zu: %s", i, err);
            CHECK_MSG(!*name || !strstr(err, name), "case %zu repeats the name: %s", i, err);
        } else {
            CHECK_MSG(st == LLMRETRY_EINVAL &&
                      strstr(err, "must not contain CR, LF, NUL or other control characters"),
                      "case %zu: %s", i, err);
        }
        i++;
    }
    cJSON_Delete(doc);
}

static void stream_bodies(void)
{
    cJSON *doc = read_vector("stream_bodies");
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(doc, "cases"), *c;
    CHECK(cJSON_GetArraySize(cases) >= 8);
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        char url[128];
        snprintf(url, sizeof url, "http://h/v1/%s",
                 cJSON_GetObjectItemCaseSensitive(c, "endpoint")->valuestring);
        int streamed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "streamed"));
        const cJSON *raw = cJSON_GetObjectItemCaseSensitive(c, "body_text");
        char *body = cJSON_IsString(raw) ? strdup(raw->valuestring)
                   : cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "body"));
        size_t len = strlen(body);
        char *out = llmretry_stream_body(url, body, &len, streamed);
        const char *sent = out ? out : body;
        CHECK_MSG(strlen(sent) == len, "%s: length %zu", name, len);
        const cJSON *want_text = cJSON_GetObjectItemCaseSensitive(c, "sent_text");
        if (cJSON_IsString(want_text)) {
            CHECK_MSG(strcmp(sent, want_text->valuestring) == 0, "%s: sent %s", name, sent);
        } else {
            cJSON *got = cJSON_Parse(sent);
            CHECK_MSG(got && cJSON_Compare(got, cJSON_GetObjectItemCaseSensitive(c, "sent"), 1),
                      "%s: sent %s", name, sent);
            cJSON_Delete(got);
        }
        llmretry_free(out);
        free(body);
    }
    cJSON_Delete(doc);
}

int main(void)
{
    token_estimates();
    headers();
    stream_bodies();
    return th_summary("test_rules");
}
