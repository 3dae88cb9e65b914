/* Runs every shared scenario in tests/vectors/ (see its README.md) against
 * the mock server through the engine and the mailbox, checking the
 * vector's "expect" and the invariants every language's runner checks. */
#include "harness.h"
#include "llmretry.h"

#include <cJSON.h>
#include <dirent.h>
#include <stdlib.h>

#define API_KEY "sk-test-SECRET-KEY-123"
#define VECTOR_DIR LLMRETRY_SOURCE_DIR "/tests/vectors"
/* No vector needs more than a few seconds; this only stops a hung call. */
#define CALL_LIMIT_MS 30000
#define MAX_EVENTS 64
#define MAX_HEADERS 16

/* The vector being run, prefixed to every failure message. */
static const char *cur = "";

#define VCHECK(cond, ...) do { if (cond) th_passed++; else { \
    fprintf(stderr, "[%s] ", cur); th_fail(__FILE__, __LINE__, __VA_ARGS__); } } while (0)

/* ------------------------------------------------------------------ */
/* Loading vectors.                                                    */
/* ------------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted *.json file names in VECTOR_DIR and its schema/ (as "schema/x.json");
 * *n gets the count. */
static char **list_vectors(size_t *n)
{
    static const char *const dirs[] = { "", "schema/" };
    char **names = NULL;
    size_t cap = 0;
    *n = 0;
    for (size_t k = 0; k < sizeof dirs / sizeof *dirs; k++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", VECTOR_DIR, dirs[k]);
    DIR *d = opendir(path);
    struct dirent *de;
    if (!d)
        continue;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len <= 5 || strcmp(de->d_name + len - 5, ".json") != 0)
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *names);
            if (!nn)
                break;
            names = nn;
        }
        size_t full = strlen(dirs[k]) + len + 1;
        if ((names[*n] = malloc(full)) != NULL)
            snprintf(names[(*n)++], full, "%s%s", dirs[k], de->d_name);
    }
    closedir(d);
    }
    if (names)
        qsort(names, *n, sizeof *names, cmp_str);
    return names;
}

static cJSON *load_json(const char *path)
{
    char *text = th_read_file(path, NULL);
    if (!text)
        return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    return j;
}

/* ------------------------------------------------------------------ */
/* Options from a vector.                                              */
/* ------------------------------------------------------------------ */

typedef struct vec_call {
    llmretry_options o;
    char url[256];
    char *body;
    /* What the server must see: the body, with stream_options added to a
     * streaming one without them (docs/streaming.md). */
    char sent_body[4096];
    char *headers[MAX_HEADERS];
    const char *header_ptrs[MAX_HEADERS];
    char *schema;                  /* the schema option's JSON text */
} vec_call;

static int int_opt(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* Apply one "options" member; -1 for an unknown name or a bad value. */
static int apply_option(vec_call *vc, const cJSON *v)
{
    llmretry_options *o = &vc->o;
    const char *k = v->string;
    int64_t i = 0;
    if (strcmp(k, "timeout_ms") == 0)
        return int_opt(v, &o->timeout_ms);
    if (strcmp(k, "base_delay_ms") == 0)
        return int_opt(v, &o->base_delay_ms);
    if (strcmp(k, "max_delay_ms") == 0)
        return int_opt(v, &o->max_delay_ms);
    if (strcmp(k, "deadline_ms") == 0)
        return int_opt(v, &o->deadline_ms);
    if (strcmp(k, "max_retry_after_ms") == 0)
        return int_opt(v, &o->max_retry_after_ms);
    if (strcmp(k, "max_response_bytes") == 0)
        return int_opt(v, &o->max_response_bytes);
    if (strcmp(k, "idle_timeout_ms") == 0)
        return int_opt(v, &o->idle_timeout_ms);
    if (strcmp(k, "breaker_cooldown_ms") == 0)
        return int_opt(v, &o->breaker_cooldown_ms);
    if (strcmp(k, "retry_budget_ratio") == 0) {
        if (!cJSON_IsNumber(v))
            return -1;
        o->retry_budget_ratio = v->valuedouble;
        return 0;
    }
    if (strcmp(k, "retry_budget_min") == 0 || strcmp(k, "breaker_failures") == 0) {
        if (int_opt(v, &i) != 0)
            return -1;
        *(k[0] == 'r' ? &o->retry_budget_min : &o->breaker_failures) = (int)i;
        return 0;
    }
    if (strcmp(k, "max_retries") == 0) {
        if (int_opt(v, &i) != 0)
            return -1;
        o->max_retries = (int)i;
        return 0;
    }
    if (strcmp(k, "endpoint") == 0) {
        char err[LLMRETRY_ERRBUF];
        return cJSON_IsString(v) && llmretry_options_set_text(o, "endpoint", v->valuestring, err,
                                                              sizeof err) == LLMRETRY_OK ? 0 : -1;
    }
    if (strcmp(k, "jitter") == 0)
        return cJSON_IsString(v) &&
               llmretry_jitter_parse(v->valuestring, &o->jitter) == LLMRETRY_OK ? 0 : -1;
    if (strcmp(k, "retry_mode") == 0)
        return cJSON_IsString(v) &&
               llmretry_retry_mode_parse(v->valuestring, &o->retry_mode) == LLMRETRY_OK ? 0 : -1;
    if (strcmp(k, "retry_invalid_response") == 0) {
        if (!cJSON_IsBool(v))
            return -1;
        o->retry_invalid_response = cJSON_IsTrue(v);
        return 0;
    }
    if (strcmp(k, "idempotency_key") == 0 || strcmp(k, "request_id") == 0) {
        if (!cJSON_IsString(v))
            return -1;
        if (k[0] == 'i')
            o->idempotency_key = v->valuestring;
        else
            o->request_id = v->valuestring;
        return 0;
    }
    if (strcmp(k, "schema") == 0) {
        char err[LLMRETRY_ERRBUF];
        vc->schema = cJSON_PrintUnformatted(v);
        return vc->schema && llmretry_options_set_json(o, "schema", vc->schema, err,
                                                       sizeof err) == LLMRETRY_OK ? 0 : -1;
    }
    if (strcmp(k, "retry_statuses") == 0) {
        const cJSON *s;
        o->n_retry_statuses = 0;
        cJSON_ArrayForEach(s, v) {
            if (!cJSON_IsNumber(s) || o->n_retry_statuses >= LLMRETRY_MAX_STATUSES)
                return -1;
            o->retry_statuses[o->n_retry_statuses++] = s->valueint;
        }
        return 0;
    }
    if (strcmp(k, "headers") == 0) {
        const cJSON *h;
        size_t n = 0;
        cJSON_ArrayForEach(h, v) {
            if (!cJSON_IsString(h) || n >= MAX_HEADERS)
                return -1;
            size_t len = strlen(h->string) + strlen(h->valuestring) + 3;
            vc->headers[n] = malloc(len);
            if (!vc->headers[n])
                return -1;
            snprintf(vc->headers[n], len, "%s: %s", h->string, h->valuestring);
            vc->header_ptrs[n] = vc->headers[n];
            n++;
        }
        o->headers = vc->header_ptrs;
        o->n_headers = n;
        return 0;
    }
    return -1;
}

static int build_call(vec_call *vc, const cJSON *vec, const th_mock *m, const char *name)
{
    memset(vc, 0, sizeof *vc);
    llmretry_options_defaults(&vc->o);
    th_mock_scenario_url(m, name, vc->url, sizeof vc->url);
    vc->o.base_url = vc->url;
    vc->o.api_key = API_KEY;
    vc->o.use_env_api_key = 0;
    vc->body = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(vec, "body"));
    if (!vc->body)
        return -1;
    vc->o.body = vc->body;
    vc->o.body_len = strlen(vc->body);
    /* The body is the vector's JSON object, encoded here, as Python encodes a dict
     * and Lua a table: a stream of it asks for its usage, in all three. */
    vc->o.stream_usage = 1;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(vec, "body");
    size_t blen = strlen(vc->body);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "stream")) &&
        !cJSON_GetObjectItemCaseSensitive(b, "stream_options") && blen > 0)
        snprintf(vc->sent_body, sizeof vc->sent_body, "%.*s,\"stream_options\":{\"include_usage\":true}}",
                 (int)blen - 1, vc->body);
    else
        snprintf(vc->sent_body, sizeof vc->sent_body, "%s", vc->body);
    const cJSON *opt;
    cJSON_ArrayForEach(opt, cJSON_GetObjectItemCaseSensitive(vec, "options")) {
        if (apply_option(vc, opt) != 0) {
            VCHECK(0, "unknown or bad option \"%s\"", opt->string);
            return -1;
        }
    }
    return 0;
}

static void free_call_opts(vec_call *vc)
{
    for (size_t i = 0; i < MAX_HEADERS; i++)
        free(vc->headers[i]);
    cJSON_free(vc->body);
    cJSON_free(vc->schema);
}

/* ------------------------------------------------------------------ */
/* Events.                                                             */
/* ------------------------------------------------------------------ */

/* Look up a field by name; 0 when found. */
static int ev_get(const llmretry_event *ev, const char *name, llmretry_field *out)
{
    size_t n = llmretry_event_field_count(ev);
    for (size_t i = 0; i < n; i++)
        if (llmretry_event_field(ev, i, out) == 0 && out->name && strcmp(out->name, name) == 0)
            return 0;
    return -1;
}

/* An int field, or `dflt` when absent or not an int. */
static int64_t ev_int(const llmretry_event *ev, const char *name, int64_t dflt)
{
    llmretry_field f;
    if (ev_get(ev, name, &f) != 0 || f.type != LLMRETRY_FIELD_INT)
        return dflt;
    return f.i;
}

/* A string field, or NULL when absent or not a string. */
static const char *ev_str(const llmretry_event *ev, const char *name)
{
    llmretry_field f;
    if (ev_get(ev, name, &f) != 0 || f.type != LLMRETRY_FIELD_STRING)
        return NULL;
    return f.s;
}

typedef struct run_out {
    llmretry_call *call;
    llmretry_event *ev[MAX_EVENTS];
    size_t n_ev;
    int done;
    int64_t wall_ms;
} run_out;

/* Submit and drain the mailbox until DONE, keeping every event. */
static void run_call(llmretry_engine *e, const llmretry_options *o, run_out *r)
{
    char err[LLMRETRY_ERRBUF] = "";
    int64_t t0 = th_now_ms(), end = t0 + CALL_LIMIT_MS;
    memset(r, 0, sizeof *r);
    llmretry_status st = llmretry_engine_submit(e, o, 0, &r->call, err, sizeof err);
    VCHECK(st == LLMRETRY_OK, "submit: %s (%s)", llmretry_status_name(st), err);
    if (st != LLMRETRY_OK) {
        r->call = NULL;
        return;
    }
    while (!r->done) {
        llmretry_event *ev = NULL;
        llmretry_mail mail = llmretry_call_next(r->call, &ev);
        if (mail == LLMRETRY_MAIL_EVENT) {
            if (r->n_ev < MAX_EVENTS)
                r->ev[r->n_ev++] = ev;
            else
                llmretry_event_free(ev);
        } else if (mail == LLMRETRY_MAIL_DONE) {
            r->done = 1;
        } else if (mail == LLMRETRY_MAIL_VALIDATE) {
            VCHECK(0, "MAIL_VALIDATE without validate set");
            llmretry_call_validated(r->call, 1, NULL);
        } else {
            int64_t left = end - th_now_ms();
            if (left <= 0)
                break;
            llmretry_call_wait(r->call, left);
        }
    }
    r->wall_ms = th_now_ms() - t0;
    VCHECK(r->done, "call did not finish within %d ms", CALL_LIMIT_MS);
}

static void free_run(run_out *r)
{
    for (size_t i = 0; i < r->n_ev; i++)
        llmretry_event_free(r->ev[i]);
    if (r->call)
        llmretry_call_free(r->call);
}

/* ------------------------------------------------------------------ */
/* Checks.                                                             */
/* ------------------------------------------------------------------ */

/* The message contents of the request body: none may leak into events. */
static size_t body_secrets(const cJSON *vec, const char **out, size_t max)
{
    size_t n = 0;
    const cJSON *msg;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(vec, "body"), "messages");
    cJSON_ArrayForEach(msg, msgs) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (cJSON_IsString(c) && c->valuestring[0] && n < max)
            out[n++] = c->valuestring;
    }
    return n;
}

static void check_event_list(const cJSON *exp, const run_out *r)
{
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(exp, "events");
    size_t want = (size_t)cJSON_GetArraySize(names);
    int same = want == r->n_ev;
    for (size_t i = 0; same && i < want; i++) {
        const char *w = cJSON_GetArrayItem(names, (int)i)->valuestring;
        same = strcmp(w, llmretry_event_name(llmretry_event_type_of(r->ev[i]))) == 0;
    }
    if (same) {
        th_passed++;
        return;
    }
    char got[2048] = "";
    size_t off = 0;
    for (size_t i = 0; i < r->n_ev && off < sizeof got - 64; i++)
        off += (size_t)snprintf(got + off, sizeof got - off, "%s%s", i ? ", " : "",
                                llmretry_event_name(llmretry_event_type_of(r->ev[i])));
    VCHECK(0, "events: got [%s], expected %zu events", got, want);
}

/* Compare an int field of the events of one type, in order, with an array. */
static void check_per_retry(const cJSON *exp, const char *key, const run_out *r,
                            llmretry_event_type type, const char *field)
{
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(exp, key);
    size_t k = 0;
    if (!want)
        return;
    for (size_t i = 0; i < r->n_ev; i++) {
        if (llmretry_event_type_of(r->ev[i]) != type)
            continue;
        const cJSON *w = cJSON_GetArrayItem(want, (int)k);
        if (cJSON_IsString(w)) {
            const char *got = ev_str(r->ev[i], field);
            VCHECK(got && strcmp(got, w->valuestring) == 0, "%s[%zu]: got %s, expected %s",
                   key, k, got ? got : "(none)", w->valuestring);
        } else if (cJSON_IsNumber(w)) {
            int64_t got = ev_int(r->ev[i], field, -999);
            VCHECK(got == (int64_t)w->valuedouble, "%s[%zu]: got %lld, expected %lld", key, k,
                   (long long)got, (long long)w->valuedouble);
        }
        k++;
    }
    VCHECK(k == (size_t)cJSON_GetArraySize(want), "%s: %zu events, expected %d", key, k,
           cJSON_GetArraySize(want));
}

static void check_usage(const cJSON *want, const llmretry_usage *u, const char *where)
{
    VCHECK(u && u->present, "%s: usage missing", where);
    if (!u || !u->present)
        return;
    int64_t p = (int64_t)cJSON_GetObjectItemCaseSensitive(want, "prompt_tokens")->valuedouble;
    int64_t c = (int64_t)cJSON_GetObjectItemCaseSensitive(want, "completion_tokens")->valuedouble;
    int64_t t = (int64_t)cJSON_GetObjectItemCaseSensitive(want, "total_tokens")->valuedouble;
    VCHECK(u->prompt_tokens == p && u->completion_tokens == c && u->total_tokens == t,
           "%s: usage %lld/%lld/%lld, expected %lld/%lld/%lld", where,
           (long long)u->prompt_tokens, (long long)u->completion_tokens,
           (long long)u->total_tokens, (long long)p, (long long)c, (long long)t);
}

static const char *opt_str(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void check_str_eq(const char *what, const char *got, const char *want)
{
    VCHECK(got && want && strcmp(got, want) == 0, "%s: got \"%s\", expected \"%s\"", what,
           got ? got : "(null)", want ? want : "(null)");
}

static void check_result(const cJSON *exp, const run_out *r, const llmretry_result *res)
{
    int want_ok = strcmp(opt_str(exp, "outcome"), "ok") == 0;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(exp, "status");
    const cJSON *v;

    VCHECK(res->ok == want_ok, "outcome: ok=%d (kind %s, reason %s, message %s)", res->ok,
           llmretry_error_kind_name(res->kind) ? llmretry_error_kind_name(res->kind) : "none",
           llmretry_reason_name(res->reason) ? llmretry_reason_name(res->reason) : "none",
           res->message ? res->message : "(null)");
    VCHECK(res->attempts == cJSON_GetObjectItemCaseSensitive(exp, "attempts")->valueint,
           "attempts: got %d, expected %d", res->attempts,
           cJSON_GetObjectItemCaseSensitive(exp, "attempts")->valueint);
    VCHECK(res->attempt == res->attempts - 1, "result.attempt %d with %d attempts",
           res->attempt, res->attempts);
    int want_status = cJSON_IsNumber(st) ? st->valueint : 0;
    VCHECK(res->status == want_status, "status: got %d, expected %d", res->status, want_status);
    VCHECK(res->request_id && res->request_id[0], "result has no request_id");
    check_str_eq("result.model", res->model, "gpt-test");
    VCHECK(res->total_ms >= res->duration_ms && res->duration_ms >= 0,
           "total_ms %lld < duration_ms %lld", (long long)res->total_ms,
           (long long)res->duration_ms);

    if ((v = cJSON_GetObjectItemCaseSensitive(exp, "min_total_ms")))
        VCHECK(res->total_ms >= (int64_t)v->valuedouble, "total_ms %lld < min %lld",
               (long long)res->total_ms, (long long)v->valuedouble);
    /* The engine's total_ms is held to the bound; the harness's own wall
     * (submit to delivery, which valgrind slows outside the engine) gets
     * LLMRETRY_TEST_WALL_SLACK_MS more: the Makefile's valgrind pass sets it. */
    const char *slack_env = getenv("LLMRETRY_TEST_WALL_SLACK_MS");
    int64_t wall_slack = slack_env ? atoll(slack_env) : 0;
    if ((v = cJSON_GetObjectItemCaseSensitive(exp, "max_total_ms")))
        VCHECK(res->total_ms <= (int64_t)v->valuedouble &&
               r->wall_ms <= (int64_t)v->valuedouble + wall_slack,
               "total_ms %lld (wall %lld) > max %lld", (long long)res->total_ms,
               (long long)r->wall_ms, (long long)v->valuedouble);
    if (opt_str(exp, "request_id"))
        check_str_eq("result.request_id", res->request_id, opt_str(exp, "request_id"));
    if ((v = cJSON_GetObjectItemCaseSensitive(exp, "usage_total")))
        check_usage(v, &res->usage_total, "result.usage_total");

    if (want_ok) {
        VCHECK(res->body && res->body_len > 0, "ok result without a body");
        if (res->body) {
            cJSON *b = cJSON_ParseWithLength(res->body, res->body_len);
            VCHECK(b != NULL, "ok result body is not JSON");
            check_str_eq("object", cJSON_GetStringValue(cJSON_GetObjectItem(b, "object")),
                         opt_str(exp, "object") ? opt_str(exp, "object") : "chat.completion");
            if (opt_str(exp, "content")) {
                const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0);
                const cJSON *msg = cJSON_GetObjectItem(ch, "message");
                check_str_eq("content", cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content")),
                             opt_str(exp, "content"));
            }
            cJSON_Delete(b);
        }
        if ((v = cJSON_GetObjectItemCaseSensitive(exp, "chunks")))
            VCHECK(res->stream && res->chunks == (int)v->valuedouble,
                   "chunks: got %d (stream %d), expected %d", res->chunks, res->stream,
                   (int)v->valuedouble);
        VCHECK(res->kind == LLMRETRY_ERR_NONE && res->reason == LLMRETRY_REASON_NONE,
               "ok result with kind %d reason %d", (int)res->kind, (int)res->reason);
        if ((v = cJSON_GetObjectItemCaseSensitive(exp, "usage")))
            check_usage(v, &res->usage, "result");
        if (opt_str(exp, "response_model"))
            check_str_eq("response_model", res->response_model, opt_str(exp, "response_model"));
        if (opt_str(exp, "system_fingerprint"))
            check_str_eq("system_fingerprint", res->system_fingerprint,
                         opt_str(exp, "system_fingerprint"));
        return;
    }
    check_str_eq("error_kind", llmretry_error_kind_name(res->kind), opt_str(exp, "error_kind"));
    check_str_eq("reason", llmretry_reason_name(res->reason), opt_str(exp, "reason"));
    VCHECK(res->message && res->message[0], "error without a message");
    if (opt_str(exp, "error_code"))
        check_str_eq("error_code", res->error_code, opt_str(exp, "error_code"));
    if ((v = cJSON_GetObjectItemCaseSensitive(exp, "retry_after_ms")))
        VCHECK(res->retry_after_ms == (int64_t)v->valuedouble,
               "retry_after_ms: got %lld, expected %lld", (long long)res->retry_after_ms,
               (long long)v->valuedouble);
    if (opt_str(exp, "body_preview_contains"))
        VCHECK(res->body_preview && strstr(res->body_preview, opt_str(exp, "body_preview_contains")),
               "body_preview \"%s\" lacks \"%s\"", res->body_preview ? res->body_preview : "(null)",
               opt_str(exp, "body_preview_contains"));
    if ((v = cJSON_GetObjectItemCaseSensitive(exp, "validation_errors"))) {
        cJSON *got = res->validation_errors ? cJSON_Parse(res->validation_errors) : NULL;
        VCHECK(got && cJSON_Compare(got, v, 1), "validation_errors: got %s",
               res->validation_errors ? res->validation_errors : "(null)");
        cJSON_Delete(got);
    } else {
        VCHECK(res->validation_errors == NULL, "validation_errors on the result: %s",
               res->validation_errors);
    }
}

/* The validation_path of each llm_request_error event, in order (null:
 * the event has none). */
static void check_validation_paths(const cJSON *exp, const run_out *r)
{
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(exp, "validation_paths");
    int k = 0;
    for (size_t i = 0; i < r->n_ev; i++) {
        if (llmretry_event_type_of(r->ev[i]) != LLMRETRY_EV_REQUEST_ERROR)
            continue;
        const char *got = ev_str(r->ev[i], "validation_path");
        const cJSON *w = cJSON_GetArrayItem(want, k++);
        if (!want)
            VCHECK(got == NULL, "an error event with validation_path %s", got);
        else if (cJSON_IsString(w))
            check_str_eq("validation_path", got, w->valuestring);
        else
            VCHECK(got == NULL, "validation_path[%d]: got %s, expected none", k - 1, got);
    }
    VCHECK(!want || k == cJSON_GetArraySize(want), "validation_paths: %d error events", k);
}

/* Per-event invariants: identity, attempt numbering, agreement with the
 * result, and no secrets in the JSON form. */
static void check_event_invariants(const cJSON *vec, const cJSON *exp, const run_out *r,
                                   const llmretry_result *res)
{
    const char *secrets[8];
    size_t n_secrets = body_secrets(vec, secrets, 8);
    int64_t cur_attempt = -1, next_attempt = 0, starts = 0;

    for (size_t i = 0; i < r->n_ev; i++) {
        const llmretry_event *ev = r->ev[i];
        llmretry_event_type t = llmretry_event_type_of(ev);
        const char *name = llmretry_event_name(t);
        llmretry_field f0;
        int64_t att = ev_int(ev, "attempt", -1);

        VCHECK(llmretry_event_field(ev, 0, &f0) == 0 && f0.type == LLMRETRY_FIELD_STRING &&
               strcmp(f0.name, "event") == 0 && strcmp(f0.s, name) == 0,
               "event %zu: field 0 is not \"event\" = %s", i, name);
        check_str_eq("event.request_id", ev_str(ev, "request_id"), res->request_id);
        check_str_eq("event.model", ev_str(ev, "model"), "gpt-test");

        switch (t) {
        case LLMRETRY_EV_REQUEST_STARTED:
            VCHECK(att == next_attempt, "%s #%zu: attempt %lld, expected %lld", name, i,
                   (long long)att, (long long)next_attempt);
            VCHECK(ev_int(ev, "timeout_ms", -1) > 0, "%s: no timeout_ms", name);
            cur_attempt = att;
            starts++;
            break;
        case LLMRETRY_EV_RETRY_SCHEDULED:
            next_attempt = ev_int(ev, "next_attempt", -1);
            VCHECK(att == cur_attempt && next_attempt == cur_attempt + 1,
                   "%s: attempt %lld next %lld after attempt %lld", name, (long long)att,
                   (long long)next_attempt, (long long)cur_attempt);
            VCHECK(ev_int(ev, "delay_ms", -1) >= 0, "%s: no delay_ms", name);
            break;
        case LLMRETRY_EV_REQUEST_GAVE_UP:
            VCHECK(att == cur_attempt, "%s: attempt %lld, last start %lld", name,
                   (long long)att, (long long)cur_attempt);
            VCHECK(ev_int(ev, "attempts", -1) == res->attempts, "%s: attempts %lld, result %d",
                   name, (long long)ev_int(ev, "attempts", -1), res->attempts);
            check_str_eq("gave_up.reason", ev_str(ev, "reason"), llmretry_reason_name(res->reason));
            check_str_eq("gave_up.error_kind", ev_str(ev, "error_kind"),
                         llmretry_error_kind_name(res->kind));
            VCHECK(i == r->n_ev - 1, "gave_up is not the last event");
            break;
        case LLMRETRY_EV_REQUEST_SUCCEEDED: {
            llmretry_field u;
            const cJSON *wu = cJSON_GetObjectItemCaseSensitive(exp, "usage");
            VCHECK(att == cur_attempt, "%s: attempt %lld, last start %lld", name,
                   (long long)att, (long long)cur_attempt);
            VCHECK(ev_int(ev, "status", -1) == res->status, "succeeded.status %lld",
                   (long long)ev_int(ev, "status", -1));
            if (wu) {
                int have = ev_get(ev, "usage", &u) == 0 && u.type == LLMRETRY_FIELD_USAGE;
                VCHECK(have, "succeeded event has no usage object");
                if (have)
                    check_usage(wu, u.usage, "succeeded event");
            }
            VCHECK(i == r->n_ev - 1, "succeeded is not the last event");
            break;
        }
        default: /* failed / error: the outcome of the current attempt */
            VCHECK(att == cur_attempt, "%s: attempt %lld, last start %lld", name,
                   (long long)att, (long long)cur_attempt);
            VCHECK(ev_int(ev, "duration_ms", -1) >= 0, "%s: no duration_ms", name);
            if (t == LLMRETRY_EV_REQUEST_FAILED)
                VCHECK(ev_int(ev, "status", 0) >= 300, "failed event without a non-2xx status");
            break;
        }

        char *json = llmretry_event_to_json(ev);
        VCHECK(json != NULL, "event_to_json returned NULL");
        if (!json)
            continue;
        cJSON *parsed = cJSON_Parse(json);
        VCHECK(parsed && strcmp(opt_str(parsed, "event") ? opt_str(parsed, "event") : "", name) == 0,
               "event JSON does not parse or names another event: %s", json);
        cJSON_Delete(parsed);
        VCHECK(strstr(json, API_KEY) == NULL, "event JSON leaks the API key: %s", json);
        for (size_t s = 0; s < n_secrets; s++)
            VCHECK(strstr(json, secrets[s]) == NULL, "event JSON leaks the prompt: %s", json);
        llmretry_free(json);
    }
    VCHECK(starts == res->attempts, "%lld started events for %d attempts", (long long)starts,
           res->attempts);
    if (res->message) {
        VCHECK(strstr(res->message, API_KEY) == NULL, "error message leaks the API key");
        for (size_t s = 0; s < n_secrets; s++)
            VCHECK(strstr(res->message, secrets[s]) == NULL, "error message leaks the prompt");
    }
}

static const char *rec_header(const cJSON *rec, const char *name)
{
    return opt_str(cJSON_GetObjectItemCaseSensitive(rec, "headers"), name);
}

/* What the server saw: count, headers and the body of every attempt. */
static void check_requests(th_mock *m, const char *name, const cJSON *exp,
                           const vec_call *vc, const llmretry_result *res)
{
    char *text = th_mock_requests(m, name);
    cJSON *recs = text ? cJSON_Parse(text) : NULL;
    int want = cJSON_GetObjectItemCaseSensitive(exp, "requests")->valueint;
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(exp, "request_headers");
    const cJSON *rec;

    free(text);
    VCHECK(cJSON_IsArray(recs), "could not read the mock's records");
    VCHECK(cJSON_GetArraySize(recs) == want, "server saw %d requests, expected %d",
           cJSON_GetArraySize(recs), want);
    /* One attempt is one request: a request sent behind the engine's back
     * (e.g. libcurl re-sending on a dead reused connection) breaks the
     * attempt count and, in unsafe mode, the promise never to re-send;
     * the engine's own free re-sends are counted in result.resends. */
    VCHECK(cJSON_GetArraySize(recs) == res->attempts + res->resends,
           "server saw %d requests for %d attempts and %d free re-sends",
           cJSON_GetArraySize(recs), res->attempts, res->resends);
    const cJSON *resends = cJSON_GetObjectItemCaseSensitive(exp, "resends");
    VCHECK(res->resends == (cJSON_IsNumber(resends) ? resends->valueint : 0),
           "free re-sends: got %d, expected %d", res->resends,
           cJSON_IsNumber(resends) ? resends->valueint : 0);
    cJSON_ArrayForEach(rec, recs) {
        const char *ua = rec_header(rec, "user-agent");
        const char *ct = rec_header(rec, "content-type");
        check_str_eq("authorization", rec_header(rec, "authorization"), "Bearer " API_KEY);
        check_str_eq("x-client-request-id", rec_header(rec, "x-client-request-id"),
                     res->request_id);
        VCHECK(ct && strncmp(ct, "application/json", 16) == 0, "content-type %s",
               ct ? ct : "(none)");
        check_str_eq("accept", rec_header(rec, "accept"), "application/json");
        VCHECK(ua && strncmp(ua, "llmretry/", 9) == 0, "user-agent %s", ua ? ua : "(none)");
        check_str_eq("method", opt_str(rec, "method"), "POST");
        check_str_eq("request body", opt_str(rec, "body"), vc->sent_body);
        const cJSON *h;
        cJSON_ArrayForEach(h, extra)
            check_str_eq(h->string, rec_header(rec, h->string), h->valuestring);
        if (!vc->o.idempotency_key)
            VCHECK(rec_header(rec, "idempotency-key") == NULL,
                   "idempotency-key sent though none was set");
    }
    cJSON_Delete(recs);
}

static void run_vector(llmretry_engine *e, th_mock *m, const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", VECTOR_DIR, file);
    cJSON *vec = load_json(path);
    cur = file;
    VCHECK(vec != NULL, "cannot read or parse %s", path);
    if (!vec)
        return;

    const char *name = opt_str(vec, "name");
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(vec, "expect");
    const cJSON *script = cJSON_GetObjectItemCaseSensitive(vec, "script");
    size_t nlen = name ? strlen(name) : 0;
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    int well_formed = name && strlen(base) == nlen + 5 && strncmp(base, name, nlen) == 0 &&
                      cJSON_IsObject(exp) && cJSON_IsObject(script) &&
                      opt_str(exp, "outcome") && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(exp, "events")) &&
                      cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(exp, "attempts")) &&
                      cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(exp, "requests"));
    VCHECK(well_formed, "malformed vector (name must match the file; expect needs outcome, "
                        "events, attempts, requests)");
    if (!well_formed) {
        cJSON_Delete(vec);
        return;
    }
    cur = name;

    char *script_text = cJSON_PrintUnformatted(script);
    int scripted = th_mock_script(m, name, script_text) == 0;
    cJSON_free(script_text);
    VCHECK(scripted, "could not script the mock");

    vec_call vc;
    if (scripted && strcmp(opt_str(exp, "outcome"), "invalid_argument") == 0) {
        /* Refused at submit, naming the mistake: nothing reaches the server. */
        if (build_call(&vc, vec, m, name) == 0) {
            char err[LLMRETRY_ERRBUF] = "";
            llmretry_call *call = NULL;
            llmretry_status st = llmretry_engine_submit(e, &vc.o, 0, &call, err, sizeof err);
            const char *want = opt_str(exp, "message_contains");
            VCHECK(st == LLMRETRY_EINVAL && want && strstr(err, want),
                   "submit: %s \"%s\", expected EINVAL with \"%s\"", llmretry_status_name(st),
                   err, want ? want : "");
            if (call)
                llmretry_call_free(call);
            char *text = th_mock_requests(m, name);
            cJSON *recs = text ? cJSON_Parse(text) : NULL;
            VCHECK(cJSON_IsArray(recs) && cJSON_GetArraySize(recs) == 0,
                   recs ? "the server saw a request" : "could not read the mock's records");
            cJSON_Delete(recs);
            free(text);
        }
        free_call_opts(&vc);
    } else if (scripted && build_call(&vc, vec, m, name) == 0) {
        run_out r;
        run_call(e, &vc.o, &r);
        const llmretry_result *res = r.call ? llmretry_call_result(r.call) : NULL;
        VCHECK(!r.done || res != NULL, "DONE but no result");
        if (r.done && res) {
            check_result(exp, &r, res);
            check_event_list(exp, &r);
            check_per_retry(exp, "delay_sources", &r, LLMRETRY_EV_RETRY_SCHEDULED, "delay_source");
            check_per_retry(exp, "delays_ms", &r, LLMRETRY_EV_RETRY_SCHEDULED, "delay_ms");
            check_per_retry(exp, "attempt_errors", &r, LLMRETRY_EV_REQUEST_ERROR, "error_kind");
            check_validation_paths(exp, &r);
            check_event_invariants(vec, exp, &r, res);
            check_requests(m, name, exp, &vc, res);
        }
        free_run(&r);
        free_call_opts(&vc);
    } else if (scripted) {
        free_call_opts(&vc);
    }
    cJSON_Delete(vec);
}

int main(void)
{
    th_mock m;
    llmretry_engine *e = NULL;
    char err[LLMRETRY_ERRBUF] = "";
    size_t n = 0;
    char **files = list_vectors(&n);

    CHECK_MSG(n >= 18, "found %zu vectors in %s, expected at least 18", n, VECTOR_DIR);
    if (th_mock_start(&m) != 0) {
        CHECK_MSG(0, "mock server did not start");
        return th_summary("test_vectors");
    }
    llmretry_status st = llmretry_engine_new(NULL, &e, err, sizeof err);
    CHECK_MSG(st == LLMRETRY_OK, "engine_new: %s (%s)", llmretry_status_name(st), err);
    /* TH_VECTOR=<name> runs one vector alone, for debugging. */
    const char *only = getenv("TH_VECTOR");
    for (size_t i = 0; e && i < n; i++) {
        int failed_before = th_failed;
        if (only && (strncmp(files[i], only, strlen(only)) != 0 ||
                     strcmp(files[i] + strlen(only), ".json") != 0))
            continue;
        int64_t t0 = th_now_ms();
        run_vector(e, &m, files[i]);
        fprintf(stderr, "%-40s %s (%lld ms)\n", files[i],
                th_failed == failed_before ? "ok" : "FAILED", (long long)(th_now_ms() - t0));
    }
    for (size_t i = 0; i < n; i++)
        free(files[i]);
    free(files);
    llmretry_engine_free(e);
    th_mock_stop(&m);
    return th_summary("test_vectors");
}
