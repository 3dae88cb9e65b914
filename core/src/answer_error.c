/* A 2xx answer that is not one (docs/reliability.md,
 * "A 200 that is not an answer"). Gateways commit their status line before
 * the model runs: OpenRouter documents that an error met while the model
 * produces its answer comes in a 200's body, and others (proxies in front
 * of a rate-limited provider) answer 200 with no choices at all. Such a
 * body is an attempt that failed, judged as the same error inside a
 * stream is (sse_payload.c): its code decides, so a 429 or a 502 in the
 * body is retried as one, and a 400 is not. A body with no choices says
 * nothing of why: an invalid response (retried while
 * retry_invalid_response allows).
 *
 * Only answers to the generation endpoints are judged (a POST whose path
 * ends in one of theirs): a fine-tuning job or a retrieved Responses
 * object may carry an "error" of a job that failed, and that is what was
 * asked for. Engine thread. */
#include "sse.h"
#include "internal.h"

#include <cjson/cJSON.h>
#include <string.h>

typedef enum answer_kind { ANSWER_NONE, ANSWER_CHOICES, ANSWER_DATA, ANSWER_RESPONSE } answer_kind;

static answer_kind answer_kind_of(const llmretry_call *c)
{
    if (c->o.method != LLMRETRY_METHOD_POST || !c->url)
        return ANSWER_NONE;
    if (lr_url_path_ends(c->url, "/completions"))   /* chat/completions too */
        return ANSWER_CHOICES;
    if (lr_url_path_ends(c->url, "/responses"))
        return ANSWER_RESPONSE;
    if (lr_url_path_ends(c->url, "/embeddings"))
        return ANSWER_DATA;
    return ANSWER_NONE;
}

/* Is the value at v (NULL: absent) an array with at least one element? */
static int nonempty_array(const char *v, const char *end)
{
    if (!v || *v != '[')
        return 0;
    for (v++; v < end && (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r'); v++)
        ;
    return v < end && *v != ']';
}

/* Does the body possibly say it failed? From what lr_read_body found in
 * its one pass, on every success: the tree is built only when it might (a
 * member "error", a Responses status, a choice's finish_reason). */
static int may_say_failed(answer_kind kind, const lr_body_tops *t)
{
    if (t->error && *t->error != 'n')        /* "error": null is none */
        return 1;
    if (kind == ANSWER_RESPONSE)
        return t->failed;
    return kind == ANSWER_CHOICES && t->error_choice;
}

int lr_answer_error(llmretry_call *c, const char *text, size_t n, const lr_body_tops *t,
                    lr_outcome *out)
{
    answer_kind kind = answer_kind_of(c);
    if (kind == ANSWER_NONE)
        return 0;
    long status = lr_call_status(c);
    if (may_say_failed(kind, t)) {
        const char *why;
        cJSON *doc = lr_parse_body(text, n, &why);
        lr_sse_payload p;
        int rc = doc ? lr_body_error(doc, kind == ANSWER_RESPONSE, &p) : 0;
        cJSON_Delete(doc);
        if (rc == LR_SSE_NOMEM) {
            out->f.kind = LLMRETRY_ERR_NETWORK;
            out->message = lr_strdup("out of memory reading the answer");
            return 1;
        }
        if (rc == 1) {
            lr_sse_payload_failure(&p, &out->f);
            /* Its code and message screened as an HTTP error's are. */
            out->error_code = lr_error_code_checked(c, p.code);
            out->f.error_code = out->error_code;
            out->message = lr_body_error_text(c, status, out->f.status);
            return 1;
        }
    }
    if (kind == ANSWER_CHOICES && !nonempty_array(t->choices, text + n)) {
        out->f.kind = LLMRETRY_ERR_INVALID_RESPONSE;
        out->message = lr_printf_alloc("HTTP %ld with no answer: the body has no choices", status);
        return 1;
    }
    if (kind == ANSWER_DATA && !(t->data && *t->data == '[')) {
        out->f.kind = LLMRETRY_ERR_INVALID_RESPONSE;
        out->message = lr_printf_alloc("HTTP %ld with no answer: the body has no data list",
                                       status);
        return 1;
    }
    return 0;
}
