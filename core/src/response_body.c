/* A 2xx body judged once for every host: whether it is a valid body
 * (strict UTF-8 JSON), and its token usage, model and fingerprint — read
 * in place (lr_read_body) or from a parsed tree (lr_read_success). The
 * text of an HTTP error is response.c's. Engine thread only. */
#include "internal.h"
#include "json_pull.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* The bytes a string's text can hold as they are: ASCII from 0x20 on,
 * but not '"' (0x22) or '\\' (0x5C). Looked up in one step in
 * json_text_problem's inner loop: every answer's body is scanned on the
 * I/O thread, and most of a body is string text. */
#define LR_X16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v
static const unsigned char str_plain[256] = {
    LR_X16(0), LR_X16(0),                                   /* 0x00-0x1F: controls */
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,         /* 0x20-0x2F: '"' */
    LR_X16(1), LR_X16(1),                                   /* 0x30-0x4F */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1,         /* 0x50-0x5F: '\\' */
    LR_X16(1), LR_X16(1),                                   /* 0x60-0x7F */
    LR_X16(0), LR_X16(0), LR_X16(0), LR_X16(0),             /* 0x80-0xFF: UTF-8, */
    LR_X16(0), LR_X16(0), LR_X16(0), LR_X16(0),             /* checked below */
};
#undef LR_X16

/* The rules cJSON does not check but every host's decoder does: the text
 * is UTF-8, strings hold no raw control characters, outside strings only
 * JSON whitespace (cJSON skips any byte <= 0x20), and arrays and objects
 * nest at most LLMRETRY_MAX_BODY_DEPTH deep (cJSON allows 1000; Python's
 * decoder recurses out earlier, by how deep the caller's stack already
 * is). Run before cJSON, so a body a host could not decode is never
 * called a success. Returns what is wrong, or NULL. */
static const char *json_text_problem(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    int in_string = 0, depth = 0;
    for (size_t i = 0; i < n;) {
        if (in_string) {
            while (i < n && str_plain[s[i]])
                i++;
            if (i == n)
                break;
        }
        unsigned char c = s[i];
        if (c >= 0x80) {
            size_t len = lr_utf8_seq(s + i, n - i);
            if (len == 0)
                return "is not UTF-8";
            i += len;
            continue;
        }
        if (in_string) {
            if (c < 0x20)
                return "has a raw control character in a string";
            if (c == '"')
                in_string = 0;
            else if (c == '\\' && i + 1 < n && s[i + 1] < 0x80)
                i++;                /* the escaped byte cannot end the string */
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > LLMRETRY_MAX_BODY_DEPTH)
                return "nests deeper than " LR_STR(LLMRETRY_MAX_BODY_DEPTH) " levels";
        } else if (c == ']' || c == '}') {
            depth--;
        } else if (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            return "has a control character outside strings";
        }
        i++;
    }
    return NULL;
}

cJSON *lr_parse_body(const char *text, size_t n, const char **why)
{
    *why = json_text_problem(text, n);
    if (*why)
        return NULL;
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    /* cJSON stops at the value's end: "{} {}" (JSON Lines) is not one value. */
    while (doc && end < text + n && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
        end++;
    if (doc && end != text + n) {
        cJSON_Delete(doc);
        doc = NULL;
    }
    if (!doc)
        *why = "is not JSON";
    else if (!cJSON_IsObject(doc))
        *why = "is not a JSON object";
    return doc;
}

/* A token count the server reports: a whole number in 0..2^53 (exact in a
 * double, so in every host), else 0 like a missing one. Usage is the
 * server's data, not truth: a negative, fractional or huge count summed
 * into totals would corrupt every batch figure. The raw usage stays in
 * the body. */
static int64_t json_count(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= 9007199254740992.0))  /* also NaN */
        return 0;
    int64_t count = (int64_t)d;
    return (double)count == d ? count : 0;
}

char *lr_json_str(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? lr_strdup(v->valuestring) : NULL;
}

void lr_read_success(const cJSON *doc, llmretry_usage *usage, char **model, char **fingerprint)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(doc, "usage");
    if (cJSON_IsObject(u)) {
        usage->present = 1;
        /* The Responses API says input_tokens / output_tokens. */
        int chat = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens") ||
                   cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        usage->prompt_tokens = json_count(u, chat ? "prompt_tokens" : "input_tokens");
        usage->completion_tokens = json_count(u, chat ? "completion_tokens" : "output_tokens");
        /* Some servers send only the parts (an embeddings answer's
         * prompt_tokens): the total is then their sum, not 0. */
        usage->total_tokens = cJSON_GetObjectItemCaseSensitive(u, "total_tokens")
            ? json_count(u, "total_tokens")
            : usage->prompt_tokens + usage->completion_tokens;
    }
    *model = lr_json_str(doc, "model");
    *fingerprint = lr_json_str(doc, "system_fingerprint");
}

/* Does the key read at k name `name`? As cJSON compares: the decoded key
 * up to its first U+0000. Our names are short: a longer key is not one. */
static int key_is(const lr_jp_str *k, const char *name, size_t name_len)
{
    if (!k->escaped)
        return k->len == name_len && memcmp(k->raw, name, name_len) == 0;
    char buf[32];
    return lr_jp_decode(k, buf, sizeof buf) == name_len && memcmp(buf, name, name_len) == 0;
}

/* A member name and its length (no strlen on every body). */
typedef struct lr_name {
    const char *s;
    size_t n;
} lr_name;
#define LR_NAME(lit) { lit, sizeof lit - 1 }

static int walk_choices(lr_jp *j, int *error_choice);
#define NO_WALK ((size_t)-1)

/* The object at j->p ('{'), checked to its '}': for each of the n names,
 * where its first member's value starts (NULL if none), as
 * cJSON_GetObjectItemCaseSensitive finds the first. 0, or -1 when the
 * object is not JSON. One pass: the body's check and its reading. The
 * first member named names[walk] (NO_WALK: none), when it is an array, is
 * read by walk_choices instead of skipped, setting *error_choice. */
static int find_members(lr_jp *j, const lr_name *names, const char **at, size_t n,
                        size_t walk, int *error_choice)
{
    for (size_t i = 0; i < n; i++)
        at[i] = NULL;
    if (lr_jp_enter(j) != 0)
        return -1;
    lr_jp_ws(j);
    if (lr_jp_peek(j) == '}') {
        lr_jp_leave(j);
        return 0;
    }
    for (;;) {
        lr_jp_str key;
        if (lr_jp_member_key(j, &key) != 0)
            return -1;
        size_t found = n;
        for (size_t i = 0; i < n; i++)
            if (!at[i] && (key.escaped || key.len == names[i].n) &&
                key_is(&key, names[i].s, names[i].n)) {
                at[i] = j->p;
                found = i;
                break;
            }
        if (found == walk && lr_jp_peek(j) == '[' ? walk_choices(j, error_choice) != 0
                                                   : lr_jp_skip(j) != 0)
            return -1;
        lr_jp_ws(j);
        char c = lr_jp_peek(j);
        if (c != '}' && c != ',')
            return -1;
        if (c == '}') {
            lr_jp_leave(j);     /* its depth too: a body's choices are many objects */
            return 0;
        }
        j->p++;
        lr_jp_ws(j);
    }
}

/* The choices array at j->p ('['), checked to its ']': *error_choice set
 * when one of its objects has finish_reason "error" (answer_error.c reads
 * such a body again, as a tree, to judge it). In the same pass as the rest
 * of the body: the choices hold most of its bytes. */
/* Is the value at v (NULL: none) the string `word` (at most 15 bytes),
 * decoded up to a first U+0000 as cJSON's valuestring compares? */
static int is_text(const char *v, const char *end, const char *word)
{
    lr_jp k;
    lr_jp_str str;
    char buf[16];
    size_t n = strlen(word);
    if (!v || *v != '"')
        return 0;
    const char *q = v + 1;          /* the usual case: no escape, compared as it is */
    while (q < end && *q != '"' && *q != '\\')
        q++;
    if (q < end && *q == '"')
        return (size_t)(q - v - 1) == n && memcmp(v + 1, word, n) == 0;
    lr_jp_init(&k, v, (size_t)(end - v));
    return lr_jp_string(&k, &str) == 0 && lr_jp_decode(&str, buf, sizeof buf) == n &&
           memcmp(buf, word, n) == 0;
}

static int walk_choices(lr_jp *j, int *error_choice)
{
    static const lr_name fr[] = { LR_NAME("finish_reason") };
    if (lr_jp_enter(j) != 0)
        return -1;
    lr_jp_ws(j);
    if (lr_jp_peek(j) == ']') {
        lr_jp_leave(j);
        return 0;
    }
    for (;;) {
        const char *at;
        if (lr_jp_peek(j) == '{') {
            if (find_members(j, fr, &at, 1, NO_WALK, NULL) != 0)
                return -1;
            if (is_text(at, j->end, "error"))
                *error_choice = 1;
        } else if (lr_jp_skip(j) != 0) {
            return -1;
        }
        lr_jp_ws(j);
        char c = lr_jp_peek(j);
        if (c != ']' && c != ',')
            return -1;
        if (c == ']') {
            lr_jp_leave(j);
            return 0;
        }
        j->p++;
        lr_jp_ws(j);
    }
}

/* json_count for a value at v (NULL: missing). */
static int64_t count_at(const char *v, const char *end)
{
    double d;
    lr_jp j;
    if (!v || !(*v == '-' || (*v >= '0' && *v <= '9')))
        return 0;
    lr_jp_init(&j, v, (size_t)(end - v));
    if (lr_jp_number(&j, &d) != 0)
        return 0;
    if (!(d >= 0.0 && d <= 9007199254740992.0))  /* also NaN */
        return 0;
    int64_t count = (int64_t)d;
    return (double)count == d ? count : 0;
}

/* json_str for a value at v: its decoded text up to a first U+0000. */
static char *str_at(const char *v, const char *end)
{
    lr_jp j;
    lr_jp_str s;
    if (!v || *v != '"')
        return NULL;
    lr_jp_init(&j, v, (size_t)(end - v));
    lr_jp_string(&j, &s);
    size_t len = s.escaped ? lr_jp_decode(&s, NULL, 0) : s.len;
    char *out = malloc(len + 1);
    if (!out)
        return NULL;
    if (s.escaped)
        lr_jp_decode(&s, out, len + 1);
    else
        memcpy(out, s.raw, len), out[len] = '\0';
    return out;
}

int lr_read_body(const char *text, size_t n, const char **why, llmretry_usage *usage,
                 char **model, char **fingerprint, lr_body_tops *tops)
{
    *model = *fingerprint = NULL;
    memset(tops, 0, sizeof *tops);
    const char *end = text + n;
    lr_jp j;
    lr_jp_init(&j, text, n);
    if (n >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        j.p += 3;                   /* a UTF-8 byte-order mark, as cJSON skips it */
    lr_jp_ws(&j);
    static const lr_name top[] = { LR_NAME("usage"), LR_NAME("model"),
                                   LR_NAME("system_fingerprint"), LR_NAME("error"),
                                   LR_NAME("choices"), LR_NAME("data"), LR_NAME("status") };
    const char *at[7];
    int object = lr_jp_peek(&j) == '{';
    int bad = object ? find_members(&j, top, at, 7, 4 /* choices */, &tops->error_choice) != 0
                     : lr_jp_skip(&j) != 0;
    lr_jp_ws(&j);
    /* Strict JSON holds to every rule of json_text_problem but the depth:
     * that scan runs only to say why a body is refused. */
    if (bad || j.p != end || j.max_depth > LLMRETRY_MAX_BODY_DEPTH) {
        /* The client asks for no encoding, so compressed bytes are a
         * proxy's doing: say that, not where the first bad byte is. */
        if (n >= 2 && memcmp(text, "\x1f\x8b", 2) == 0) {
            *why = "is gzip-compressed, which the client did not ask for (a proxy or "
                   "gateway adding Content-Encoding?)";
            return -1;
        }
        *why = json_text_problem(text, n);
        if (!*why)
            *why = "is not JSON";
        return -1;
    }
    if (!object) {
        *why = "is not a JSON object";
        return -1;
    }
    if (at[0] && *at[0] == '{') {
        /* as lr_read_success reads a usage object, member for member */
        static const lr_name names[] = { LR_NAME("prompt_tokens"), LR_NAME("completion_tokens"),
                                         LR_NAME("input_tokens"), LR_NAME("output_tokens"),
                                         LR_NAME("total_tokens") };
        const char *u[5];
        lr_jp_init(&j, at[0], (size_t)(end - at[0]));
        find_members(&j, names, u, 5, NO_WALK, NULL);
        usage->present = 1;
        int chat = u[0] || u[1];
        usage->prompt_tokens = count_at(chat ? u[0] : u[2], end);
        usage->completion_tokens = count_at(chat ? u[1] : u[3], end);
        usage->total_tokens = u[4] ? count_at(u[4], end)
                                   : usage->prompt_tokens + usage->completion_tokens;
    }
    *model = str_at(at[1], end);
    *fingerprint = str_at(at[2], end);
    tops->error = at[3];
    tops->choices = at[4];
    tops->data = at[5];
    tops->failed = is_text(at[6], end, "failed");
    return 0;
}

/* Append s (n bytes) to out (room for cap bytes with the NUL), escaping
 * control characters, DEL and bytes that are not UTF-8 as \n, \r, \t or
 * \xNN: a server's text must not start a new log line or break a host's
 * decoder. Whole characters only; returns the new length, and in *taken
 * (when non-NULL) how many bytes of s it holds. */
