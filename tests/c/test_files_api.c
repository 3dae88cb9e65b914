/* The options the Files API needs (method, content_type, raw_response)
 * against the mock's /v1/files: a multipart upload, a GET of the file, a
 * GET of its content (JSON Lines, not JSON) and a DELETE, each an engine
 * call with its retries; and the checks that refuse what cannot be sent. */
#include "harness.h"
#include "llmretry.h"

#include <stdlib.h>

static th_mock mock;
static llmretry_engine *engine;

#define LINES "{\"custom_id\":\"a\"}\n{\"custom_id\":\"b\"}\n"
#define BOUNDARY "llmretry-test-boundary"
#define MULTIPART                                                                        \
    "--" BOUNDARY "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" \
    "--" BOUNDARY "\r\nContent-Disposition: form-data; name=\"file\"; "                  \
    "filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n" LINES               \
    "\r\n--" BOUNDARY "--\r\n"

static char file_id[64];

static void base(llmretry_options *o, const char *url)
{
    llmretry_options_defaults(o);
    o->url = url;
    o->api_key = "sk-test";
    o->base_delay_ms = 1;
    o->max_delay_ms = 5;
    o->deadline_ms = 30000;
}

static const llmretry_result *run(const llmretry_options *o, llmretry_call **c)
{
    *c = th_submit(engine, o);
    const llmretry_result *r = th_wait_done(*c, 30000);
    CHECK(r != NULL);
    return r;
}

/* The mock answers the next n API requests 503: the engine retries them. */
static void fail_next(int n)
{
    char doc[64];
    snprintf(doc, sizeof doc, "{\"fail\": %d}", n);
    th_mock_put(&mock, "/_mock/batches", doc);
}

static void test_upload_is_multipart_and_retried(void)
{
    char url[128];
    snprintf(url, sizeof url, "%s/files", mock.base_url);
    llmretry_options o;
    base(&o, url);
    o.body = MULTIPART;
    o.body_len = sizeof MULTIPART - 1;
    o.content_type = "multipart/form-data; boundary=" BOUNDARY;
    fail_next(1);
    llmretry_call *c;
    const llmretry_result *r = run(&o, &c);
    if (r) {
        CHECK_MSG(r->ok, "upload failed: %s", r->message ? r->message : "");
        CHECK_INT(r->attempts, 2);
        const char *id = r->ok ? strstr(r->body, "\"id\": \"") : NULL;
        CHECK(id != NULL);
        if (id)
            sscanf(id + 7, "%63[^\"]", file_id);
    }
    llmretry_call_free(c);
}

static void test_get_content_is_raw_and_retried(void)
{
    char url[256];
    snprintf(url, sizeof url, "%s/files/%s/content", mock.base_url, file_id);
    llmretry_options o;
    base(&o, url);
    o.method = LLMRETRY_METHOD_GET;
    o.raw_response = 1;
    fail_next(2);
    llmretry_call *c;
    const llmretry_result *r = run(&o, &c);
    if (r) {
        CHECK_MSG(r->ok, "GET content failed: %s", r->message ? r->message : "");
        CHECK_INT(r->attempts, 3);
        CHECK(r->raw_response);
        CHECK_STR(r->ok ? r->body : NULL, LINES);      /* JSON Lines, as they came */
    }
    llmretry_call_free(c);

    /* Without raw_response the same answer is not a JSON object. */
    o.raw_response = 0;
    o.max_retries = 0;
    r = run(&o, &c);
    if (r) {
        CHECK(!r->ok);
        CHECK_INT(r->kind, LLMRETRY_ERR_INVALID_RESPONSE);
    }
    llmretry_call_free(c);
}

#define EMPTY_MULTIPART                                                                  \
    "--" BOUNDARY "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" \
    "--" BOUNDARY "\r\nContent-Disposition: form-data; name=\"file\"; "                  \
    "filename=\"empty.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"              \
    "\r\n--" BOUNDARY "--\r\n"

/* An empty file's content: a 200 with no body at all. The engine had no
 * buffer for it and wrote its NUL through a null pointer (found by a
 * hostile Batch API server's test: tests/python/test_batch_api_hostile.py). */
static void test_empty_content_is_an_empty_body(void)
{
    char url[256], id[64] = "";
    snprintf(url, sizeof url, "%s/files", mock.base_url);
    llmretry_options o;
    base(&o, url);
    o.body = EMPTY_MULTIPART;
    o.body_len = sizeof EMPTY_MULTIPART - 1;
    o.content_type = "multipart/form-data; boundary=" BOUNDARY;
    llmretry_call *c;
    const llmretry_result *r = run(&o, &c);
    const char *at = r && r->ok ? strstr(r->body, "\"id\": \"") : NULL;
    CHECK_MSG(at != NULL, "upload failed: %s", r && r->message ? r->message : "");
    if (at)
        sscanf(at + 7, "%63[^\"]", id);
    llmretry_call_free(c);
    if (!at)
        return;

    snprintf(url, sizeof url, "%s/files/%s/content", mock.base_url, id);
    base(&o, url);
    o.method = LLMRETRY_METHOD_GET;
    o.raw_response = 1;
    r = run(&o, &c);
    if (r) {
        CHECK_MSG(r->ok, "GET content failed: %s", r->message ? r->message : "");
        CHECK_STR(r->ok ? r->body : NULL, "");
        CHECK_INT((int)r->body_len, 0);
    }
    llmretry_call_free(c);
}

static void test_get_and_delete(void)
{
    char url[256];
    snprintf(url, sizeof url, "%s/files/%s", mock.base_url, file_id);
    llmretry_options o;
    base(&o, url);
    o.method = LLMRETRY_METHOD_GET;
    llmretry_call *c;
    const llmretry_result *r = run(&o, &c);
    if (r) {
        CHECK_MSG(r->ok, "GET failed: %s", r->message ? r->message : "");
        CHECK(r->ok && strstr(r->body, "\"purpose\": \"batch\"") != NULL);
        CHECK(!r->raw_response);
    }
    llmretry_call_free(c);

    o.method = LLMRETRY_METHOD_DELETE;
    fail_next(1);
    r = run(&o, &c);
    if (r) {
        CHECK_MSG(r->ok, "DELETE failed: %s", r->message ? r->message : "");
        CHECK_INT(r->attempts, 2);
        CHECK(r->ok && strstr(r->body, "\"deleted\": true") != NULL);
    }
    llmretry_call_free(c);

    /* Gone: a GET now is a 404, not retried. */
    o.method = LLMRETRY_METHOD_GET;
    r = run(&o, &c);
    if (r) {
        CHECK(!r->ok);
        CHECK_INT(r->status, 404);
        CHECK_INT(r->attempts, 1);
    }
    llmretry_call_free(c);
}

static void expect_einval(const llmretry_options *o, const char *words)
{
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_INT(llmretry_options_check(o, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_MSG(strstr(err, words) != NULL, "error \"%s\" lacks \"%s\"", err, words);
}

static void test_checks(void)
{
    llmretry_options o;
    base(&o, "http://127.0.0.1:1/v1/files/x");
    o.method = LLMRETRY_METHOD_GET;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_INT(llmretry_options_check(&o, err, sizeof err), LLMRETRY_OK);   /* no body */
    o.body = "{}";
    o.body_len = 2;
    expect_einval(&o, "a GET sends no body");
    o.body = NULL;
    o.body_len = 0;
    o.content_type = "text/plain";
    expect_einval(&o, "content_type is for a POST");
    o.method = LLMRETRY_METHOD_POST;
    o.body = "x";
    o.body_len = 1;
    o.content_type = "text/plain\r\nX-Evil: 1";
    expect_einval(&o, "content_type must be");
    o.content_type = "text/plain";
    o.fallbacks = "[{\"model\": \"m\"}]";
    expect_einval(&o, "fallbacks need a JSON body");
    o.fallbacks = NULL;
    o.raw_response = 1;
    o.schema = "{\"type\": \"object\"}";
    expect_einval(&o, "raw_response");

    /* A body that is not JSON goes as is under its own content type (no
     * "body is not valid JSON" at submit), where a JSON one is checked. */
    llmretry_options_defaults(&o);
    o.url = "http://127.0.0.1:1/v1/files";
    o.body = "not json";
    o.body_len = 8;
    llmretry_call *c = NULL;
    CHECK_INT(llmretry_engine_submit(engine, &o, 0, &c, err, sizeof err), LLMRETRY_EINVAL);
    CHECK_MSG(strstr(err, "body is not the JSON text of an object, such as {") != NULL &&
                  !strstr(err, "not json"), "%s", err);
    /* Checked by its first byte even when nothing is read from it (the
     * model given): a prompt or a number is no request. */
    static const char *const not_objects[] = { "42", "  hello {", "\"text\"", "\n null" };
    o.model = "m";
    for (size_t i = 0; i < sizeof not_objects / sizeof not_objects[0]; i++) {
        o.body = not_objects[i];
        o.body_len = strlen(not_objects[i]);
        CHECK_INT(llmretry_engine_submit(engine, &o, 0, &c, err, sizeof err), LLMRETRY_EINVAL);
        CHECK_MSG(strstr(err, "not the JSON text of an object") != NULL, "%s: %s",
                  not_objects[i], err);
    }
    o.model = NULL;
    o.body = "not json";
    o.body_len = 8;
    o.content_type = "text/plain";
    o.max_retries = 0;
    c = th_submit(engine, &o);
    llmretry_call_free(c);
}

int main(void)
{
    if (th_mock_start(&mock) != 0)
        return th_summary("files_api");
    engine = th_engine_new();
    static const th_case cases[] = {
        { "upload_is_multipart_and_retried", test_upload_is_multipart_and_retried },
        { "get_content_is_raw_and_retried", test_get_content_is_raw_and_retried },
        { "empty_content_is_an_empty_body", test_empty_content_is_an_empty_body },
        { "get_and_delete", test_get_and_delete },
        { "checks", test_checks },
    };
    TH_RUN(cases);
    llmretry_engine_free(engine);
    th_mock_stop(&mock);
    return th_summary("files_api");
}
