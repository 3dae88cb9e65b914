/* Issue 13, item 18, the core's part: what the error messages say and
 * which transport failures are retried.
 *
 *   - an HTTP error whose provider code only repeats the status says
 *     "HTTP 429", not "HTTP 429 (429)";
 *   - a ca_file that cannot be read is refused at submit, before any I/O,
 *     saying so (it used to fail each attempt as "TLS verification failed");
 *   - https:// to a plain-HTTP port ("wrong version number") is not
 *     retried: no number of attempts makes that server speak TLS. */
#include "harness.h"
#include "llmretry.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API_KEY "sk-test-SECRET-KEY-123"
#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static th_mock mock;
static llmretry_engine *mock_engine;

static void opts_for(llmretry_options *o, const char *name, char *url, size_t urllen)
{
    llmretry_options_defaults(o);
    o->base_url = th_mock_scenario_url(&mock, name, url, urllen);
    o->api_key = API_KEY;
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 10;
    o->timeout_ms = 5000;
}

static int recorded(const char *name)
{
    char *t = th_mock_requests(&mock, name);
    cJSON *a = t ? cJSON_Parse(t) : NULL;
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    free(t);
    cJSON_Delete(a);
    return n;
}

static const char *msg(const llmretry_result *r)
{
    return r && r->message ? r->message : "(none)";
}

static void test_code_repeating_the_status(void)
{
    char url[128];
    llmretry_options o;
    llmretry_call *c = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_INT(th_mock_script(&mock, "code429",
                             "{\"steps\": [{\"status\": 429, \"error_code\": \"429\"},"
                             " {\"status\": 400, \"error_code\": \"invalid_request\"}]}"), 0);
    opts_for(&o, "code429", url, sizeof url);
    o.max_retries = 0;
    CHECK_INT(llmretry_call_blocking(mock_engine, &o, NULL, NULL, &c, err, sizeof err),
              LLMRETRY_OK);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->status == 429, "status %d", r ? r->status : -1);
    /* The result's message goes on with the give-up ("; gave up after ..."). */
    static const char want429[] = "HTTP 429 from /s/code429/v1/chat/completions: "
                                  "\"mock error 429\";";
    CHECK_MSG(r && r->message && strncmp(r->message, want429, strlen(want429)) == 0 &&
              !strstr(r->message, "(429)"), "message \"%s\", expected \"%s ...\"", msg(r), want429);
    llmretry_call_free(c);
    /* A code that says more than the status is kept. */
    c = NULL;
    CHECK_INT(llmretry_call_blocking(mock_engine, &o, NULL, NULL, &c, err, sizeof err),
              LLMRETRY_OK);
    r = c ? llmretry_call_result(c) : NULL;
    static const char want400[] = "HTTP 400 from /s/code429/v1/chat/completions (invalid_request): "
                                  "\"mock error 400\";";
    CHECK_MSG(r && r->message && strncmp(r->message, want400, strlen(want400)) == 0,
              "message \"%s\"", msg(r));
    llmretry_call_free(c);
}

static void test_missing_ca_file(void)
{
    char url[128];
    llmretry_options o;
    llmretry_call *c = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    CHECK_INT(th_mock_script(&mock, "cafile", "{\"steps\": []}"), 0);
    opts_for(&o, "cafile", url, sizeof url);
    o.ca_file = "/nonexistent/llmretry-test-ca.pem";
    llmretry_status st = llmretry_call_blocking(mock_engine, &o, NULL, NULL, &c, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_EINVAL, "submit returned %s", llmretry_status_name(st));
    CHECK_MSG(strstr(err, "ca_file") && strstr(err, "cannot be read") &&
              strstr(err, "/nonexistent/llmretry-test-ca.pem"),
              "message \"%s\" does not say the ca_file cannot be read", err);
    CHECK_MSG(strstr(err, "TLS verification") == NULL, "message \"%s\"", err);
    if (st == LLMRETRY_OK)
        llmretry_call_free(c);
    CHECK_INT(recorded("cafile"), 0);
}

static void test_tls_to_a_plain_http_port(void)
{
    char url[128], https[160];
    llmretry_options o;
    llmretry_call *c = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    opts_for(&o, "plain", url, sizeof url);
    CHECK_MSG(strncmp(url, "http://", 7) == 0, "mock url %s", url);
    snprintf(https, sizeof https, "https://%s", url + 7);
    o.base_url = https;
    o.max_retries = 3;
    int64_t t0 = th_now_ms();
    CHECK_INT(llmretry_call_blocking(mock_engine, &o, NULL, NULL, &c, err, sizeof err),
              LLMRETRY_OK);
    int64_t took = th_now_ms() - t0;
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_NETWORK, "kind %d (%s)",
              r ? (int)r->kind : -1, msg(r));
    CHECK_MSG(r && r->attempts == 1 && r->reason == LLMRETRY_REASON_NOT_RETRYABLE,
              "%d attempts, reason %d (%s): expected 1, not_retryable", r ? r->attempts : -1,
              r ? (int)r->reason : -1, msg(r));
    CHECK_MSG(r && r->message && strstr(r->message, "TLS") && strstr(r->message, "http://"),
              "message \"%s\" does not say the server does not speak TLS", msg(r));
    CHECK_MSG(took < 2000, "took %lld ms", (long long)took);
    llmretry_call_free(c);
}

int main(void)
{
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_correctness_batch");
    }
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = llmretry_engine_new(NULL, &mock_engine, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_OK && mock_engine, "engine_new: %s (%s)",
              llmretry_status_name(st), err);
    if (mock_engine) {
        test_code_repeating_the_status();
        test_missing_ca_file();
        test_tls_to_a_plain_http_port();
        llmretry_engine_free(mock_engine);
    }
    th_mock_stop(&mock);
    return th_summary("test_correctness_batch");
}
