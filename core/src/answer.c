/* Structured outputs (docs/structured-outputs.md): which schema a call's
 * answers are held to (its schema option, else the body's response_format
 * or text.format json_schema), compiled once at submit; and what a 2xx
 * answer comes to against it: a success, an invalid_response with its
 * validation errors (retried as any invalid answer), or a refusal (never
 * retried). The validator itself is schema.c; this file only finds the
 * answer's text in a Chat Completions or Responses body. Engine thread,
 * except lr_answer_schema (the host's, at submit). */
#include "engine.h"
#include "schema.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- compiled schemas, shared ---------------------------------------------
 * A batch's calls, and a client's, name the same schema thousands of times:
 * compiling a 40-property schema costs tens of microseconds of the host
 * thread, more than the rest of a submit. So the last few schemas compiled
 * are kept, by their JSON text, and shared (a compiled schema is read-only).
 * Only schemas that compiled are kept; a bad one is refused each time. */
#define SCHEMA_CACHE 8

typedef struct cached_schema {
    char *text;
    size_t len;
    lr_schema *schema;
    uint64_t used;
} cached_schema;

static cached_schema cache[SCHEMA_CACHE];
static uint64_t cache_clock;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

/* A child of fork() has only the forking thread: the mutex may have been
 * held by another; the entries themselves are intact. */
static void cache_after_fork(void)
{
    pthread_mutex_init(&cache_mu, NULL);
}

static void cache_init(void)
{
    pthread_atfork(NULL, NULL, cache_after_fork);
}

/* When the module is unloaded (Lua closes its C libraries at lua_close;
 * a host may dlclose the extension) the kept schemas go with it: freed
 * here, not left unreachable (LeakSanitizer counts them as leaks). */
#if defined(__GNUC__)
__attribute__((destructor))
#endif
static void cache_free_all(void)
{
    for (int i = 0; i < SCHEMA_CACHE; i++) {
        free(cache[i].text);
        lr_schema_free(cache[i].schema);
        cache[i] = (cached_schema){ NULL, 0, NULL, 0 };
    }
}

/* The compiled schema of this JSON text (a reference: lr_schema_free it),
 * from the cache or compiled now; NULL with why. */
static lr_schema *schema_for(const char *text, size_t len, char *why, size_t whylen)
{
    pthread_once(&cache_once, cache_init);
    lr_schema *s = NULL;
    pthread_mutex_lock(&cache_mu);
    for (int i = 0; i < SCHEMA_CACHE && !s; i++)
        if (cache[i].schema && cache[i].len == len && memcmp(cache[i].text, text, len) == 0) {
            cache[i].used = ++cache_clock;
            s = lr_schema_ref(cache[i].schema);
        }
    pthread_mutex_unlock(&cache_mu);
    if (s)
        return s;
    if (!(s = lr_schema_compile_text(text, len, why, whylen)))
        return NULL;
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return s;                   /* not kept: compiled again next time */
    memcpy(copy, text, len);
    pthread_mutex_lock(&cache_mu);
    int slot = 0;
    for (int i = 1; i < SCHEMA_CACHE; i++)
        if (cache[i].used < cache[slot].used)
            slot = i;
    cached_schema old = cache[slot];
    cache[slot] = (cached_schema){ copy, len, lr_schema_ref(s), ++cache_clock };
    pthread_mutex_unlock(&cache_mu);
    free(old.text);
    lr_schema_free(old.schema);
    return s;
}

llmretry_status llmretry_schema_validate(const char *schema, size_t schema_len,
                                         const char *json, size_t json_len, char **errors,
                                         char *err, size_t errlen)
{
    char why[LLMRETRY_ERRBUF - 32];
    if (errors)
        *errors = NULL;
    if (!schema || !json || !errors) {
        lr_errf(err, errlen, "%s must not be NULL", !schema ? "schema" : !json ? "json" : "errors");
        return LLMRETRY_EINVAL;
    }
    lr_schema *s = schema_for(schema, schema_len, why, sizeof why);
    if (!s) {
        lr_errf(err, errlen, "schema: %s", why);
        return strcmp(why, "out of memory") == 0 ? LLMRETRY_ENOMEM : LLMRETRY_EINVAL;
    }
    lr_schema_errors out;
    int n = lr_schema_validate_text(s, json, json_len, &out);
    llmretry_status st = LLMRETRY_OK;
    if (n < 0) {
        lr_errf(err, errlen, "json is not valid JSON");
        st = LLMRETRY_EINVAL;
    } else if (n > 0 && !(*errors = lr_schema_errors_json(&out))) {
        st = LLMRETRY_ENOMEM;
    }
    lr_schema_free(s);
    return st;
}

int lr_schema_check_json(const char *json, const char *name, char *err, size_t errlen)
{
    char why[LLMRETRY_ERRBUF - 32];
    lr_schema *s = schema_for(json, strlen(json), why, sizeof why);
    if (!s) {
        lr_errf(err, errlen, "%s: %s", name, why);
        return -1;
    }
    lr_schema_free(s);
    return 0;
}

/* The schema a body asks for: response_format.json_schema.schema (Chat
 * Completions) or text.format.schema (Responses), when its type is
 * "json_schema"; *where names it for messages. NULL when it asks none. */
static const cJSON *body_schema(const cJSON *doc, const char **where, int *missing)
{
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(doc, "response_format");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    *missing = 0;
    if (cJSON_IsString(type) && strcmp(type->valuestring, "json_schema") == 0) {
        *where = "response_format.json_schema.schema";
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(js, "schema");
        *missing = s == NULL;
        return s;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(doc, "text"), "format");
    type = cJSON_GetObjectItemCaseSensitive(fmt, "type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "json_schema") == 0) {
        *where = "text.format.schema";
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(fmt, "schema");
        *missing = s == NULL;
        return s;
    }
    return NULL;
}

int lr_answer_schema(llmretry_call *c, const llmretry_options *o, char *err, size_t errlen)
{
    char why[LLMRETRY_ERRBUF - 48];
    if (o->schema) {
        c->schema = schema_for(o->schema, strlen(o->schema), why, sizeof why);
        c->schema_extract = 1;
        if (!c->schema) {
            lr_errf(err, errlen, "schema: %s", why);
            return strcmp(why, "out of memory") == 0 ? -2 : -1;
        }
        return 0;
    }
    /* Most bodies ask for no schema: those are not parsed at all. */
    if (!o->body || !memmem(o->body, o->body_len, "json_schema", 11))
        return 0;
    cJSON *doc = cJSON_ParseWithLength(o->body, o->body_len);
    if (!doc)
        return 0;                   /* the body's own check reports it */
    const char *where = NULL;
    int missing = 0;
    const cJSON *s = body_schema(doc, &where, &missing);
    int rc = 0;
    if (missing) {
        lr_errf(err, errlen, "the body asks for a json_schema answer but %s is missing", where);
        rc = -1;
    } else if (s) {
        /* By its text, as the schema option's: a batch's bodies share one. */
        char *text = cJSON_PrintUnformatted(s);
        if (!text) {
            rc = -2;
        } else if (!(c->schema = schema_for(text, strlen(text), why, sizeof why))) {
            lr_errf(err, errlen, "%s: %s", where, why);
            rc = strcmp(why, "out of memory") == 0 ? -2 : -1;
        }
        cJSON_free(text);
    }
    cJSON_Delete(doc);
    return rc;
}

/* ---- checking an answer ---------------------------------------------------- */

static void refused(lr_outcome *out)
{
    out->success = 0;
    out->f.kind = LLMRETRY_ERR_REFUSAL;
    out->f.fatal = 1;               /* the same request would be refused again */
    free(out->message);
    /* The refusal is the model's text: on the result's body_preview only. */
    out->message = lr_strdup("the model refused to answer (message.refusal)");
}

/* One error for an answer that is not even JSON, in the list's form. */
static void not_json(lr_schema_errors *errs, const char *what)
{
    lr_schema_error *e = &errs->e[errs->n++];
    snprintf(e->path, sizeof e->path, "$");
    snprintf(e->message, sizeof e->message, "%s", what);
}

/* Validate one answer text; its errors appended to errs (prefixed with
 * the choice when there are several). The text is checked where it
 * stands, never parsed into a tree (schema_text.c). */
static void check_text(llmretry_call *c, const char *text, size_t len, int choice, int n_choices,
                       lr_schema_errors *errs)
{
    if (errs->n >= LR_SCHEMA_MAX_ERRORS) {
        errs->truncated = 1;
        return;
    }
    size_t start = 0, n = len;
    char why[64];
    lr_schema_errors one;
    /* Most answers are JSON as they are: extract_json only for the rest. */
    int found = lr_schema_validate_text(c->schema, text, len, &one);
    if (found < 0 && c->schema_extract) {
        if (llmretry_extract_json(text, len, &start, &n, why, sizeof why) != LLMRETRY_OK) {
            not_json(errs, "the answer holds no JSON");
            return;
        }
        found = lr_schema_validate_text(c->schema, text + start, n, &one);
    }
    if (found < 0) {
        not_json(errs, "the answer is not JSON");
        return;
    }
    for (int i = 0; i < one.n; i++) {
        if (errs->n == LR_SCHEMA_MAX_ERRORS) {
            errs->truncated = 1;
            break;
        }
        lr_schema_error *e = &errs->e[errs->n++];
        memcpy(e->path, one.e[i].path, sizeof e->path);
        if (n_choices > 1)
            snprintf(e->message, sizeof e->message, "choice %d: %.130s", choice,
                     one.e[i].message);
        else
            memcpy(e->message, one.e[i].message, sizeof e->message);
    }
    errs->truncated |= one.truncated;
}

/* The answers of a Chat Completions body: each choice's message content
 * (or a legacy completion's text). 1 when it had choices. */
static int check_choices(llmretry_call *c, const cJSON *doc, lr_schema_errors *errs, int *refusal)
{
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(doc, "choices");
    if (!cJSON_IsArray(choices))
        return 0;
    int n = cJSON_GetArraySize(choices), i = 0;
    for (const cJSON *ch = choices->child; ch; ch = ch->next, i++) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(msg, "refusal"))) {
            *refusal = 1;
            return 1;
        }
        if (!msg)
            content = cJSON_GetObjectItemCaseSensitive(ch, "text");
        if (cJSON_IsString(content))
            check_text(c, content->valuestring, strlen(content->valuestring), i, n, errs);
        else if (!cJSON_GetObjectItemCaseSensitive(msg, "tool_calls") && errs->n < LR_SCHEMA_MAX_ERRORS)
            not_json(errs, "the answer has no content");
    }
    if (n == 0)
        not_json(errs, "the answer has no choices");
    return 1;
}

/* The answer of a Responses body: its message items' output_text parts,
 * joined (as the SDKs' output_text is). */
static void check_output(llmretry_call *c, const cJSON *doc, lr_schema_errors *errs, int *refusal)
{
    const cJSON *output = cJSON_GetObjectItemCaseSensitive(doc, "output");
    size_t len = 0, cap = 0;
    char *text = NULL;
    int parts = 0;
    for (const cJSON *item = cJSON_IsArray(output) ? output->child : NULL; item; item = item->next) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(item, "content");
        for (const cJSON *p = cJSON_IsArray(content) ? content->child : NULL; p; p = p->next) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (cJSON_IsString(type) && strcmp(type->valuestring, "refusal") == 0) {
                *refusal = 1;
                free(text);
                return;
            }
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "output_text") != 0 ||
                !cJSON_IsString(t))
                continue;
            size_t n = strlen(t->valuestring);
            if (len + n + 1 > cap) {
                cap = (len + n + 1) * 2;
                char *grown = realloc(text, cap);
                if (!grown) {
                    free(text);
                    not_json(errs, "out of memory reading the answer");
                    return;
                }
                text = grown;
            }
            memcpy(text + len, t->valuestring, n + 1);
            len += n;
            parts++;
        }
    }
    if (parts)
        check_text(c, text, len, 0, 1, errs);
    else
        not_json(errs, "the answer has no output text");
    free(text);
}

void lr_answer_check(llmretry_call *c, const cJSON *doc, lr_outcome *out)
{
    if (!c->schema || !out->success)
        return;
    cJSON *own = NULL;
    if (!doc) {
        const char *why = NULL;
        doc = own = lr_parse_body(c->resp.data ? c->resp.data : "", c->resp.len, &why);
        if (!own || why) {
            cJSON_Delete(own);
            return;                 /* the body's own check judged it */
        }
    }
    lr_schema_errors errs;
    errs.n = errs.truncated = 0;
    int refusal = 0;
    if (!check_choices(c, doc, &errs, &refusal))
        check_output(c, doc, &errs, &refusal);
    cJSON_Delete(own);
    if (refusal) {
        refused(out);
        return;
    }
    if (errs.n == 0)
        return;
    out->success = 0;
    out->f.kind = LLMRETRY_ERR_INVALID_RESPONSE;
    out->validation_errors = lr_schema_errors_json(&errs);
    snprintf(out->validation_path, sizeof out->validation_path, "%s", errs.e[0].path);
    free(out->message);
    char msg[LR_VALIDATION_PATH_MAX + LR_SCHEMA_MESSAGE_MAX + 96];
    int n = snprintf(msg, sizeof msg, "the answer does not match the schema: %s: %s",
                     errs.e[0].path, errs.e[0].message);
    if ((errs.n > 1 || errs.truncated) && n > 0 && (size_t)n < sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, " (and %d%s more)", errs.n - 1,
                 errs.truncated ? "+" : "");
    out->message = lr_strdup(msg);
}
