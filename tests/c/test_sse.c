/* Tests of the SSE reader (core/src/sse.c) and the chunk classifier
 * (core/src/sse_payload.c): every vector of tests/vectors/sse/ (see its
 * README.md) fed in one piece, byte by byte and split in two at every
 * offset, then the rules one by one where a vector cannot say it (feed
 * boundaries, pointer lifetimes, memory bounds, the policy's verdict).
 *
 * Every slice is copied into a buffer of exactly its length, so that
 * AddressSanitizer catches any read past it. */
#include "harness.h"
#include "sse.h"

#include <cJSON.h>
#include <dirent.h>
#include <stdlib.h>

#define VECTOR_DIR LLMRETRY_SOURCE_DIR "/tests/vectors/sse"

/* ------------------------------------------------------------------ */
/* Running a stream                                                    */
/* ------------------------------------------------------------------ */

static void put_hex(FILE *t, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(t, "%02x", (unsigned char)s[i]);
}

static const char *class_name(lr_sse_err_class c)
{
    static const char *const names[] = {"other", "rate_limit", "server", "quota"};
    return names[c];
}

/* One event and (p non-NULL) its payload, as one transcript line: all
 * the reader and the classifier said, so two runs compare as strings. */
static void put_event(FILE *t, const lr_sse_event *ev, const lr_sse_payload *p)
{
    fprintf(t, "event=%s data=", ev->event);
    put_hex(t, ev->data, ev->data_len);
    fputs(" id=", t);
    put_hex(t, ev->id, strlen(ev->id));
    fprintf(t, " retry=%lld", (long long)ev->retry);
    if (p && p->kind == LR_SSE_CHUNK)
        fprintf(t, " kind=chunk finish=%d open=%d", p->has_finish_reason, p->has_open_choice);
    else if (p && p->kind == LR_SSE_ERROR)
        fprintf(t, " kind=error code=%s class=%s status=%d", p->code ? p->code : "(null)",
                class_name(p->err_class), p->status);
    else if (p)
        fputs(" kind=invalid", t);
    fputc('\n', t);
}

/* Feed `in` to a fresh reader in slices: split > 0 cuts it in two there,
 * else slices of `step` bytes. The transcript: one line per event (with
 * its payload when `payloads`), then the end and the activity count. */
static char *run_stream(const char *in, size_t len, size_t max, size_t step, size_t split,
                        int payloads)
{
    lr_sse_reader r;
    lr_sse_event ev;
    /* Static: gcc -O3 takes open_memstream's hold on a local's address for
     * a dangling pointer after fclose (-Wdangling-pointer). One caller at
     * a time. */
    static char *out;
    static size_t out_len;
    out = NULL;
    out_len = 0;
    FILE *t = open_memstream(&out, &out_len);
    int rc = LR_SSE_AGAIN;
    lr_sse_init(&r, max);
    for (size_t off = 0; off < len && rc >= 0 && rc != LR_SSE_DONE;) {
        size_t n = split ? (off == 0 ? split : len - split) : (len - off < step ? len - off : step);
        char *slice = malloc(n);
        memcpy(slice, in + off, n);
        rc = lr_sse_feed(&r, slice, n);
        free(slice);
        off += n;
        while (rc == LR_SSE_AGAIN && (rc = lr_sse_next(&r, &ev)) == LR_SSE_EVENT) {
            lr_sse_payload p;
            lr_sse_classify(ev.event, ev.data, ev.data_len, &p, NULL);
            lr_sse_note(&r, &p);
            put_event(t, &ev, payloads ? &p : NULL);
            lr_sse_payload_clear(&p);
            rc = LR_SSE_AGAIN;
        }
    }
    lr_sse_end end = lr_sse_finish(&r);
    fprintf(t, "end=%s activity=%llu\n", lr_sse_end_name(end), (unsigned long long)r.activity);
    fclose(t);
    lr_sse_free(&r);
    return out;
}

/* ------------------------------------------------------------------ */
/* Vectors                                                             */
/* ------------------------------------------------------------------ */

static char *hex_decode(const char *h, size_t *n)
{
    size_t len = strlen(h);
    char *out = malloc(len / 2 + 1);
    for (size_t i = 0; i + 1 < len; i += 2) {
        unsigned v;
        sscanf(h + i, "%2x", &v);
        out[i / 2] = (char)v;
    }
    *n = len / 2;
    return out;
}

/* Does the payload line of `got` agree with the keys the vector gives? */
static void check_payload(const char *name, size_t i, const cJSON *want, const char *got)
{
    static const char *const keys[][2] = {{"kind", "kind="}, {"finish", "finish="},
                                          {"open", "open="}, {"code", "code="},
                                          {"class", "class="}, {"status", "status="}};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(want, keys[k][0]);
        char expect[160];
        if (!v)
            continue;
        if (cJSON_IsString(v))
            snprintf(expect, sizeof expect, " %s%s", keys[k][1], v->valuestring);
        else if (cJSON_IsBool(v))
            snprintf(expect, sizeof expect, " %s%d", keys[k][1], cJSON_IsTrue(v));
        else if (cJSON_IsNull(v))
            snprintf(expect, sizeof expect, " %s(null)", keys[k][1]);
        else
            snprintf(expect, sizeof expect, " %s%d", keys[k][1], v->valueint);
        size_t el = strlen(expect);
        const char *at = strstr(got, expect);
        CHECK_MSG(at && (at[el] == ' ' || at[el] == '\n' || at[el] == '\0'),
                  "[%s] event %zu: payload wants \"%s\" in \"%s\"", name, i, expect + 1, got);
    }
}

/* The transcript a vector expects, without payloads (a vector gives only
 * some of their keys: check_payload checks those). */
static char *expected_events(const cJSON *events)
{
    char *out = NULL;
    size_t out_len = 0;
    FILE *t = open_memstream(&out, &out_len);
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(e, "event");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(e, "data");
        const cJSON *dh = cJSON_GetObjectItemCaseSensitive(e, "data_hex");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(e, "retry");
        fprintf(t, "event=%s data=", cJSON_IsString(ty) ? ty->valuestring : "message");
        if (cJSON_IsString(dh))
            fputs(dh->valuestring, t);
        else
            put_hex(t, d->valuestring, strlen(d->valuestring));
        fputs(" id=", t);
        if (cJSON_IsString(id))
            put_hex(t, id->valuestring, strlen(id->valuestring));
        fprintf(t, " retry=%lld\n", cJSON_IsNumber(re) ? (long long)re->valuedouble : -1LL);
    }
    fclose(t);
    return out;
}

static void run_vector(const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", VECTOR_DIR, file);
    char *json = th_read_file(path, NULL);
    cJSON *v = json ? cJSON_Parse(json) : NULL;
    free(json);
    CHECK_MSG(v != NULL, "[%s] not JSON", file);
    if (!v)
        return;
    const char *name = cJSON_GetObjectItemCaseSensitive(v, "name")->valuestring;
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(v, "input");
    const cJSON *inhex = cJSON_GetObjectItemCaseSensitive(v, "input_hex");
    const cJSON *max = cJSON_GetObjectItemCaseSensitive(v, "max_event_bytes");
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(v, "events");
    const cJSON *end = cJSON_GetObjectItemCaseSensitive(v, "end");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(v, "activity");
    size_t len = 0, maxb = cJSON_IsNumber(max) ? (size_t)max->valuedouble : 0;
    char *bytes = cJSON_IsString(inhex) ? hex_decode(inhex->valuestring, &len)
                                        : strdup(in->valuestring);
    if (!cJSON_IsString(inhex))
        len = strlen(bytes);
    CHECK_MSG(strncmp(file, name, strlen(name)) == 0 && strcmp(file + strlen(name), ".json") == 0,
              "[%s] name %s is not the file name", file, name);

    /* In one piece: against the vector. */
    char *one = run_stream(bytes, len, maxb, len ? len : 1, 0, 1);
    char *got = run_stream(bytes, len, maxb, len ? len : 1, 0, 0);
    char *want = expected_events(events);
    *strstr(got, "end=") = '\0';
    CHECK_MSG(strcmp(got, want) == 0, "[%s] events:\n%s-- expected:\n%s", name, got, want);
    const char *line = one;
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "payload");
        if (p && strncmp(line, "event=", 6) == 0) {
            char *eol = strchr(line, '\n');
            char *copy = strndup(line, (size_t)(eol - line));
            check_payload(name, i, p, copy);
            free(copy);
        }
        line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line;
        i++;
    }
    const char *endline = strstr(one, "end=");
    char wend[96];
    if (cJSON_IsNumber(act))
        snprintf(wend, sizeof wend, "end=%s activity=%d\n", end->valuestring, act->valueint);
    else
        snprintf(wend, sizeof wend, "end=%s ", end->valuestring);
    CHECK_MSG(endline && strncmp(endline, wend, strlen(wend)) == 0, "[%s] %s, expected %s",
              name, endline ? endline : "(none)", wend);

    /* Byte by byte, and every two-way split: exactly the same transcript. */
    char *bb = run_stream(bytes, len, maxb, 1, 0, 1);
    CHECK_MSG(strcmp(bb, one) == 0, "[%s] byte by byte:\n%s-- in one piece:\n%s", name, bb, one);
    int split_ok = 1;
    for (size_t k = 1; k < len && split_ok; k++) {
        char *sp = run_stream(bytes, len, maxb, 0, k, 1);
        if (strcmp(sp, one) != 0) {
            CHECK_MSG(0, "[%s] split at %zu:\n%s-- in one piece:\n%s", name, k, sp, one);
            split_ok = 0;
        }
        free(sp);
    }
    CHECK(split_ok);
    free(bb);
    free(want);
    free(got);
    free(one);
    free(bytes);
    cJSON_Delete(v);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_vectors(void)
{
    DIR *d = opendir(VECTOR_DIR);
    char *names[256];
    size_t n = 0;
    struct dirent *de;
    CHECK(d != NULL);
    if (!d)
        return;
    while ((de = readdir(d)) != NULL && n < 256) {
        size_t l = strlen(de->d_name);
        if (l > 5 && strcmp(de->d_name + l - 5, ".json") == 0)
            names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof names[0], cmp_str);
    CHECK_MSG(n >= 40, "only %zu SSE vectors", n);
    for (size_t i = 0; i < n; i++) {
        run_vector(names[i]);
        free(names[i]);
    }
}

/* ------------------------------------------------------------------ */
/* Rules a vector cannot show                                          */
/* ------------------------------------------------------------------ */

static int feed_str(lr_sse_reader *r, const char *s)
{
    size_t n = strlen(s);
    char *copy = malloc(n ? n : 1);
    memcpy(copy, s, n);
    int rc = lr_sse_feed(r, copy, n);
    free(copy);
    return rc;
}

/* A CR ending one slice and an LF starting the next are one line end:
 * were the LF a second one, the first "\n" would dispatch the event. */
static void test_crlf_across_feeds(void)
{
    lr_sse_reader r;
    lr_sse_event ev;
    lr_sse_init(&r, 0);
    feed_str(&r, "data: a\r");
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_AGAIN);
    feed_str(&r, "\n");
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_AGAIN);
    feed_str(&r, "\n");
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_EVENT);
    CHECK_STR(ev.data, "a");
    /* CR then CR: two line ends, a dispatch. */
    feed_str(&r, "data: b\r");
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_AGAIN);
    feed_str(&r, "\r");
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_EVENT);
    CHECK_STR(ev.data, "b");
    lr_sse_free(&r);
}

/* The BOM in three slices; and again after a reset (a new stream). */
static void test_bom_split(void)
{
    lr_sse_reader r;
    lr_sse_event ev;
    lr_sse_init(&r, 0);
    for (int round = 0; round < 2; round++) {
        feed_str(&r, "\xEF");
        CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_AGAIN);
        feed_str(&r, "\xBB");
        CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_AGAIN);
        feed_str(&r, "\xBF" "data: x\n\n\xEF\xBB\xBF" "data: y\n\ndata: z\n\n");
        CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_EVENT);
        CHECK_STR(ev.data, "x");
        CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_EVENT);  /* the second BOM spoils "data" */
        CHECK_STR(ev.data, "z");
        CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_AGAIN);
        lr_sse_reset(&r);
    }
    lr_sse_free(&r);
}

/* An event's strings live in the reader until the next lr_sse_next: a
 * feed that grows and moves the input buffer leaves them alone. */
static void test_event_lifetime(void)
{
    lr_sse_reader r;
    lr_sse_event ev;
    size_t big = 200000;
    char *filler = malloc(big + 1);
    memset(filler, 'f', big);
    filler[big] = '\0';
    lr_sse_init(&r, 0);
    feed_str(&r, "event: kind\nid: 42\nretry: 5\ndata: hello\n\ndata: partial");
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_EVENT);
    feed_str(&r, filler);
    CHECK_STR(ev.event, "kind");
    CHECK_STR(ev.data, "hello");
    CHECK_INT(ev.data_len, 5);
    CHECK_STR(ev.id, "42");
    CHECK_INT(ev.retry, 5);
    CHECK_INT(r.retry_ms, 5);
    feed_str(&r, "\n\n");
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_EVENT);
    CHECK_INT(ev.data_len, 7 + big);
    CHECK_STR(ev.event, "message");
    CHECK_INT(ev.retry, -1);
    CHECK_INT(r.retry_ms, 5);       /* the stream's retry persists */
    lr_sse_free(&r);
    free(filler);
}

/* Bounds: one line of exactly max + slack passes, one byte more fails,
 * whether its end has arrived or not; failures are sticky until reset. */
static void test_limits(void)
{
    lr_sse_reader r;
    lr_sse_event ev;
    char line[64];
    size_t max_line = 8 + LR_SSE_LINE_SLACK;
    lr_sse_init(&r, 8);
    memset(line, 'x', sizeof line);
    line[0] = ':';
    CHECK_INT(lr_sse_feed(&r, line, max_line), LR_SSE_AGAIN);
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_AGAIN);
    CHECK_INT(lr_sse_feed(&r, "\n", 1), LR_SSE_AGAIN);
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_AGAIN);
    CHECK_INT(r.activity, 1);
    CHECK_INT(lr_sse_feed(&r, line, max_line + 1), LR_SSE_AGAIN);
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_TOO_LARGE);
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_TOO_LARGE);
    CHECK_INT(lr_sse_feed(&r, "\n\n", 2), LR_SSE_TOO_LARGE);
    CHECK_INT(lr_sse_finish(&r), LR_SSE_END_TOO_LARGE);
    lr_sse_reset(&r);
    CHECK_INT(feed_str(&r, "data: 12345678\n\n"), LR_SSE_AGAIN);
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_EVENT);
    CHECK_STR(ev.data, "12345678");
    lr_sse_free(&r);

    lr_sse_init(&r, 0);
    CHECK_INT(r.max_event_bytes, LR_SSE_DEFAULT_MAX_EVENT_BYTES);
    lr_sse_free(&r);
}

/* A server that never ends its line, fed in 16 KiB slices as curl would:
 * the reader fails once the line passes the bound, holding a buffer of
 * about that size, never the whole stream. */
static void test_memory_bound(void)
{
    lr_sse_reader r;
    lr_sse_event ev;
    size_t slice = 16384, fed = 0;
    char *x = malloc(slice);
    int rc = LR_SSE_AGAIN;
    memset(x, 'x', slice);
    lr_sse_init(&r, 0);
    while (rc == LR_SSE_AGAIN && fed < ((size_t)64 << 20)) {
        rc = lr_sse_feed(&r, x, slice);
        fed += slice;
        if (rc == LR_SSE_AGAIN)
            rc = lr_sse_next(&r, &ev);
    }
    CHECK_INT(rc, LR_SSE_TOO_LARGE);
    CHECK(fed <= r.max_line + 2 * slice);
    CHECK(r.in.cap <= 2 * (r.max_line + 2 * slice));
    lr_sse_free(&r);

    /* Data lines within bounds adding up past it: data stops at the bound. */
    lr_sse_init(&r, 1000);
    memcpy(x, "data: ", 6);
    x[99] = '\n';
    rc = LR_SSE_AGAIN;
    for (int i = 0; i < 100000 && rc == LR_SSE_AGAIN; i++)
        if ((rc = lr_sse_feed(&r, x, 100)) == LR_SSE_AGAIN)
            rc = lr_sse_next(&r, &ev);
    CHECK_INT(rc, LR_SSE_TOO_LARGE);
    CHECK(r.data.len <= 1000 && r.data.cap <= 2048);
    lr_sse_free(&r);
    free(x);
}

/* A long line fed one byte at a time, then many events in one slice:
 * both must come out whole (a reader that rescans or moves the partial
 * line on every feed would take minutes here). */
static void test_long_line_bytewise(void)
{
    lr_sse_reader r;
    lr_sse_event ev;
    size_t n = 300000, count = 0, i;
    lr_sse_init(&r, 0);
    feed_str(&r, "data: ");
    for (i = 0; i < n; i++) {
        char c = (char)('a' + i % 26);
        if (lr_sse_feed(&r, &c, 1) != LR_SSE_AGAIN || lr_sse_next(&r, &ev) != LR_SSE_AGAIN)
            break;
    }
    CHECK_INT(i, n);
    feed_str(&r, "\r\n\r\n");
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_EVENT);
    CHECK_INT(ev.data_len, n);
    CHECK(ev.data[0] == 'a' && ev.data[n - 1] == (char)('a' + (n - 1) % 26));

    size_t many = 50000, one = strlen("data: e\n\n");
    char *text = malloc(many * one);
    for (i = 0; i < many; i++)
        memcpy(text + i * one, "data: e\n\n", one);
    CHECK_INT(lr_sse_feed(&r, text, many * one), LR_SSE_AGAIN);
    while (lr_sse_next(&r, &ev) == LR_SSE_EVENT)
        count += ev.data_len == 1 && ev.data[0] == 'e';
    CHECK_INT(count, many);
    free(text);
    lr_sse_free(&r);
}

/* [DONE] ends everything; finish without draining is never clean. */
static void test_done_and_contract(void)
{
    lr_sse_reader r;
    lr_sse_event ev;
    lr_sse_init(&r, 0);
    CHECK_INT(lr_sse_feed(&r, NULL, 0), LR_SSE_AGAIN);
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_AGAIN);
    feed_str(&r, "data: [DONE]\n\ndata: x\n\n");
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_DONE);
    CHECK(r.done);
    CHECK_INT(lr_sse_next(&r, &ev), LR_SSE_DONE);
    CHECK_INT(feed_str(&r, "data: y\n\n"), LR_SSE_DONE);
    CHECK_INT(lr_sse_finish(&r), LR_SSE_END_DONE);
    lr_sse_reset(&r);
    CHECK(!r.done);
    feed_str(&r, "data: a\n\n");
    CHECK_INT(lr_sse_finish(&r), LR_SSE_END_TRUNCATED);  /* events not pulled */
    lr_sse_free(&r);
    CHECK_STR(lr_sse_end_name(LR_SSE_END_AFTER_FINISH), "eof_after_finish");
}

static void test_rules(void)
{
    test_crlf_across_feeds();
    test_bom_split();
    test_event_lifetime();
    test_limits();
    test_memory_bound();
    test_long_line_bytewise();
    test_done_and_contract();
}

/* What opens an event stream (lr_sse_opens): the body's first bytes decide
 * whether a mislabelled 2xx is one (transfer.c). */
static void test_opens(void)
{
    static const struct { const char *text; int opens; } t[] = {
        { "data: {}\n\n", 1 }, { "data:x", 1 }, { "event: error\n", 1 }, { ": ping\n", 1 },
        { "\xEF\xBB\xBF" "data: x", 1 }, { "\r\n\ndata: x", 1 }, { "\xEF\xBB\xBF\n: c", 1 },
        { "{\"data:\": 1}", 0 }, { "[1]", 0 }, { " data: x", 0 }, { "dat", 0 }, { "even", 0 },
        { "id: 1\n", 0 }, { "", 0 }, { "\n\n", 0 }, { "\xEF\xBB", 0 }, { "Data: x", 0 },
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        CHECK_MSG(lr_sse_opens(t[i].text, strlen(t[i].text)) == t[i].opens, "case %zu: \"%s\"",
                  i, t[i].text);
}

int main(void)
{
    test_vectors();
    test_rules();
    test_opens();
    return th_summary("test_sse");
}
