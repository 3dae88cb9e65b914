/* Fallback targets (docs/reliability.md): the `fallbacks` option, checked where it
 * is set (option setter, policy file), built into each call's targets on
 * the host thread at submit, and switched to by the engine when a target
 * gives up (attempt.c).
 *
 * Target 0 is the caller's request. A fallback with no URL of its own is
 * the caller's endpoint: it shares the caller's URL, key and headers and
 * differs only by model. One with its own URL sends only what it names:
 * the caller's key must never reach a host it was not given for. A
 * target's body is the caller's with "model" replaced, built only when the
 * engine switches to it (most calls never fall back). */
#include "engine.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { OWN_URL = 1, OWN_HEADERS = 2, OWN_MODEL = 4, OWN_BODY = 8 };

static const char *const target_keys[] = { "model", "base_url", "url", "api_key",
                                            "api_key_env", "headers", NULL };

static int known_key(const char *k)
{
    for (const char *const *p = target_keys; *p; p++)
        if (strcmp(*p, k) == 0)
            return 1;
    return 0;
}

static int has_ctl(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return 1;
    return 0;
}

/* One target's field that must be a non-empty string without controls. */
static int check_string(const cJSON *t, const char *key, const char *name, int i, char *err,
                        size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    /* Values are never repeated: api_key is a secret, and a key pasted
     * into the wrong field is one too. */
    if (!cJSON_IsString(v)) {
        lr_errf(err, errlen, "%s[%d].%s must be a string", name, i, key);
        return -1;
    }
    if (!v->valuestring[0] || has_ctl(v->valuestring)) {
        lr_errf(err, errlen, "%s[%d].%s must be a non-empty string without control characters",
                name, i, key);
        return -1;
    }
    return 0;
}

static const char *string_of(const cJSON *t, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int lr_targets_check(const cJSON *doc, const char *name, int in_policy, char *err, size_t errlen)
{
    if (!cJSON_IsArray(doc)) {
        lr_errf(err, errlen, "%s must be a list of targets (objects with model, base_url, url, "
                "api_key, api_key_env, headers)", name);
        return -1;
    }
    int n = cJSON_GetArraySize(doc);
    if (n > LLMRETRY_MAX_FALLBACKS) {
        lr_errf(err, errlen, "%s must list at most %d targets (got %d)", name,
                LLMRETRY_MAX_FALLBACKS, n);
        return -1;
    }
    int i = 0;
    for (const cJSON *t = doc->child; t; t = t->next, i++) {
        if (!cJSON_IsObject(t)) {
            lr_errf(err, errlen, "%s[%d] must be an object (model, base_url, url, api_key, "
                    "api_key_env, headers)", name, i);
            return -1;
        }
        for (const cJSON *kv = t->child; kv; kv = kv->next)
            if (!known_key(kv->string)) {
                lr_errf(err, errlen, "%s[%d]: unknown key '%s' (known: model, base_url, url, "
                        "api_key, api_key_env, headers)", name, i, kv->string);
                return -1;
            }
        for (const char *const *k = target_keys; strcmp(*k, "headers") != 0; k++)
            if (check_string(t, *k, name, i, err, errlen) != 0)
                return -1;
        const char *url = string_of(t, "url"), *base = string_of(t, "base_url");
        if (url && base) {
            lr_errf(err, errlen, "%s[%d] sets both url and base_url (one of them)", name, i);
            return -1;
        }
        const char *called = url ? url : base;
        if (called && strncasecmp(called, "http://", 7) != 0 &&
            strncasecmp(called, "https://", 8) != 0) {
            lr_errf(err, errlen, "%s[%d].%s must start with http:// or https://", name, i,
                    url ? "url" : "base_url");
            return -1;
        }
        if (string_of(t, "api_key") && string_of(t, "api_key_env")) {
            lr_errf(err, errlen, "%s[%d] sets both api_key and api_key_env (one of them)", name, i);
            return -1;
        }
        if (in_policy && string_of(t, "api_key")) {
            lr_errf(err, errlen, "%s[%d].api_key cannot be in a policy (a policy file holds no "
                    "secrets): use api_key_env, the name of a variable holding it", name, i);
            return -1;
        }
        int own_endpoint = called != NULL;
        if (!own_endpoint && (string_of(t, "api_key") || string_of(t, "api_key_env"))) {
            lr_errf(err, errlen, "%s[%d].%s needs the target's own url or base_url (a target "
                    "without one sends the caller's key)", name, i,
                    string_of(t, "api_key") ? "api_key" : "api_key_env");
            return -1;
        }
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(t, "headers");
        if (h && !cJSON_IsNull(h)) {
            if (!cJSON_IsObject(h)) {
                lr_errf(err, errlen, "%s[%d].headers must be a table of header names to values",
                        name, i);
                return -1;
            }
            if (!own_endpoint) {
                lr_errf(err, errlen, "%s[%d].headers needs the target's own url or base_url (a "
                        "target without one sends the caller's headers)", name, i);
                return -1;
            }
            for (const cJSON *kv = h->child; kv; kv = kv->next) {
                char label[96];
                snprintf(label, sizeof label, "%s[%d].headers", name, i);
                if (!cJSON_IsString(kv)) {
                    lr_errf(err, errlen, "%s: each value must be a string", label);
                    return -1;
                }
                if (lr_check_header_parts(kv->string, kv->valuestring, label,
                                          string_of(t, "api_key") || string_of(t, "api_key_env"),
                                          err, errlen) != LLMRETRY_OK)
                    return -1;
            }
        }
        if (!own_endpoint && !string_of(t, "model")) {
            lr_errf(err, errlen, "%s[%d] names neither a model nor a url or base_url: it would "
                    "send the same request to the same endpoint again", name, i);
            return -1;
        }
    }
    return 0;
}

int lr_targets_check_json(const char *json, const char *name, char *err, size_t errlen)
{
    cJSON *doc = cJSON_Parse(json);
    if (!doc) {
        lr_errf(err, errlen, "%s must be a list of targets (not valid JSON)", name);
        return -1;
    }
    int rc = lr_targets_check(doc, name, 0, err, errlen);
    cJSON_Delete(doc);
    return rc;
}

/* ---- a call's targets (host thread, at submit) ------------------------------ */

/* One fallback from its checked JSON; 0 or -1 (out of memory). */
static int build_one(llmretry_call *c, lr_target *t, const cJSON *spec)
{
    const lr_target *t0 = &c->targets[0];
    const char *model = string_of(spec, "model");
    if (model) {
        if (!(t->model = lr_strdup(model)))
            return -1;
        t->owns |= OWN_MODEL;
    } else {
        t->model = t0->model;
    }
    t->body = t0->body;             /* replaced at the switch when it names a model */
    t->body_len = t0->body_len;
    const char *url = string_of(spec, "url"), *base = string_of(spec, "base_url");
    if (!url && !base) {
        /* The caller's endpoint: its URL, key and headers. */
        t->url = t0->url;
        t->headers = t0->headers;
        t->key_hash = t0->key_hash;
        t->is_https = t0->is_https;
        return 0;
    }
    if (!(t->url = lr_call_url(url, base, c->o.endpoint, NULL)))
        return -1;
    t->owns |= OWN_URL;
    t->is_https = strncasecmp(t->url, "https://", 8) == 0;
    const char *key = string_of(spec, "api_key");
    const char *env = string_of(spec, "api_key_env");
    if (!key && env)
        key = getenv(env);          /* unset: no key (a local server needs none) */
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(spec, "headers");
    size_t n = cJSON_IsObject(h) ? (size_t)cJSON_GetArraySize(h) : 0;
    char **lines = n ? calloc(n, sizeof *lines) : NULL;
    int rc = n && !lines ? -1 : 0;
    size_t k = 0;
    for (const cJSON *kv = n ? h->child : NULL; kv && rc == 0; kv = kv->next, k++) {
        size_t len = strlen(kv->string) + strlen(kv->valuestring) + 3;
        if (!(lines[k] = malloc(len)))
            rc = -1;
        else
            snprintf(lines[k], len, "%s: %s", kv->string, kv->valuestring);
    }
    if (rc == 0)
        rc = lr_call_headers(c, (const char *const *)lines, n, key, 0, &t->headers);
    for (size_t j = 0; j < n && lines; j++)
        free(lines[j]);
    free(lines);
    if (rc != 0)
        return -1;
    t->owns |= OWN_HEADERS;
    t->key_hash = lr_call_key_hash(t->headers);
    return 0;
}

int lr_targets_build(llmretry_call *c, const char *fallbacks)
{
    if (!fallbacks)
        return 0;
    cJSON *doc = cJSON_Parse(fallbacks);
    int n = cJSON_GetArraySize(doc);
    /* Target 0 lives in the record (target0) until now: copied to the
     * array's head; c->url and the rest point at its strings, not at it. */
    lr_target *more = doc ? malloc((size_t)(1 + n) * sizeof *more) : NULL;
    if (!more) {
        cJSON_Delete(doc);
        return -1;
    }
    more[0] = c->targets[0];
    if (c->targets != &c->target0)
        free(c->targets);
    c->targets = more;
    memset(more + 1, 0, (size_t)n * sizeof *more);
    int rc = 0, i = 1;
    for (const cJSON *spec = doc->child; spec && rc == 0; spec = spec->next, i++) {
        rc = build_one(c, &c->targets[i], spec);
        c->n_targets = i + 1;       /* freed by lr_targets_free from here on */
    }
    cJSON_Delete(doc);
    return rc;
}

void lr_targets_free(llmretry_call *c)
{
    for (int i = 0; c->targets && i < c->n_targets; i++) {
        lr_target *t = &c->targets[i];
        if (t->owns & OWN_URL)
            free(t->url);
        if (t->owns & OWN_HEADERS)
            lr_call_headers_free(t->headers);
        if (t->owns & OWN_MODEL)
            free(t->model);
        if (t->owns & OWN_BODY)
            free(t->body);
    }
    if (c->targets != &c->target0)
        free(c->targets);
    c->targets = NULL;
    c->n_targets = 0;
}

/* ---- switching (engine thread) ----------------------------------------------- */

/* The caller's body with "model" set to the target's; NULL when out of
 * memory or the body is not a JSON object. */
static char *body_with_model(const char *body, size_t len, const char *model, size_t *out_len)
{
    cJSON *doc = cJSON_ParseWithLength(body, len);
    char *text = NULL;
    if (cJSON_IsObject(doc)) {
        cJSON *m = cJSON_CreateString(model);
        int ok = m && (cJSON_GetObjectItemCaseSensitive(doc, "model")
                       ? cJSON_ReplaceItemInObjectCaseSensitive(doc, "model", m)
                       : cJSON_AddItemToObject(doc, "model", m));
        if (!ok)
            cJSON_Delete(m);
        text = ok ? cJSON_PrintUnformatted(doc) : NULL;
    }
    cJSON_Delete(doc);
    if (text)
        *out_len = strlen(text);
    return text;
}

void lr_target_use(llmretry_call *c, int i)
{
    lr_target *t = &c->targets[i];
    c->target = i;
    c->url = t->url;
    c->headers = t->headers;
    c->model = t->model;
    c->body = t->body;
    c->o.body = t->body;
    c->o.body_len = t->body_len;
    c->key_hash = t->key_hash;
    c->is_https = t->is_https;
}

int lr_target_next(llmretry_call *c)
{
    if (c->target + 1 >= c->n_targets)
        return -1;
    lr_target *t = &c->targets[c->target + 1];
    if ((t->owns & OWN_MODEL) && !(t->owns & OWN_BODY)) {
        size_t n = 0;
        char *body = body_with_model(c->targets[0].body, c->targets[0].body_len, t->model, &n);
        if (!body)
            return -1;
        t->body = body;
        t->body_len = n;
        t->owns |= OWN_BODY;
    }
    lr_target_use(c, c->target + 1);
    return 0;
}

void lr_targets_report(llmretry_call *c)
{
    if (c->n_targets < 2)
        return;
    llmretry_target_report *out = calloc((size_t)c->n_targets, sizeof *out);
    if (!out)
        return;                     /* out of memory: target and n_targets still say */
    for (int i = 0; i < c->n_targets; i++) {
        const lr_target *t = &c->targets[i];
        out[i] = (llmretry_target_report){ .model = t->model, .attempts = t->attempts,
                                           .status = t->status, .kind = t->kind,
                                           .reason = t->reason };
    }
    c->result.targets = out;
}

llmretry_status llmretry_call_target_report(const llmretry_call *c, size_t i,
                                            llmretry_target_report *out)
{
    const llmretry_result *r = c ? llmretry_call_result(c) : NULL;
    if (!r || !out || !r->targets || i >= (size_t)r->n_targets)
        return LLMRETRY_EINVAL;
    *out = r->targets[i];
    return LLMRETRY_OK;
}
