/* libFuzzer target: the response handling of the core on arbitrary server
 * data — header capture (transfer.c's lr_call_on_header, including the
 * Content-Length limit and values too long for the inline buffer), body
 * capture within max_response_bytes (lr_call_on_body), the success fields
 * (lr_read_success: usage, model, system_fingerprint), a 2xx body that is
 * an error or no answer (lr_answer_error), the HTTP error text
 * (lr_http_error via lr_call_read_outcome), a stream error event's text,
 * the body told as a stream's events (stream_whole.c), and the preview; no message may quote the request's prompt (the screen).
 *
 * This file includes transfer.c itself (it was written when those two were
 * static) and is linked with the other core sources, not transfer.c. No network: the call
 * record is built by hand and lr_call_read_outcome runs with no easy
 * handle (HTTP status 0, i.e. the error-body path).
 *
 * Input: byte 0 picks max_response_bytes and the chunk size; if the rest
 * holds "\r\n\r\n", what precedes it is header lines (CRLF-separated) and
 * what follows is the body, else it is all body. Every header line and
 * body chunk is handed over in its own exact-size, non-NUL-terminated
 * buffer, as libcurl documents ("do not assume that the header line is
 * null-terminated"), so over-reads are caught by ASan. Build: tools/fuzz.sh. */
#include "../../core/src/transfer.c"

#include <stdint.h>

#include "fuzz_util.h"

#define PREVIEW_BYTES 500           /* outcome.c's */

/* The request every input answers: no message may quote 16 bytes of its
 * prompt (docs/security.md; the seed seed-echo quotes it). */
#define FUZZ_PROMPT "FUZZ-SECRET-PROMPT the harbour plan at dawn"
static const char fuzz_request[] = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                                   "\"content\":\"" FUZZ_PROMPT "\"}]}";

static void check_screened(const char *what, const char *msg)
{
    static const char prompt[] = FUZZ_PROMPT;
    if (!msg)
        return;
    for (size_t i = 0; i + LR_ECHO_RUN <= sizeof prompt - 1; i++)
        if (memmem(msg, strlen(msg), prompt + i, LR_ECHO_RUN))
            fail(what);
}

static int same_text(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* One event of a whole answer told as a stream (stream_whole.c): a JSON
 * object text of its length, a typed event named response.*. */
static int check_whole_event(void *ud, const char *data, size_t len, const char *event)
{
    (void)ud;
    if (!data || strlen(data) != len)
        fail("a whole answer's event whose text is not its length");
    cJSON *doc = cJSON_ParseWithLength(data, len);
    if (!cJSON_IsObject(doc))
        fail("a whole answer's event that is not a JSON object");
    if (event && strncmp(event, "response.", 9) != 0)
        fail("a whole answer's event of another name than response.*");
    cJSON_Delete(doc);
    return 0;
}

/* Hand one header line (with its CRLF) to on_header; 0 = aborted. */
static int feed_header(llmretry_call *c, const uint8_t *line, size_t n)
{
    char *buf = copy(line, n);
    size_t r = lr_call_on_header(buf, 1, n, c);
    free(buf);
    if (r != n && r != 0)
        fail("on_header returned neither n nor 0");
    if (r == 0 && !c->too_large)
        fail("on_header aborted without too_large");
    return r == n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int64_t limits[4] = {64, 1024, 1 << 20, INT64_C(32) << 20};
    if (size < 1)
        return 0;
    uint8_t ctl = data[0];
    data++;
    size--;

    llmretry_call *c = calloc(1, sizeof *c);
    if (!c)
        abort();
    c->o.max_response_bytes = limits[ctl & 3];
    c->url = (char *)"http://fuzz.invalid/v1/chat/completions"; /* HTTP errors name it */
    c->body = (char *)fuzz_request;     /* what their messages must not quote */
    c->o.body_len = sizeof fuzz_request - 1;
    size_t chunk = (size_t)1 << ((ctl >> 2) & 7); /* 1..128 bytes */
    if ((ctl >> 5) & 1)
        chunk = SIZE_MAX; /* the whole body at once */

    /* Split headers from body. */
    const uint8_t *body = data;
    size_t body_len = size;
    int aborted = 0;
    for (size_t i = 0; i + 4 <= size; i++) {
        if (memcmp(data + i, "\r\n\r\n", 4) == 0) {
            /* Bit 6: a redirect, whose Location is kept for the give-up's hint. */
            static const char status_line[] = "HTTP/1.1 429 Too Many Requests\r\n";
            static const char moved[] = "HTTP/1.1 301 Moved Permanently\r\n";
            aborted = (ctl >> 6) & 1 ? !feed_header(c, (const uint8_t *)moved, sizeof moved - 1)
                                     : !feed_header(c, (const uint8_t *)status_line,
                                                    sizeof status_line - 1);
            size_t p = 0, hend = i + 2; /* keep the last line's CRLF */
            while (!aborted && p < hend) {
                size_t q = p;
                while (q + 1 < hend && !(data[q] == '\r' && data[q + 1] == '\n'))
                    q++;
                size_t n = q + 2 <= hend ? q + 2 - p : hend - p;
                aborted = !feed_header(c, data + p, n);
                p += n;
            }
            body = data + i + 4;
            body_len = size - i - 4;
            break;
        }
    }
    for (int h = 0; h < LR_H_COUNT; h++)
        if (c->hdr_set[h] && !c->hdr_long[h] && memchr(c->hdr[h], '\0', LR_HVAL) == NULL)
            fail("captured header value not NUL-terminated");
    if (c->location) {
        if (!c->redirect || strlen(c->location) > 2048)
            fail("a Location kept for no redirect, or too long");
        for (const char *p = c->location; *p; p++)
            if (*p < 0x21 || *p > 0x7e)
                fail("a Location kept with a byte that is not printable ASCII");
        char *shown = llmretry_url_shown(c->location);
        if (shown && (strchr(shown, '\n') || strchr(shown, '\r')))
            fail("a shown Location with a line break");
        llmretry_free(shown);
    }

    /* The body, chunk by chunk, within max_response_bytes. */
    size_t fed = 0;
    while (!aborted && fed < body_len) {
        size_t n = body_len - fed < chunk ? body_len - fed : chunk;
        char *buf = copy(body + fed, n);
        size_t r = lr_call_on_body(buf, 1, n, c);
        free(buf);
        if (r == 0) {
            if (!c->too_large || (int64_t)(fed + n) <= c->o.max_response_bytes)
                fail("on_body refused a chunk within the limit");
            aborted = 1;
            break;
        }
        if (r != n)
            fail("on_body returned neither n nor 0");
        fed += n;
    }
    if ((int64_t)c->resp.len > c->o.max_response_bytes)
        fail("captured body above max_response_bytes");
    if (!aborted && (c->resp.len != body_len ||
                     (body_len && memcmp(c->resp.data, body, body_len) != 0)))
        fail("captured body differs from the body sent");

    /* The outcome, as the engine reads it (status 0: the error path). */
    lr_outcome out;
    lr_call_read_outcome(c, aborted ? CURLE_WRITE_ERROR : CURLE_OK, &out);
    if (aborted && out.f.kind != LLMRETRY_ERR_RESPONSE_TOO_LARGE)
        fail("too large response not classified as response_too_large");
    if (!aborted && out.f.kind != LLMRETRY_ERR_HTTP_STATUS)
        fail("error body not classified as http_status");
    if (out.message == NULL)
        fail("failure without a message");
    check_screened("an HTTP error's message quotes the prompt", out.message);
    llmretry_decision d = llmretry_decide(NULL, &out.f, 0, INT64_C(1700000000000),
                                          LLMRETRY_NO_DEADLINE, 0.5);
    if (d.delay_ms < 0 || (d.retry_after_ms != -1 && d.retry_after_ms <= 0))
        fail("decision with a negative delay or a non-positive server wait");
    lr_outcome_clear(&out);

    /* The success path on the same body: usage, model, fingerprint. */
    if (!aborted) {
        cJSON *doc = cJSON_ParseWithLength(c->resp.data ? c->resp.data : "", c->resp.len);
        if (doc && cJSON_IsObject(doc)) {
            lr_outcome ok;
            memset(&ok, 0, sizeof ok);
            lr_read_success(doc, &ok.usage, &ok.response_model, &ok.fingerprint);
            /* json_int casts a double to int64_t: UBSan checks the cast. */
            if (!ok.usage.present && (ok.usage.prompt_tokens || ok.usage.total_tokens))
                fail("token counts without usage");
            lr_outcome_clear(&ok);
        }
        /* Read in place (what the engine does): a body it takes, the tree
         * takes too, with the same usage, model and fingerprint. */
        lr_outcome in;
        const char *why = NULL;
        memset(&in, 0, sizeof in);
        lr_body_tops tops;
        if (lr_read_body(c->resp.data ? c->resp.data : "", c->resp.len, &why, &in.usage,
                         &in.response_model, &in.fingerprint, &tops) == 0) {
            lr_outcome t;
            memset(&t, 0, sizeof t);
            if (!doc || !cJSON_IsObject(doc))
                fail("a body read in place that cJSON does not take as an object");
            lr_read_success(doc, &t.usage, &t.response_model, &t.fingerprint);
            if (t.usage.present != in.usage.present ||
                t.usage.prompt_tokens != in.usage.prompt_tokens ||
                t.usage.completion_tokens != in.usage.completion_tokens ||
                t.usage.total_tokens != in.usage.total_tokens ||
                !same_text(t.response_model, in.response_model) ||
                !same_text(t.fingerprint, in.fingerprint))
                fail("a body read in place differs from its tree");
            lr_outcome_clear(&t);
            /* A chat answer (c's URL) that is an error or no answer fails
             * the attempt (answer_error.c) as a policy can read it; one it
             * passes has choices and no error of its own. */
            lr_outcome ae;
            memset(&ae, 0, sizeof ae);
            if (lr_answer_error(c, c->resp.data ? c->resp.data : "", c->resp.len, &tops, &ae)) {
                if (!ae.message)
                    fail("an answer refused without a message");
                check_screened("a refused answer's message quotes the prompt", ae.message);
                if (ae.f.kind == LLMRETRY_ERR_HTTP_STATUS &&
                    (ae.f.status < 400 || ae.f.status > 599))
                    fail("an error inside an answer stands for no HTTP error status");
                if (ae.f.kind != LLMRETRY_ERR_HTTP_STATUS &&
                    ae.f.kind != LLMRETRY_ERR_INVALID_RESPONSE && ae.f.kind != LLMRETRY_ERR_NETWORK)
                    fail("an answer refused as neither an error nor an invalid response");
                llmretry_decision ad = llmretry_decide(NULL, &ae.f, 0, INT64_C(1700000000000),
                                                       LLMRETRY_NO_DEADLINE, 0.5);
                if (ad.delay_ms < 0)
                    fail("a refused answer's decision with a negative delay");
            } else {
                const cJSON *ch = cJSON_GetObjectItemCaseSensitive(doc, "choices");
                const cJSON *er = cJSON_GetObjectItemCaseSensitive(doc, "error");
                if (!cJSON_IsArray(ch) || cJSON_GetArraySize(ch) == 0)
                    fail("a chat answer taken without choices");
                if (cJSON_IsObject(er) || cJSON_IsString(er))
                    fail("a chat answer taken with an error of its own");
                const cJSON *one;
                cJSON_ArrayForEach(one, ch) {
                    const cJSON *fr = cJSON_IsObject(one)
                        ? cJSON_GetObjectItemCaseSensitive(one, "finish_reason") : NULL;
                    if (cJSON_IsString(fr) && strcmp(fr->valuestring, "error") == 0)
                        fail("a chat answer taken with a choice ended by an error");
                }
            }
            lr_outcome_clear(&ae);
            /* The body told as a stream's events, for a host that asked for
             * one (stream_whole.c): never a crash, each event JSON. */
            if (lr_whole_as_events(c->resp.data ? c->resp.data : "", c->resp.len,
                                   check_whole_event, NULL) != 0)
                fail("a whole answer's events not told");
        } else if (!why) {
            fail("a body refused in place without a reason");
        }
        lr_outcome_clear(&in);
        cJSON_Delete(doc);
        char *code = NULL, *msg = lr_http_error(c, 500, &code);
        if (!msg || strstr(msg, "\n") || strstr(msg, "\r"))
            fail("an HTTP error text with a raw line break");
        check_screened("an HTTP error text quotes the prompt", msg);
        check_screened("an error code quotes the prompt", code);
        free(msg);
        free(code);
        /* The same body as a stream's error event (stream.c keeps its data). */
        msg = lr_stream_error_text(c, c->resp.data, c->resp.len, 500);
        if (!msg || strstr(msg, "\n") || strstr(msg, "\r"))
            fail("a stream error text with a raw line break");
        check_screened("a stream error text quotes the prompt", msg);
        free(msg);
    }

    /* The preview: at most 500 bytes, a prefix of the body. */
    char *pv = lr_call_preview(c);
    if (pv) {
        size_t n = strlen(pv);
        /* strlen stops at an embedded NUL: still a prefix. */
        if (n > PREVIEW_BYTES || n > c->resp.len || memcmp(pv, c->resp.data, n) != 0)
            fail("preview longer than 500 bytes or not a prefix of the body");
        free(pv);
    }

    lr_call_forget_headers(c);
    free(c->resp.data);
    free(c);
    return 0;
}
