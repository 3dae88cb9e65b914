/* libFuzzer target: URL text (url.c) on arbitrary strings: a base_url
 * comes from the user or $OPENAI_BASE_URL, and what llmretry_url_shown
 * makes of it goes to stats and reprs.
 *
 * Invariants:
 * - llmretry_url_join(base, path): the path's own query (the base's, if
 *   any) starts right after the path, so a base's query never swallows it;
 *   the result's path ends with the endpoint's; no fragment is kept.
 * - llmretry_url_shown(url): no fragment, and a query only as "?***" at
 *   the end; in the authority, an '@' only as "***@" (no user info shown);
 *   never longer than the URL plus the masks.
 * - lr_url_path: a span of url starting with '/', holding no '?' or '#'
 *   (or the constant "/").
 * Build: tools/fuzz.sh. */
#include "internal.h"
#include "fuzz_util.h"

static const char ENDPOINT[] = "/chat/completions";

static void check_join(const char *base)
{
    size_t plen = sizeof ENDPOINT - 1;
    char *r = llmretry_url_join(base, ENDPOINT);
    if (!r)
        abort();
    const char *q = strchr(r, '?');
    if (q && ((size_t)(q - r) < plen || memcmp(q - plen, ENDPOINT, plen) != 0))
        fail("join: a query before the endpoint's path");
    if (!lr_url_path_ends(r, ENDPOINT))
        fail("join: the path does not end with the endpoint's");
    if (strchr(r, '#'))
        fail("join: a fragment kept");
    llmretry_free(r);
}

static void check_shown(const char *url)
{
    char *s = llmretry_url_shown(url);
    if (!s)
        abort();
    size_t n = strlen(s);
    if (strchr(s, '#'))
        fail("shown: a fragment shown");
    const char *q = strchr(s, '?');
    if (q && strcmp(q, "?***") != 0)
        fail("shown: a query shown");
    if (n > strlen(url) + 3 + 4)
        fail("shown: longer than the url and its masks");
    /* The authority: past the first "://" when nothing of a path, a query
     * or a fragment comes before it, up to the first '/', '?' or '#'. */
    const char *sep = strstr(s, "://");
    const char *auth = sep && strcspn(s, "/?#") >= (size_t)(sep - s) ? sep + 3 : s;
    size_t alen = strcspn(auth, "/?#");
    const char *at = memchr(auth, '@', alen);
    if (at && (at != auth + 3 || memcmp(auth, "***", 3) != 0))
        fail("shown: user info shown");
    if (at && memchr(at + 1, '@', alen - (size_t)(at + 1 - auth)))
        fail("shown: a second '@' in the authority");
    llmretry_free(s);
}

static void check_path(const char *url)
{
    const char *p;
    size_t len;
    lr_url_path(url, &p, &len);
    if (len == 0 || p[0] != '/')
        fail("path: not a path");
    int inside = p >= url && p + len <= url + strlen(url);
    if (!inside && !(len == 1 && strcmp(p, "/") == 0))
        fail("path: outside the url");
    if (memchr(p, '?', len) || memchr(p, '#', len))
        fail("path: holds a query or a fragment");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The input up to its first NUL, as a C string of exactly its size. */
    size_t n = strnlen((const char *)data, size);
    char *url = malloc(n + 1);
    if (!url)
        abort();
    memcpy(url, data, n);
    url[n] = '\0';
    check_join(url);
    check_shown(url);
    check_path(url);
    lr_url_path_ends(url, "/embeddings");
    char *joined = llmretry_url_join(url, ENDPOINT);
    if (joined) {
        check_shown(joined);
        llmretry_free(joined);
    }
    free(url);
    return 0;
}
