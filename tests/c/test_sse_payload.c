/* Tests of the SSE chunk classifier (core/src/sse_payload.c) beyond what
 * the vectors of tests/vectors/sse/ show: the parse gate it shares with
 * 2xx bodies (depth, UTF-8), how codes, types and statuses combine, and
 * that its failure is judged by the retry policy as a status would be. */
#include "harness.h"
#include "sse.h"

#include <cJSON.h>
#include <stdlib.h>

/* Classify s (copied to an exact-size buffer: ASan sees any over-read). */
static void classify(const char *event, const char *s, lr_sse_payload *p, cJSON **doc)
{
    size_t n = strlen(s);
    char *copy = malloc(n ? n : 1);
    memcpy(copy, s, n);
    CHECK_INT(lr_sse_classify(event, copy, n, p, doc), 0);
    free(copy);
}

static char *nested(int depth)
{
    char *s = malloc((size_t)depth * 2 + 64);
    size_t n = (size_t)sprintf(s, "{\"choices\":[],\"x\":");
    for (int i = 0; i < depth; i++)
        s[n++] = '[';
    for (int i = 0; i < depth; i++)
        s[n++] = ']';
    strcpy(s + n, "}");
    return s;
}

static void test_parse_gate(void)
{
    lr_sse_payload p;
    cJSON *doc;
    classify(NULL, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}", &p, &doc);
    CHECK_INT(p.kind, LR_SSE_CHUNK);
    CHECK(doc && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(doc, "choices")));
    cJSON_Delete(doc);
    classify("message", "not json", &p, &doc);
    CHECK_INT(p.kind, LR_SSE_INVALID);
    CHECK(doc == NULL && p.why != NULL);

    /* LLMRETRY_MAX_BODY_DEPTH, as for a whole response (the object counts). */
    char *ok = nested(LLMRETRY_MAX_BODY_DEPTH - 1), *deep = nested(LLMRETRY_MAX_BODY_DEPTH);
    classify(NULL, ok, &p, NULL);
    CHECK_INT(p.kind, LR_SSE_CHUNK);
    classify(NULL, deep, &p, &doc);
    CHECK_INT(p.kind, LR_SSE_INVALID);
    CHECK(p.why && strstr(p.why, "nests") && doc == NULL);
    free(ok);
    free(deep);

    classify(NULL, "{\"choices\":[],\"x\":\"\xC3\"}", &p, NULL);
    CHECK_INT(p.kind, LR_SSE_INVALID);
    classify(NULL, "{\"x\":\"a\tb\"}", &p, NULL);     /* a raw tab in a string */
    CHECK_INT(p.kind, LR_SSE_INVALID);
    CHECK_INT(lr_sse_classify(NULL, NULL, 0, &p, NULL), 0);
    CHECK_INT(p.kind, LR_SSE_INVALID);
}

static void test_finish_reason(void)
{
    lr_sse_payload p;
    classify(NULL, "{\"choices\":[{\"finish_reason\":\"\"}]}", &p, NULL);
    CHECK(!p.has_finish_reason && p.has_open_choice);   /* "" is no reason */
    classify(NULL, "{\"choices\":[{\"finish_reason\":null},{\"finish_reason\":\"stop\"}]}", &p, NULL);
    CHECK(p.has_finish_reason && p.has_open_choice);
    classify(NULL, "{\"choices\":[{}]}", &p, NULL);
    CHECK(!p.has_finish_reason && p.has_open_choice);
    classify(NULL, "{\"choices\":[1,\"x\",[{\"finish_reason\":\"stop\"}]]}", &p, NULL);
    CHECK(!p.has_finish_reason && !p.has_open_choice);  /* not choice objects */
    classify(NULL, "{\"choices\":{\"finish_reason\":\"stop\"}}", &p, NULL);
    CHECK(!p.has_finish_reason && !p.has_open_choice);  /* not an array */
    classify(NULL, "{\"error\":null,\"choices\":[{\"finish_reason\":\"stop\"}]}", &p, NULL);
    CHECK_INT(p.kind, LR_SSE_CHUNK);
    CHECK(p.has_finish_reason);
}

/* One error payload: its code, class and status. */
static void check_error(const char *event, const char *data, const char *code,
                        lr_sse_err_class cls, int status)
{
    lr_sse_payload p;
    classify(event, data, &p, NULL);
    CHECK_MSG(p.kind == LR_SSE_ERROR, "%s: kind %d", data, p.kind);
    if (code)
        CHECK_MSG(p.code && strcmp(p.code, code) == 0, "%s: code %s, expected %s", data,
                  p.code ? p.code : "(null)", code);
    else
        CHECK_MSG(p.code == NULL, "%s: code %s, expected none", data, p.code);
    CHECK_MSG(p.err_class == cls, "%s: class %d, expected %d", data, p.err_class, cls);
    CHECK_MSG(p.status == status, "%s: status %d, expected %d", data, p.status, status);
    lr_sse_payload_clear(&p);
    CHECK(p.code == NULL);
}

static void test_errors(void)
{
    /* Any case and any field: the policy's quota rule needs this exact code. */
    check_error(NULL, "{\"error\":{\"code\":\"quota_exceeded\",\"type\":\"INSUFFICIENT_QUOTA\"}}",
                "insufficient_quota", LR_SSE_ERR_QUOTA, 429);
    check_error(NULL, "{\"error\":{\"type\":\"weird\",\"status\":503}}", "weird",
                LR_SSE_ERR_SERVER, 503);
    check_error(NULL, "{\"error\":{\"code\":\"429\"}}", "429", LR_SSE_ERR_RATE_LIMIT, 429);
    check_error(NULL, "{\"error\":{\"code\":\"Rate_Limit_Error\"}}", "Rate_Limit_Error",
                LR_SSE_ERR_RATE_LIMIT, 429);
    check_error(NULL, "{\"error\":{\"type\":\"service_unavailable\"}}", "service_unavailable",
                LR_SSE_ERR_SERVER, 503);
    check_error(NULL, "{\"error\":{\"type\":\"internal_error\"}}", "internal_error",
                LR_SSE_ERR_SERVER, 500);
    /* The provider's status wins over the class's own. */
    check_error(NULL, "{\"error\":{\"type\":\"overloaded_error\",\"code\":529}}",
                "overloaded_error", LR_SSE_ERR_SERVER, 529);
    /* Numbers that are no HTTP error status: not a status, maybe a code. */
    check_error(NULL, "{\"error\":{\"code\":200}}", "200", LR_SSE_ERR_OTHER, 400);
    check_error(NULL, "{\"error\":{\"code\":429.5}}", NULL, LR_SSE_ERR_OTHER, 400);
    check_error(NULL, "{\"error\":{\"code\":1e300}}", NULL, LR_SSE_ERR_OTHER, 400);
    check_error(NULL, "{\"error\":{\"code\":-7}}", "-7", LR_SSE_ERR_OTHER, 400);
    check_error(NULL, "{\"error\":{\"code\":\"\",\"type\":\"server_error\"}}", "server_error",
                LR_SSE_ERR_SERVER, 500);
    check_error(NULL, "{\"error\":{\"code\":501}}", "501", LR_SSE_ERR_OTHER, 501);
    /* The message is never taken for a code: it may echo the prompt. */
    check_error(NULL, "{\"error\":{\"message\":\"secret prompt text\"}}", NULL,
                LR_SSE_ERR_OTHER, 400);
    /* event: error with an "error" member uses that member. */
    check_error("error", "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\"}}",
                "rate_limit_error", LR_SSE_ERR_RATE_LIMIT, 429);
    check_error("error", "{\"error\":7,\"type\":\"server_error\"}", NULL, LR_SSE_ERR_OTHER, 400);
    check_error("error", "{}", NULL, LR_SSE_ERR_OTHER, 400);
}

/* A choice ended by finish_reason "error": an error, by that choice's own
 * error object, else a server error (the model failed mid-answer). */
static void test_choice_error(void)
{
    check_error(NULL, "{\"choices\":[{\"delta\":{},\"finish_reason\":\"error\"}]}", NULL,
                LR_SSE_ERR_SERVER, 500);
    check_error(NULL, "{\"choices\":[{\"finish_reason\":\"stop\"},{\"finish_reason\":\"error\","
                "\"error\":{\"code\":429,\"message\":\"x\"}}]}", "429", LR_SSE_ERR_RATE_LIMIT, 429);
    /* The top-level error, where there is one, is the one judged. */
    check_error(NULL, "{\"error\":{\"code\":\"server_error\"},\"choices\":[{\"finish_reason\":"
                "\"error\",\"error\":{\"code\":400}}]}", "server_error", LR_SSE_ERR_SERVER, 500);
}

/* lr_body_error: a whole 2xx answer's own verdict (answer_error.c). */
static void body_error(const char *text, int responses, int want, int status)
{
    cJSON *doc = cJSON_Parse(text);
    lr_sse_payload p;
    CHECK(doc != NULL);
    int rc = lr_body_error(doc, responses, &p);
    CHECK_MSG(rc == want && (rc != 1 || (p.kind == LR_SSE_ERROR && p.status == status)),
              "%s: rc %d status %d, want %d and %d", text, rc, p.status, want, status);
    lr_sse_payload_clear(&p);
    cJSON_Delete(doc);
}

static void test_body_error(void)
{
    body_error("{\"error\":{\"code\":502,\"message\":\"Provider returned error\"}}", 0, 1, 502);
    body_error("{\"error\":\"upstream failed\"}", 0, 1, 400);
    body_error("{\"error\":null,\"choices\":[{\"finish_reason\":\"stop\"}]}", 0, 0, 0);
    body_error("{\"error\":[],\"choices\":[{\"finish_reason\":\"stop\"}]}", 0, 0, 0);
    body_error("{\"choices\":[{\"message\":{\"content\":\"error\"},\"finish_reason\":\"stop\"}]}",
               0, 0, 0);
    body_error("{\"choices\":[{\"finish_reason\":\"error\"}]}", 0, 1, 500);
    /* The Responses API: failed is its error; queued or completed with a
     * null error is an answer; a chat body's "status" says nothing. */
    body_error("{\"object\":\"response\",\"status\":\"failed\",\"error\":{\"code\":"
               "\"rate_limit_exceeded\"},\"output\":[]}", 1, 1, 429);
    body_error("{\"object\":\"response\",\"status\":\"failed\",\"error\":null}", 1, 1, 400);
    body_error("{\"object\":\"response\",\"status\":\"queued\",\"error\":null}", 1, 0, 0);
    body_error("{\"status\":\"failed\",\"choices\":[{\"finish_reason\":\"stop\"}]}", 0, 0, 0);
}

/* What llmretry_decide makes of each payload, with default options. */
static void test_policy(void)
{
    static const struct { const char *data; int retry; } cases[] = {
        {"{\"error\":{\"code\":\"rate_limit_exceeded\"}}", 1},
        {"{\"error\":{\"type\":\"server_error\"}}", 1},
        {"{\"error\":{\"type\":\"overloaded_error\"}}", 1},
        {"{\"error\":{\"code\":\"insufficient_quota\"}}", 0},
        {"{\"error\":{\"type\":\"invalid_request_error\"}}", 0},
        {"{\"error\":{\"code\":501}}", 0},
    };
    llmretry_options o;
    llmretry_failure f;
    lr_sse_payload p;
    llmretry_options_defaults(&o);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        classify(NULL, cases[i].data, &p, NULL);
        lr_sse_payload_failure(&p, &f);
        CHECK_INT(f.kind, LLMRETRY_ERR_HTTP_STATUS);
        CHECK(f.error_code == p.code);
        llmretry_decision d = llmretry_decide(&o, &f, 0, 0, LLMRETRY_NO_DEADLINE, 0.5);
        CHECK_MSG(d.retry == cases[i].retry, "%s: retry %d", cases[i].data, d.retry);
        if (!d.retry)
            CHECK_INT(d.reason, LLMRETRY_REASON_NOT_RETRYABLE);
        lr_sse_payload_clear(&p);
    }
    classify(NULL, "{oops", &p, NULL);
    lr_sse_payload_failure(&p, &f);
    CHECK_INT(f.kind, LLMRETRY_ERR_INVALID_RESPONSE);
    CHECK_INT(llmretry_decide(&o, &f, 0, 0, LLMRETRY_NO_DEADLINE, 0.5).retry,
              o.retry_invalid_response != 0);
    classify(NULL, "{\"choices\":[]}", &p, NULL);
    lr_sse_payload_failure(&p, &f);
    CHECK_INT(f.kind, LLMRETRY_ERR_NONE);
    CHECK(f.error_code == NULL && f.status == 0);
}

/* lr_sse_note: what each payload does to a clean end of file. */
static void test_note(void)
{
    lr_sse_reader r;
    lr_sse_payload fin = {0}, open = {0}, none = {0}, err = {0};
    fin.has_finish_reason = 1;
    open.has_open_choice = 1;
    err.kind = LR_SSE_ERROR;
    lr_sse_init(&r, 0);
    lr_sse_note(&r, &fin);
    lr_sse_note(&r, &none);
    CHECK_INT(lr_sse_finish(&r), LR_SSE_END_AFTER_FINISH);
    lr_sse_note(&r, &err);
    CHECK_INT(lr_sse_finish(&r), LR_SSE_END_TRUNCATED);
    lr_sse_note(&r, &fin);
    lr_sse_note(&r, &open);
    CHECK_INT(lr_sse_finish(&r), LR_SSE_END_TRUNCATED);
    lr_sse_free(&r);
}

/* lr_sse_type: the event: line's type, else a Responses API "type" in the
 * payload (LiteLLM sends no event: lines); classification follows it. */
static void test_type_from_payload(void)
{
    lr_sse_payload p;
    cJSON *doc;
    static const char delta[] = "{\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}";
    classify(NULL, delta, &p, &doc);
    CHECK_STR(lr_sse_type(NULL, doc), "response.output_text.delta");
    CHECK_STR(lr_sse_type("message", doc), "response.output_text.delta");
    CHECK_STR(lr_sse_type("response.created", doc), "response.created");  /* the line wins */
    cJSON_Delete(doc);
    /* A chat chunk, or a vendor's "type" of its own, stays a message. */
    classify(NULL, "{\"type\":\"chunk\",\"choices\":[]}", &p, &doc);
    CHECK_STR(lr_sse_type(NULL, doc), "message");
    cJSON_Delete(doc);
    CHECK_STR(lr_sse_type(NULL, NULL), "message");
    /* response.failed and "error" without event: lines are errors. */
    check_error(NULL, "{\"type\":\"response.failed\",\"response\":{\"status\":\"failed\","
                "\"error\":{\"code\":\"server_error\",\"message\":\"x\"}}}", "server_error",
                LR_SSE_ERR_SERVER, 500);
    check_error(NULL, "{\"type\":\"error\",\"code\":\"rate_limit_exceeded\",\"message\":\"x\"}",
                "rate_limit_exceeded", LR_SSE_ERR_RATE_LIMIT, 429);
}

/* U+0000 and U+001F (the mask's own escape) in parsed strings, and back. */
static void test_nul_mask(void)
{
    lr_sse_payload p;
    cJSON *doc;
    classify(NULL, "{\"a\":\"xa\\u0000by\",\"b\":\"\\u001F\\u001f0\",\"c\":\"\\\\u0000\"}",
             &p, &doc);
    CHECK_INT(p.kind, LR_SSE_CHUNK);
    const char *a = cJSON_GetStringValue(cJSON_GetObjectItem(doc, "a"));
    CHECK(a && strlen(a) == 6 && memcmp(a, "xa\x1f" "0by", 6) == 0);   /* no NUL inside */
    char *text = cJSON_PrintUnformatted(doc);
    size_t n = lr_sse_unmask(text, strlen(text));
    CHECK_STR(text, "{\"a\":\"xa\\u0000by\",\"b\":\"\\u001f\\u001f0\",\"c\":\"\\\\u0000\"}");
    CHECK_INT(n, strlen(text));
    free(text);
    cJSON_Delete(doc);
    /* Text with nothing masked is left as it is. */
    char plain[] = "{\"a\":\"\\\\u001f0\"}";
    CHECK_INT(lr_sse_unmask(plain, strlen(plain)), strlen("{\"a\":\"\\\\u001f0\"}"));
    CHECK_STR(plain, "{\"a\":\"\\\\u001f0\"}");
}

int main(void)
{
    test_parse_gate();
    test_finish_reason();
    test_errors();
    test_choice_error();
    test_body_error();
    test_policy();
    test_note();
    test_type_from_payload();
    test_nul_mask();
    return th_summary("test_sse_payload");
}
