/* Checking the options of one call as a whole (texts, headers, ids and
 * what the option table's ranges cannot say), and the names of the enums.
 * Everything here is pure; a bad field is reported by name so the host
 * binding can raise a precise TypeError/ValueError before any I/O. */
#include "internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static llmretry_status fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return LLMRETRY_EINVAL;
}

static int has_crlf(const char *s)
{
    return strpbrk(s, "\r\n") != NULL;
}

/* Controls other than HTAB would corrupt or split a header line. */
static int has_ctl(const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return 1;
    }
    return 0;
}

/* Ids are echoed in logs and headers: keep them to plain printable ASCII. */
static int printable_ascii(const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c > 0x7e)
            return 0;
    }
    return 1;
}

/* RFC 9110 §5.6.2 tchar. */
static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* What a header name may be, for messages. */
#define NAME_RULE "a name is non-empty, of letters, digits and !#$%&'*+-.^_`|~: no spaces, " \
                  "':' or control characters"

/* Does header line h ("Name: value") have this name (case-insensitive)? */
static int header_is(const char *h, const char *name)
{
    size_t n = strlen(name);
    return strncasecmp(h, name, n) == 0 && h[n] == ':';
}

/* Headers the caller cannot set: libcurl frames the request (a second
 * Content-Length or Transfer-Encoding smuggles a request past proxies;
 * Host must match the URL), and the ids have their own options. */
static const char *const reserved_headers[][2] = {
    {"Content-Length", "libcurl sets it from the body"},
    {"Transfer-Encoding", "libcurl frames the body"},
    {"Host", "it comes from the URL"},
    {"X-Client-Request-Id", "use request_id"},
    {"Idempotency-Key", "use idempotency_key"},
};

/* Header values are never echoed: a caller may pass its own Authorization.
 * `label` names the line in messages ("headers[2]"). */
static llmretry_status check_line(const char *h, const char *label, int has_key, char *err,
                                  size_t errlen)
{
    const char *colon;
    if (!h)
        return fail(err, errlen, "%s must not be NULL", label);
    if (has_crlf(h))
        return fail(err, errlen, "%s must not contain CR or LF", label);
    colon = strchr(h, ':');
    if (!colon)
        return fail(err, errlen, "%s must look like \"Name: value\" (no ':')", label);
    if (colon == h)
        return fail(err, errlen, "%s has an empty name", label);
    for (const char *p = h; p < colon; p++)
        if (!is_tchar((unsigned char)*p))
            return fail(err, errlen, "%s has an invalid character in its name", label);
    if (has_ctl(colon + 1))
        return fail(err, errlen, "%s must not contain control characters", label);
    for (size_t k = 0; k < sizeof reserved_headers / sizeof reserved_headers[0]; k++)
        if (header_is(h, reserved_headers[k][0]))
            return fail(err, errlen, "%s must not set %s (%s)", label,
                        reserved_headers[k][0], reserved_headers[k][1]);
    /* Never two Authorization headers. (A key from $OPENAI_API_KEY yields
     * to the caller's own header instead: see llmretry_options.headers.) */
    if (has_key && header_is(h, "Authorization"))
        return fail(err, errlen, "%s must not set Authorization when api_key is set", label);
    return LLMRETRY_OK;
}

llmretry_status llmretry_check_header(const char *name, size_t name_len, const char *value,
                                      size_t value_len, size_t index, char *err, size_t errlen)
{
    size_t i = 0;
    while (i < name_len && is_tchar((unsigned char)name[i]))
        i++;
    /* An invalid name is never repeated: a whole "Authorization: Bearer
     * sk-..." line given as a name would put the key in the message. */
    if (name_len == 0 || i < name_len) {
        if (index == (size_t)-1)
            return fail(err, errlen, "headers: a header's name is invalid (%s)", NAME_RULE);
        return fail(err, errlen, "headers: the name of header #%zu is invalid (%s)", index,
                    NAME_RULE);
    }
    for (i = 0; i < value_len; i++) {
        unsigned char c = (unsigned char)value[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return fail(err, errlen, "headers[\"%.*s\"] must not contain CR, LF, NUL or other "
                        "control characters", (int)(name_len > 60 ? 60 : name_len), name);
    }
    return LLMRETRY_OK;
}

static llmretry_status check_header(const llmretry_options *o, const char *h, size_t i,
                                    char *err, size_t errlen)
{
    /* Every line of every call comes here: only a bad one pays for its
     * label (an snprintf was a tenth of a header's checking). */
    int has_key = o->api_key && *o->api_key;
    if (check_line(h, "", has_key, NULL, 0) == LLMRETRY_OK)
        return LLMRETRY_OK;
    char label[40];
    snprintf(label, sizeof label, "headers[%zu]", i);
    return check_line(h, label, has_key, err, errlen);
}

llmretry_status lr_check_header_parts(const char *name, const char *value, const char *label,
                                      int has_key, char *err, size_t errlen)
{
    /* The name is checked (and never echoed) before the line is. */
    if (llmretry_check_header(name, strlen(name), "", 0, (size_t)-1, err, errlen) != LLMRETRY_OK)
        return fail(err, errlen, "%s has a header whose name is invalid (%s)", label, NAME_RULE);
    size_t n = strlen(name) + strlen(value) + 3;
    char *line = malloc(n);
    if (!line)
        return fail(err, errlen, "out of memory");
    snprintf(line, n, "%s: %s", name, value);
    char where[160];
    snprintf(where, sizeof where, "%s[\"%.60s\"]", label, name);
    llmretry_status st = check_line(line, where, has_key, err, errlen);
    free(line);
    return st;
}

static llmretry_status check_id(const char *name, const char *v, char *err, size_t errlen)
{
    if (!v)
        return LLMRETRY_OK;
    if (!*v)
        return fail(err, errlen, "%s must not be empty", name);
    if (has_crlf(v))
        return fail(err, errlen, "%s must not contain CR or LF", name);
    if (!printable_ascii(v))
        return fail(err, errlen, "%s must contain only printable ASCII characters", name);
    return LLMRETRY_OK;
}

llmretry_status lr_options_check_body(const llmretry_options *o, char *err, size_t errlen)
{
    if (o->method != LLMRETRY_METHOD_POST) {
        const char *m = o->method == LLMRETRY_METHOD_GET ? "GET" : "DELETE";
        if (o->body && o->body_len > 0)
            return fail(err, errlen, "a %s sends no body (body_len is %zu; method POST has one)",
                        m, o->body_len);
        if (o->content_type)
            return fail(err, errlen, "content_type is for a POST's body (method is %s)", m);
    } else if (!o->body) {
        return fail(err, errlen, "body is required (got NULL)");
    } else if (o->body_len == 0) {
        return fail(err, errlen, "body must not be empty (body_len is 0)");
    }
    return LLMRETRY_OK;
}

llmretry_status llmretry_options_check(const llmretry_options *o, char *err, size_t errlen)
{
    llmretry_status st;

    if (!o)
        return fail(err, errlen, "options must not be NULL");
    /* NULL url/base_url are filled from the environment; "" is a mistake. */
    if (o->url && !*o->url)
        return fail(err, errlen, "url must not be empty");
    if (o->url && has_ctl(o->url))
        return fail(err, errlen, "url must not contain control characters");
    if (o->base_url && !*o->base_url)
        return fail(err, errlen, "base_url must not be empty");
    if (o->base_url && has_ctl(o->base_url))
        return fail(err, errlen, "base_url must not contain control characters");
    /* The URL called: url, else base_url (else $OPENAI_BASE_URL, at submit). */
    const char *called = o->url ? o->url : o->base_url;
    if (called && strncasecmp(called, "http://", 7) != 0 && strncasecmp(called, "https://", 8) != 0)
        return fail(err, errlen, "%s must start with http:// or https://",
                    o->url ? "url" : "base_url");
    /* The key goes into a header; the message must never show it. */
    if (o->api_key && has_ctl(o->api_key))
        return fail(err, errlen, "api_key must not contain control characters");
    if ((st = lr_options_check_body(o, err, errlen)) != LLMRETRY_OK)
        return st;
    if (o->content_type && (!*o->content_type || has_ctl(o->content_type)))
        return fail(err, errlen, "content_type must be a non-empty header value without control "
                    "characters");
    if (o->n_headers > 0 && !o->headers)
        return fail(err, errlen, "headers must not be NULL when n_headers is %zu", o->n_headers);
    for (size_t i = 0; i < o->n_headers; i++)
        if ((st = check_header(o, o->headers[i], i, err, errlen)) != LLMRETRY_OK)
            return st;
    if ((st = check_id("request_id", o->request_id, err, errlen)) != LLMRETRY_OK)
        return st;
    if (o->request_id && strlen(o->request_id) > LLMRETRY_REQUEST_ID_MAX)
        return fail(err, errlen, "request_id must be at most %d bytes (got %zu)",
                    LLMRETRY_REQUEST_ID_MAX, strlen(o->request_id));
    if ((st = check_id("idempotency_key", o->idempotency_key, err, errlen)) != LLMRETRY_OK)
        return st;
    /* Integers and enums: by the option table's ranges. */
    if ((st = lr_options_check_table(o, err, errlen)) != LLMRETRY_OK)
        return st;
    if (o->n_retry_statuses > LLMRETRY_MAX_STATUSES)
        return fail(err, errlen, "n_retry_statuses must be <= %d (got %zu)", LLMRETRY_MAX_STATUSES,
                    o->n_retry_statuses);
    for (size_t i = 0; i < o->n_retry_statuses; i++)
        if (o->retry_statuses[i] < 100 || o->retry_statuses[i] > 599)
            return fail(err, errlen, "retry_statuses[%zu] must be an HTTP status, 100..599 (got %d)", i,
                        o->retry_statuses[i]);
    if (o->events & ~LLMRETRY_EVENTS_ALL)
        return fail(err, errlen, "events has unknown bits (got 0x%x)", o->events);
    if (o->ca_file && !*o->ca_file)
        return fail(err, errlen, "ca_file must not be empty");
    if (o->fallbacks && lr_targets_check_json(o->fallbacks, "fallbacks", err, errlen) != 0)
        return LLMRETRY_EINVAL;
    /* A fallback rewrites the body's "model"; a schema reads a JSON answer. */
    if (o->fallbacks && !lr_options_json_body(o))
        return fail(err, errlen, "fallbacks need a JSON body (method POST, content_type JSON)");
    if (o->raw_response && o->schema)
        return fail(err, errlen, "schema checks a JSON answer: it cannot go with raw_response");
    return LLMRETRY_OK;
}

int lr_options_json_body(const llmretry_options *o)
{
    const char *t = o->content_type;
    return o->method == LLMRETRY_METHOD_POST &&
           (!t || strncasecmp(t, "application/json", 16) == 0);
}

/* Unknown values give NULL (events write null) except status names, which
 * end up in printf-style messages where NULL is not allowed. */
const char *llmretry_status_name(llmretry_status s)
{
    switch (s) {
    case LLMRETRY_OK: return "ok";
    case LLMRETRY_EINVAL: return "einval";
    case LLMRETRY_ENOMEM: return "enomem";
    case LLMRETRY_ESTATE: return "estate";
    case LLMRETRY_ETIMEDOUT: return "etimedout";
    case LLMRETRY_EINTERNAL: return "einternal";
    }
    return "unknown";
}

const char *llmretry_jitter_name(llmretry_jitter j)
{
    switch (j) {
    case LLMRETRY_JITTER_ADDITIVE: return "additive";
    case LLMRETRY_JITTER_FULL: return "full";
    case LLMRETRY_JITTER_NONE: return "none";
    }
    return NULL;
}

const char *llmretry_retry_mode_name(llmretry_retry_mode m)
{
    switch (m) {
    case LLMRETRY_RETRY_SAFE: return "safe";
    case LLMRETRY_RETRY_UNSAFE: return "unsafe";
    }
    return NULL;
}

llmretry_status llmretry_jitter_parse(const char *s, llmretry_jitter *out)
{
    static const llmretry_jitter all[] = {LLMRETRY_JITTER_ADDITIVE, LLMRETRY_JITTER_FULL,
                                          LLMRETRY_JITTER_NONE};
    if (!s || !out)
        return LLMRETRY_EINVAL;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, llmretry_jitter_name(all[i])) == 0) {
            *out = all[i];
            return LLMRETRY_OK;
        }
    return LLMRETRY_EINVAL;
}

llmretry_status llmretry_retry_mode_parse(const char *s, llmretry_retry_mode *out)
{
    static const llmretry_retry_mode all[] = {LLMRETRY_RETRY_SAFE, LLMRETRY_RETRY_UNSAFE};
    if (!s || !out)
        return LLMRETRY_EINVAL;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, llmretry_retry_mode_name(all[i])) == 0) {
            *out = all[i];
            return LLMRETRY_OK;
        }
    return LLMRETRY_EINVAL;
}

const char *llmretry_error_kind_name(llmretry_error_kind k)
{
    switch (k) {
    case LLMRETRY_ERR_NONE: return NULL;
    case LLMRETRY_ERR_HTTP_STATUS: return "http_status";
    case LLMRETRY_ERR_TIMEOUT: return "timeout";
    case LLMRETRY_ERR_NETWORK: return "network";
    case LLMRETRY_ERR_INVALID_RESPONSE: return "invalid_response";
    case LLMRETRY_ERR_DEADLINE_EXCEEDED: return "deadline_exceeded";
    case LLMRETRY_ERR_CANCELLED: return "cancelled";
    case LLMRETRY_ERR_RESPONSE_TOO_LARGE: return "response_too_large";
    case LLMRETRY_ERR_STREAM_INTERRUPTED: return "stream_interrupted";
    case LLMRETRY_ERR_CIRCUIT_OPEN: return "circuit_open";
    case LLMRETRY_ERR_REFUSAL: return "refusal";
    }
    return NULL;
}

const char *llmretry_reason_name(llmretry_giveup_reason r)
{
    switch (r) {
    case LLMRETRY_REASON_NONE: return NULL;
    case LLMRETRY_REASON_RETRIES_EXHAUSTED: return "retries_exhausted";
    case LLMRETRY_REASON_NOT_RETRYABLE: return "not_retryable";
    case LLMRETRY_REASON_DEADLINE: return "deadline";
    case LLMRETRY_REASON_RETRY_AFTER_TOO_LONG: return "retry_after_too_long";
    case LLMRETRY_REASON_UNSAFE_MODE: return "unsafe_mode";
    case LLMRETRY_REASON_CANCELLED: return "cancelled";
    case LLMRETRY_REASON_STREAM_INTERRUPTED: return "stream_interrupted";
    case LLMRETRY_REASON_RETRY_BUDGET_EXHAUSTED: return "retry_budget_exhausted";
    case LLMRETRY_REASON_CIRCUIT_OPEN: return "circuit_open";
    }
    return NULL;
}

const char *llmretry_stream_reason_name(llmretry_stream_reason r)
{
    switch (r) {
    case LLMRETRY_STREAM_NONE: return NULL;
    case LLMRETRY_STREAM_NETWORK: return "network";
    case LLMRETRY_STREAM_IDLE_TIMEOUT: return "idle_timeout";
    case LLMRETRY_STREAM_ERROR_EVENT: return "error_event";
    case LLMRETRY_STREAM_TRUNCATED: return "truncated";
    case LLMRETRY_STREAM_DEADLINE: return "deadline";
    case LLMRETRY_STREAM_CANCELLED: return "cancelled";
    case LLMRETRY_STREAM_INVALID_CHUNK: return "invalid_chunk";
    case LLMRETRY_STREAM_TOO_LARGE: return "too_large";
    }
    return NULL;
}

const char *llmretry_delay_source_name(llmretry_delay_source s)
{
    switch (s) {
    case LLMRETRY_DELAY_BACKOFF: return "backoff";
    case LLMRETRY_DELAY_RETRY_AFTER: return "retry_after";
    case LLMRETRY_DELAY_RATELIMIT_RESET: return "ratelimit_reset";
    case LLMRETRY_DELAY_FALLBACK: return "fallback";
    }
    return NULL;
}
