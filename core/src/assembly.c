/* Stream assembly: chat.completion.chunk objects merged into one
 * chat.completion (the rules are in assembly.h). Every concatenated string
 * is a growable buffer doubled as needed, so a stream of many tiny deltas
 * costs O(total bytes), never a copy per chunk; every index is bounded
 * before it addresses anything, so memory stays proportional to the input. */
#include "assembly.h"
#include "internal.h"
#include "sse.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The string fields of a delta that are concatenated, in output order. */
enum { F_CONTENT, F_REASONING_CONTENT, F_REASONING, F_REFUSAL, F_COUNT };
static const char *const text_key[F_COUNT] = {
    "content", "reasoning_content", "reasoning", "refusal"
};

/* The logprobs arrays that are concatenated. */
enum { LP_CONTENT, LP_REFUSAL, LP_COUNT };
static const char *const lp_key[LP_COUNT] = { "content", "refusal" };

typedef struct tool_call {
    char *id, *type, *name;
    lr_buf args;                  /* data == NULL: no arguments came */
} tool_call;

typedef struct choice {
    char *role, *finish;
    lr_buf text[F_COUNT];         /* data == NULL: that field never came */
    cJSON *lp[LP_COUNT];          /* NULL until a chunk had that array */
    tool_call **calls;            /* calls_cap slots, grown as indexes come */
    int calls_cap;
    int ncalls;                   /* highest used call index + 1 */
    int last_call;                /* the call an unindexed piece continues */
} choice;

struct lr_asm {
    lr_asm_stats stats;
    char *id, *model, *fingerprint;
    double created;
    int has_created;
    cJSON *usage;                 /* a copy of the last usage object */
    /* Grown as indexes come (up to LR_ASM_MAX_CHOICES): the assembler
     * lives as long as its stream is open, and nearly every stream has one
     * choice, so 128 slots up front were 1 KiB of each open stream. */
    choice **choices;
    int choices_cap;
};

/* Room for slot i in an array of pointers grown by doubling, the new slots
 * NULL: *slots is realloc'd, *cap updated. 0, or -1 when out of memory (the
 * array stays as it was). One function for both kinds of slots: `slots`
 * is a choice ** or a tool_call ** (its address as void *). */
static int reserve_slot(void *slots, int *cap, int i)
{
    if (i < *cap)
        return 0;
    int n = *cap ? *cap : 1;
    while (n <= i)
        n *= 2;
    void *old, *grown;
    memcpy(&old, slots, sizeof old);
    if (!(grown = realloc(old, (size_t)n * sizeof(void *))))
        return -1;
    memset((char *)grown + (size_t)*cap * sizeof(void *), 0,
           (size_t)(n - *cap) * sizeof(void *));
    memcpy(slots, &grown, sizeof grown);
    *cap = n;
    return 0;
}

/* ---- building blocks --------------------------------------------------- */

static const cJSON *get(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* obj[key] when it is a string, else NULL. */
static const char *str_at(const cJSON *obj, const char *key)
{
    const cJSON *v = get(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Keep the first non-empty string obj[key] in *slot. -1 when out of memory. */
static int keep_first(char **slot, const cJSON *obj, const char *key)
{
    const char *s = str_at(obj, key);
    if (*slot || !s || !s[0])
        return 0;
    *slot = lr_strdup(s);
    return *slot ? 0 : -1;
}

/* obj["index"] as an integer in 0..max-1; dflt when it is missing or null;
 * -1 when it is anything else, so the entry is dropped. */
static int index_of(const cJSON *obj, int dflt, int max)
{
    const cJSON *v = get(obj, "index");
    if (!v || cJSON_IsNull(v))
        return dflt;
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d < (double)max) || d != (double)(int)d)
        return -1;
    return (int)d;
}

/* ---- merging one chunk ------------------------------------------------- */

/* The index of a tool call that came without one: a new call when its id
 * differs from the last call's, else the last call (or 0 for the first). */
static int implicit_call(const choice *ch, const cJSON *t)
{
    const char *id = str_at(t, "id");
    if (ch->ncalls == 0)
        return 0;
    const tool_call *last = ch->calls[ch->last_call];
    if (id && id[0] && last->id && strcmp(last->id, id) != 0)
        return ch->ncalls < LR_ASM_MAX_TOOL_CALLS ? ch->ncalls : -1;
    return ch->last_call;
}

static int add_tool_call(choice *ch, const cJSON *t)
{
    if (!cJSON_IsObject(t))
        return 0;
    const cJSON *iv = get(t, "index");
    int i = !iv || cJSON_IsNull(iv) ? implicit_call(ch, t)
                                    : index_of(t, 0, LR_ASM_MAX_TOOL_CALLS);
    if (i < 0)
        return 0;
    if (reserve_slot(&ch->calls, &ch->calls_cap, i))
        return -1;
    if (!ch->calls[i] && !(ch->calls[i] = calloc(1, sizeof *ch->calls[i])))
        return -1;
    tool_call *tc = ch->calls[i];
    ch->ncalls = i >= ch->ncalls ? i + 1 : ch->ncalls;
    ch->last_call = i;
    if (keep_first(&tc->id, t, "id") || keep_first(&tc->type, t, "type"))
        return -1;
    const cJSON *fn = cJSON_IsObject(get(t, "function")) ? get(t, "function") : NULL;
    const char *args = str_at(fn, "arguments");
    if (keep_first(&tc->name, fn, "name"))
        return -1;
    return args ? lr_buf_add(&tc->args, args, strlen(args)) : 0;
}

static int add_delta(choice *ch, const cJSON *d)
{
    if (keep_first(&ch->role, d, "role"))
        return -1;
    for (int f = 0; f < F_COUNT; f++) {
        const char *s = str_at(d, text_key[f]);
        if (s && lr_buf_add(&ch->text[f], s, strlen(s)))
            return -1;
    }
    const cJSON *calls = get(d, "tool_calls"), *t;
    if (cJSON_IsArray(calls))
        cJSON_ArrayForEach(t, calls)
            if (add_tool_call(ch, t))
                return -1;
    return 0;
}

static int add_logprobs(choice *ch, const cJSON *lp)
{
    for (int k = 0; k < LP_COUNT; k++) {
        const cJSON *arr = get(lp, lp_key[k]), *item;
        if (!cJSON_IsArray(arr))
            continue;
        if (!ch->lp[k] && !(ch->lp[k] = cJSON_CreateArray()))
            return -1;
        cJSON_ArrayForEach(item, arr) {
            cJSON *copy = cJSON_Duplicate(item, 1);
            if (!copy)
                return -1;
            cJSON_AddItemToArray(ch->lp[k], copy);   /* O(1): cJSON keeps the tail */
        }
    }
    return 0;
}

static int add_choice(lr_asm *a, const cJSON *c)
{
    if (!cJSON_IsObject(c))
        return 0;
    int i = index_of(c, 0, LR_ASM_MAX_CHOICES);
    if (i < 0)
        return 0;
    if (reserve_slot(&a->choices, &a->choices_cap, i) ||
        (!a->choices[i] && !(a->choices[i] = calloc(1, sizeof *a->choices[i]))))
        return -1;
    choice *ch = a->choices[i];
    const cJSON *d = get(c, "delta");
    if (cJSON_IsObject(d) && add_delta(ch, d))
        return -1;
    const char *fr = str_at(c, "finish_reason");
    /* "" counts as none: some servers send it on every unfinished chunk. */
    if (fr && fr[0]) {
        char *s = lr_strdup(fr);
        if (!s)
            return -1;
        free(ch->finish);
        ch->finish = s;
        a->stats.finished = 1;
    }
    const cJSON *lp = get(c, "logprobs");
    return cJSON_IsObject(lp) ? add_logprobs(ch, lp) : 0;
}

static int add_usage(lr_asm *a, const cJSON *chunk)
{
    const cJSON *u = get(chunk, "usage");
    if (!cJSON_IsObject(u))
        return 0;
    cJSON *copy = cJSON_Duplicate(u, 1);
    if (!copy)
        return -1;
    cJSON_Delete(a->usage);
    a->usage = copy;
    /* The counts as a plain body's are read; model and fingerprint are
     * kept by the first-seen rule instead. */
    char *model = NULL, *fingerprint = NULL;
    lr_read_success(chunk, &a->stats.usage, &model, &fingerprint);
    free(model);
    free(fingerprint);
    return 0;
}

llmretry_status lr_asm_add(lr_asm *a, const cJSON *chunk)
{
    a->stats.chunks++;
    if (!cJSON_IsObject(chunk))
        return LLMRETRY_OK;
    if (keep_first(&a->id, chunk, "id") || keep_first(&a->model, chunk, "model") ||
        keep_first(&a->fingerprint, chunk, "system_fingerprint"))
        return LLMRETRY_ENOMEM;
    const cJSON *created = get(chunk, "created");
    if (!a->has_created && cJSON_IsNumber(created)) {
        a->created = created->valuedouble;
        a->has_created = 1;
    }
    if (add_usage(a, chunk))
        return LLMRETRY_ENOMEM;
    const cJSON *choices = get(chunk, "choices"), *c;
    if (cJSON_IsArray(choices))
        cJSON_ArrayForEach(c, choices)
            if (add_choice(a, c))
                return LLMRETRY_ENOMEM;
    return LLMRETRY_OK;
}

/* ---- the result -------------------------------------------------------- */

/* by_ref: the tree points into the assembler (strings and arrays as cJSON
 * references, which cJSON_Delete leaves alone), only to be printed. */
static cJSON *str_item(const char *s, int by_ref)
{
    return !s ? cJSON_CreateNull() : by_ref ? cJSON_CreateStringReference(s)
                                            : cJSON_CreateString(s);
}

/* Add item under a constant key; -1 (item freed) when item is NULL. */
static int put(cJSON *obj, const char *key, cJSON *item)
{
    if (item && cJSON_AddItemToObjectCS(obj, key, item))
        return 0;
    cJSON_Delete(item);
    return -1;
}

/* A new object appended to arr, or NULL. */
static cJSON *new_in(cJSON *arr)
{
    cJSON *o = cJSON_CreateObject();
    if (o && cJSON_AddItemToArray(arr, o))
        return o;
    cJSON_Delete(o);
    return NULL;
}

static int put_call(cJSON *arr, const tool_call *tc, int by_ref)
{
    cJSON *o = new_in(arr), *fn;
    if (!o || put(o, "id", str_item(tc->id, by_ref)) ||
        put(o, "type", str_item(tc->type ? tc->type : "function", by_ref)) ||
        put(o, "function", fn = cJSON_CreateObject()))
        return -1;
    return put(fn, "name", str_item(tc->name, by_ref)) ||
           put(fn, "arguments", str_item(tc->args.data ? tc->args.data : "", by_ref));
}

static int put_message(cJSON *m, const choice *ch, int by_ref)
{
    if (put(m, "role", str_item(ch->role ? ch->role : "assistant", by_ref)))
        return -1;
    for (int f = 0; f < F_COUNT; f++) {
        const char *s = ch->text[f].data;
        if ((s || f == F_CONTENT) && put(m, text_key[f], str_item(s, by_ref)))
            return -1;
    }
    if (ch->ncalls == 0)
        return 0;
    cJSON *arr;
    if (put(m, "tool_calls", arr = cJSON_CreateArray()))
        return -1;
    for (int i = 0; i < ch->ncalls; i++)
        if (ch->calls[i] && put_call(arr, ch->calls[i], by_ref))
            return -1;
    return 0;
}

static int put_choice(cJSON *arr, int index, const choice *ch, int by_ref)
{
    cJSON *o = new_in(arr), *m;
    if (!o || put(o, "index", cJSON_CreateNumber(index)) ||
        put(o, "message", m = cJSON_CreateObject()) ||
        put_message(m, ch, by_ref) ||
        put(o, "finish_reason", str_item(ch->finish, by_ref)))
        return -1;
    if (!ch->lp[LP_CONTENT] && !ch->lp[LP_REFUSAL])
        return 0;
    cJSON *lp;
    if (put(o, "logprobs", lp = cJSON_CreateObject()))
        return -1;
    for (int k = 0; k < LP_COUNT; k++) {
        const cJSON *src = ch->lp[k];
        if (src && put(lp, lp_key[k], by_ref ? cJSON_CreateArrayReference(src->child)
                                             : cJSON_Duplicate(src, 1)))
            return -1;
    }
    return 0;
}

static cJSON *build(const lr_asm *a, int by_ref)
{
    cJSON *root = cJSON_CreateObject(), *choices;
    if (!root || put(root, "id", str_item(a->id, by_ref)) ||
        put(root, "object", cJSON_CreateStringReference("chat.completion")) ||
        put(root, "created", a->has_created ? cJSON_CreateNumber(a->created)
                                            : cJSON_CreateNull()) ||
        put(root, "model", str_item(a->model, by_ref)) ||
        (a->fingerprint && put(root, "system_fingerprint", str_item(a->fingerprint, by_ref))) ||
        put(root, "choices", choices = cJSON_CreateArray()))
        goto fail;
    for (int i = 0; i < a->choices_cap; i++)
        if (a->choices[i] && put_choice(choices, i, a->choices[i], by_ref))
            goto fail;
    if (a->usage && put(root, "usage", by_ref ? cJSON_CreateObjectReference(a->usage->child)
                                              : cJSON_Duplicate(a->usage, 1)))
        goto fail;
    return root;
fail:
    cJSON_Delete(root);
    return NULL;
}

cJSON *lr_asm_result(const lr_asm *a)
{
    return build(a, 0);
}

char *lr_asm_result_text(const lr_asm *a, size_t *len)
{
    cJSON *tree = build(a, 1);
    char *text = tree ? cJSON_PrintUnformatted(tree) : NULL;
    cJSON_Delete(tree);
    /* The chunks' U+0000 back (sse.h, lr_sse_unmask). */
    size_t n = text ? lr_sse_unmask(text, strlen(text)) : 0;
    if (text && len)
        *len = n;
    return text;
}

/* ---- life cycle -------------------------------------------------------- */

lr_asm *lr_asm_new(void)
{
    return calloc(1, sizeof(lr_asm));
}

static void choice_free(choice *ch)
{
    free(ch->role);
    free(ch->finish);
    for (int f = 0; f < F_COUNT; f++)
        free(ch->text[f].data);
    for (int k = 0; k < LP_COUNT; k++)
        cJSON_Delete(ch->lp[k]);
    for (int i = 0; i < ch->ncalls; i++) {
        tool_call *tc = ch->calls[i];
        if (!tc)
            continue;
        free(tc->id);
        free(tc->type);
        free(tc->name);
        free(tc->args.data);
        free(tc);
    }
    free(ch->calls);
    free(ch);
}

void lr_asm_free(lr_asm *a)
{
    if (!a)
        return;
    for (int i = 0; i < a->choices_cap; i++)
        if (a->choices[i])
            choice_free(a->choices[i]);
    free(a->choices);
    free(a->id);
    free(a->model);
    free(a->fingerprint);
    cJSON_Delete(a->usage);
    free(a);
}

const lr_asm_stats *lr_asm_stats_of(const lr_asm *a)
{
    return &a->stats;
}
