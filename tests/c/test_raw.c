/* The core against a raw-socket server that sends exactly the bytes a test
 * gives it: what the mock server cannot say (duplicate headers, 1xx interim
 * responses, very long header values, invalid UTF-8 bodies). Each
 * connection reads one request and gets the canned response, then closes. */
#include "harness.h"
#include "llmretry.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"

static int listen_fd = -1, port;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char *response;          /* what every connection gets (mu) */
static size_t response_len;
static char last_request[8192]; /* the last request's head and body (mu) */
static int requests;

/* Read one request: headers, then Content-Length bytes of body. */
static void read_request(int fd)
{
    char buf[8192];
    size_t len = 0;
    long body = -1;
    for (;;) {
        ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end && body < 0) {
            char *cl = strcasestr(buf, "\r\nContent-Length:");
            body = cl && cl < end ? strtol(cl + 17, NULL, 10) : 0;
        }
        if (end && (size_t)(end + 4 - buf) + (size_t)body <= len)
            break;
        if (len >= sizeof buf - 1)
            break;
    }
    buf[len] = '\0';
    pthread_mutex_lock(&mu);
    memcpy(last_request, buf, len + 1);
    requests++;
    pthread_mutex_unlock(&mu);
}

static void *serve(void *ud)
{
    (void)ud;
    for (;;) {
        int fd = accept(listen_fd, NULL, NULL);
        if (fd < 0)
            return NULL;
        read_request(fd);
        pthread_mutex_lock(&mu);
        size_t off = 0;
        while (off < response_len) {
            ssize_t w = write(fd, response + off, response_len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        pthread_mutex_unlock(&mu);
        close(fd);
    }
}

static int start_server(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(listen_fd, 16) != 0 || getsockname(listen_fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    port = ntohs(a.sin_port);
    pthread_t t;
    if (pthread_create(&t, NULL, serve, NULL) != 0)
        return -1;
    pthread_detach(t);
    return 0;
}

/* The canned response becomes `text` (len bytes, malloc'd, taken). */
static void put_response(char *text, size_t len)
{
    pthread_mutex_lock(&mu);
    free(response);
    response = text;
    response_len = len;
    requests = 0;
    pthread_mutex_unlock(&mu);
}

/* Set the canned response: `head` (status line and headers, each ending
 * in \r\n, without the blank line) and a body of `blen` bytes. */
static void set_response(const char *head, const char *body, size_t blen)
{
    char cl[64];
    snprintf(cl, sizeof cl, "Content-Length: %zu\r\nConnection: close\r\n\r\n", blen);
    size_t hl = strlen(head), cll = strlen(cl);
    char *text = malloc(hl + cll + blen);
    memcpy(text, head, hl);
    memcpy(text + hl, cl, cll);
    memcpy(text + hl + cll, body, blen);
    put_response(text, hl + cll + blen);
}

/* A whole response as given (its own framing: chunked, say). */
static void set_raw_response(const char *all)
{
    put_response(strdup(all), strlen(all));
}

static void opts(llmretry_options *o, char *url, size_t len)
{
    snprintf(url, len, "http://127.0.0.1:%d/v1", port);
    llmretry_options_defaults(o);
    o->base_url = url;
    o->api_key = "sk-test";
    o->use_env_api_key = 0;
    o->body = BODY;
    o->body_len = strlen(BODY);
    o->timeout_ms = 5000;
    o->max_retries = 0;
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 10;
}

static int ev_count[8];
static char ev_text[1 << 16];   /* the last call's events, as JSON lines (cut) */
static size_t ev_len;
static char ev_code[128];       /* the last llm_request_failed's error_code */

static void count_event(const llmretry_event *ev, void *ud)
{
    (void)ud;
    int t = (int)llmretry_event_type_of(ev);
    if (t >= 0 && t < 8)
        ev_count[t]++;
    char *json = llmretry_event_to_json(ev);
    if (json && ev_len + strlen(json) + 2 < sizeof ev_text)
        ev_len += (size_t)snprintf(ev_text + ev_len, sizeof ev_text - ev_len, "%s\n", json);
    llmretry_free(json);
    llmretry_field f;
    for (size_t i = 0; llmretry_event_field(ev, i, &f) == 0; i++)
        if (strcmp(f.name, "error_code") == 0)
            snprintf(ev_code, sizeof ev_code, "%s", f.s ? f.s : "(null)");
}

static llmretry_call *run(const llmretry_options *o)
{
    static llmretry_engine *e;
    char err[LLMRETRY_ERRBUF] = "";
    if (!e && llmretry_engine_new(NULL, &e, err, sizeof err) != LLMRETRY_OK)
        return NULL;
    if (!o) {
        llmretry_engine_free(e);
        e = NULL;
        return NULL;
    }
    llmretry_call *c = NULL;
    memset(ev_count, 0, sizeof ev_count);
    ev_len = 0;
    ev_text[0] = ev_code[0] = '\0';
    llmretry_status st = llmretry_call_blocking(e, o, count_event, NULL, &c, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_OK && c, "call: %s (%s)", llmretry_status_name(st), err);
    return c;
}

/* One call with options o, answered with this response. */
static llmretry_call *answered_with(const llmretry_options *o, const char *head, const char *body,
                                    size_t blen)
{
    set_response(head, body, blen);
    return run(o);
}

/* The same with opts' defaults. */
static llmretry_call *answered_by(const char *head, const char *body, size_t blen)
{
    char url[64];
    llmretry_options o;
    opts(&o, url, sizeof url);
    return answered_with(&o, head, body, blen);
}

#define ERR_BODY "{\"error\":{\"message\":\"busy\",\"type\":\"server_error\"}}"

/* The server's wait as the call read it (result.retry_after_ms). */
static int64_t retry_after_of(const char *head)
{
    llmretry_call *c = answered_by(head, ERR_BODY, strlen(ERR_BODY));
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    int64_t v = r ? r->retry_after_ms : -2;
    CHECK_MSG(r && !r->ok && r->status == 503, "expected a 503 result");
    llmretry_call_free(c);
    return v;
}

static void test_retry_after_whole_value(void)
{
    char head[1024];
    char pad[401];
    memset(pad, ' ', 400);
    pad[400] = '\0';
    /* Cut at 95 bytes this read as 300 ms. */
    snprintf(head, sizeof head, "HTTP/1.1 503 Busy\r\nRetry-After: 0.3%sgarbage\r\n", pad);
    CHECK_INT(retry_after_of(head), -1);
    snprintf(head, sizeof head, "HTTP/1.1 503 Busy\r\nretry-after-ms: 300%sgarbage\r\n", pad);
    CHECK_INT(retry_after_of(head), -1);
    /* A long value that is one number is read whole. */
    char zeros[301];
    memset(zeros, '0', 300);
    zeros[300] = '\0';
    snprintf(head, sizeof head, "HTTP/1.1 503 Busy\r\nRetry-After: 0.5%s\r\n", zeros);
    CHECK_INT(retry_after_of(head), 500);
    snprintf(head, sizeof head, "HTTP/1.1 503 Busy\r\nRetry-After: 1%s\r\n", zeros);
    CHECK_INT(retry_after_of(head), LLMRETRY_MAX_WAIT_MS);
}

static void test_duplicate_retry_after(void)
{
    CHECK_INT(retry_after_of("HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nRetry-After: 2\r\n"), 7000);
    CHECK_INT(retry_after_of("HTTP/1.1 503 Busy\r\nRetry-After: 2\r\nRetry-After: 7\r\n"), 7000);
    CHECK_INT(retry_after_of("HTTP/1.1 503 Busy\r\nRetry-After: 3\r\nRetry-After: soon\r\n"), 3000);
    CHECK_INT(retry_after_of("HTTP/1.1 503 Busy\r\nretry-after-ms: 900\r\n"
                             "Retry-After-Ms: 40\r\n"), 900);
    /* A 429 with two resets: the longest (the result keeps the decided
     * delay out of retry_after_ms, so look at the giving-up reason). */
    char url[64];
    llmretry_options o;
    opts(&o, url, sizeof url);
    o.max_retries = 1;
    o.max_retry_after_ms = 5000;
    set_response("HTTP/1.1 429 Slow\r\nx-ratelimit-reset-requests: 10s\r\n"
                 "x-ratelimit-reset-requests: 1s\r\n", ERR_BODY, strlen(ERR_BODY));
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->reason == LLMRETRY_REASON_RETRY_AFTER_TOO_LONG,
              "duplicate reset headers 10s, 1s: reason %s, want retry_after_too_long",
              r ? llmretry_reason_name(r->reason) : "(none)");
    llmretry_call_free(c);
}

static void test_interim_content_length(void)
{
    static const char ok[] = "{\"id\":\"x\",\"object\":\"chat.completion\",\"model\":\"gpt-test\","
                             "\"choices\":[{}]}";
    char url[64];
    llmretry_options o;
    opts(&o, url, sizeof url);
    o.max_response_bytes = 1000;
    set_response("HTTP/1.1 103 Early Hints\r\nContent-Length: 999999999\r\n"
                 "Link: </x>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n"
                 "Content-Type: application/json\r\n", ok, strlen(ok));
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->ok, "a 1xx Content-Length counted toward max_response_bytes: %s",
              r && r->message ? r->message : "(no message)");
    llmretry_call_free(c);
}

/* The provider's text in an error cannot start a log line of its own, and
 * the error names the path called, never the query or credentials. */
static void test_error_message(void)
{
    char url[160];
    llmretry_options o;
    opts(&o, url, sizeof url);
    snprintf(url, sizeof url, "http://user:pw-SECRET@127.0.0.1:%d/v1/chat/completions?key=Q-SECRET",
             port);
    o.url = url;
    o.base_url = NULL;
    o.api_key = "sk-test-ECHOED";
    /* A message quoting the key is withheld; a code that is free text is replaced. */
    static const char body[] =
        "{\"error\":{\"message\":\"bad key sk-test-ECHOED\","
        "\"code\":\"bad\\n2026-12-01 INFO forged\\r\\u001b[31m\xff\"}}";
    set_response("HTTP/1.1 401 No\r\nContent-Type: application/json\r\n", body, strlen(body));
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    const char *m = r && r->message ? r->message : "";
    static const char want[] = "HTTP 401 from /v1/chat/completions (invalid_code): (the "
                               "server's message is withheld because it echoes the request); "
                               "gave up";
    CHECK_MSG(strncmp(m, want, strlen(want)) == 0, "message: %s", m);
    CHECK_MSG(!strstr(m, "SECRET") && !strstr(m, "ECHOED") && !strstr(m, "?"),
              "credentials, prompt or query in: %s", m);
    CHECK_STR(r ? r->error_code : NULL, "invalid_code");
    llmretry_call_free(c);

    /* The message itself: escaped, quoted. */
    static const char ctl[] = "{\"error\":{\"message\":\"no\\n2026-12-01 INFO forged\\r"
                              "\\u001b[31m\xff\",\"code\":\"c.ok:1\"}}";
    set_response("HTTP/1.1 401 No\r\nContent-Type: application/json\r\n", ctl, strlen(ctl));
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    m = r && r->message ? r->message : "";
    static const char want2[] = "HTTP 401 from /v1/chat/completions (c.ok:1): \"no\\n2026-12-01 "
                                "INFO forged\\r\\x1b[31m\\xff\"; gave up";
    CHECK_MSG(strncmp(m, want2, strlen(want2)) == 0, "message: %s", m);
    CHECK_MSG(!strpbrk(m, "\r\n\x1b"), "raw control characters in: %s", m);
    llmretry_call_free(c);

    opts(&o, url, sizeof url);
    static const char rl[] = "{\"error\":{\"message\":\"slow down\",\"code\":\"429\"}}";
    set_response("HTTP/1.1 429 Slow\r\n", rl, strlen(rl));
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    m = r && r->message ? r->message : "";
    static const char want3[] = "HTTP 429 from /v1/chat/completions: \"slow down\"; gave up";
    CHECK_MSG(strncmp(m, want3, strlen(want3)) == 0, "message: %s", m);
    llmretry_call_free(c);
}

/* A request whose message contents are secrets (at least 16 bytes each). */
#define PROMPT "SECRET-PROMPT please summarise the attached report"
#define TOKEN_PROMPT "SECRET_PROMPT_TOKEN_0123456789"
#define SECRET_BODY "{\"model\":\"gpt-test\",\"messages\":[{\"role\":\"system\",\"content\":" \
    "\"" TOKEN_PROMPT "\"},{\"role\":\"user\",\"content\":\"" PROMPT "\"}]}"

/* One call of SECRET_BODY (streaming with `stream`) answered with `head`
 * and `body`; the result's message, error code and the events' code are
 * checked for the secrets. Returns the call (to free). */
static llmretry_call *secret_call(const char *head, const char *body, size_t blen, int stream)
{
    static const char streaming[] = "{\"model\":\"gpt-test\",\"stream\":true,\"messages\":"
        "[{\"role\":\"system\",\"content\":\"" TOKEN_PROMPT "\"},{\"role\":\"user\","
        "\"content\":\"" PROMPT "\"}]}";
    char url[64];
    llmretry_options o;
    opts(&o, url, sizeof url);
    o.body = stream ? streaming : SECRET_BODY;
    o.body_len = strlen(o.body);
    set_response(head, body, blen);
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    const char *m = r && r->message ? r->message : "";
    const char *code = r && r->error_code ? r->error_code : "";
    CHECK_MSG(r && !r->ok, "the call succeeded");
    /* 16 bytes of each secret, and the start of a long run of 'c'. */
    static const char *const secrets[] = { "SECRET-PROMPT pl", "SECRET_PROMPT_TO",
                                           "0123456789", "cccccccccccccccc", "has spaces" };
    for (size_t i = 0; i < sizeof secrets / sizeof *secrets; i++)
        CHECK_MSG(!strstr(m, secrets[i]) && !strstr(code, secrets[i]) &&
                  !strstr(ev_code, secrets[i]),
                  "\"%s\" in the message \"%.300s\", the code \"%.80s\" or the events' "
                  "code \"%.80s\"", secrets[i], m, code, ev_code);
    return c;
}

/* A server's error.code shows only as a short token that does not quote
 * the request: else "invalid_code", in the result, the message and the
 * events alike, for an HTTP error body and a stream's error event. */
static void test_error_code_screened(void)
{
    static const char head400[] = "HTTP/1.1 400 Bad\r\nContent-Type: application/json\r\n";
    static const char fmt[] = "{\"error\":{\"message\":\"bad\",\"type\":\"x\",\"code\":\"%s\"}}";
    size_t big = 200 * 1024;
    char *code = malloc(big + 1);
    memset(code, 'c', big);
    code[big] = '\0';
    char long_token[66];        /* 65 bytes of the token alphabet: too long */
    memset(long_token, 'a', 65);
    long_token[65] = '\0';
    const char *bad[] = { code, "has spaces in it", TOKEN_PROMPT, PROMPT, long_token };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t n = strlen(bad[i]) + sizeof fmt;
        char *body = malloc(n);
        snprintf(body, n, fmt, bad[i]);
        llmretry_call *c = secret_call(head400, body, strlen(body), 0);
        const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
        CHECK_STR(r ? r->error_code : NULL, "invalid_code");
        CHECK_STR(ev_code, "invalid_code");
        CHECK_MSG(r && r->message && strstr(r->message, " (invalid_code): \"bad\"; gave up"),
                  "message: %.300s", r && r->message ? r->message : "");
        llmretry_call_free(c);
        free(body);
    }
    free(code);
    /* 64 bytes of the token alphabet is a code. */
    long_token[57] = '\0';
    char token[80], ok[160];
    snprintf(token, sizeof token, "Zz09_.:%s", long_token);
    snprintf(ok, sizeof ok, fmt, token);
    CHECK_INT(strlen(token), 64);
    llmretry_call *c = secret_call(head400, ok, strlen(ok), 0);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_STR(r ? r->error_code : NULL, token);
    CHECK_STR(ev_code, token);
    llmretry_call_free(c);
    /* A stream's error event: its code is checked the same way. */
    static const char sse[] = "data: {\"error\":{\"message\":\"" PROMPT "\",\"code\":\""
                              PROMPT "\"}}\n\n";
    c = secret_call("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n", sse,
                    strlen(sse), 1);
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_STR(r ? r->error_code : NULL, "invalid_code");
    CHECK_STR(ev_code, "invalid_code");
    llmretry_call_free(c);
}

/* A 4xx's provider message is in the error (what the user must fix), cut
 * to 300 bytes, unless it quotes 16 bytes in a row of the request's
 * messages: then the error says it was withheld. */
static void test_error_message_shown(void)
{
    static const char head[] = "HTTP/1.1 400 Bad\r\nContent-Type: application/json\r\n";
    static const char temp[] = "{\"error\":{\"message\":\"Invalid value for 'temperature': must "
                               "be <= 2.\",\"type\":\"invalid_request_error\",\"code\":null}}";
    llmretry_call *c = secret_call(head, temp, strlen(temp), 0);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    static const char want[] = "HTTP 400 from /v1/chat/completions (invalid_request_error): "
        "\"Invalid value for 'temperature': must be <= 2.\"; gave up after 1 attempt";
    CHECK_MSG(r && r->message && strncmp(r->message, want, strlen(want)) == 0,
              "message: %s", r && r->message ? r->message : "");
    CHECK_MSG(!strstr(ev_text, "temperature': must be <= 2.\"; gave"),
              "the message reached the events: %s", ev_text);
    llmretry_call_free(c);

    /* 16 bytes of a message content: withheld; 15: shown. */
    static const char *const echo[] = {
        "{\"error\":{\"message\":\"cannot read 'ummarise the att' here\"}}",
        "{\"error\":{\"message\":\"cannot read 'TOKEN_0123456789'\"}}",
        "{\"error\":\"rejected: " PROMPT "\"}",
        "{\"detail\":\"rejected: " PROMPT "\"}",
    };
    for (size_t i = 0; i < sizeof echo / sizeof *echo; i++) {
        c = secret_call(head, echo[i], strlen(echo[i]), 0);
        r = c ? llmretry_call_result(c) : NULL;
        CHECK_MSG(r && r->message && strstr(r->message, "/v1/chat/completions: (the server's "
                  "message is withheld because it echoes the request); gave up"),
                  "echo %zu: %s", i, r && r->message ? r->message : "");
        CHECK_MSG(r && r->message && !strstr(r->message, "cannot read") &&
                  !strstr(r->message, "rejected"), "echo %zu: %s", i,
                  r && r->message ? r->message : "");
        llmretry_call_free(c);
    }
    static const char fifteen[] = "{\"error\":{\"message\":\"cannot read 'ummarise the at'\"}}";
    c = secret_call(head, fifteen, strlen(fifteen), 0);
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->message && strstr(r->message, ": \"cannot read 'ummarise the at'\"; gave"),
              "message: %s", r && r->message ? r->message : "");
    llmretry_call_free(c);

    /* Cut to 300 bytes on a whole character, marked "...". */
    char body[1200];
    int n = snprintf(body, sizeof body, "{\"error\":{\"message\":\"");
    int n0 = n;
    memset(body + n, 'a', 299);
    n += 299;
    for (int i = 0; i < 100; i++)
        n += snprintf(body + n, sizeof body - (size_t)n, "\xc3\xa9");
    n += snprintf(body + n, sizeof body - (size_t)n, "\"}}");
    c = secret_call(head, body, (size_t)n, 0);
    r = c ? llmretry_call_result(c) : NULL;
    char want_cut[400];
    snprintf(want_cut, sizeof want_cut, "/v1/chat/completions: \"%.299s...\"; gave up",
             body + n0);
    CHECK_MSG(r && r->message && strstr(r->message, want_cut), "message: %s",
              r && r->message ? r->message : "");
    llmretry_call_free(c);
}

/* A redirect is not followed; the message says where it leads (a base_url
 * to give when the endpoint moved whole), shown without user info or
 * query, and only for a 3xx. */
static void test_redirect_hint(void)
{
    static const struct { const char *head; const char *want; } t[] = {
        { "HTTP/1.1 301 Moved Permanently\r\nLocation: https://api.example.com/v1/chat/completions\r\n",
          "HTTP 301 from /v1/chat/completions; the server redirects to https://api.example.com/v1/"
          "chat/completions: use base_url https://api.example.com/v1 (redirects are not "
          "followed); gave up after 1 attempt: not retryable" },
        { "HTTP/1.1 307 Temporary Redirect\r\nlocation:  /v2/chat/completions \r\n",
          "; the server redirects to /v2/chat/completions (redirects are not followed: check "
          "base_url); gave up" },
        { "HTTP/1.1 302 Found\r\nLocation: https://user:pw@elsewhere.example/v1/chat/completions"
          "?key=sk-LEAK\r\n",
          "; the server redirects to https://***@elsewhere.example/v1/chat/completions?*** "
          "(redirects are not followed: check base_url)" },
        { "HTTP/1.1 404 Not Found\r\nLocation: https://api.example.com/v1/chat/completions\r\n",
          NULL },
        /* not a URL's text (a space, a byte above ASCII): no hint */
        { "HTTP/1.1 301 Moved\r\nLocation: https://api.example.com/v1/chat completions\r\n", NULL },
        { "HTTP/1.1 301 Moved\r\nLocation: https://api.example.com/v1/\xc3\xa9\r\n", NULL },
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        char url[64];
        llmretry_options o;
        opts(&o, url, sizeof url);
        o.max_retries = 2;
        set_response(t[i].head, "", 0);
        llmretry_call *c = run(&o);
        const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
        const char *m = r && r->message ? r->message : "";
        if (t[i].want)
            CHECK_MSG(strstr(m, t[i].want), "redirect %zu: %s", i, m);
        else
            CHECK_MSG(!strstr(m, "redirect"), "a 404's Location taken for a redirect: %s", m);
        CHECK_MSG(!strstr(m, "pw") && !strstr(m, "LEAK"), "redirect %zu: a secret shown: %s", i, m);
        pthread_mutex_lock(&mu);
        int seen = requests;
        pthread_mutex_unlock(&mu);
        CHECK_MSG(seen == 1, "redirect %zu: %d requests (followed, or retried)", i, seen);
        llmretry_call_free(c);
    }
}

/* A 200 whose body is an error (answer_error.c) says so as an HTTP error
 * does: the path, the status it stands for, the provider's code and
 * message screened alike (a prompt echoed is withheld, a code holding it
 * is invalid_code). */
static void test_answer_error_message(void)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
    static const char gw[] = "{\"error\":{\"code\":502,\"message\":\"Provider returned error\","
                             "\"metadata\":{\"provider_name\":\"Example\"}}}";
    llmretry_call *c = secret_call(head, gw, strlen(gw), 0);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    static const char want[] = "HTTP 200 from /v1/chat/completions whose body is an error "
        "(HTTP 502-like): \"Provider returned error\"; gave up after 1 attempt";
    CHECK_MSG(r && r->message && strncmp(r->message, want, strlen(want)) == 0 &&
              r->kind == LLMRETRY_ERR_HTTP_STATUS && r->status == 502 && r->error_code &&
              strcmp(r->error_code, "502") == 0,
              "message: %s (status %d, code %s)", r && r->message ? r->message : "",
              r ? r->status : -1, r && r->error_code ? r->error_code : "(none)");
    llmretry_call_free(c);

    static const char *const echo[] = {
        "{\"error\":{\"type\":\"server_error\",\"message\":\"rejected: " PROMPT "\"}}",
        "{\"error\":{\"code\":\"" TOKEN_PROMPT "\",\"message\":\"x\"}}",
    };
    for (size_t i = 0; i < sizeof echo / sizeof *echo; i++) {
        c = secret_call(head, echo[i], strlen(echo[i]), 0);
        r = c ? llmretry_call_result(c) : NULL;
        CHECK_MSG(r && r->message && strstr(r->message, "whose body is an error (HTTP ") &&
                  (i != 0 || strstr(r->message, "(the server's message is withheld because "
                                               "it echoes the request)")) &&
                  (i != 1 || (r->error_code && strcmp(r->error_code, "invalid_code") == 0)),
                  "echo %zu: %s (code %s)", i, r && r->message ? r->message : "",
                  r && r->error_code ? r->error_code : "(none)");
        llmretry_call_free(c);
    }
}

/* An error inside a stream says what the provider said, screened as an
 * HTTP error's message is: the chat error event, the Responses API's
 * response.failed, a choice ended by an error. */
static void test_stream_error_message(void)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n";
    static const struct { const char *sse, *want; } shown[] = {
        { "data: {\"error\":{\"type\":\"server_error\",\"message\":\"The model crashed\"}}\n\n",
          "HTTP 200 from /v1/chat/completions: the server sent an error inside the stream "
          "(HTTP 500-like) (server_error): \"The model crashed\"; gave up after 1 attempt" },
        { "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":"
          "\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"Out of capacity\"}}}\n\n",
          "(HTTP 500-like) (server_error): \"Out of capacity\"; gave up" },
        { "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hal\"},\"finish_reason\":"
          "\"error\",\"error\":{\"message\":\"Upstream cut the answer\"}}]}\n\n",
          "(HTTP 500-like): \"Upstream cut the answer\"; gave up" },
        { "data: {\"error\":{\"message\":\"rejected: " PROMPT "\"}}\n\n",
          "(HTTP 400-like): (the server's message is withheld because it echoes the request)" },
        { "event: error\ndata: {\"error\":{\"code\":429}}\n\n",
          "(HTTP 429-like); gave up after 1 attempt" },
    };
    for (size_t i = 0; i < sizeof shown / sizeof *shown; i++) {
        llmretry_call *c = secret_call(head, shown[i].sse, strlen(shown[i].sse), 1);
        const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
        CHECK_MSG(r && r->message && strstr(r->message, shown[i].want) &&
                  r->kind == LLMRETRY_ERR_HTTP_STATUS,
                  "case %zu: %s", i, r && r->message ? r->message : "(none)");
        llmretry_call_free(c);
    }
    /* With keep_response, the event given up on is the result's body (a
     * transport hands it on: an empty 2xx stream would read as no answer). */
    static const char ev[] = "{\"error\":{\"type\":\"server_error\",\"message\":\"kept\"}}";
    char sse[128], url[64];
    snprintf(sse, sizeof sse, "data: %s\n\n", ev);
    llmretry_options o;
    opts(&o, url, sizeof url);
    o.keep_response = 1;
    llmretry_call *c = answered_with(&o, head, sse, strlen(sse));
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->body && r->body_len == strlen(ev) && memcmp(r->body, ev,
                                                                        r->body_len) == 0,
              "kept body: %.*s", r && r->body ? (int)r->body_len : 6,
              r && r->body ? r->body : "(none)");
    llmretry_call_free(c);
}

/* An event stream labelled otherwise (a gateway rewriting it to
 * application/json): read as the stream it is, as the openai SDK reads a
 * stream it asked for; an error status whose body looks so stays an error. */
static void test_stream_under_another_label(void)
{
    static const char sse[] = ": hello\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                              "\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    static const char *const heads[] = {
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n",
        "HTTP/1.1 200 OK\r\n",
    };
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++) {
        llmretry_call *c = answered_by(heads[i], sse, strlen(sse));
        const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
        CHECK_MSG(r && r->ok && r->stream && r->body && strstr(r->body, "\"content\":\"hi\""),
                  "head %zu: ok=%d stream=%d %s", i, r ? r->ok : -1, r ? r->stream : -1,
                  r && r->message ? r->message : "");
        llmretry_call_free(c);
    }
    static const char err[] = "data: upstream failed\n\n";
    llmretry_call *c = answered_by("HTTP/1.1 502 Bad Gateway\r\nContent-Type: "
                                   "application/json\r\n", err, strlen(err));
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_HTTP_STATUS && r->status == 502 && !r->stream,
              "a 502: %s", r && r->message ? r->message : "");
    llmretry_call_free(c);
}

/* The label is judged by the first bytes that are not white space, even
 * when white space came alone first (a chunk of blank lines, a gateway's
 * keep-alive): chunked, each chunk reaches the call on its own. */
static void test_label_judged_past_leading_white_space(void)
{
    char url[64];
    llmretry_options o;
    opts(&o, url, sizeof url);
    set_raw_response("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                     "2\r\n\n\n\r\n"
                     "51\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},"
                     "\"finish_reason\":\"stop\"}]}\n\n\r\n"
                     "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n");
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->ok && r->stream && r->body && strstr(r->body, "\"content\":\"hi\""),
              "a stream labelled JSON after a blank chunk: ok=%d stream=%d %s", r ? r->ok : -1,
              r ? r->stream : -1, r && r->message ? r->message : "");
    llmretry_call_free(c);
    set_raw_response("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                     "2\r\n\r\n\r\n"
                     "4b\r\n{\"choices\":[{\"index\":0,\"message\":{\"content\":\"hi\"},"
                     "\"finish_reason\":\"stop\"}]}\r\n0\r\n\r\n");
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->ok && !r->stream && r->body && strstr(r->body, "\"content\":\"hi\""),
              "JSON labelled a stream after a blank chunk: ok=%d stream=%d %s", r ? r->ok : -1,
              r ? r->stream : -1, r && r->message ? r->message : "");
    llmretry_call_free(c);
}

/* A header line past libcurl's 100 KB: said so, not "Out of memory" (what
 * libcurl before 8.6 calls it). */
static void test_huge_header_line(void)
{
    size_t n = 150 * 1024;
    static const char pre[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Big: ";
    char *head = malloc(sizeof pre + n + 3);
    if (!head)
        return;
    memcpy(head, pre, sizeof pre - 1);
    memset(head + sizeof pre - 1, 'a', n);
    memcpy(head + sizeof pre - 1 + n, "\r\n", 3);
    static const char ok[] = "{\"choices\":[{\"index\":0,\"message\":{\"content\":\"x\"},"
                             "\"finish_reason\":\"stop\"}]}";
    llmretry_call *c = answered_by(head, ok, strlen(ok));
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_NETWORK && r->message &&
              strstr(r->message, "the response's head is larger than libcurl takes"),
              "message: %s", r && r->message ? r->message : "(none)");
    llmretry_call_free(c);
    free(head);
}

/* A JSON answer labelled text/event-stream (a proxy labelling every answer
 * so) is read as the JSON it is, as the openai SDK reads it: read as a
 * stream it was no event at all, an empty stream retried to the end. */
static void test_json_labelled_as_a_stream(void)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n";
    static const char answer[] = "\r\n {\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                                 "\"content\":\"hi\"},\"finish_reason\":\"stop\"}],\"usage\":"
                                 "{\"prompt_tokens\":2,\"completion_tokens\":1,\"total_tokens\":3}}";
    static const char error[] = "{\"error\":{\"message\":\"no such model\",\"code\":\"model_not_found\"}}";
    char url[64];
    llmretry_options o;
    opts(&o, url, sizeof url);
    o.max_retries = 1;
    llmretry_call *c = answered_with(&o, head, answer, strlen(answer));
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->ok && r->attempts == 1 && r->usage.total_tokens == 3 && !r->stream,
              "answer: ok=%d attempts=%d %s", r ? r->ok : -1, r ? r->attempts : -1,
              r && r->message ? r->message : "");
    llmretry_call_free(c);
    c = answered_with(&o, head, error, strlen(error));
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_HTTP_STATUS && r->status == 400 &&
              r->attempts == 1 && r->message && strstr(r->message, "\"no such model\""),
              "error: %s", r && r->message ? r->message : "");
    llmretry_call_free(c);
    /* A stream that is one: still a stream. */
    static const char sse[] = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},"
                              "\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    c = answered_with(&o, head, sse, strlen(sse));
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->ok && r->stream, "a real stream: ok=%d stream=%d", r ? r->ok : -1,
              r ? r->stream : -1);
    llmretry_call_free(c);
}

/* A 2xx body must be UTF-8 JSON as every host decodes it: anything else is
 * an invalid response, retried, and no event says it succeeded. */
static void test_body_must_be_utf8_json(void)
{
    static const struct { const char *body; int ok; } t[] = {
        { "{\"choices\":[{}],\"x\":\"\xff\"}", 0 },          /* invalid UTF-8 */
        { "{\"choices\":[{}],\"x\":\"\xc0\xaf\"}", 0 },       /* overlong */
        { "{\"choices\":[{}],\"x\":\"\xed\xa0\x80\"}", 0 },   /* a surrogate */
        { "{\"choices\":[{}],\"x\":\"a\x01b\"}", 0 },         /* raw control char */
        { "{\"choices\":[{}],\"x\":\"a\nb\"}", 0 },           /* raw newline in a string */
        { "{\x01\"choices\":[{}]}", 0 },                       /* control char outside */
        { "{\"choices\":[{}],\"x\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}", 1 },
        { "{\"choices\":[{}],\"x\":\"a\\u0000b\\\"\\\\\"}", 1 },   /* escapes are fine */
        { "{\"choices\":[{}]}\r\n\t ", 1 },
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        char url[64];
        llmretry_options o;
        opts(&o, url, sizeof url);
        o.max_retries = 1;
        set_response("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n", t[i].body,
                     strlen(t[i].body));
        llmretry_call *c = run(&o);
        const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
        if (t[i].ok) {
            CHECK_MSG(r && r->ok, "body %zu: not ok (%s)", i, r && r->message ? r->message : "");
        } else {
            CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_INVALID_RESPONSE && r->attempts == 2,
                      "body %zu: ok=%d kind=%s attempts=%d", i, r ? r->ok : -1,
                      r ? llmretry_error_kind_name(r->kind) : "", r ? r->attempts : -1);
            CHECK_MSG(ev_count[LLMRETRY_EV_REQUEST_SUCCEEDED] == 0 &&
                      ev_count[LLMRETRY_EV_REQUEST_ERROR] == 2,
                      "body %zu: %d succeeded, %d error events", i,
                      ev_count[LLMRETRY_EV_REQUEST_SUCCEEDED], ev_count[LLMRETRY_EV_REQUEST_ERROR]);
        }
        llmretry_call_free(c);
    }
    /* Compressed bytes the client never asked for: said so, not "a control
     * character outside strings" at byte 0. */
    static const char gz[] = "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xab\xae\x05\x00";
    llmretry_call *c = answered_by("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                   "Content-Encoding: gzip\r\n", gz, sizeof gz - 1);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_INVALID_RESPONSE && r->message &&
              strstr(r->message, "HTTP 200 with a body that is gzip-compressed, which the client "
                                 "did not ask for"),
              "gzip: %s", r && r->message ? r->message : "(none)");
    llmretry_call_free(c);
}

/* A port nobody listens on: bind, read the port, close. */
static int closed_port(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0)
        return -1;
    int p = -1;
    if (bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        p = ntohs(a.sin_port);
    close(s);
    return p;
}

/* A base_url that ends with the endpoint's path (the whole URL pasted in)
 * has it twice in the request, and one with no path misses the API's /v1:
 * a 404 then says what to check. Not for a url given whole, nor for a
 * base_url of the API's base. */
static void test_doubled_path_hint(void)
{
    char url[160];
    llmretry_options o;
    set_response("HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n",
                 "{\"error\":{\"message\":\"Invalid URL\"}}", 35);
    opts(&o, url, sizeof url);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions/", port);
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->status == 404 && r->message &&
              strstr(r->message, "HTTP 404 from /v1/chat/completions/chat/completions") &&
              strstr(r->message, "\"Invalid URL\"; check base_url: it ends with "
                                 "/chat/completions, which each call appends (give the API's "
                                 "base, such as https://api.openai.com/v1, or the whole URL as "
                                 "url); gave up after 1 attempt"),
              "doubled: message %s", r && r->message ? r->message : "(none)");
    llmretry_call_free(c);
    /* The same path, given whole as url: the caller wrote it. */
    opts(&o, url, sizeof url);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions/chat/completions", port);
    o.base_url = NULL;
    o.url = url;
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->status == 404 && r->message && !strstr(r->message, "check"),
              "url: message %s", r && r->message ? r->message : "(none)");
    llmretry_call_free(c);
    /* A base_url with no path: OpenAI-compatible servers answer under /v1. */
    opts(&o, url, sizeof url);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->status == 404 && r->message &&
              strstr(r->message, "HTTP 404 from /chat/completions") &&
              strstr(r->message, "; check base_url: it has no path, and OpenAI-compatible "
                                 "servers answer under one, most often /v1 "
                                 "(http://host:port/v1); gave up after 1 attempt"),
              "no path: message %s", r && r->message ? r->message : "(none)");
    llmretry_call_free(c);
    /* A base_url of the API's base: a 404 is the server's word alone. */
    opts(&o, url, sizeof url);
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->status == 404 && r->message && !strstr(r->message, "check"),
              "plain 404: message %s", r && r->message ? r->message : "(none)");
    llmretry_call_free(c);
}

/* A 401 to a request that carried no credential says what is missing; one
 * that carried a key, in a header of another name (Azure's api-key) or in
 * its URL's query, is the server's word alone. */
static void test_no_key_hint(void)
{
    char url[128];
    llmretry_options o;
    static const char *api_key_header[] = { "api-key: k-123456789" };
    set_response("HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n",
                 "{\"error\":{\"message\":\"no key\"}}", 30);
    for (int i = 0; i < 4; i++) {           /* none, a key, an api-key header, ?key= */
        opts(&o, url, sizeof url);
        if (i != 1)
            o.api_key = NULL;
        if (i == 2) {
            o.headers = api_key_header;
            o.n_headers = 1;
        }
        if (i == 3)
            snprintf(url, sizeof url, "http://127.0.0.1:%d/v1?key=k-123456789", port);
        llmretry_call *c = run(&o);
        const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
        int hinted = r && r->message && strstr(r->message, "\"no key\"; no API key was sent "
                                                  "(give api_key, or set OPENAI_API_KEY); gave "
                                                  "up after 1 attempt") != NULL;
        CHECK_MSG(r && !r->ok && r->status == 401 && hinted == (i == 0),
                  "case %d: message %s", i, r && r->message ? r->message : "(none)");
        llmretry_call_free(c);
    }
}

/* A network failure where nothing of the URL's origin ever answered (issue
 * 32 item 6): the message says the call never reached it and to check the
 * option that named it; the retries are as ever. Where the origin answered
 * before (this raw server, then stopped), the ordinary message. Runs last:
 * it stops the server. */
static void test_never_reached(void)
{
    char url[128], want[160];
    llmretry_options o;
    int closed = closed_port();
    CHECK_MSG(closed > 0, "could not find a closed port");
    opts(&o, url, sizeof url);
    snprintf(url, sizeof url, "http://user:SECRET-PW@127.0.0.1:%d/v1", closed);
    o.max_retries = 2;
    llmretry_call *c = run(&o);
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_NETWORK && r->attempts == 3 &&
              r->reason == LLMRETRY_REASON_RETRIES_EXHAUSTED,
              "closed port: expected network after 3 attempts");
    snprintf(want, sizeof want, "; never reached http://127.0.0.1:%d (no connection to it "
             "has worked yet): check base_url; gave up after 3 attempts", closed);
    CHECK_MSG(r && r->message && strstr(r->message, "could not connect: ") == r->message &&
              strstr(r->message, want), "closed port: message %s", r ? r->message : "(none)");
    CHECK_MSG(r && r->message && !strstr(r->message, "SECRET") && !strstr(r->message, "sk-test")
              && !strstr(r->message, "/v1"), "closed port: message %s", r ? r->message : "");
    llmretry_call_free(c);

    /* Named by url: that is what to check. A name that does not resolve too. */
    opts(&o, url, sizeof url);
    o.base_url = NULL;
    o.url = "http://nonexistent.invalid/v1/chat/completions";
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_NETWORK && r->message &&
              strstr(r->message, "; never reached http://nonexistent.invalid (no connection "
                                 "to it has worked yet): check url; gave up after 1 attempt"),
              "unknown host: message %s", r && r->message ? r->message : "(none)");
    llmretry_call_free(c);

    /* This server answered; stopped, it refuses: an outage, said as ever. */
    opts(&o, url, sizeof url);
    set_response("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n",
                 "{\"choices\":[{}]}", 16);
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && r->ok, "the raw server did not answer");
    llmretry_call_free(c);
    shutdown(listen_fd, SHUT_RDWR);
    close(listen_fd);
    listen_fd = -1;
    o.max_retries = 1;
    c = run(&o);
    r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r && !r->ok && r->kind == LLMRETRY_ERR_NETWORK && r->attempts == 2 && r->message &&
              strstr(r->message, "could not connect: ") == r->message &&
              !strstr(r->message, "never reached"),
              "stopped server: message %s", r && r->message ? r->message : "(none)");
    llmretry_call_free(c);
}

/* The screen on its own (llmretry_text_quotes), for text the engine did not
 * read itself: the same rule as an error message's above. */
static void test_text_quotes(void)
{
    static const char body[] = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": "
                               "\"the itinerary of the secret harbour visit\"}], \"temperature\": "
                               "\"a value that is not a message at all\"}";
    const char *secrets[] = { "sk-0123456789abcdef0123", "short-12", "tiny", NULL };
    static const struct { const char *text; int quotes; } cases[] = {
        { "Invalid content: the itinerary of the secret harbour visit", 1 },
        { "...secret harbour visi...", 1 },                 /* 16 bytes in a row */
        { "secret harbour vis", 1 },
        { "secret harbour", 0 },                            /* 14: too short to tell */
        { "a value that is not a message at all", 0 },      /* not a message's */
        { "Incorrect API key provided: sk-0123456789abcdef0123.", 1 },
        { "key 0123456789abcdef0 is wrong", 1 },            /* 16 bytes of the key */
        { "token short-12 refused", 1 },                    /* a short secret, whole */
        { "token short-1 refused", 0 },
        { "tiny", 0 },                                      /* under 8 bytes: ignored */
        { "max_tokens is too large", 0 },
        { "", 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK_MSG(llmretry_text_quotes(cases[i].text, strlen(cases[i].text), body, strlen(body),
                                       secrets, 4) == cases[i].quotes,
                  "case %zu (%s): expected %d", i, cases[i].text, cases[i].quotes);
    /* A body that is not JSON is all request; no body, only the secrets. */
    CHECK(llmretry_text_quotes("echo: plain text prompt here!", 29, "plain text prompt here!!",
                               24, NULL, 0) == 1);
    CHECK(llmretry_text_quotes("the itinerary of the secret harbour visit", 41, NULL, 0, NULL,
                               0) == 0);
    /* Past 512 bytes of text nothing is looked at (an error shows 300). */
    char longer[700];
    memset(longer, 'x', sizeof longer);
    memcpy(longer + 600, "the itinerary of", 16);
    CHECK(llmretry_text_quotes(longer, sizeof longer, body, strlen(body), NULL, 0) == 0);
    memcpy(longer + 100, "the itinerary of", 16);
    CHECK(llmretry_text_quotes(longer, sizeof longer, body, strlen(body), NULL, 0) == 1);
}

int main(void)
{
    if (start_server() != 0) {
        CHECK_MSG(0, "raw server did not start");
        return th_summary("test_raw");
    }
    struct { const char *name; void (*fn)(void); } tests[] = {
        { "retry_after_whole_value", test_retry_after_whole_value },
        { "duplicate_retry_after", test_duplicate_retry_after },
        { "interim_content_length", test_interim_content_length },
        { "error_message", test_error_message },
        { "error_code_screened", test_error_code_screened },
        { "error_message_shown", test_error_message_shown },
        { "answer_error_message", test_answer_error_message },
        { "stream_error_message", test_stream_error_message },
        { "text_quotes", test_text_quotes },
        { "redirect_hint", test_redirect_hint },
        { "body_must_be_utf8_json", test_body_must_be_utf8_json },
        { "json_labelled_as_a_stream", test_json_labelled_as_a_stream },
        { "huge_header_line", test_huge_header_line },
        { "stream_under_another_label", test_stream_under_another_label },
        { "label_past_white_space", test_label_judged_past_leading_white_space },
        { "doubled_path_hint", test_doubled_path_hint },
        { "no_key_hint", test_no_key_hint },
        { "never_reached", test_never_reached },        /* last: it stops the server */
    };
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        int before = th_failed;
        tests[i].fn();
        fprintf(stderr, "%-28s %s\n", tests[i].name, th_failed == before ? "ok" : "FAILED");
    }
    run(NULL);
    if (listen_fd >= 0) {
        shutdown(listen_fd, SHUT_RDWR);
        close(listen_fd);
    }
    free(response);
    return th_summary("test_raw");
}
