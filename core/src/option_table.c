/* The call options as one table, in the spirit of curl's option table:
 * name, type, where the field lives, its built-in value, its range and what
 * it does (tools/gen_surface.py makes docs/reliability.md's table and
 * Python's typed keywords from it).
 * The table drives the defaults (llmretry_options_defaults), the range
 * checks and their messages (llmretry_options_check), the named-policy
 * keys (policies.c) and the shims: Python and Lua look options up here by
 * name and set them through the typed setters, so no binding keeps a list
 * of options or a rule of its own. */
#include "internal.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An enum's value is the index of its name here. */
static const char *const JITTERS[] = { "additive", "full", "none", NULL };
static const char *const MODES[] = { "safe", "unsafe", NULL };
/* Upper case, as HTTP spells them (methods are case-sensitive). */
static const char *const METHODS[] = { "POST", "GET", "DELETE", NULL };
static const char *const APIS[] = { "chat/completions", "completions", "embeddings", "responses",
                                    NULL };
_Static_assert(LLMRETRY_JITTER_ADDITIVE == 0 && LLMRETRY_JITTER_FULL == 1 &&
               LLMRETRY_JITTER_NONE == 2, "JITTERS follows llmretry_jitter");
_Static_assert(LLMRETRY_RETRY_SAFE == 0 && LLMRETRY_RETRY_UNSAFE == 1,
               "MODES follows llmretry_retry_mode");
_Static_assert(LLMRETRY_API_CHAT_COMPLETIONS == 0 && LLMRETRY_API_COMPLETIONS == 1 &&
               LLMRETRY_API_EMBEDDINGS == 2 && LLMRETRY_API_RESPONSES == 3,
               "APIS follows llmretry_api");
_Static_assert(LLMRETRY_METHOD_POST == 0 && LLMRETRY_METHOD_GET == 1 &&
               LLMRETRY_METHOD_DELETE == 2, "METHODS follows llmretry_method");

#define OFF(f) offsetof(llmretry_options, f), sizeof(((llmretry_options *)0)->f)
#define NUL LLMRETRY_OPTFLAG_NULLABLE
#define POL LLMRETRY_OPTFLAG_POLICY
#define ONE LLMRETRY_OPTFLAG_PER_CALL

/* The policy keys come in the order resolved settings list them
 * (tests/policies/resolved.json); the others may go anywhere. */
static const llmretry_option_info TABLE[] = {
    /* A policy's url or base_url is one setting with the other (policies.c). */
    { "url", LLMRETRY_OPTTYPE_TEXT, NUL | POL, OFF(url), 0, 0, NULL, NULL, "null",
      "the full endpoint URL, used as is (instead of base_url + / + endpoint)" },
    { "base_url", LLMRETRY_OPTTYPE_TEXT, NUL | POL, OFF(base_url), 0, 0, NULL, NULL, "null",
      "the API's base URL, / + endpoint appended before its query, if any (else "
      "$OPENAI_BASE_URL, else https://api.openai.com/v1)" },
    { "endpoint", LLMRETRY_OPTTYPE_ENUM, POL, OFF(endpoint), 0, 0, NULL, APIS,
      "\"chat/completions\"",
      "the API path appended to base_url (docs/endpoints.md); url, when set, wins" },
    { "api_key", LLMRETRY_OPTTYPE_TEXT, NUL | LLMRETRY_OPTFLAG_SECRET, OFF(api_key), 0, 0,
      NULL, NULL, "null",
      "sent as Authorization: Bearer (else $OPENAI_API_KEY, else none); never in a log, event "
      "or error" },
    { "model", LLMRETRY_OPTTYPE_TEXT, NUL | POL, OFF(model), 0, 0, NULL, NULL, "null",
      "the call's model, for events and policies (else the body's \"model\")" },
    { "timeout_ms", LLMRETRY_OPTTYPE_INT, POL, OFF(timeout_ms), 1, INT64_MAX, "> 0", NULL,
      "60000",
      "one attempt, connect to last byte (for a stream: to the first chunk)" },
    { "max_retries", LLMRETRY_OPTTYPE_INT, POL, OFF(max_retries), 0, LLMRETRY_MAX_RETRIES,
      "0..100", NULL, "3",
      "attempts = 1 + retries; every request the server saw counts, a refused one (429) too" },
    { "base_delay_ms", LLMRETRY_OPTTYPE_INT, POL, OFF(base_delay_ms), 0, INT64_MAX, ">= 0",
      NULL, "800",
      "the exponential backoff's base" },
    { "max_delay_ms", LLMRETRY_OPTTYPE_INT, POL, OFF(max_delay_ms), 0, INT64_MAX, ">= 0", NULL,
      "30000",
      "the exponential backoff's cap" },
    { "jitter", LLMRETRY_OPTTYPE_ENUM, POL, OFF(jitter), 0, 0, NULL, JITTERS, "\"additive\"",
      "additive: min(cap, base·2ⁿ) + U(0, base); full: U(0, min(cap, base·2ⁿ)); none: min(cap, "
      "base·2ⁿ)" },
    /* Unset is LLMRETRY_NO_DEADLINE (-1), never a value a caller passes. */
    { "deadline_ms", LLMRETRY_OPTTYPE_INT, NUL | POL, OFF(deadline_ms), 0, INT64_MAX, ">= 0",
      NULL, "null",
      "one budget for all attempts and waits; each attempt gets min(timeout, time left)" },
    { "retry_mode", LLMRETRY_OPTTYPE_ENUM, POL, OFF(retry_mode), 0, 0, NULL, MODES,
      "\"safe\"",
      "unsafe: never retry once the request may have reached the server" },
    /* Unset is the default set of statuses (n_retry_statuses == 0). */
    { "retry_statuses", LLMRETRY_OPTTYPE_STATUSES, NUL | POL, OFF(retry_statuses), 100, 599,
      "100..599", NULL, "null",
      "the statuses that may be retried (null: 408, 429, 500-599 except 501 and 505)" },
    { "max_retry_after_ms", LLMRETRY_OPTTYPE_INT, POL, OFF(max_retry_after_ms), 0, INT64_MAX,
      ">= 0", NULL, "120000",
      "a longer server-requested wait ends the call" },
    { "retry_invalid_response", LLMRETRY_OPTTYPE_BOOL, POL, OFF(retry_invalid_response), 0, 1,
      NULL, NULL, "true",
      "a 2xx body that is not JSON, or that validate rejects, is retried" },
    { "max_response_bytes", LLMRETRY_OPTTYPE_INT, POL, OFF(max_response_bytes), 1, INT64_MAX,
      "> 0", NULL, "33554432",
      "larger bodies fail with response_too_large" },
    /* In a policy only "auto" (a new key per call): a fixed key would be
     * shared by every call made under the policy. */
    { "idempotency_key", LLMRETRY_OPTTYPE_TEXT, NUL | POL | ONE | LLMRETRY_OPTFLAG_POLICY_AUTO,
      OFF(idempotency_key), 0, 0, NULL, NULL, "null",
      "sent as Idempotency-Key on every attempt; in a policy only \"auto\" (a new key per call)" },
    { "rpm", LLMRETRY_OPTTYPE_INT, POL, OFF(rpm), 0, INT64_MAX, ">= 0 (0: none)", NULL, "0",
      "requests a minute to the endpoint (its URL, key and model), paced evenly on the client" },
    { "tpm", LLMRETRY_OPTTYPE_INT, POL, OFF(tpm), 0, INT64_MAX, ">= 0 (0: none)", NULL, "0",
      "tokens a minute to the endpoint, estimated from each body and corrected by its usage" },
    { "retry_budget_ratio", LLMRETRY_OPTTYPE_NUMBER, POL, OFF(retry_budget_ratio), 0, 1000000,
      ">= 0", NULL, "0.2",
      "the endpoint's retry budget: over a rolling 10 s, retries <= ratio x requests + min" },
    { "retry_budget_min", LLMRETRY_OPTTYPE_INT, POL, OFF(retry_budget_min), 0, 1000000000,
      ">= 0", NULL, "10",
      "the retry budget's allowance: retries <= ratio x requests + min" },
    { "breaker_failures", LLMRETRY_OPTTYPE_INT, POL, OFF(breaker_failures), 0, 1000000000,
      ">= 0 (0: off)", NULL, "0",
      "that many transient failures in a row (timeout, network, 408, 429, 5xx) open the "
      "endpoint's circuit breaker" },
    { "breaker_cooldown_ms", LLMRETRY_OPTTYPE_INT, POL, OFF(breaker_cooldown_ms), 1, INT64_MAX,
      "> 0", NULL, "30000",
      "how long the breaker stays open before one probe may go" },
    /* Its api_key fields are secrets: the whole value is never repeated. */
    { "fallbacks", LLMRETRY_OPTTYPE_TARGETS, NUL | POL | LLMRETRY_OPTFLAG_SECRET, OFF(fallbacks),
      0, 0, NULL, NULL, "null",
      "targets ({model, base_url or url, api_key or api_key_env, headers}) tried in order when "
      "the current one gives up" },
    { "schema", LLMRETRY_OPTTYPE_SCHEMA, NUL, OFF(schema), 0, 0, NULL, NULL, "null",
      "a JSON Schema every answer must match (docs/structured-outputs.md)" },
    { "repair", LLMRETRY_OPTTYPE_BOOL, 0, OFF(repair), 0, 1, NULL, NULL, "false",
      "a retry after an answer that failed the schema sends that answer and its errors back" },
    { "estimated_tokens", LLMRETRY_OPTTYPE_INT, ONE, OFF(estimated_tokens), 0, INT64_MAX,
      ">= 0 (0: estimated)", NULL, "0",
      "the call's tokens for tpm (0: estimated from the body)" },
    { "request_id", LLMRETRY_OPTTYPE_TEXT, NUL | ONE, OFF(request_id), 0, 0, NULL, NULL,
      "null",
      "sent as X-Client-Request-Id (else a new UUID v4)" },
    { "headers", LLMRETRY_OPTTYPE_HEADERS, NUL, OFF(headers), 0, 0, NULL, NULL, "null",
      "extra request headers" },
    { "policy", LLMRETRY_OPTTYPE_TEXT, NUL, OFF(policy), 0, 0, NULL, NULL, "null",
      "the name of the policy the options came from, in every event" },
    { "ca_file", LLMRETRY_OPTTYPE_TEXT, NUL, OFF(ca_file), 0, 0, NULL, NULL, "null",
      "the CA bundle to verify servers with, instead of libcurl's default one" },
    { "idle_timeout_ms", LLMRETRY_OPTTYPE_INT, 0, OFF(idle_timeout_ms), 1, INT64_MAX, "> 0",
      NULL, "30000",
      "for a stream, the longest gap between two chunks" },
    { "stream_buffer_bytes", LLMRETRY_OPTTYPE_INT, 0, OFF(stream_buffer_bytes), 1, INT64_MAX,
      "> 0", NULL, "1048576",
      "unread stream chunks beyond this pause the transfer until the host reads" },
    { "method", LLMRETRY_OPTTYPE_ENUM, 0, OFF(method), 0, 0, NULL, METHODS, "\"POST\"",
      "the HTTP method; GET and DELETE send no body (a retried POST may repeat its effect)" },
    { "content_type", LLMRETRY_OPTTYPE_TEXT, NUL, OFF(content_type), 0, 0, NULL, NULL, "null",
      "the body's Content-Type (null: application/json); another type sends the body as is, "
      "unparsed" },
    { "raw_response", LLMRETRY_OPTTYPE_BOOL, 0, OFF(raw_response), 0, 1, NULL, NULL, "false",
      "a 2xx answer's bytes are the result as text, not parsed as JSON (JSON Lines, say)" },
    { "event_mask", LLMRETRY_OPTTYPE_INT, 0, OFF(events), 0, LLMRETRY_EVENTS_ALL, "0..255", NULL,
      "255",
      "which events to make: bit n asks for EVENT_NAMES[n]" },
};
#define N_TABLE (sizeof TABLE / sizeof TABLE[0])

size_t llmretry_option_count(void)
{
    return N_TABLE;
}

const llmretry_option_info *llmretry_option_at(size_t i)
{
    return i < N_TABLE ? &TABLE[i] : NULL;
}

const llmretry_option_info *llmretry_option_find(const char *name)
{
    for (size_t i = 0; name && i < N_TABLE; i++)
        if (strcmp(TABLE[i].name, name) == 0)
            return &TABLE[i];
    return NULL;
}

const char *llmretry_option_expects(const llmretry_option_info *opt)
{
    switch (opt ? opt->type : 0) {
    case LLMRETRY_OPTTYPE_TEXT: return "a string";
    case LLMRETRY_OPTTYPE_INT: return "an integer";
    case LLMRETRY_OPTTYPE_BOOL: return "a boolean";
    case LLMRETRY_OPTTYPE_ENUM: return "a string";
    case LLMRETRY_OPTTYPE_STATUSES: return "an array of integers";
    case LLMRETRY_OPTTYPE_HEADERS: return "a table of header names to values";
    case LLMRETRY_OPTTYPE_NUMBER: return "a number";
    case LLMRETRY_OPTTYPE_TARGETS: return "a list of targets";
    case LLMRETRY_OPTTYPE_SCHEMA: return "a JSON Schema";
    }
    return "a value";
}

void lr_option_choices(const llmretry_option_info *opt, char *buf, size_t len)
{
    buf[0] = '\0';
    for (const char *const *c = opt->choices; c && *c; c++) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s\"%s\"", used ? ", " : "", *c);
    }
}

/* Fields are int (or unsigned, or an enum) or int64_t: the table knows which. */
int64_t lr_int_at(const void *base, size_t offset, size_t size)
{
    const char *p = (const char *)base + offset;
    if (size == sizeof(int64_t)) {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    int v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int64_t get_int(const llmretry_options *o, const llmretry_option_info *opt)
{
    return lr_int_at(o, opt->offset, opt->size);
}

static void put_int(llmretry_options *o, const llmretry_option_info *opt, int64_t v)
{
    char *p = (char *)o + opt->offset;
    if (opt->size == sizeof(int64_t)) {
        memcpy(p, &v, sizeof v);
    } else {
        int i = (int)v;          /* in range: checked against min/max first */
        memcpy(p, &i, sizeof i);
    }
}

static double get_number(const llmretry_options *o, const llmretry_option_info *opt)
{
    double v;
    memcpy(&v, (const char *)o + opt->offset, sizeof v);
    return v;
}

static void put_number(llmretry_options *o, const llmretry_option_info *opt, double v)
{
    memcpy((char *)o + opt->offset, &v, sizeof v);
}

llmretry_status lr_option_check_number(const llmretry_option_info *opt, double v, char *err,
                                       size_t errlen)
{
    if (!isfinite(v) || v < (double)opt->min || v > (double)opt->max) {
        lr_errf(err, errlen, "%s must be %s (got %g)", opt->name, opt->range, v);
        return LLMRETRY_EINVAL;
    }
    return LLMRETRY_OK;
}

llmretry_status lr_option_check_int(const llmretry_option_info *opt, int64_t v, char *err,
                                    size_t errlen)
{
    if (v < opt->min || v > opt->max) {
        lr_errf(err, errlen, "%s must be %s (got %" PRId64 ")", opt->name, opt->range, v);
        return LLMRETRY_EINVAL;
    }
    return LLMRETRY_OK;
}

/* The defaults, read from the table once: every call's options start from
 * them (each binding's parse, a host's FFI prep), and reading the built-in
 * texts again (a strtoll or strtod per option) was a share of every call
 * (issue 36). */
static llmretry_options defaults;
static pthread_once_t defaults_once = PTHREAD_ONCE_INIT;

static void defaults_init(void)
{
    llmretry_options *o = &defaults;
    memset(o, 0, sizeof *o);
    for (size_t i = 0; i < N_TABLE; i++) {
        const llmretry_option_info *opt = &TABLE[i];
        if (opt->type == LLMRETRY_OPTTYPE_INT && opt->builtin[0] != 'n')
            put_int(o, opt, strtoll(opt->builtin, NULL, 10));
        else if (opt->type == LLMRETRY_OPTTYPE_BOOL)
            put_int(o, opt, opt->builtin[0] == 't');
        else if (opt->type == LLMRETRY_OPTTYPE_NUMBER)
            put_number(o, opt, strtod(opt->builtin, NULL));
        /* Enums: the first choice is the default and is 0; texts are NULL. */
    }
    o->deadline_ms = LLMRETRY_NO_DEADLINE;
    o->use_env_api_key = 1;
}

void llmretry_options_defaults(llmretry_options *o)
{
    if (!o)
        return;
    pthread_once(&defaults_once, defaults_init);
    *o = defaults;
}

static const llmretry_option_info *settable(const char *name, llmretry_option_type want,
                                            char *err, size_t errlen)
{
    const llmretry_option_info *opt = llmretry_option_find(name);
    if (!opt) {
        const char *meant = llmretry_option_suggest(name, NULL, 0);
        lr_errf(err, errlen, "unknown option '%s'%s%s%s", name ? name : "(null)",
                meant ? " (did you mean " : "", meant ? meant : "", meant ? "?)" : "");
        return NULL;
    }
    int ok = opt->type == want ||
             (want == LLMRETRY_OPTTYPE_TARGETS && opt->type == LLMRETRY_OPTTYPE_SCHEMA) ||
             (want == LLMRETRY_OPTTYPE_TEXT && opt->type == LLMRETRY_OPTTYPE_ENUM) ||
             /* an integer is a number too */
             (want == LLMRETRY_OPTTYPE_INT && opt->type == LLMRETRY_OPTTYPE_NUMBER);
    if (!ok) {
        lr_errf(err, errlen, "%s must be %s", opt->name, llmretry_option_expects(opt));
        return NULL;
    }
    return opt;
}

llmretry_status llmretry_options_set_int(llmretry_options *o, const char *name, int64_t v,
                                         char *err, size_t errlen)
{
    const llmretry_option_info *opt = settable(name, LLMRETRY_OPTTYPE_INT, err, errlen);
    if (!o || !opt)
        return LLMRETRY_EINVAL;
    if (opt->type == LLMRETRY_OPTTYPE_NUMBER)
        return llmretry_options_set_number(o, name, (double)v, err, errlen);
    llmretry_status st = lr_option_check_int(opt, v, err, errlen);
    if (st == LLMRETRY_OK)
        put_int(o, opt, v);
    return st;
}

llmretry_status llmretry_options_set_number(llmretry_options *o, const char *name, double v,
                                            char *err, size_t errlen)
{
    const llmretry_option_info *opt = settable(name, LLMRETRY_OPTTYPE_NUMBER, err, errlen);
    if (!o || !opt)
        return LLMRETRY_EINVAL;
    llmretry_status st = lr_option_check_number(opt, v, err, errlen);
    if (st == LLMRETRY_OK)
        put_number(o, opt, v);
    return st;
}

llmretry_status llmretry_options_set_json(llmretry_options *o, const char *name, const char *json,
                                          char *err, size_t errlen)
{
    const llmretry_option_info *opt = settable(name, LLMRETRY_OPTTYPE_TARGETS, err, errlen);
    if (!o || !opt)
        return LLMRETRY_EINVAL;
    if (!json)
        return llmretry_options_unset(o, name, err, errlen);
    if (opt->type == LLMRETRY_OPTTYPE_SCHEMA ? lr_schema_check_json(json, opt->name, err, errlen)
                                             : lr_targets_check_json(json, opt->name, err, errlen))
        return LLMRETRY_EINVAL;
    memcpy((char *)o + opt->offset, &json, sizeof json);   /* borrowed, like set_text */
    return LLMRETRY_OK;
}

llmretry_status llmretry_options_set_bool(llmretry_options *o, const char *name, int v,
                                          char *err, size_t errlen)
{
    const llmretry_option_info *opt = settable(name, LLMRETRY_OPTTYPE_BOOL, err, errlen);
    if (!o || !opt)
        return LLMRETRY_EINVAL;
    put_int(o, opt, v != 0);
    return LLMRETRY_OK;
}

llmretry_status llmretry_options_set_text(llmretry_options *o, const char *name, const char *v,
                                          char *err, size_t errlen)
{
    const llmretry_option_info *opt = settable(name, LLMRETRY_OPTTYPE_TEXT, err, errlen);
    if (!o || !opt)
        return LLMRETRY_EINVAL;
    if (!v)
        return llmretry_options_unset(o, name, err, errlen);
    if (opt->type == LLMRETRY_OPTTYPE_TEXT) {
        memcpy((char *)o + opt->offset, &v, sizeof v);   /* borrowed: see the header */
        return LLMRETRY_OK;
    }
    for (int i = 0; opt->choices[i]; i++)
        if (strcmp(opt->choices[i], v) == 0) {
            put_int(o, opt, i);
            return LLMRETRY_OK;
        }
    char list[128];
    lr_option_choices(opt, list, sizeof list);
    /* The value is not repeated: it could be a secret pasted in the wrong place. */
    lr_errf(err, errlen, "%s must be one of %s (got another string)", opt->name, list);
    return LLMRETRY_EINVAL;
}

llmretry_status lr_option_check_statuses(size_t n, char *err, size_t errlen)
{
    if (n == 0) {
        lr_errf(err, errlen, "retry_statuses must not be empty (use max_retries = 0 to never "
                "retry)");
        return LLMRETRY_EINVAL;
    }
    if (n > LLMRETRY_MAX_STATUSES) {
        lr_errf(err, errlen, "retry_statuses must list at most %d statuses (got %zu)",
                LLMRETRY_MAX_STATUSES, n);
        return LLMRETRY_EINVAL;
    }
    return LLMRETRY_OK;
}

llmretry_status llmretry_options_set_statuses(llmretry_options *o, const int *v, size_t n,
                                              char *err, size_t errlen)
{
    const llmretry_option_info *opt = llmretry_option_find("retry_statuses");
    if (!o || (n && !v)) {
        lr_errf(err, errlen, "%s must not be NULL", !o ? "options" : "retry_statuses");
        return LLMRETRY_EINVAL;
    }
    if (lr_option_check_statuses(n, err, errlen) != LLMRETRY_OK)
        return LLMRETRY_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (v[i] < opt->min || v[i] > opt->max) {
            lr_errf(err, errlen, "retry_statuses[%zu] must be an HTTP status, %s (got %d)", i,
                    opt->range, v[i]);
            return LLMRETRY_EINVAL;
        }
    memcpy(o->retry_statuses, v, n * sizeof *v);
    o->n_retry_statuses = n;
    return LLMRETRY_OK;
}

llmretry_status llmretry_options_unset(llmretry_options *o, const char *name, char *err,
                                       size_t errlen)
{
    const llmretry_option_info *opt = llmretry_option_find(name);
    if (!o || !opt) {
        const char *meant = llmretry_option_suggest(name, NULL, 0);
        lr_errf(err, errlen, "unknown option '%s'%s%s%s", name ? name : "(null)",
                meant ? " (did you mean " : "", meant ? meant : "", meant ? "?)" : "");
        return LLMRETRY_EINVAL;
    }
    if (!(opt->flags & LLMRETRY_OPTFLAG_NULLABLE)) {
        lr_errf(err, errlen, "%s must be %s (got null)", opt->name, llmretry_option_expects(opt));
        return LLMRETRY_EINVAL;
    }
    switch (opt->type) {
    case LLMRETRY_OPTTYPE_TEXT:
    case LLMRETRY_OPTTYPE_TARGETS:
    case LLMRETRY_OPTTYPE_SCHEMA:
        memset((char *)o + opt->offset, 0, sizeof(const char *));
        break;
    case LLMRETRY_OPTTYPE_INT:
        o->deadline_ms = LLMRETRY_NO_DEADLINE;   /* the one nullable integer */
        break;
    case LLMRETRY_OPTTYPE_STATUSES:
        o->n_retry_statuses = 0;
        break;
    case LLMRETRY_OPTTYPE_HEADERS:
        o->headers = NULL;
        o->n_headers = 0;
        break;
    default:
        break;
    }
    return LLMRETRY_OK;
}

llmretry_status lr_options_check_table(const llmretry_options *o, char *err, size_t errlen)
{
    for (size_t i = 0; i < N_TABLE; i++) {
        const llmretry_option_info *opt = &TABLE[i];
        if (opt->type == LLMRETRY_OPTTYPE_NUMBER) {
            if (lr_option_check_number(opt, get_number(o, opt), err, errlen) != LLMRETRY_OK)
                return LLMRETRY_EINVAL;
            continue;
        }
        if (opt->type != LLMRETRY_OPTTYPE_INT && opt->type != LLMRETRY_OPTTYPE_ENUM)
            continue;
        int64_t v = get_int(o, opt);
        if (opt->type == LLMRETRY_OPTTYPE_ENUM) {
            int n = 0;
            while (opt->choices[n])
                n++;
            if (v < 0 || v >= n) {
                char list[128];
                lr_option_choices(opt, list, sizeof list);
                lr_errf(err, errlen, "%s must be one of %s (got %" PRId64 ")", opt->name, list,
                        v);
                return LLMRETRY_EINVAL;
            }
        } else if (!(opt->flags & LLMRETRY_OPTFLAG_NULLABLE && v == LLMRETRY_NO_DEADLINE) &&
                   lr_option_check_int(opt, v, err, errlen) != LLMRETRY_OK) {
            return LLMRETRY_EINVAL;
        }
    }
    return LLMRETRY_OK;
}
