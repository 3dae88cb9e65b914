/* URL text (llmretry/url.h): joining a base URL and a path, showing a URL
 * without its secrets, and reading a URL's path. Text only: nothing here
 * parses a URL for connecting (libcurl does, and host_io.c with its URL
 * API). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Where url's authority (user info, host, port) starts: past the first
 * "://" when no '/', '?' or '#' comes before it (a scheme, even a
 * misspelt one: "htps://user:pw@host" still has its user info hidden),
 * else at url's start, as libcurl guesses "http://" for "host:8000/v1".
 * A "://" after a '/' or a '?' is in a path or a query
 * ("h/v1?next=https://u:pw@x/"), not a scheme's. */
static const char *authority_of(const char *url)
{
    const char *sep = strstr(url, "://");
    return sep && strcspn(url, "/?#") >= (size_t)(sep - url) ? sep + 3 : url;
}

char *llmretry_url_join(const char *base, const char *path)
{
    const char *auth = authority_of(base);
    size_t n = (size_t)(auth - base) + strcspn(auth, "?#");
    const char *query = base[n] == '?' ? base + n : "";
    size_t qlen = strcspn(query, "#");
    while (n > 0 && base[n - 1] == '/')
        n--;
    size_t size = n + strlen(path) + qlen + 1;
    char *out = malloc(size);
    if (out)
        snprintf(out, size, "%.*s%s%.*s", (int)n, base, path, (int)qlen, query);
    return out;
}

char *llmretry_url_shown(const char *url)
{
    const char *auth = authority_of(url);
    const char *at = NULL;
    /* The last '@' before the first '/', '?' or '#' ends the user info,
     * as libcurl reads it. */
    for (size_t i = strcspn(auth, "/?#"); i > 0 && !at; i--)
        at = auth[i - 1] == '@' ? auth + i - 1 : NULL;
    const char *host = at ? at : auth;      /* "@host..." when there is user info */
    size_t head = (size_t)(auth - url), rest = strcspn(host, "?#");
    size_t size = head + 3 + rest + 4 + 1;
    char *out = malloc(size);
    if (out)
        snprintf(out, size, "%.*s%s%.*s%s", (int)head, url, at ? "***" : "", (int)rest, host,
                 host[rest] == '?' ? "?***" : "");
    return out;
}

void lr_url_path(const char *url, const char **path, size_t *len)
{
    const char *s = authority_of(url);
    s += strcspn(s, "/?#");
    *path = *s == '/' ? s : "/";
    *len = *s == '/' ? strcspn(s, "?#") : 1;
}

int lr_url_path_ends(const char *url, const char *suffix)
{
    const char *s;
    size_t n, k = strlen(suffix);
    lr_url_path(url, &s, &n);
    while (n > 0 && s[n - 1] == '/')
        n--;
    return n >= k && strncasecmp(s + n - k, suffix, k) == 0;
}
