/* One call's record: building its request (URL, headers, body) from the
 * options, on the host thread (lr_call_new), and its life cycle. What the
 * engine does with it is in transfer.c (an attempt on the wire) and
 * outcome.c (what a finished attempt means). */
#include "engine.h"
#include "condvar.h"
#include "schema.h"
#include "stream.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define DEFAULT_BASE_URL "https://api.openai.com/v1"

/* The URL to call; *is_default says it is OpenAI's because nothing else
 * was given (no url, base_url or $OPENAI_BASE_URL). A fallback's (no
 * is_default) never reads the environment: it names its own. */
char *lr_call_url(const char *url, const char *base, llmretry_api api, int *is_default)
{
    if (is_default)
        *is_default = 0;
    if (url)
        return lr_strdup(url);
    if ((!base || !*base) && is_default)
        base = getenv("OPENAI_BASE_URL");
    if (!base || !*base) {
        base = DEFAULT_BASE_URL;
        if (is_default)
            *is_default = 1;
    }
    return llmretry_url_join(base, lr_api_path(api));
}

const char *lr_api_path(llmretry_api api)
{
    static const char *const paths[] = { "/chat/completions", "/completions", "/embeddings",
                                         "/responses" };
    return (unsigned)api < sizeof paths / sizeof paths[0] ? paths[api] : paths[0];
}

/* What the request body says, read with one parse and only when needed:
 * its "model" (when want_model; NULL if none) and whether it streams.
 * *bad_json: not JSON at all, or not an object's (or an array's) text (a
 * programming error, reported before any I/O). Most bodies never mention
 * "stream": those the caller named the model of are not parsed at all. */
static char *read_body(const char *body, size_t len, int want_model, int *bad_json,
                       int *streams)
{
    *bad_json = *streams = 0;
    /* Checked even when nothing is read, so a prompt passed as the body
     * ("hello", or "42") is refused before any I/O, as a parse would. */
    if (len > 0 && !llmretry_json_text_opens(body, len)) {
        *bad_json = 1;
        return NULL;
    }
    if (!want_model && !memmem(body, len, "\"stream\"", 8))
        return NULL;
    cJSON *doc = cJSON_ParseWithLength(body, len);
    *bad_json = doc == NULL && want_model;
    if (!doc)
        return NULL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(doc, "model");
    char *model = want_model && cJSON_IsString(m) ? lr_strdup(m->valuestring) : NULL;
    *streams = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "stream"));
    cJSON_Delete(doc);
    return model;
}

/* The endpoint's key for its rate budget (ratelimit.c): a hash of the
 * Authorization header's value, so the key itself is kept nowhere else. The
 * value only (from its first non-blank): "authorization: Bearer k" and
 * "Authorization: Bearer k" are the same key, and so one endpoint. */
uint64_t lr_call_key_hash(const struct curl_slist *h)
{
    for (; h; h = h->next)
        if (strncasecmp(h->data, "Authorization:", 14) == 0) {
            const unsigned char *p = (const unsigned char *)h->data + 14;
            while (*p == ' ' || *p == '\t')
                p++;
            uint64_t x = 1469598103934665603ull;         /* FNV-1a */
            for (; *p; p++)
                x = (x ^ *p) * 1099511628211ull;
            return x;
        }
    return 0;
}

/* Is there a header line of this name? */
static int caller_sets(const char *const *lines, size_t n_lines, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < n_lines; i++)
        if (strncasecmp(lines[i], name, n) == 0 && lines[i][n] == ':')
            return 1;
    return 0;
}

/* The request's header list is built on the submitting thread for every
 * call (the request id differs), so it is one allocation, not libcurl's
 * malloc + strdup per line: the curl_slist nodes, then every line's text.
 * libcurl only reads the list (CURLOPT_HTTPHEADER), and nothing changes it
 * after it is built (a fallback target has its own list, or shares target
 * 0's), so one block freed at once (lr_call_headers_free) is the whole
 * life of it. It is laid out in two passes of the same decisions
 * (put_headers): the first counts lines and bytes, the second writes. */
typedef struct {
    struct curl_slist *node;        /* NULL in the counting pass */
    char *text;
    size_t lines, bytes;
} header_block;

/* One line: a then b, joined as they are ("Name: " and the value, or a
 * whole constant line and ""). */
static void put_line(header_block *hb, const char *a, size_t al, const char *b, size_t bl)
{
    if (hb->node) {
        struct curl_slist *n = &hb->node[hb->lines];
        memcpy(hb->text, a, al);
        memcpy(hb->text + al, b, bl);
        hb->text[al + bl] = '\0';
        n->data = hb->text;
        n->next = NULL;
        if (hb->lines > 0)
            n[-1].next = n;
        hb->text += al + bl + 1;
    }
    hb->lines++;
    hb->bytes += al + bl + 1;
}

static void put_const(header_block *hb, const char *line)
{
    put_line(hb, line, strlen(line), "", 0);
}

/* The caller's "Name: value" as libcurl must get it: "Name:" with nothing
 * but blanks after it would tell libcurl to drop the header (and its own
 * of that name), "Name;" sends it empty. */
static void put_caller_line(header_block *hb, const char *line)
{
    const char *colon = strchr(line, ':');
    const char *v = colon + 1;
    v += strspn(v, " \t");
    if (*v == '\0')
        put_line(hb, line, (size_t)(colon - line), ";", 1);
    else
        put_const(hb, line);
}

static void put_headers(header_block *hb, const llmretry_call *c, const char *const *lines,
                        size_t n_lines, const char *api_key)
{
    static const char bearer[] = "Authorization: Bearer ";
    if (api_key && *api_key)
        put_line(hb, bearer, sizeof bearer - 1, api_key, strlen(api_key));
    /* Only a POST has a body to describe. */
    if (c->o.method == LLMRETRY_METHOD_POST && !caller_sets(lines, n_lines, "Content-Type")) {
        if (c->o.content_type)
            put_line(hb, "Content-Type: ", 14, c->o.content_type, strlen(c->o.content_type));
        else
            put_const(hb, "Content-Type: application/json");
    }
    if (!caller_sets(lines, n_lines, "Accept"))
        put_const(hb, c->o.raw_response ? "Accept: */*" : "Accept: application/json");
    if (!caller_sets(lines, n_lines, "User-Agent"))
        put_const(hb, "User-Agent: llmretry/" LLMRETRY_VERSION);
    put_line(hb, "X-Client-Request-Id: ", 21, c->request_id, strlen(c->request_id));
    if (c->o.idempotency_key)
        put_line(hb, "Idempotency-Key: ", 17, c->o.idempotency_key,
                 strlen(c->o.idempotency_key));
    /* An empty Expect stops libcurl waiting for 100-continue on big bodies. */
    put_const(hb, "Expect:");
    for (size_t i = 0; i < n_lines; i++)
        put_caller_line(hb, lines[i]);
}

int lr_call_headers(const llmretry_call *c, const char *const *lines, size_t n_lines,
                    const char *api_key, int key_from_env, struct curl_slist **out)
{
    *out = NULL;
    /* A key from the environment yields to the caller's own Authorization
     * (one for another provider, say): never two Authorization lines. An
     * explicit api_key with one was refused by llmretry_options_check. */
    if (key_from_env && caller_sets(lines, n_lines, "Authorization"))
        api_key = NULL;
    header_block count = { 0 };
    put_headers(&count, c, lines, n_lines, api_key);
    struct curl_slist *block = malloc(count.lines * sizeof *block + count.bytes);
    if (!block)
        return -1;
    header_block fill = { block, (char *)(block + count.lines), 0, 0 };
    put_headers(&fill, c, lines, n_lines, api_key);
    *out = block;
    return 0;
}

void lr_call_headers_free(struct curl_slist *h)
{
    if (!h)
        return;
    /* The key lives only in this block: wiped before it goes back. The
     * text runs from the first line's to the end of the last's. */
    const struct curl_slist *last = h;
    while (last->next)
        last = last->next;
    explicit_bzero(h->data, (size_t)(last->data - h->data) + strlen(last->data) + 1);
    free(h);
}

/* A call's record (2.4 KB) from the engine's spares when it has one,
 * zeroed as calloc's: glibc serves a block that size outside its per-thread
 * cache, often consolidating its free lists first, and that cost the
 * submitting thread more per call than the rest of its record. A record
 * is only memory here (its mutex and condition variable are made and
 * destroyed with the call), so a spare is as good as a fresh one (kept
 * and taken as spares.c says: none in a forked child). The spares,
 * poisoned for AddressSanitizer and valgrind (all but their link), still
 * show a use after free. At most lr_spares_cap(e) are kept (2.4 KB each,
 * no more than the engine's busiest moment had alive): a batch keeps about
 * 4 x limit + 64 records alive and frees them in runs; 32 kept missed half
 * the time. */

/* A spare's first bytes link it to the next spare; the rest is hidden. */
typedef union spare {
    union spare *next;
    llmretry_call call;
} spare;
#define SPARE_REST(s) ((char *)(s) + sizeof(spare *))
#define SPARE_REST_LEN (sizeof(spare) - sizeof(spare *))

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define SPARE_HIDE(s) ASAN_POISON_MEMORY_REGION(SPARE_REST(s), SPARE_REST_LEN)
#define SPARE_SHOW(s) ASAN_UNPOISON_MEMORY_REGION(SPARE_REST(s), SPARE_REST_LEN)
#elif defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define SPARE_HIDE(s) VALGRIND_MAKE_MEM_NOACCESS(SPARE_REST(s), SPARE_REST_LEN)
#define SPARE_SHOW(s) VALGRIND_MAKE_MEM_UNDEFINED(SPARE_REST(s), SPARE_REST_LEN)
#endif
#endif
#ifndef SPARE_HIDE
#define SPARE_HIDE(s) ((void)(s))
#define SPARE_SHOW(s) ((void)(s))
#endif

static llmretry_call *record_new(llmretry_engine *e)
{
    spare *s = lr_spares_take(e, &e->spare_calls);
    if (!s)
        return calloc(1, sizeof(llmretry_call));
    SPARE_SHOW(s);
    memset(s, 0, sizeof *s);
    return &s->call;
}

static void record_free(llmretry_engine *e, llmretry_call *c)
{
    /* Hidden before it is on the list: from then on another thread may
     * take it, and shows it first. */
    SPARE_HIDE((spare *)c);
    if (e && lr_spares_put(e, &e->spare_calls, c, lr_spares_cap(e)))
        return;
    SPARE_SHOW((spare *)c);
    free(c);
}

void lr_call_spares_free(llmretry_engine *e)
{
    spare *s;
    while ((s = lr_spares_pop(&e->spare_calls)) != NULL) {
        SPARE_SHOW(s);
        free(s);
    }
    lr_host_xfer_spares_free(e);
    pthread_mutex_destroy(&e->spare_mu);
}

static void call_destroy(llmretry_call *c)
{
    /* The mailbox is empty here: each queued event held a reference. */
    lr_stream_free(c);
    lr_host_xfer_free(c);
    lr_targets_free(c);
    free(c->policy);
    free(c->ca_file);
    if (c->request_id != c->request_id_buf)
        free(c->request_id);
    free((void *)c->o.idempotency_key);
    free((void *)c->o.content_type);
    if (c->o.headers) {
        for (size_t i = 0; i < c->o.n_headers; i++)
            free((void *)c->o.headers[i]);
        free((void *)c->o.headers);
    }
    lr_call_forget_headers(c);
    free(c->resp_head.data);
    free(c->resp.data);
    free(c->last_message);
    free(c->last_error_code);
    free(c->last_body_preview);
    free(c->last_validation_errors);
    free(c->repair_body);
    lr_schema_free(c->schema);
    free(c->v_response_model);
    free(c->v_fingerprint);
    free(c->validate_msg);
    free((void *)c->result.message);
    free((void *)c->result.error_code);
    free((void *)c->result.body_preview);
    free((void *)c->result.validation_errors);
    free((void *)c->result.response_model);
    free((void *)c->result.system_fingerprint);
    free((void *)c->result.targets);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    llmretry_engine *e = c->engine;
    if (c->group)
        lr_group_unref(c->group);
    if (c->channel)
        lr_channel_unref(c->channel);
    record_free(e, c);              /* e is alive: c holds a reference */
    if (e)
        lr_engine_unref(e);
}

void lr_call_ref(llmretry_call *c)
{
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

void lr_call_unref(llmretry_call *c)
{
    if (c && atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
        call_destroy(c);
}

static int copy_headers(llmretry_call *c, const llmretry_options *opts)
{
    c->o.headers = NULL;
    if (opts->n_headers == 0)
        return 0;
    char **copy = calloc(opts->n_headers, sizeof *copy);
    if (!copy)
        return -1;
    c->o.headers = (const char *const *)copy;
    for (size_t i = 0; i < opts->n_headers; i++)
        if (!(copy[i] = lr_strdup(opts->headers[i])))
            return -1;
    return 0;
}

llmretry_status lr_call_new(llmretry_engine *e, const llmretry_options *opts,
                            unsigned flags, llmretry_call **out, char *err, size_t errlen)
{
    llmretry_status st = flags & LR_SUBMIT_CHECKED ? lr_options_check_body(opts, err, errlen)
                                                   : llmretry_options_check(opts, err, errlen);
    if (st != LLMRETRY_OK)
        return st;
    flags &= ~LR_SUBMIT_CHECKED;
    if (opts->group && opts->group->engine != e) {
        lr_errf(err, errlen, "group belongs to another engine");
        return LLMRETRY_EINVAL;
    }
    llmretry_call *c = record_new(e);
    if (!c)
        return LLMRETRY_ENOMEM;
    pthread_mutex_init(&c->mu, NULL);
    lr_cond_init(&c->cv);
    atomic_init(&c->refs, 1);
    c->engine = e;                  /* the engine reference is taken by the caller */
    c->flags = flags;
    c->o = *opts;
    c->o.url = c->o.base_url = c->o.api_key = c->o.body = c->o.model = NULL;
    c->o.request_id = c->o.idempotency_key = c->o.policy = c->o.ca_file = NULL;
    c->o.content_type = NULL;
    c->o.fallbacks = NULL;          /* built into the targets below */
    c->o.schema = NULL;             /* compiled below */
    c->o.n_headers = opts->n_headers;
    c->last_retry_after_ms = -1;
    c->deadline_at = -1;
    c->est_tokens = c->completion_limit = -1;

    int bad_json = 0, no_key = 0, default_url = 0;
    int oom = 0;
    /* Target 0 owns the caller's URL, body, model and headers; c->url and
     * the rest point at the current target's. */
    c->targets = &c->target0;      /* zeroed with the record */
    c->n_targets = 1;
    lr_target *t0 = &c->targets[0];
    t0->owns = ~0u;
    c->url = t0->url = lr_call_url(opts->url, opts->base_url, opts->endpoint, &default_url);
    /* Named in an error that never reached the URL (attempt.c). */
    c->url_option = opts->url ? "url" : opts->base_url && *opts->base_url ? "base_url"
                  : default_url ? "base_url (none was given)" : "base_url ($OPENAI_BASE_URL)";
    /* A GET or DELETE has no body (NULL is allowed there): "" stands in. */
    c->body = t0->body = lr_strndup(opts->body ? opts->body : "", opts->body ? opts->body_len : 0);
    oom |= !c->url || !c->body;
    if (opts->model)
        oom |= !(c->model = t0->model = lr_strdup(opts->model));
    if (opts->content_type)
        oom |= !(c->o.content_type = lr_strdup(opts->content_type));
    size_t body_len = opts->body ? opts->body_len : 0;
    /* A body the host encoded, as the core sends it: streamed, it says
     * "stream": true, and streaming, it asks for its usage (stream.c). The
     * caller's own text is sent as written. */
    if (!oom && opts->stream_usage && lr_options_json_body(opts)) {
        char *sent = llmretry_stream_body(c->url, c->body, &body_len, opts->stream_chunks);
        if (sent) {
            free(c->body);
            c->body = t0->body = sent;
        }
    }
    /* Only a JSON body is read (model, stream); another is sent as is. */
    if (!oom && lr_options_json_body(opts)) {
        char *model = read_body(c->body, body_len, !opts->model, &bad_json,
                                &c->stream_req);
        if (!opts->model)
            c->model = t0->model = model;
    }
    if (opts->policy)
        oom |= !(c->policy = lr_strdup(opts->policy));
    if (opts->ca_file)
        oom |= !(c->ca_file = lr_strdup(opts->ca_file));
    if (opts->idempotency_key)
        oom |= !(c->o.idempotency_key = lr_strdup(opts->idempotency_key));
    oom |= copy_headers(c, opts) != 0;
    size_t id_len = opts->request_id ? strlen(opts->request_id) : 0;
    c->request_id = c->request_id_buf;
    if (!opts->request_id)
        oom |= lr_uuid4(c->request_id_buf) != 0;
    else if (id_len < sizeof c->request_id_buf)
        memcpy(c->request_id_buf, opts->request_id, id_len + 1);
    else
        oom |= !(c->request_id = lr_strdup(opts->request_id));

    if (!oom && !bad_json) {
        t0->body_len = body_len;
        c->o.body = c->body;
        c->o.body_len = body_len;
        c->o.model = c->model;
        c->o.policy = c->policy;
        c->o.ca_file = c->ca_file;
        c->o.url = c->url;
        const char *key = opts->api_key;
        int from_env = 0;
        if (!key && opts->use_env_api_key) {
            key = getenv("OPENAI_API_KEY");
            from_env = 1;
        }
        oom |= lr_call_headers(c, c->o.headers, c->o.n_headers, key, from_env, &t0->headers) != 0;
        c->headers = t0->headers;
        c->key_hash = t0->key_hash = lr_call_key_hash(c->headers);
        /* OpenAI's endpoint without a key can only answer 401 (or, offline,
         * fail to resolve, retried for seconds): say what is missing now. */
        no_key = default_url && !(key && *key) &&
                 !caller_sets(c->o.headers, c->o.n_headers, "Authorization");
    }
    int bad_scheme = c->url && strncasecmp(c->url, "http://", 7) != 0
                     && strncasecmp(c->url, "https://", 8) != 0;
    /* Before any I/O: else each attempt fails as a TLS verification error. */
    int ca_errno = c->ca_file && access(c->ca_file, R_OK) != 0 ? errno : 0;
    c->is_https = t0->is_https = c->url && strncasecmp(c->url, "https://", 8) == 0;
    if (!oom && !bad_json && lr_targets_build(c, opts->fallbacks) != 0)
        oom = 1;
    char schema_err[LLMRETRY_ERRBUF] = "";
    int bad_schema = 0;
    if (!oom && !bad_json) {
        int rc = lr_answer_schema(c, opts, schema_err, sizeof schema_err);
        oom |= rc == -2;
        bad_schema = rc == -1;
    }
    if (oom || bad_json || bad_scheme || no_key || ca_errno || bad_schema) {
        c->engine = NULL;
        lr_call_unref(c);
        if (no_key && !oom) {
            lr_errf(err, errlen, "%s: %s needs a key (or set base_url for another server)",
                    opts->use_env_api_key ? "api_key is not set and OPENAI_API_KEY is empty or unset"
                                          : "api_key is not set (and use_env_api_key is off, so "
                                            "OPENAI_API_KEY is not read)", DEFAULT_BASE_URL);
            return LLMRETRY_EINVAL;
        }
        if (bad_json) {
            /* Never quoted: the text may be the prompt itself. */
            lr_errf(err, errlen, "body is not the JSON text of an object, such as "
                    "{\"model\": \"gpt-4.1-mini\", \"messages\": [{\"role\": \"user\", "
                    "\"content\": \"hi\"}]}");
            return LLMRETRY_EINVAL;
        }
        if (bad_schema && !oom) {
            lr_errf(err, errlen, "%s", schema_err);
            return LLMRETRY_EINVAL;
        }
        if (bad_scheme) {
            lr_errf(err, errlen, "%s must start with http:// or https://",
                    opts->url ? "url" : opts->base_url ? "base_url" : "OPENAI_BASE_URL");
            return LLMRETRY_EINVAL;
        }
        if (ca_errno) {
            lr_errf(err, errlen, "ca_file cannot be read: %s: %s", opts->ca_file,
                    strerror(ca_errno));
            return LLMRETRY_EINVAL;
        }
        return LLMRETRY_ENOMEM;
    }
    c->submitted_at = lr_mono_ms();
    if (opts->deadline_ms != LLMRETRY_NO_DEADLINE)
        c->deadline_at = lr_time_add(c->submitted_at, opts->deadline_ms);
    if (opts->group) {
        /* No item of a batch runs past the batch's deadline. */
        c->group = opts->group;
        atomic_fetch_add_explicit(&c->group->refs, 1, memory_order_relaxed);
        if (c->group->deadline_at >= 0 &&
            (c->deadline_at < 0 || c->group->deadline_at < c->deadline_at))
            c->deadline_at = c->group->deadline_at;
    }
    *out = c;
    return LLMRETRY_OK;
}

