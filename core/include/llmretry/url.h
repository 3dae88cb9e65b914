/* llmretry/url.h — URL text: how a base URL and a path join, and how a URL
 * may be shown. The engine's own rules, for hosts that build or show URLs
 * themselves (the Batch API's Files URLs, a client's repr).
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_URL_H
#define LLMRETRY_URL_H

#ifdef __cplusplus
extern "C" {
#endif

/* base + path as the engine joins a base_url and an endpoint's path
 * ("/chat/completions"): base's trailing slashes trimmed, the path before
 * base's query (Azure's "?api-version=..."), base's fragment dropped (it
 * is never sent). malloc'd (free with llmretry_free); NULL when out of
 * memory. */
char *llmretry_url_join(const char *base, const char *path);

/* url as stats and reprs show it: its user info and its query, where a
 * password or a provider's key can be, each "***" when there is one, and
 * no fragment. https://user:pw@host/v1?key=k#f is shown as https://, then
 * ***@host/v1?*** (the endpoint stats' url). malloc'd (free with
 * llmretry_free); NULL when out of memory. */
char *llmretry_url_shown(const char *url);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_URL_H */
