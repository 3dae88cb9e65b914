/* llmretry/policies.h — named policies: sets of call options as plain data.
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_POLICIES_H
#define LLMRETRY_POLICIES_H

#include <stddef.h>
#include <stdint.h>
#include "llmretry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Named policies: sets of call options as plain data.                  */
/* ------------------------------------------------------------------ */

/* A policies document is a JSON object {name: {key: value, ...}, ...}; the
 * keys are llmretry_policy_key(0..), each with the rules of docs/reliability.md
 * (types, ranges), plus base_url, model and idempotency_key ("auto" only).
 * JSON null in a policy means "unset" for base_url, model, deadline_ms,
 * retry_statuses and idempotency_key. Integers are exact JSON integers
 * (|n| <= 2^53 - 1). Everything is checked at parse time; EINVAL's message
 * names the source (when given), the policy and the key, e.g.
 *   policies.json: policy 'fast': timeout_ms must be an integer (got string)
 * Hosts with other formats (Python's TOML, a Lua table) convert to JSON and
 * call this, so every binding accepts and refuses alike, with one text. */
typedef struct llmretry_policies llmretry_policies;

llmretry_status llmretry_policies_parse(const char *json, size_t len, const char *source,
                                        llmretry_policies **out, char *err, size_t errlen);
void llmretry_policies_free(llmretry_policies *p);
size_t llmretry_policies_count(const llmretry_policies *p);
/* Names in the order of the document; NULL past the end. */
const char *llmretry_policies_name(const llmretry_policies *p, size_t i);
/* The keys policy `name` sets, as a JSON object (malloc'd: llmretry_free),
 * or NULL when there is no such policy. */
char *llmretry_policies_get_json(const llmretry_policies *p, const char *name);
/* Every policy key's value for one call, as a JSON object (malloc'd):
 * explicit > policy `name` (NULL = none) > client defaults > built-in.
 * explicit_json and defaults_json are JSON objects of call options (NULL or
 * empty = none; keys that are not policy keys are ignored; null = not
 * given); their policy keys are checked by the same rules. EINVAL for an
 * unknown policy ("unknown policy 'x' (known: 'a', 'b')") or a bad value.
 * The endpoint is one setting of two keys: the highest layer naming url or
 * base_url gives both (a policy's base_url beats a default url); the output
 * has "url" only when that layer set it. */
llmretry_status llmretry_policies_resolve(const llmretry_policies *p, const char *name,
                                          const char *explicit_json, size_t explicit_len,
                                          const char *defaults_json, size_t defaults_len,
                                          char **out_json, char *err, size_t errlen);
/* The i-th policy key (NULL past the end), in the order resolve lists them. */
const char *llmretry_policy_key(size_t i);
/* Check one value (JSON text) of policy key `key` by the policy rules. */
llmretry_status llmretry_policy_check_value(const char *key, const char *json, size_t len,
                                            char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_POLICIES_H */
