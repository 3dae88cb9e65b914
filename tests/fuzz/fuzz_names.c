/* libFuzzer target: llmretry_option_suggest (option_suggest.c) on any
 * name, against the core's option table and against a list of names taken
 * from the input: Lua passes any string key of a table, with its own
 * names beside the table's.
 *
 * Invariants: the suggestion is NULL or one of the candidates (the same
 * pointer), never the name itself, and NULL for a name that is a
 * candidate. Build: tools/fuzz.sh. */
#include "llmretry.h"
#include "fuzz_util.h"

static void check(const char *name, const char *const *names, size_t n)
{
    const char *meant = llmretry_option_suggest(name, names, n);
    size_t count = names ? n : llmretry_option_count();
    int known = 0, member = meant == NULL;
    for (size_t i = 0; i < count; i++) {
        const char *cand = names ? names[i] : llmretry_option_at(i)->name;
        known |= strcmp(cand, name) == 0;
        member |= cand == meant;
    }
    if (!member)
        fail("a suggestion that is not a candidate");
    if (meant && strcmp(meant, name) == 0)
        fail("the name suggested for itself");
    if (known && meant)
        fail("a suggestion for a known name");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* name \0 candidate \0 candidate ... (each a C string of the input). */
    char *text = malloc(size + 1);
    if (!text)
        abort();
    memcpy(text, data, size);
    text[size] = '\0';
    const char *names[32];
    size_t n = 0;
    for (size_t at = strlen(text) + 1; at <= size && n < 32; at += strlen(text + at) + 1)
        names[n++] = text + at;
    check(text, NULL, 0);
    check(text, names, n);
    free(text);
    return 0;
}
