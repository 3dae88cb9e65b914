/* Integration tests of streaming calls that hand their chunks to the host
 * (options.stream_chunks) through the mailbox, against the mock's SSE
 * server: chunk order, the commit point (retried before it, not after),
 * failures after it, cancel, backpressure, keep-alives, a JSON answer to a
 * streaming request, and engine shutdown with streams in flight.
 * Whole-result streaming (stream_chunks = 0) is in tests/vectors/stream_*.
 * Each test names the rule of the core it guards. */
#include "harness.h"
#include "internal.h"
#include "llmretry.h"
#include "stream.h"

#include <cJSON.h>
#include <stdlib.h>
#include <time.h>

#define SBODY "{\"model\":\"gpt-test\",\"stream\":true," \
              "\"messages\":[{\"role\":\"user\",\"content\":\"SECRET-PROMPT\"}]}"
#define MAX_EV 32

static th_mock mock;
static llmretry_engine *eng;     /* tests 1-7 share one */

static void opts_for(llmretry_options *o, const char *name, char *url, size_t urllen)
{
    llmretry_options_defaults(o);
    o->base_url = th_mock_scenario_url(&mock, name, url, urllen);
    o->api_key = "sk-test";
    o->use_env_api_key = 0;
    o->body = SBODY;
    o->body_len = strlen(SBODY);
    o->jitter = LLMRETRY_JITTER_NONE;
    o->base_delay_ms = 10;
    o->max_retries = 2;
    o->timeout_ms = 5000;
    o->stream_chunks = 1;
    o->stream_usage = 1;
}

static int script(const char *name, const char *json)
{
    int rc = th_mock_script(&mock, name, json);
    CHECK_MSG(rc == 0, "could not script %s", name);
    return rc;
}

static llmretry_engine *new_engine(void)
{
    llmretry_engine *e = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = llmretry_engine_new(NULL, &e, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_OK && e, "engine_new: %s", err);
    return e;
}

static llmretry_call *submit(llmretry_engine *e, const llmretry_options *o)
{
    llmretry_call *c = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    llmretry_status st = llmretry_engine_submit(e, o, 0, &c, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_OK && c, "submit: %s", err);
    return st == LLMRETRY_OK ? c : NULL;
}

/* A field of the scenario's last record (`client_gone` 1/0, `events_sent`),
 * or with field NULL the number of records; -1 when there is none. */
static int record_int(const char *name, const char *fld)
{
    char *t = th_mock_requests(&mock, name);
    cJSON *a = t ? cJSON_Parse(t) : NULL, *f;
    int v = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    if (fld) {
        f = cJSON_GetObjectItem(cJSON_GetArrayItem(a, v - 1), fld);
        v = cJSON_IsBool(f) ? cJSON_IsTrue(f) : cJSON_IsNumber(f) ? f->valueint : -1;
    }
    free(t);
    cJSON_Delete(a);
    return v;
}

/* ---- reading the mailbox ---------------------------------------------------- */

/* Everything one call's mailbox gave: the chunks in order (label()), and
 * the events with how many chunks came before each. */
typedef struct reader {
    char **chunk;
    int n, cap;
    /* With keep_raw set: every chunk as it came, "EVENT DATA" a line each. */
    int keep_raw;
    char *raw;
    size_t raw_len;
    llmretry_event *ev[MAX_EV];
    int ev_after[MAX_EV];
    int n_ev;
} reader;

static char *label(const char *chunk, const char *event);

static void reader_free(reader *rd)
{
    for (int i = 0; i < rd->n; i++)
        free(rd->chunk[i]);
    free(rd->chunk);
    for (int i = 0; i < rd->n_ev; i++)
        llmretry_event_free(rd->ev[i]);
    free(rd->raw);
    memset(rd, 0, sizeof *rd);
}

/* Take mail until DONE, or until `want` chunks were read in all (-1: no
 * such goal), or timeout_ms. Sleeps 1 ms every `slow` chunks (0: never).
 * 1 when the goal was reached. */
static int read_mail(llmretry_call *c, reader *rd, int want, int slow, int64_t timeout_ms)
{
    int64_t end = th_now_ms() + timeout_ms;
    for (;;) {
        if (want >= 0 && rd->n >= want)
            return 1;
        llmretry_event *ev = NULL;
        llmretry_mail m = llmretry_call_next(c, &ev);
        if (m == LLMRETRY_MAIL_DONE)
            return want < 0;
        if (m == LLMRETRY_MAIL_CHUNK) {
            size_t len = 0;
            const char *d = llmretry_chunk_data(ev, &len);
            CHECK_MSG(d && strlen(d) == len, "chunk text and length");
            if (rd->n == rd->cap) {
                rd->cap = rd->cap ? rd->cap * 2 : 64;
                rd->chunk = realloc(rd->chunk, (size_t)rd->cap * sizeof *rd->chunk);
            }
            const char *e = llmretry_chunk_event(ev);
            rd->chunk[rd->n++] = label(d ? d : "", e);
            if (rd->keep_raw && d) {
                rd->raw = realloc(rd->raw, rd->raw_len + strlen(e ? e : "?") + len + 3);
                rd->raw_len += (size_t)sprintf(rd->raw + rd->raw_len, "%s %s\n", e ? e : "?", d);
            }
            llmretry_event_free(ev);
            if (slow && rd->n % slow == 0)
                th_sleep_ms(1);
            continue;
        }
        if (m == LLMRETRY_MAIL_EVENT) {
            CHECK(llmretry_chunk_data(ev, NULL) == NULL);
            if (rd->n_ev == MAX_EV) {
                llmretry_event_free(ev);
                continue;
            }
            rd->ev_after[rd->n_ev] = rd->n;
            rd->ev[rd->n_ev++] = ev;
            continue;
        }
        int64_t left = end - th_now_ms();
        if (left <= 0)
            return 0;
        llmretry_call_wait(c, left);
    }
}

static const llmretry_event *find_event(const reader *rd, llmretry_event_type t, int *at)
{
    for (int i = 0; i < rd->n_ev; i++)
        if (llmretry_event_type_of(rd->ev[i]) == t) {
            if (at)
                *at = rd->ev_after[i];
            return rd->ev[i];
        }
    return NULL;
}

/* Does the event's JSON line hold `text`? */
static int event_has(const llmretry_event *ev, const char *text)
{
    char *j = ev ? llmretry_event_to_json(ev) : NULL;
    int yes = j && strstr(j, text) != NULL;
    llmretry_free(j);
    return yes;
}

/* ---- chunk and body contents ------------------------------------------------- */

/* What a chunk is, as the reader keeps it (malloc'd): its delta's content,
 * or "<finish:REASON>", "<usage>" (no choices, a usage object), "<?>"; a
 * typed chunk (the event name the core gave it) "<EVENT>", but for
 * response.output_text.delta its delta's text. */
static char *label(const char *chunk, const char *event)
{
    cJSON *doc = cJSON_Parse(chunk), *u = cJSON_GetObjectItem(doc, "usage");
    if (event && strcmp(event, "message") != 0) {
        cJSON *delta = cJSON_GetObjectItem(doc, "delta");
        char *typed;
        if (strcmp(event, "response.output_text.delta") == 0 && cJSON_IsString(delta)) {
            typed = strdup(delta->valuestring);
        } else {
            typed = malloc(strlen(event) + 3);
            sprintf(typed, "<%s>", event);
        }
        cJSON_Delete(doc);
        return typed;
    }
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0);
    cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "content");
    cJSON *fin = cJSON_GetObjectItem(ch, "finish_reason");
    char buf[64] = "<?>";
    char *out = NULL;
    if (cJSON_IsString(content))
        out = strdup(content->valuestring);
    else if (cJSON_IsString(fin))
        snprintf(buf, sizeof buf, "<finish:%s>", fin->valuestring);
    else if (!ch && cJSON_IsNumber(cJSON_GetObjectItem(u, "total_tokens")))
        strcpy(buf, "<usage>");
    cJSON_Delete(doc);
    return out ? out : strdup(buf);
}

/* The content of the assembled chat.completion in a result's body (malloc'd). */
static char *body_content(const llmretry_result *r)
{
    cJSON *doc = r && r->body ? cJSON_Parse(r->body) : NULL;
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0);
    cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "message"), "content");
    char *out = cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
    cJSON_Delete(doc);
    return out;
}

/* The chunks read, joined (malloc'd): their labels with '|' between, or
 * (contents_only) just the contents. */
static char *joined(const reader *rd, int contents_only)
{
    size_t total = 1;
    for (int i = 0; i < rd->n; i++)
        total += strlen(rd->chunk[i]) + 1;
    char *out = calloc(1, total);
    for (int i = 0; i < rd->n; i++) {
        if (contents_only && rd->chunk[i][0] == '<')
            continue;
        if (!contents_only && i > 0)
            strcat(out, "|");
        strcat(out, rd->chunk[i]);
    }
    return out;
}

/* Script `name`, submit `o` on the shared engine and read until `want`
 * chunks (-1: until DONE, 0: nothing). */
static llmretry_call *start(const char *name, const char *json, const llmretry_options *o,
                            reader *rd, int want)
{
    memset(rd, 0, sizeof *rd);
    llmretry_call *c = script(name, json) == 0 ? submit(eng, o) : NULL;
    CHECK_MSG(c && read_mail(c, rd, want, 0, 10000), "%s: no %s", name,
              want < 0 ? "DONE" : "chunk");
    return c;
}

/* The finished call's result; a zeroed one (and a failure) when it has none. */
static const llmretry_result *result_of(llmretry_call *c)
{
    static const llmretry_result none;
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    CHECK_MSG(r != NULL, "the call has no result");
    return r ? r : &none;
}

/* Bytes of chunks in c's mailbox, not yet read (under the call's lock). */
static int64_t chunks_unread(llmretry_call *c)
{
    pthread_mutex_lock(&c->mu);
    int64_t n = c->st ? c->st->unread_bytes : 0;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* The result, once the engine has published it (without reading mail). */
static const llmretry_result *wait_result(llmretry_call *c, int64_t ms)
{
    for (int64_t end = th_now_ms() + ms; c && !llmretry_call_result(c) && th_now_ms() < end;)
        th_sleep_ms(10);
    return result_of(c);
}

/* CHECK_STR of a malloc'd string, freed. */
#define CHECK_OWN_STR(expr, want) do { char *s_ = (expr); CHECK_STR(s_, want); free(s_); } while (0)

static const char *why(const llmretry_result *r)
{
    const char *s = r ? llmretry_stream_reason_name(r->stream_reason) : NULL;
    return s ? s : "none";
}

/* ==== 1. Chunks in order, then DONE; the assembled result; the events. ====== */

/* Guards stream.c take_event -> mail_chunk (one CHUNK per SSE chunk, in
 * order), lr_stream_request (stream_options added), lr_stream_result and
 * attempt.c stream_fields (the result's and the succeeded event's stream
 * fields), and lr_stream_delivered (chunks_delivered counts the last
 * chunks, read after the engine finished: it used to fall short). */
static void test_chunks_in_order(void)
{
    char url[256];
    llmretry_options o;
    reader rd;
    opts_for(&o, "s_order", url, sizeof url);
    llmretry_call *c = start("s_order", "{\"steps\":[{\"stream\":{\"chunks\":[\"SECRET-A\","
                             "\"SECRET-B\",\" SECRET-C\",\"SECRET-D\"],\"delay_ms\":5}}]}",
                             &o, &rd, -1);
    CHECK_OWN_STR(joined(&rd, 0), "SECRET-A|SECRET-B| SECRET-C|SECRET-D|<finish:stop>|<usage>");
    const llmretry_result *r = result_of(c);
    CHECK(r->ok);
    CHECK_OWN_STR(body_content(r), "SECRET-ASECRET-B SECRET-CSECRET-D");
    CHECK(r->body && strstr(r->body, "\"chat.completion\"") && r->usage.present);
    CHECK_INT(r->stream, 1);
    CHECK_INT(r->chunks, 6);
    CHECK_INT(r->chunks_delivered, r->chunks);
    CHECK(r->ttft_ms >= 0);
    CHECK_INT(r->stream_reason, LLMRETRY_STREAM_NONE);
    int at = -1;
    const llmretry_event *ok = find_event(&rd, LLMRETRY_EV_REQUEST_SUCCEEDED, &at);
    CHECK_INT(at, 6);                    /* after the last chunk */
    char ttft[64];
    snprintf(ttft, sizeof ttft, "\"ttft_ms\":%lld,", (long long)result_of(c)->ttft_ms);
    CHECK(event_has(ok, "\"stream\":true") && event_has(ok, "\"chunks\":6"));
    CHECK(event_has(ok, ttft) && !event_has(ok, "stream_reason"));    /* only when broken */
    for (int i = 0; i < rd.n_ev; i++)    /* chunk text never in an event */
        CHECK_MSG(!event_has(rd.ev[i], "SECRET"), "event %d carries chunk text", i);
    char *recs = th_mock_requests(&mock, "s_order");    /* the body sent asked for usage */
    CHECK(recs && strstr(recs, "\\\"include_usage\\\":true"));
    free(recs);
    reader_free(&rd);
    llmretry_call_free(c);
}

/* ==== 2. Before the commit point: retried, unread chunks dropped. =========== */

/* Guards stream.c lr_stream_attempt_failed / unlink_chunks (attempt 1's
 * unread chunks leave the mailbox, its events stay) and attempt.c
 * handle_failure (an uncommitted stream goes to the policy). */
static void test_retry_before_commit(void)
{
    char url[256];
    llmretry_options o;
    reader rd;
    opts_for(&o, "s_precommit", url, sizeof url);
    llmretry_call *c = start("s_precommit", "{\"steps\":[{\"stream\":{\"chunks\":[\"A1\","
                             "\"A2\",\"A3\"],\"end\":\"drop\",\"after\":2}},"
                             "{\"stream\":{\"chunks\":[\"B1\",\"B2\"]}}]}", &o, &rd, 0);
    const llmretry_result *r = wait_result(c, 10000);  /* not a chunk read till then */
    CHECK(c && read_mail(c, &rd, -1, 0, 1000));
    CHECK_OWN_STR(joined(&rd, 0), "B1|B2|<finish:stop>|<usage>");  /* nothing of attempt 1 */
    CHECK(find_event(&rd, LLMRETRY_EV_REQUEST_ERROR, NULL) != NULL);
    CHECK(find_event(&rd, LLMRETRY_EV_RETRY_SCHEDULED, NULL) != NULL);
    CHECK(r->ok);
    CHECK_INT(r->attempts, 2);
    CHECK_INT(r->chunks, 4);
    CHECK_INT(r->chunks_delivered, 4);   /* read after the engine finished */
    CHECK_OWN_STR(body_content(r), "B1B2");
    CHECK_INT(record_int("s_precommit", NULL), 2);
    reader_free(&rd);
    llmretry_call_free(c);
}

/* ==== 3. After the commit point: no retry, stream_interrupted, partial. ===== */

#define P123 "{\"stream\":{\"chunks\":[\"p1\",\"p2\",\"p3\"],\"delay_ms\":300,\"after\":2,"

/* Guards attempt.c handle_failure (a committed stream gives up as
 * stream_interrupted, never retried), stream.c lr_stream_reason_of (the
 * stream_reason of each failure: a reset read as "truncated" before),
 * lr_stream_timer (idle and deadline after the first chunk) and
 * lr_stream_result(partial) (the partial body). */
static void test_fail_after_commit(void)
{
    static const struct {
        const char *name, *step, *reason, *partial;
        int64_t idle_ms, deadline_ms;
    } cases[] = {
        { "s_post_drop", P123 "\"end\":\"drop\"}}", "truncated", "p1p2", 30000, -1 },
        { "s_post_close", P123 "\"end\":\"drop\",\"framing\":\"close\"}}", "truncated", "p1p2",
          30000, -1 },
        { "s_post_reset", P123 "\"end\":\"reset\"}}", "network", "p1p2", 30000, -1 },
        { "s_post_error", P123 "\"end\":\"error_event\"}}", "error_event", "p1p2", 30000, -1 },
        { "s_post_stall", P123 "\"end\":\"stall\"}}", "idle_timeout", "p1p2", 1000, -1 },
        { "s_post_deadline", "{\"content\":\"abcdefghij\",\"stream\":{\"chunks\":10,"
          "\"delay_ms\":500}}", "deadline", NULL, 30000, 1500 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char url[256], json[512];
        llmretry_options o;
        reader rd;
        opts_for(&o, cases[k].name, url, sizeof url);
        o.idle_timeout_ms = cases[k].idle_ms;
        o.deadline_ms = cases[k].deadline_ms;
        /* A retry would get a clean stream: it must not be asked for. */
        snprintf(json, sizeof json, "{\"steps\":[%s],\"after\":{\"stream\":{\"chunks\":"
                 "[\"retried\"]}}}", cases[k].step);
        llmretry_call *c = start(cases[k].name, json, &o, &rd, 1);     /* the commit point */
        int64_t t0 = th_now_ms();
        CHECK(c && read_mail(c, &rd, -1, 0, 5000));
        CHECK_MSG(th_now_ms() - t0 < 4000, "%s: DONE took %lld ms", cases[k].name,
                  (long long)(th_now_ms() - t0));
        const llmretry_result *r = result_of(c);
        CHECK(!r->ok);
        CHECK_INT(r->kind, LLMRETRY_ERR_STREAM_INTERRUPTED);
        CHECK_INT(r->reason, LLMRETRY_REASON_STREAM_INTERRUPTED);
        CHECK_MSG(strcmp(why(r), cases[k].reason) == 0, "%s: stream_reason %s, expected "
                  "%s", cases[k].name, why(r), cases[k].reason);
        CHECK_INT(r->attempts, 1);
        CHECK(r->chunks_delivered >= 1);
        CHECK_INT(r->chunks_delivered, rd.n);
        CHECK_INT(r->chunks, rd.n);
        char *content = body_content(r), *read = joined(&rd, 1);
        CHECK_MSG(content && strcmp(content, read) == 0, "%s: partial body \"%s\", "
                  "chunks read \"%s\"", cases[k].name, content ? content : "(null)", read);
        if (cases[k].partial)
            CHECK_STR(content, cases[k].partial);
        else            /* the deadline: some of the stream, not all of it */
            CHECK(content && content[0] == 'a' && strlen(content) < 10);
        free(content);
        free(read);
        snprintf(json, sizeof json, "\"stream_reason\":\"%s\"", why(r));
        CHECK(event_has(find_event(&rd, LLMRETRY_EV_REQUEST_GAVE_UP, NULL), json));
        CHECK_MSG(record_int(cases[k].name, NULL) == 1, "%s: retried after the commit point",
                  cases[k].name);
        reader_free(&rd);
        llmretry_call_free(c);
    }
}

/* ==== 4. Cancel mid-stream. ================================================= */

/* Guards attempt.c lr_give_up (stream_reason cancelled only once
 * committed) and lr_cancel -> detach_easy (the connection is closed: the
 * server sees the client go). */
static void test_cancel_mid_stream(void)
{
    char url[256];
    llmretry_options o;
    reader rd;
    opts_for(&o, "s_cancel", url, sizeof url);
    const char *json = "{\"steps\":[],\"after\":{\"content\":\"abcdefghijklmnopqrst\","
                       "\"stream\":{\"chunks\":20,\"delay_ms\":100}}}";
    llmretry_call *c = start("s_cancel", json, &o, &rd, 1);
    llmretry_call_cancel(c);
    CHECK(c && read_mail(c, &rd, -1, 0, 2000));
    const llmretry_result *r = result_of(c);
    CHECK(!r->ok);
    CHECK_INT(r->kind, LLMRETRY_ERR_CANCELLED);
    CHECK_INT(r->reason, LLMRETRY_REASON_CANCELLED);
    CHECK_INT(r->stream_reason, LLMRETRY_STREAM_CANCELLED);
    char *content = body_content(r);
    CHECK(content && content[0] == 'a' && strlen(content) < 20);
    free(content);
    int gone = 0;
    for (int64_t end = th_now_ms() + 3000; !gone && th_now_ms() < end; th_sleep_ms(20))
        gone = record_int("s_cancel", "client_gone") == 1;
    CHECK_MSG(gone, "the mock never saw the cancelled stream's client go");
    reader_free(&rd);
    llmretry_call_free(c);

    /* Cancelled with chunks in the mailbox but none read: not committed. */
    c = start("s_cancel", json, &o, &rd, 0);
    CHECK_MSG(c && TH_EVENTUALLY(chunks_unread(c) > 0, 10000), "no chunk reached the mailbox");
    llmretry_call_cancel(c);
    r = wait_result(c, 2000);
    CHECK_INT(r->kind, LLMRETRY_ERR_CANCELLED);
    CHECK_INT(r->stream_reason, LLMRETRY_STREAM_NONE);
    llmretry_call_free(c);
}

/* ==== 5. Backpressure. ====================================================== */

#define PIECE 50
#define PIECES 3000

/* Piece i of a long content: "[0042]xxxx...", PIECE code points. */
static void piece(int i, char *out)
{
    snprintf(out, PIECE + 1, "[%04d]%.*s", i, PIECE - 6,
             "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
}

/* A scenario of one stream of PIECES chunks of ~200 bytes. */
static char *pieces_json(void)
{
    char *json = malloc((size_t)PIECES * PIECE + 128), *p = json;
    p += sprintf(p, "{\"steps\":[{\"stream\":{\"chunks\":%d},\"content\":\"", PIECES);
    for (int i = 0; i < PIECES; i++, p += PIECE)
        piece(i, p);
    strcpy(p, "\"}]}");
    return json;
}

/* All the pieces, in order, then finish and usage; the result whole. */
static void check_pieces(const reader *rd, const llmretry_result *r)
{
    char want[PIECE + 1];
    int bad = 0;
    CHECK_INT(rd->n, PIECES + 2);
    for (int i = 0; i < PIECES && i < rd->n && !bad; i++) {
        piece(i, want);
        bad = strcmp(rd->chunk[i], want) != 0;
        CHECK_MSG(!bad, "chunk %d is \"%s\", expected \"%s\"", i, rd->chunk[i], want);
    }
    CHECK(rd->n == PIECES + 2 && strcmp(rd->chunk[PIECES], "<finish:stop>") == 0 &&
          strcmp(rd->chunk[PIECES + 1], "<usage>") == 0);
    CHECK_MSG(r->ok, "the stream failed: %s", why(r));
    CHECK_INT(r->attempts, 1);
    CHECK_INT(r->chunks_delivered, PIECES + 2);
    char *content = body_content(r);
    CHECK(content && strlen(content) == (size_t)PIECES * PIECE);
    free(content);
}

/* Guards stream.c lr_stream_write (CURL_WRITEFUNC_PAUSE past
 * stream_buffer_bytes, the paused bytes handed again, none lost),
 * lr_stream_delivered + lr_stream_resume (the host's reads resume it) and
 * lr_stream_due_at (a paused stream has no idle timer). */
static void test_backpressure(void)
{
    char url[256], *json = pieces_json();
    llmretry_options o;
    reader rd;
    opts_for(&o, "s_slow", url, sizeof url);
    o.stream_buffer_bytes = 8192;
    llmretry_call *c = start("s_slow", json, &o, &rd, 0);
    CHECK(c && read_mail(c, &rd, -1, 20, 60000));     /* a slow reader */
    check_pieces(&rd, result_of(c));
    reader_free(&rd);
    llmretry_call_free(c);

    /* A reader away for 1 s, three idle timeouts: paused, not idle. */
    o.idle_timeout_ms = 300;
    c = start("s_slow", json, &o, &rd, 1);
    th_sleep_ms(1000);     /* the reader's absence is the subject: real time must pass */
    /* Paused on a full mailbox, it cannot have read to [DONE]. */
    CHECK_MSG(c && !llmretry_call_result(c), "the stream did not pause");
    CHECK(c && read_mail(c, &rd, -1, 0, 60000));
    check_pieces(&rd, result_of(c));
    reader_free(&rd);
    llmretry_call_free(c);
    free(json);
}

/* ==== 6. Keep-alives; 7. a JSON answer to a streaming request. ============== */

/* Guards stream.c lr_stream_write (a comment is activity) and
 * lr_stream_timer (a timer due before the last activity is set again). */
static void test_keepalives(void)
{
    char url[256];
    llmretry_options o;
    reader rd;
    opts_for(&o, "s_keepalive", url, sizeof url);
    o.idle_timeout_ms = 300;
    llmretry_call *c = start("s_keepalive", "{\"steps\":[{\"stream\":{\"chunks\":[\"k1\","
                             "\"k2\",\"k3\"],\"delay_ms\":600,\"keepalive_ms\":50}}]}",
                             &o, &rd, -1);
    const llmretry_result *r = result_of(c);
    CHECK_MSG(r->ok, "keep-alives did not keep the stream: %s", why(r));
    CHECK_OWN_STR(joined(&rd, 0), "k1|k2|k3|<finish:stop>|<usage>");
    CHECK_OWN_STR(body_content(r), "k1k2k3");
    CHECK_INT(record_int("s_keepalive", NULL), 1);
    reader_free(&rd);
    llmretry_call_free(c);
}

/* Guards transfer.c streams_now (only a text/event-stream answer is read
 * as a stream), lr_stream_result (a streaming request's result says
 * stream, with no chunks from the server and no ttft) and stream_whole.c
 * (the whole answer mailed as the chunks it would have streamed: a host
 * reading chunks got none, an empty answer on its screen). */
static void test_json_answer(void)
{
    char url[256];
    llmretry_options o;
    reader rd;
    opts_for(&o, "s_json", url, sizeof url);
    llmretry_call *c = start("s_json", "{\"steps\":[{\"stream\":false,\"content\":\"pl\\u0000ain\"}]}",
                             &o, &rd, -1);
    CHECK_OWN_STR(joined(&rd, 0), "pl");        /* label() is cJSON's: cut at U+0000 */
    CHECK_MSG(rd.n == 1, "%d chunks", rd.n);
    const llmretry_result *r = result_of(c);
    CHECK(r->ok);
    CHECK_MSG(r->body && strstr(r->body, "\"message\"") && strstr(r->body, "pl\\u0000ain"),
              "the result is the body as sent: %s", r->body ? r->body : "(null)");
    CHECK_INT(r->stream, 1);
    CHECK_INT(r->chunks, 0);
    CHECK_INT(r->chunks_delivered, 1);
    CHECK_INT(r->ttft_ms, -1);
    reader_free(&rd);
    llmretry_call_free(c);
}

/* One whole answer to a streaming request (`step` the scenario's step,
 * `path` the URL's, "" for the base): its chunks as the host got them,
 * "EVENT DATA" a line each (malloc'd; EVENT "message" for none), and the result
 * checked whole with no chunk from the server. */
static char *whole_chunks(const char *name, const char *step, const char *path)
{
    char url[300], base[256], json[2048];
    llmretry_options o;
    opts_for(&o, name, base, sizeof base);
    if (*path) {
        snprintf(url, sizeof url, "%s%s", base, path);
        o.base_url = NULL;
        o.url = url;
    }
    snprintf(json, sizeof json, "{\"steps\":[%s]}", step);
    reader rd = { .keep_raw = 1 };
    llmretry_call *c = script(name, json) == 0 ? submit(eng, &o) : NULL;
    CHECK_MSG(c && read_mail(c, &rd, -1, 0, 10000), "%s: no DONE", name);
    char *out = rd.raw ? rd.raw : strdup("");
    rd.raw = NULL;
    reader_free(&rd);
    const llmretry_result *r = result_of(c);
    CHECK_MSG(r->ok && r->chunks == 0 && r->body && !strstr(r->body, "chunk"),
              "%s: ok=%d chunks=%d", name, r->ok, r->chunks);
    llmretry_call_free(c);
    return out;
}

/* Guards stream_whole.c for each kind of answer: a Responses API response
 * as its events, numbered, in the order the API sends them (the openai
 * SDK's stream helper checks it), a legacy completion as itself, tool
 * calls indexed, and what does not stream (an odd body the mock sends as
 * given): no chunk, the result still whole. */
static void test_json_answer_kinds(void)
{
    char *got = whole_chunks("s_whole_resp", "{\"stream\":false,\"content\":\"hi\"}",
                             "/responses");
    static const char *const order[] = {
        "response.created {", "response.output_item.added {", "response.content_part.added {",
        "response.output_text.delta {", "response.output_text.done {",
        "response.content_part.done {", "response.output_item.done {", "response.completed {",
    };
    const char *at = got;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        char seq[64];
        snprintf(seq, sizeof seq, "\"sequence_number\":%zu}", i);
        CHECK_MSG(at && strncmp(at, order[i], strlen(order[i])) == 0, "event %zu: %.60s", i,
                  at ? at : "(none)");
        const char *eol = at ? strchr(at, '\n') : NULL;
        CHECK_MSG(eol && memmem(at, (size_t)(eol - at), seq, strlen(seq)), "numbered %zu", i);
        at = eol ? eol + 1 : NULL;
    }
    CHECK_MSG(at && *at == '\0', "more events: %s", at ? at : "");
    CHECK(strstr(got, "\"delta\":\"hi\"") && strstr(got, "\"status\":\"in_progress\""));
    CHECK(strstr(got, "\"output\":[]") && strstr(got, "\"content\":[]"));
    free(got);
    got = whole_chunks("s_whole_legacy", "{\"stream\":false,\"content\":\"old\"}", "/completions");
    CHECK_MSG(strncmp(got, "message {", 9) == 0 && strstr(got, "\"object\":\"text_completion\"") &&
              strstr(got, "\"text\":\"old\"") && !strchr(strchr(got, '\n') + 1, '\n'),
              "legacy: %s", got);
    free(got);
    got = whole_chunks("s_whole_tools", "{\"stream\":false,\"body\":{\"object\":"
                       "\"chat.completion\",\"choices\":[{\"index\":0,\"message\":"
                       "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\"},{\"id\":\"b\","
                       "\"index\":7},5]},\"finish_reason\":\"tool_calls\"},3]}}", "");
    CHECK_MSG(strstr(got, "\"object\":\"chat.completion.chunk\"") &&
              strstr(got, "\"delta\":{\"role\":\"assistant\",\"tool_calls\":"
                          "[{\"id\":\"a\",\"index\":0},{\"id\":\"b\",\"index\":7},5]}") &&
              !strstr(got, "\"message\""), "tools: %s", got);
    free(got);
    got = whole_chunks("s_whole_odd", "{\"stream\":false,\"body\":{\"object\":"
                       "\"list\",\"choices\":[{\"message\":{\"content\":\"x\"}}]}}", "");
    CHECK_STR(got, "");
    free(got);
}

/* ==== 8. Engines freed with streams in flight. ============================== */

/* Guards engine shutdown with running streams (committed, uncommitted,
 * paused, and freed by the host with unread chunks): no hang, no leak
 * (ASan, valgrind), every call still held ends. */
static void test_engine_free_mid_stream(void)
{
    enum { N = 20 };
    char url[256];
    if (script("s_life", "{\"steps\":[],\"after\":{\"content\":\"abcdefghijklmnopqrstuvwxyz\","
               "\"stream\":{\"chunks\":26,\"delay_ms\":20}}}") != 0)
        return;
    for (int round = 0; round < 3; round++) {
        llmretry_options o;
        opts_for(&o, "s_life", url, sizeof url);
        o.stream_buffer_bytes = 300;     /* some pause */
        llmretry_engine *e = new_engine();
        llmretry_call *calls[N] = { 0 };
        for (int i = 0; i < N; i++)
            calls[i] = submit(e, &o);
        th_sleep_ms(50 + 50 * round);    /* each round frees them at another stage */
        reader rd = { 0 };
        for (int i = 0; i < N; i++) {
            if (i % 3 == 0 && calls[i])
                read_mail(calls[i], &rd, rd.n + 1, 0, 2000);    /* committed */
            if (i % 3 == 1) {
                llmretry_call_free(calls[i]);                   /* unread chunks */
                calls[i] = NULL;
            }
        }
        llmretry_engine_free(e);
        for (int i = 0; i < N; i++) {
            if (!calls[i])
                continue;
            reader r2 = { 0 };
            CHECK_MSG(read_mail(calls[i], &r2, -1, 0, 3000), "round %d call %d never ended",
                      round, i);
            const llmretry_result *r = llmretry_call_result(calls[i]);
            CHECK(r && (r->ok || r->kind == LLMRETRY_ERR_CANCELLED));
            reader_free(&r2);
            llmretry_call_free(calls[i]);
        }
        reader_free(&rd);
    }
}

/* ==== 9. The terminal event ends the stream, whatever the server does next. == */

/* Polls the scenario's last record until the mock saw the client close
 * the connection it kept open; 1 when it did. */
static int client_went(const char *name)
{
    int gone = 0;
    for (int64_t end = th_now_ms() + 3000; !gone && th_now_ms() < end; th_sleep_ms(20))
        gone = record_int(name, "client_gone") == 1;
    return gone;
}

/* Guards stream.c lr_stream_write + lr_stream_due_at + lr_stream_timer
 * (DESIGN rule 9: [DONE] or response.completed ends the attempt within
 * LR_STREAM_END_GRACE_MS as a success, the held connection closed) and
 * lr_sse_type (a typed stream without event: lines). It used to read on
 * after [DONE] until the idle timeout: here the deadline (3 s) would end
 * the committed call as stream_interrupted. */
static void test_end_at_done(void)
{
    static const struct {
        const char *name, *stream, *chunks;
        int typed;
    } cases[] = {
        { "s_end_silence", "\"after_done\":\"silence\"", "o|k|<finish:stop>|<usage>", 0 },
        { "s_end_junk", "\"after_done\":\"junk\"", "o|k|<finish:stop>|<usage>", 0 },
        { "s_end_length", "\"framing\":\"length\"", "o|k|<finish:stop>|<usage>", 0 },
        { "s_end_typed", "\"api\":\"responses\",\"event_lines\":false,\"after_done\":"
          "\"silence\"", "<response.created>|o|k|<response.completed>", 1 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char url[256], json[512];
        llmretry_options o;
        reader rd;
        opts_for(&o, cases[k].name, url, sizeof url);
        o.timeout_ms = 20000;
        o.deadline_ms = 3000;
        snprintf(json, sizeof json, "{\"steps\":[{\"stream\":{\"chunks\":[\"o\",\"k\"],%s}}],"
                 "\"after\":{\"stream\":{\"chunks\":[\"retried\"]}}}", cases[k].stream);
        llmretry_call *c = start(cases[k].name, json, &o, &rd, -1);
        const llmretry_result *r = result_of(c);
        CHECK_MSG(r->ok, "%s: failed (%s)", cases[k].name, why(r));
        CHECK_INT(r->attempts, 1);
        CHECK_OWN_STR(joined(&rd, 0), cases[k].chunks);
        if (cases[k].typed) {
            CHECK(r->body && strstr(r->body, "\"object\":\"response\""));
            CHECK_INT(r->usage.prompt_tokens, 12);      /* input_tokens */
            CHECK_INT(r->usage.completion_tokens, 3);   /* output_tokens */
        } else {
            CHECK_OWN_STR(body_content(r), "ok");
        }
        CHECK_MSG(record_int(cases[k].name, NULL) == 1, "%s: the request was sent again",
                  cases[k].name);
        CHECK_MSG(client_went(cases[k].name), "%s: the held connection was not closed",
                  cases[k].name);
        reader_free(&rd);
        llmretry_call_free(c);
    }
}

/* ==== 10. A stream that ends with no finish_reason is truncated. ========== */

/* Guards stream.c lr_stream_outcome (DESIGN rule 9): [DONE] after a
 * role-only chunk (llama-cpp-python pre-empting a request) or at once is
 * no answer: retried before the commit point, stream_interrupted
 * (truncated) after it. It used to succeed with content null. */
static void test_no_finish_is_truncated(void)
{
    char url[256];
    llmretry_options o;
    reader rd;
    opts_for(&o, "s_role_only", url, sizeof url);
    /* The usage chunk and [DONE] 300 ms after the role-only chunk: time to
     * read it, the commit point. */
    llmretry_call *c = start("s_role_only", "{\"steps\":[{\"stream\":{\"role_only\":true,"
                             "\"delay_ms\":300}}],\"after\":{\"stream\":{\"chunks\":"
                             "[\"retried\"]}}}", &o, &rd, 1);
    CHECK(c && read_mail(c, &rd, -1, 0, 5000));
    const llmretry_result *r = result_of(c);
    CHECK(!r->ok);
    CHECK_INT(r->kind, LLMRETRY_ERR_STREAM_INTERRUPTED);
    CHECK_STR(why(r), "truncated");
    CHECK_INT(r->attempts, 1);
    CHECK_INT(record_int("s_role_only", NULL), 1);
    reader_free(&rd);
    llmretry_call_free(c);

    /* Uncommitted: [DONE] and nothing else, then a real answer. */
    opts_for(&o, "s_done_only", url, sizeof url);
    c = start("s_done_only", "{\"steps\":[{\"stream\":{\"chunks\":[],\"finish_reason\":null,"
              "\"usage_chunk\":false}},{\"stream\":{\"chunks\":[\"o\",\"k\"]}}]}", &o, &rd, 0);
    r = wait_result(c, 5000);
    CHECK_MSG(r->ok, "failed (%s)", why(r));
    CHECK_INT(r->attempts, 2);
    CHECK_OWN_STR(body_content(r), "ok");
    llmretry_call_free(c);
}

/* ==== 11. U+0000 and U+001F in chunk strings. ================================= */

/* Guards sse_payload.c mask_text + lr_sse_unmask (assembly.c, stream.c):
 * cJSON's strings end at a NUL, so "xa\u0000by" assembled as "xa". A
 * U+001F, the escape char of the mask, and a literal backslash before
 * "u0000" come out as they went in. */
static void test_nul_in_text(void)
{
    char url[256];
    llmretry_options o;
    reader rd;
    opts_for(&o, "s_nul", url, sizeof url);
    llmretry_call *c = start("s_nul", "{\"steps\":[{\"stream\":{\"chunks\":[\"xa\\u0000by\","
                             "\"\\u001f0\",\"\\\\u0000\"]}}]}", &o, &rd, -1);
    const llmretry_result *r = result_of(c);
    CHECK_MSG(r->ok, "failed (%s)", why(r));
    CHECK(r->body && strlen(r->body) == r->body_len);
    CHECK_MSG(r->body && strstr(r->body, "\"content\":\"xa\\u0000by\\u001f0\\\\u0000\""),
              "assembled: %s", r->body ? r->body : "(null)");
    reader_free(&rd);
    llmretry_call_free(c);
}

/* ==== 12. A stream to a /responses URL. ======================================= */

/* Guards lr_stream_with_usage (no stream_options, a Chat Completions
 * field, for the Responses API) and response.c lr_read_success (its
 * input_tokens / output_tokens read as prompt / completion). */
static void test_responses_url(void)
{
    char url[300], base[256];
    llmretry_options o;
    reader rd;
    opts_for(&o, "s_resp_url", base, sizeof base);
    snprintf(url, sizeof url, "%s/responses", base);
    o.base_url = NULL;
    o.url = url;
    llmretry_call *c = start("s_resp_url", "{\"steps\":[{\"usage\":{\"prompt_tokens\":5,"
                             "\"completion_tokens\":2,\"total_tokens\":7},\"stream\":"
                             "{\"api\":\"responses\",\"chunks\":[\"o\",\"k\"]}}]}",
                             &o, &rd, -1);
    const llmretry_result *r = result_of(c);
    CHECK_MSG(r->ok, "failed (%s)", why(r));
    CHECK_OWN_STR(joined(&rd, 0), "<response.created>|o|k|<response.completed>");
    CHECK_INT(r->usage.prompt_tokens, 5);
    CHECK_INT(r->usage.completion_tokens, 2);
    CHECK_INT(r->usage.total_tokens, 7);
    char *recs = th_mock_requests(&mock, "s_resp_url");
    CHECK(recs && strstr(recs, "/responses") && !strstr(recs, "stream_options"));
    free(recs);
    reader_free(&rd);
    llmretry_call_free(c);
}

int main(void)
{
    if (th_mock_start(&mock) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_stream");
    }
    eng = new_engine();
    struct { const char *name; void (*fn)(void); } tests[] = {
        { "chunks_in_order", test_chunks_in_order },
        { "retry_before_commit", test_retry_before_commit },
        { "fail_after_commit", test_fail_after_commit },
        { "cancel_mid_stream", test_cancel_mid_stream },
        { "backpressure", test_backpressure },
        { "keepalives", test_keepalives },
        { "json_answer", test_json_answer },
        { "json_answer_kinds", test_json_answer_kinds },
        { "engine_free_mid_stream", test_engine_free_mid_stream },
        { "end_at_done", test_end_at_done },
        { "no_finish_is_truncated", test_no_finish_is_truncated },
        { "nul_in_text", test_nul_in_text },
        { "responses_url", test_responses_url },
    };
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
        int before = th_failed;
        int64_t t0 = th_now_ms();
        tests[i].fn();
        fprintf(stderr, "%-24s %s (%lld ms)\n", tests[i].name,
                th_failed == before ? "ok" : "FAILED", (long long)(th_now_ms() - t0));
    }
    llmretry_engine_free(eng);
    th_mock_stop(&mock);
    return th_summary("test_stream");
}
