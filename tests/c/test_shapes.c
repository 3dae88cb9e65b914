/* The shapes the core hands to hosts (shapes.c): every table well formed,
 * values read with their null rules, a broken stream's reason, the targets
 * list, and the enumerations of kinds and reasons ending where they should. */
#include "harness.h"
#include "llmretry.h"

#include <string.h>

/* The value of field `name` of `obj`, or a NULL-typed field when absent. */
static llmretry_field get(llmretry_shape s, const void *obj, const char *name)
{
    llmretry_field f;
    for (size_t i = 0; llmretry_shape_field(s, obj, i, &f) == 0; i++)
        if (strcmp(f.name, name) == 0)
            return f;
    memset(&f, 0, sizeof f);
    f.name = "(absent)";
    f.type = (llmretry_field_type)-1;
    return f;
}

static void test_tables(void)
{
    CHECK(llmretry_shape_name(LLMRETRY_SHAPE_COUNT) == NULL);
    CHECK(llmretry_shape_field_count(LLMRETRY_SHAPE_COUNT) == 0);
    for (int s = 0; s < LLMRETRY_SHAPE_COUNT; s++) {
        size_t n = llmretry_shape_field_count((llmretry_shape)s);
        CHECK_MSG(n > 0 && llmretry_shape_name((llmretry_shape)s), "shape %d", s);
        CHECK(llmretry_shape_field_info((llmretry_shape)s, n) == NULL);
        for (size_t i = 0; i < n; i++) {
            const llmretry_field_info *fi = llmretry_shape_field_info((llmretry_shape)s, i);
            CHECK(fi && fi->name && fi->doc && *fi->doc);
            CHECK(fi->type != LLMRETRY_FIELD_NULL);
            for (size_t j = 0; j < i; j++)
                CHECK_MSG(strcmp(llmretry_shape_field_info((llmretry_shape)s, j)->name,
                                 fi->name) != 0, "%s.%s twice", llmretry_shape_name(s), fi->name);
        }
    }
}

static void test_result_values(void)
{
    llmretry_target_report targets[2] = {
        { "a", 2, 503, LLMRETRY_ERR_HTTP_STATUS, LLMRETRY_REASON_RETRIES_EXHAUSTED },
        { "b", 0, 0, LLMRETRY_ERR_NONE, LLMRETRY_REASON_NONE },
    };
    llmretry_result r;
    memset(&r, 0, sizeof r);
    r.request_id = "rid";
    r.attempts = 3;
    r.ttft_ms = -1;
    r.retry_after_ms = -1;
    r.kind = LLMRETRY_ERR_STREAM_INTERRUPTED;
    r.reason = LLMRETRY_REASON_STREAM_INTERRUPTED;
    r.stream_reason = LLMRETRY_STREAM_IDLE_TIMEOUT;
    r.stream = 1;
    r.chunks_delivered = 4;
    r.n_targets = 2;
    r.targets = targets;
    r.error_code = "quota";

    /* The error says how the stream broke; no status, no wait. */
    CHECK_STR(get(LLMRETRY_SHAPE_ERROR, &r, "kind").s, "stream_interrupted");
    CHECK_STR(get(LLMRETRY_SHAPE_ERROR, &r, "reason").s, "idle_timeout");
    CHECK_INT(get(LLMRETRY_SHAPE_ERROR, &r, "status").type, LLMRETRY_FIELD_NULL);
    CHECK_INT(get(LLMRETRY_SHAPE_ERROR, &r, "retry_after_ms").type, LLMRETRY_FIELD_NULL);
    CHECK_STR(get(LLMRETRY_SHAPE_ERROR, &r, "error_code").s, "quota");
    CHECK_INT(get(LLMRETRY_SHAPE_ERROR, &r, "attempts").i, 3);
    CHECK_INT(get(LLMRETRY_SHAPE_STREAM, &r, "chunks_delivered").i, 4);
    CHECK_STR(get(LLMRETRY_SHAPE_STREAM, &r, "stream_reason").s, "idle_timeout");
    CHECK_INT(get(LLMRETRY_SHAPE_STREAM, &r, "ttft_ms").type, LLMRETRY_FIELD_NULL);

    llmretry_field t = get(LLMRETRY_SHAPE_ERROR, &r, "targets");
    CHECK_INT(t.type, LLMRETRY_FIELD_LIST);
    CHECK_INT(t.list.shape, LLMRETRY_SHAPE_TARGET);
    CHECK_INT(t.list.n, 2);
    const void *second = (const char *)t.list.items + t.list.size;
    CHECK_STR(get(LLMRETRY_SHAPE_TARGET, t.list.items, "kind").s, "http_status");
    CHECK_INT(get(LLMRETRY_SHAPE_TARGET, t.list.items, "status").i, 503);
    CHECK_INT(get(LLMRETRY_SHAPE_TARGET, second, "status").type, LLMRETRY_FIELD_NULL);
    CHECK_INT(get(LLMRETRY_SHAPE_TARGET, second, "kind").type, LLMRETRY_FIELD_NULL);

    /* Without fallbacks there is no list; a plain failure's reason is its own. */
    r.n_targets = 1;
    r.targets = NULL;
    r.kind = LLMRETRY_ERR_HTTP_STATUS;
    r.reason = LLMRETRY_REASON_NOT_RETRYABLE;
    r.status = 400;
    r.retry_after_ms = 250;
    CHECK_INT(get(LLMRETRY_SHAPE_ERROR, &r, "targets").type, LLMRETRY_FIELD_NULL);
    CHECK_STR(get(LLMRETRY_SHAPE_ERROR, &r, "reason").s, "not_retryable");
    CHECK_INT(get(LLMRETRY_SHAPE_ERROR, &r, "status").i, 400);
    CHECK_INT(get(LLMRETRY_SHAPE_ERROR, &r, "retry_after_ms").i, 250);

    /* A success read as an error (a host that cannot decode its body):
     * the failure's own fields are null. */
    r.ok = 1;
    CHECK_INT(get(LLMRETRY_SHAPE_ERROR, &r, "retry_after_ms").type, LLMRETRY_FIELD_NULL);
    CHECK_INT(get(LLMRETRY_SHAPE_ERROR, &r, "error_code").type, LLMRETRY_FIELD_NULL);

    /* Meta: usage only when present, ttft_ms null when -1, stream a bool. */
    r.usage.present = 1;
    r.usage.total_tokens = 9;
    r.stream = 7;
    llmretry_field u = get(LLMRETRY_SHAPE_META, &r, "usage");
    CHECK_INT(u.type, LLMRETRY_FIELD_USAGE);
    CHECK_INT(get(LLMRETRY_SHAPE_USAGE, u.usage, "total_tokens").i, 9);
    CHECK_INT(get(LLMRETRY_SHAPE_META, &r, "usage_total").type, LLMRETRY_FIELD_NULL);
    CHECK_INT(get(LLMRETRY_SHAPE_META, &r, "ttft_ms").type, LLMRETRY_FIELD_NULL);
    llmretry_field st = get(LLMRETRY_SHAPE_META, &r, "stream");
    CHECK(st.type == LLMRETRY_FIELD_BOOL && st.i == 1);
    r.ttft_ms = 0;
    CHECK(get(LLMRETRY_SHAPE_META, &r, "ttft_ms").type == LLMRETRY_FIELD_INT);
}

static void test_stats_values(void)
{
    llmretry_endpoint_stats e;
    memset(&e, 0, sizeof e);
    e.url = "http://x/v1";
    e.breaker = "open";
    e.has_key = 1;
    e.tpm = (int64_t)1 << 40;
    e.in_flight = 3;
    CHECK_STR(get(LLMRETRY_SHAPE_ENDPOINT, &e, "breaker").s, "open");
    CHECK_INT(get(LLMRETRY_SHAPE_ENDPOINT, &e, "tpm").i, (int64_t)1 << 40);
    CHECK_INT(get(LLMRETRY_SHAPE_ENDPOINT, &e, "in_flight").i, 3);
    CHECK_INT(get(LLMRETRY_SHAPE_ENDPOINT, &e, "has_key").type, LLMRETRY_FIELD_BOOL);
    llmretry_group_stats g = { 5, 4, 3, 2, 1 };
    CHECK_INT(get(LLMRETRY_SHAPE_GROUP, &g, "window").i, 5);
    CHECK_INT(get(LLMRETRY_SHAPE_GROUP, &g, "halvings").i, 1);
}

/* Hosts list the kinds and reasons by counting up until NULL. */
static void test_enumerations(void)
{
    int n = 0;
    while (llmretry_error_kind_name((llmretry_error_kind)(n + 1)))
        n++;
    CHECK_INT(n, LLMRETRY_ERR_REFUSAL);
    n = 0;
    while (llmretry_reason_name((llmretry_giveup_reason)(n + 1)))
        n++;
    CHECK_INT(n, LLMRETRY_REASON_CIRCUIT_OPEN);
    n = 0;
    while (llmretry_stream_reason_name((llmretry_stream_reason)(n + 1)))
        n++;
    CHECK_INT(n, LLMRETRY_STREAM_TOO_LARGE);
}

int main(void)
{
    test_tables();
    test_result_values();
    test_stats_values();
    test_enumerations();
    return th_summary("shapes");
}
