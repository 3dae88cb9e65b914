/* Named policies: sets of call options kept as plain data (a JSON object
 * of name -> settings), checked once when loaded, and resolved with the
 * precedence explicit > policy > client defaults > built-in. The Python
 * and Lua shims turn their host values (and Python's TOML) into this JSON
 * and call here, so both accept, refuse and word their errors alike.
 *
 * The rules of each key are those of the option table (option_table.c):
 * name, type, range; the same rules check a single value for a shim
 * (llmretry_policy_check_value). */
#include "internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Integers a JSON number carries exactly (RFC 7493 §2.2). */
#define EXACT_INT_MAX 9007199254740991.0

/* A policy key is an option of the table (option_table.c) marked POLICY. */
typedef llmretry_option_info key_rule;

struct llmretry_policies {
    size_t n;
    char **names;                  /* in the order of the document */
    cJSON **settings;              /* checked copies: only the keys each sets */
};

/* The i-th policy key of the option table, or NULL. */
static const key_rule *key_at(size_t i)
{
    const llmretry_option_info *opt;
    for (size_t k = 0; (opt = llmretry_option_at(k)); k++)
        if ((opt->flags & LLMRETRY_OPTFLAG_POLICY) && i-- == 0)
            return opt;
    return NULL;
}

const char *llmretry_policy_key(size_t i)
{
    const key_rule *r = key_at(i);
    return r ? r->name : NULL;
}

static const key_rule *rule_of(const char *name)
{
    const llmretry_option_info *opt = llmretry_option_find(name);
    return opt && (opt->flags & LLMRETRY_OPTFLAG_POLICY) ? opt : NULL;
}

/* JSON's name for a value's type, as every message says it. */
static const char *type_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "array";
    if (cJSON_IsObject(v)) return "object";
    if (cJSON_IsNumber(v)) return "number";
    return "value";
}

static int is_exact_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
           fabs(v->valuedouble) <= EXACT_INT_MAX;
}

/* A number as the document wrote it, near enough for a message. */
static void number_text(const cJSON *v, char *buf, size_t len)
{
    double d = v->valuedouble;
    if (d == floor(d) && fabs(d) < 1e18)
        snprintf(buf, len, "%.0f", d);
    else
        snprintf(buf, len, "%g", d);
}

/* Write the message (lr_errf) and return -1, for `return bad(...)`. */
#define bad(err, errlen, ...) (lr_errf((err), (errlen), __VA_ARGS__), -1)

static int check_text(const key_rule *r, const cJSON *v, char *err, size_t errlen)
{
    if (!cJSON_IsString(v))
        return bad(err, errlen, "%s must be a string (got %s)", r->name, type_name(v));
    if (!v->valuestring[0])
        return bad(err, errlen, "%s must not be empty", r->name);
    for (const unsigned char *p = (const unsigned char *)v->valuestring; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return bad(err, errlen, "%s must not contain control characters", r->name);
    return 0;
}

static int check_enum(const key_rule *r, const cJSON *v, char *err, size_t errlen)
{
    char list[128];
    lr_option_choices(r, list, sizeof list);
    if (!cJSON_IsString(v))
        return bad(err, errlen, "%s must be one of %s (got %s)", r->name, list, type_name(v));
    for (const char *const *c = r->choices; *c; c++)
        if (strcmp(*c, v->valuestring) == 0)
            return 0;
    /* The value is not repeated: it could be a secret pasted in the wrong place. */
    return bad(err, errlen, "%s must be one of %s (got another string)", r->name, list);
}

static int check_statuses(const key_rule *r, const cJSON *v, char *err, size_t errlen)
{
    if (!cJSON_IsArray(v))
        return bad(err, errlen, "%s must be an array of integers (got %s)", r->name, type_name(v));
    int i = 0;
    for (const cJSON *s = v->child; s; s = s->next, i++) {
        if (!is_exact_int(s))
            return bad(err, errlen, "%s[%d] must be an integer (got %s)", r->name, i, type_name(s));
        if (s->valuedouble < (double)r->min || s->valuedouble > (double)r->max)
            return bad(err, errlen, "%s[%d] must be an HTTP status, %s (got %.0f)", r->name,
                       i, r->range, s->valuedouble);
    }
    return lr_option_check_statuses((size_t)i, err, errlen) == LLMRETRY_OK ? 0 : -1;
}

/* in_policy: the value is a policy file's (which may hold no secrets). */
static int check_rule(const key_rule *r, const cJSON *v, int in_policy, char *err, size_t errlen)
{
    if ((r->flags & LLMRETRY_OPTFLAG_NULLABLE) && cJSON_IsNull(v))
        return 0;
    char num[40];
    if (r->flags & LLMRETRY_OPTFLAG_POLICY_AUTO) {
        if (cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0)
            return 0;
        /* A fixed key is not repeated in the message: it could be a secret. */
        return bad(err, errlen, "%s must be \"auto\" (a new key per call; a fixed key would be "
                   "shared by every call)", r->name);
    }
    switch (r->type) {
    case LLMRETRY_OPTTYPE_TEXT:
        return check_text(r, v, err, errlen);
    case LLMRETRY_OPTTYPE_INT:
        if (!is_exact_int(v))
            return bad(err, errlen, "%s must be an integer (got %s)", r->name, type_name(v));
        if (v->valuedouble < (double)r->min || v->valuedouble > (double)r->max) {
            number_text(v, num, sizeof num);
            return bad(err, errlen, "%s must be %s (got %s)", r->name, r->range, num);
        }
        return 0;
    case LLMRETRY_OPTTYPE_ENUM:
        return check_enum(r, v, err, errlen);
    case LLMRETRY_OPTTYPE_BOOL:
        return cJSON_IsBool(v) ? 0
             : bad(err, errlen, "%s must be a boolean (got %s)", r->name, type_name(v));
    case LLMRETRY_OPTTYPE_STATUSES:
        return check_statuses(r, v, err, errlen);
    case LLMRETRY_OPTTYPE_NUMBER:
        if (!cJSON_IsNumber(v))
            return bad(err, errlen, "%s must be a number (got %s)", r->name, type_name(v));
        if (!isfinite(v->valuedouble) || v->valuedouble < (double)r->min ||
            v->valuedouble > (double)r->max) {
            number_text(v, num, sizeof num);
            return bad(err, errlen, "%s must be %s (got %s)", r->name, r->range, num);
        }
        return 0;
    case LLMRETRY_OPTTYPE_TARGETS:
        return lr_targets_check(v, r->name, in_policy, err, errlen);
    case LLMRETRY_OPTTYPE_HEADERS:
    case LLMRETRY_OPTTYPE_SCHEMA:       /* not a policy key */
        break;
    }
    return bad(err, errlen, "%s: unknown rule", r->name);
}

static void known_keys(char *buf, size_t len)
{
    buf[0] = '\0';
    const key_rule *r;
    for (size_t i = 0; (r = key_at(i)); i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s%s", i ? ", " : "", r->name);
    }
}

/* Check one settings object; on success a copy holding only its keys. */
static cJSON *check_settings(const cJSON *obj, const char *where, const char *name,
                             char *err, size_t errlen)
{
    char why[LLMRETRY_ERRBUF], keys[800];
    if (!cJSON_IsObject(obj)) {
        lr_errf(err, errlen, "%spolicy '%s' must be a table of settings (got %s)", where, name,
            type_name(obj));
        return NULL;
    }
    for (const cJSON *kv = obj->child; kv; kv = kv->next) {
        const key_rule *r = rule_of(kv->string);
        if (!r) {
            known_keys(keys, sizeof keys);
            lr_errf(err, errlen, "%spolicy '%s': unknown key '%s' (known: %s)", where, name,
                kv->string, keys);
            return NULL;
        }
        for (const cJSON *o = obj->child; o != kv; o = o->next)
            if (strcmp(o->string, kv->string) == 0) {
                lr_errf(err, errlen, "%spolicy '%s': %s is set twice", where, name, kv->string);
                return NULL;
            }
        if (check_rule(r, kv, 1, why, sizeof why) != 0) {
            lr_errf(err, errlen, "%spolicy '%s': %s", where, name, why);
            return NULL;
        }
    }
    return cJSON_Duplicate(obj, 1);
}

static const cJSON *find(const llmretry_policies *p, const char *name)
{
    for (size_t i = 0; p && name && i < p->n; i++)
        if (strcmp(p->names[i], name) == 0)
            return p->settings[i];
    return NULL;
}

void llmretry_policies_free(llmretry_policies *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++) {
        free(p->names[i]);
        cJSON_Delete(p->settings[i]);
    }
    free(p->names);
    free(p->settings);
    free(p);
}

/* Line and column of byte `at` in `s`, for "not valid JSON" messages. */
static void line_col(const char *s, size_t at, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at; i++) {
        if (s[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

llmretry_status llmretry_policies_parse(const char *json, size_t len, const char *source,
                                        llmretry_policies **out, char *err, size_t errlen)
{
    char where[300] = "";
    if (!out || (!json && len)) {
        lr_errf(err, errlen, "%s must not be NULL", !out ? "out" : "json");
        return LLMRETRY_EINVAL;
    }
    *out = NULL;
    if (source)
        snprintf(where, sizeof where, "%s: ", source);
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(json ? json : "", len, &end, 0);
    size_t stop = end ? (size_t)(end - json) : len;
    while (doc && stop < len && strchr(" \t\r\n", json[stop]))
        stop++;
    if (!doc || stop < len) {
        const char *at = doc ? json + stop : cJSON_GetErrorPtr();
        size_t off = at && json && at >= json && at <= json + len ? (size_t)(at - json) : 0;
        int line, col;
        line_col(json ? json : "", off, &line, &col);
        cJSON_Delete(doc);
        lr_errf(err, errlen, "%snot valid JSON (line %d, column %d)", where, line, col);
        return LLMRETRY_EINVAL;
    }
    if (!cJSON_IsObject(doc)) {
        lr_errf(err, errlen, "%spolicies must be a table of policies by name (got %s)", where,
            type_name(doc));
        cJSON_Delete(doc);
        return LLMRETRY_EINVAL;
    }
    llmretry_policies *p = calloc(1, sizeof *p);
    size_t n = (size_t)cJSON_GetArraySize(doc);
    if (p && n) {
        p->names = calloc(n, sizeof *p->names);
        p->settings = calloc(n, sizeof *p->settings);
    }
    if (!p || (n && (!p->names || !p->settings))) {
        llmretry_policies_free(p);
        cJSON_Delete(doc);
        return LLMRETRY_ENOMEM;
    }
    llmretry_status st = LLMRETRY_OK;
    for (const cJSON *pol = doc->child; pol && st == LLMRETRY_OK; pol = pol->next) {
        const char *name = pol->string;
        int blank = 1;
        for (const char *c = name; *c; c++)
            blank &= strchr(" \t\r\n", *c) != NULL;
        if (blank) {
            lr_errf(err, errlen, "%sa policy name must be a non-empty string (got \"%s\")", where, name);
            st = LLMRETRY_EINVAL;
            break;
        }
        if (find(p, name)) {
            lr_errf(err, errlen, "%spolicy '%s' is defined twice", where, name);
            st = LLMRETRY_EINVAL;
            break;
        }
        cJSON *s = check_settings(pol, where, name, err, errlen);
        if (!s) {
            st = LLMRETRY_EINVAL;
            break;
        }
        p->names[p->n] = lr_strdup(name);
        p->settings[p->n] = s;
        if (!p->names[p->n]) {
            cJSON_Delete(s);
            st = LLMRETRY_ENOMEM;
            break;
        }
        p->n++;
    }
    cJSON_Delete(doc);
    if (st != LLMRETRY_OK) {
        llmretry_policies_free(p);
        return st;
    }
    *out = p;
    return LLMRETRY_OK;
}

size_t llmretry_policies_count(const llmretry_policies *p)
{
    return p ? p->n : 0;
}

const char *llmretry_policies_name(const llmretry_policies *p, size_t i)
{
    return p && i < p->n ? p->names[i] : NULL;
}

char *llmretry_policies_get_json(const llmretry_policies *p, const char *name)
{
    const cJSON *s = find(p, name);
    return s ? cJSON_PrintUnformatted(s) : NULL;
}

static void unknown_policy(const llmretry_policies *p, const char *name, char *err, size_t errlen)
{
    char list[400] = "";
    for (size_t i = 0; p && i < p->n; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s'%s'", i ? ", " : "", p->names[i]);
    }
    lr_errf(err, errlen, "unknown policy '%s' (known: %s)", name, list[0] ? list : "none");
}

/* Parse a layer of call options (NULL/empty = none): a JSON object. */
static int parse_layer(const char *json, size_t len, const char *what, cJSON **out,
                       char *err, size_t errlen)
{
    *out = NULL;
    if (!json || !len)
        return 0;
    cJSON *o = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return bad(err, errlen, "%s must be a JSON object", what);
    }
    *out = o;
    return 0;
}

/* Does this layer name an endpoint (a url or base_url that is not null)? */
static int has_endpoint(const cJSON *layer)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(layer, "url");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(layer, "base_url");
    return (u && !cJSON_IsNull(u)) || (b && !cJSON_IsNull(b));
}

llmretry_status llmretry_policies_resolve(const llmretry_policies *p, const char *name,
                                          const char *explicit_json, size_t explicit_len,
                                          const char *defaults_json, size_t defaults_len,
                                          char **out_json, char *err, size_t errlen)
{
    char why[LLMRETRY_ERRBUF];
    if (!out_json) {
        lr_errf(err, errlen, "out_json must not be NULL");
        return LLMRETRY_EINVAL;
    }
    *out_json = NULL;
    const cJSON *pol = NULL;
    if (name && !(pol = find(p, name))) {
        unknown_policy(p, name, err, errlen);
        return LLMRETRY_EINVAL;
    }
    cJSON *ex = NULL, *def = NULL;
    if (parse_layer(explicit_json, explicit_len, "the explicit options", &ex, err, errlen) != 0 ||
        parse_layer(defaults_json, defaults_len, "the client's defaults", &def, err, errlen) != 0) {
        cJSON_Delete(ex);
        return LLMRETRY_EINVAL;
    }
    /* The endpoint is one setting made of two keys: the highest layer that
     * names one (url or base_url) gives both, so a policy's base_url beats
     * a client's default url and a call's url beats a policy's base_url. */
    const cJSON *endpoint = has_endpoint(ex) ? ex : has_endpoint(pol) ? pol
                          : has_endpoint(def) ? def : NULL;
    cJSON *out = cJSON_CreateObject();
    llmretry_status st = out ? LLMRETRY_OK : LLMRETRY_ENOMEM;
    const key_rule *r;
    for (size_t i = 0; st == LLMRETRY_OK && (r = key_at(i)); i++) {
        /* In a call's or a client's options null means "not given"; in a
         * policy it means "unset" (no deadline, the default statuses). */
        const cJSON *v;
        if (strcmp(r->name, "url") == 0)
            continue;               /* listed below, only when set */
        if (strcmp(r->name, "base_url") == 0) {
            v = endpoint ? cJSON_GetObjectItemCaseSensitive(endpoint, "base_url") : NULL;
            if (v && cJSON_IsNull(v))
                v = NULL;
        } else {
            v = cJSON_GetObjectItemCaseSensitive(ex, r->name);
            if (!v || cJSON_IsNull(v))
                v = cJSON_GetObjectItemCaseSensitive(pol, r->name);
            if (!v) {
                v = cJSON_GetObjectItemCaseSensitive(def, r->name);
                if (v && cJSON_IsNull(v))
                    v = NULL;
            }
        }
        cJSON *copy = v ? cJSON_Duplicate(v, 1) : cJSON_Parse(r->builtin);
        if (v && check_rule(r, v, 0, why, sizeof why) != 0) {
            lr_errf(err, errlen, "%s", why);
            st = LLMRETRY_EINVAL;
        } else if (!copy || !cJSON_AddItemToObject(out, r->name, copy)) {
            st = LLMRETRY_ENOMEM;
        } else {
            copy = NULL;
        }
        cJSON_Delete(copy);
    }
    /* url is listed only when the endpoint's layer set it (a null url is
     * base_url's business). */
    const cJSON *url = endpoint ? cJSON_GetObjectItemCaseSensitive(endpoint, "url") : NULL;
    if (st == LLMRETRY_OK && cJSON_IsString(url)) {
        if (check_text(llmretry_option_find("url"), url, why, sizeof why) != 0) {
            lr_errf(err, errlen, "%s", why);
            st = LLMRETRY_EINVAL;
        } else if (!cJSON_AddStringToObject(out, "url", url->valuestring)) {
            st = LLMRETRY_ENOMEM;
        }
    }
    cJSON_Delete(ex);
    cJSON_Delete(def);
    if (st == LLMRETRY_OK && !(*out_json = cJSON_PrintUnformatted(out)))
        st = LLMRETRY_ENOMEM;
    cJSON_Delete(out);
    return st;
}

llmretry_status llmretry_policy_check_value(const char *key, const char *json, size_t len,
                                            char *err, size_t errlen)
{
    const key_rule *r = key ? rule_of(key) : NULL;
    if (!r) {
        char keys[800];
        known_keys(keys, sizeof keys);
        lr_errf(err, errlen, "unknown key '%s' (known: %s)", key ? key : "(null)", keys);
        return LLMRETRY_EINVAL;
    }
    cJSON *v = json ? cJSON_ParseWithLength(json, len) : NULL;
    if (!v) {
        lr_errf(err, errlen, "%s: the value is not JSON", key);
        return LLMRETRY_EINVAL;
    }
    int rc = check_rule(r, v, 0, err, errlen);
    cJSON_Delete(v);
    return rc == 0 ? LLMRETRY_OK : LLMRETRY_EINVAL;
}
