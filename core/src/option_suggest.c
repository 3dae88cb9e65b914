/* What an unknown option name was meant to be (llmretry/options.h): a
 * field of the request body given beside it, or the known name a typo, a
 * unit left off or another library's spelling most likely meant. One rule
 * for every shim's message. */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define NAME_MAX_LEN 64

/* name lower-cased, without '_' and '-': "maxRetries", "max-retries" and
 * "max_retries" are one. Its length; 0 when too long to compare. */
static size_t folded(const char *name, char *out)
{
    size_t n = 0;
    for (const char *s = name; *s; s++) {
        if (*s == '_' || *s == '-')
            continue;
        if (n + 1 >= NAME_MAX_LEN)
            return 0;
        out[n++] = (char)tolower((unsigned char)*s);
    }
    out[n] = '\0';
    return n;
}

/* Edit distance with adjacent transpositions (max_retires is one edit
 * from max_retries), over strings shorter than NAME_MAX_LEN: three rows of
 * the table (this one, the last, the one before). */
static size_t distance(const char *a, size_t na, const char *b, size_t nb)
{
    size_t rows[3][NAME_MAX_LEN], *before = rows[0], *last = rows[1], *row = rows[2];
    for (size_t j = 0; j <= nb; j++)
        last[j] = j;
    for (size_t i = 1; i <= na; i++) {
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t best = last[j - 1] + (a[i - 1] != b[j - 1]);
            if (last[j] + 1 < best)
                best = last[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                before[j - 2] + 1 < best)
                best = before[j - 2] + 1;
            row[j] = best;
        }
        size_t *spare = before;
        before = last;
        last = row;
        row = spare;
    }
    return last[nb];
}

/* Is `part` one or more whole '_'-separated words of `name`
 * ("retries" of "max_retries", "retry_after" of "max_retry_after_ms")? */
static int has_words(const char *name, const char *part)
{
    size_t k = strlen(part);
    for (const char *s = strstr(name, part); k && s; s = strstr(s + 1, part))
        if ((s == name || s[-1] == '_') && (s[k] == '\0' || s[k] == '_'))
            return 1;
    return 0;
}

static const char *name_at(const char *const *names, size_t i)
{
    if (names)
        return names[i];
    const llmretry_option_info *opt = llmretry_option_at(i);
    return opt ? opt->name : NULL;
}

const char *llmretry_option_suggest(const char *name, const char *const *names, size_t n)
{
    char want[NAME_MAX_LEN], have[NAME_MAX_LEN], with_ms[NAME_MAX_LEN + 3];
    size_t nw = name ? folded(name, want) : 0;
    if (nw == 0)
        return NULL;
    if (!names)
        n = llmretry_option_count();
    for (size_t i = 0; i < n; i++) {
        const char *cand = name_at(names, i);
        if (cand && strcmp(cand, name) == 0)
            return NULL;                    /* known: nothing to suggest */
    }
    /* Times are in milliseconds: timeout meant timeout_ms. */
    snprintf(with_ms, sizeof with_ms, "%sms", want);
    const char *by_words = NULL, *nearest = NULL;
    size_t n_words = 0, best = (size_t)-1, n_best = 0, n_nearest = 0;
    for (size_t i = 0; i < n; i++) {
        const char *cand = name_at(names, i);
        size_t nh = cand ? folded(cand, have) : 0;
        if (nh == 0)
            continue;
        if (strcmp(have, want) == 0 || strcmp(have, with_ms) == 0)
            return cand;                    /* the same name spelt otherwise */
        if (has_words(cand, name)) {
            by_words = cand;
            n_words++;
        }
        size_t d = distance(want, nw, have, nh);
        if (d < best) {
            best = d;
            nearest = cand;
            n_nearest = nh;
            n_best = 1;
        } else if (d == best) {
            n_best++;
        }
    }
    /* Near enough to be a typo: at most one edit in three letters (of the
     * longer), and no other name as near (max_retry meant max_retries,
     * not max_retry_after_ms, whose words it is). */
    size_t longer = n_nearest > nw ? n_nearest : nw;
    if (nearest && n_best == 1 && best * 3 <= longer)
        return nearest;
    return n_words == 1 ? by_words : NULL;  /* cooldown meant breaker_cooldown_ms */
}

/* The fields of a chat, completions, responses or embeddings request that
 * a newcomer passes as options (call_llm(model=..., messages=...)). */
static const char *const BODY_FIELDS[] = {
    "model", "messages", "prompt", "input", "temperature", "max_tokens",
    "max_completion_tokens", "top_p", "n", "stop", "seed", "tools", "tool_choice",
    "response_format", "stream", "stream_options", "user", NULL,
};

const char *const *llmretry_body_fields(void)
{
    return BODY_FIELDS;
}
