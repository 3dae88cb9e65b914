/* Repair retries (option repair, docs/structured-outputs.md): after an
 * answer that failed its schema or the host's validate, the next attempt's
 * body is the target's own body with two more messages, the failed answer
 * (as the assistant's) and one user message naming what was wrong, as
 * instructor does. Built from the target's body each time, so a body never
 * grows past one failed answer; a fallback target starts from its own.
 * Engine thread. */
#include "engine.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The answer's text of a response body (choice 0's message content, or a
 * Responses answer's output text), malloc'd; NULL when it has none. */
static char *answer_text(const char *body, size_t len)
{
    cJSON *doc = cJSON_ParseWithLength(body, len);
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(doc, "choices");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(choices, 0), "message");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    char *text = cJSON_IsString(content) ? lr_strdup(content->valuestring) : NULL;
    const cJSON *output = cJSON_GetObjectItemCaseSensitive(doc, "output");
    for (const cJSON *item = !text && cJSON_IsArray(output) ? output->child : NULL; item;
         item = item->next) {
        const cJSON *parts = cJSON_GetObjectItemCaseSensitive(item, "content");
        for (const cJSON *p = cJSON_IsArray(parts) ? parts->child : NULL; p; p = p->next) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (cJSON_IsString(type) && strcmp(type->valuestring, "output_text") == 0 &&
                cJSON_IsString(t)) {
                text = lr_strdup(t->valuestring);   /* the first part: what was answered */
                break;
            }
        }
        if (text)
            break;
    }
    cJSON_Delete(doc);
    return text;
}

/* The user message naming what was wrong: the schema's errors, else the
 * failure's own message (a validate rejection). */
static char *what_was_wrong(const llmretry_call *c)
{
    size_t cap = 4096, n = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    n += (size_t)snprintf(out, cap, "Your answer was rejected:\n");
    cJSON *errs = c->last_validation_errors ? cJSON_Parse(c->last_validation_errors) : NULL;
    const cJSON *e;
    cJSON_ArrayForEach(e, errs) {
        const char *path = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "path"));
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message"));
        if (path && msg && n < cap)
            n += (size_t)snprintf(out + n, cap - n, "- %s: %s\n", path, msg);
    }
    cJSON_Delete(errs);
    if (!c->last_validation_errors && c->last_message && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "- %s\n", c->last_message);
    if (n < cap)
        snprintf(out + n, cap - n, "Answer again, with JSON that fixes these errors.");
    return out;
}

static cJSON *message(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    if (m && (!cJSON_AddStringToObject(m, "role", role) ||
              !cJSON_AddStringToObject(m, "content", content))) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

/* Append the failed answer and the user message to the body's messages
 * (Chat Completions) or input (Responses: a string input becomes the first
 * message). 0, or -1 when the body has neither (or out of memory). */
static int append_turns(cJSON *doc, const char *answer, const char *note)
{
    cJSON *list = cJSON_GetObjectItemCaseSensitive(doc, "messages");
    if (!cJSON_IsArray(list)) {
        cJSON *input = cJSON_GetObjectItemCaseSensitive(doc, "input");
        if (cJSON_IsString(input)) {
            cJSON *first = message("user", input->valuestring);
            cJSON *arr = cJSON_CreateArray();
            if (!first || !arr || !cJSON_AddItemToArray(arr, first)) {
                cJSON_Delete(first);
                cJSON_Delete(arr);
                return -1;
            }
            cJSON_ReplaceItemInObjectCaseSensitive(doc, "input", arr);
            input = arr;
        }
        list = cJSON_IsArray(input) ? input : NULL;
    }
    cJSON *a = list ? message("assistant", answer) : NULL;
    cJSON *u = a ? message("user", note) : NULL;
    if (!u || !cJSON_AddItemToArray(list, a)) {
        cJSON_Delete(a);
        cJSON_Delete(u);
        return -1;
    }
    return cJSON_AddItemToArray(list, u) ? 0 : (cJSON_Delete(u), -1);
}

int lr_repair_body(llmretry_call *c)
{
    if (!c->o.repair || c->last_kind != LLMRETRY_ERR_INVALID_RESPONSE || !c->resp.data)
        return 0;
    char *answer = answer_text(c->resp.data, c->resp.len);
    if (!answer)
        return 0;                   /* nothing was answered (not JSON at all): a plain retry */
    const lr_target *t = &c->targets[c->target];
    cJSON *doc = cJSON_ParseWithLength(t->body, t->body_len);
    char *note = what_was_wrong(c);
    char *body = NULL;
    if (doc && note && append_turns(doc, answer, note) == 0)
        body = cJSON_PrintUnformatted(doc);
    cJSON_Delete(doc);
    free(note);
    free(answer);
    if (!body)
        return 0;
    free(c->repair_body);
    c->repair_body = body;
    c->body = body;
    c->o.body = body;
    c->o.body_len = strlen(body);
    return 1;
}
