/*
 * llmretry.h — the public header of the llmretry C core: include this one.
 * It brings in the parts, one header per concern (as curl's include/curl/):
 *   llmretry/status.h    status codes       llmretry/options.h  call options
 *   llmretry/result.h    errors, results    llmretry/events.h   events
 *   llmretry/engine.h    engines, calls     llmretry/channel.h  channels
 *   llmretry/group.h     batches            llmretry/policy.h   retry rules, pacer
 *   llmretry/policies.h  named policies     llmretry/json.h     JSON helpers
 *   llmretry/shapes.h    what hosts are handed, field by field
 *   llmretry/host_io.h   engines whose host moves the bytes (io_loop host)
 *   llmretry/url.h       joining a base URL and a path, showing a URL
 *
 * llmretry wraps calls to an OpenAI-compatible chat API in a production
 * policy: a timeout per attempt, one total deadline, retries of transient
 * failures only (exponential backoff with jitter, Retry-After), a request id,
 * structured events, response validation and token accounting.
 *
 * Threading model (docs/design.md): an engine owns one I/O thread that performs
 * all network I/O. Host threads submit calls and wait on each call's
 * mailbox; events and results are delivered to whichever host thread waits.
 * Nothing is ever called back from the I/O thread.
 *
 * Conventions: every function that can fail returns an llmretry_status;
 * text describing an argument error is written to the caller's `err`
 * buffer (when given) and names the offending field. Whoever creates a
 * handle frees it with the matching _free function.
 */
#ifndef LLMRETRY_H
#define LLMRETRY_H

#include <stddef.h>
#include <stdint.h>

/* The project's one version number: setup.py, CMake and `make rock` read
 * it from this line, the Python package and the Lua module report it, and
 * tests/python/test_version.py checks that CHANGELOG.md agrees. */
#define LLMRETRY_VERSION "0.1.0"

#include "llmretry/status.h"
#include "llmretry/options.h"
#include "llmretry/result.h"
#include "llmretry/shapes.h"
#include "llmretry/events.h"
#include "llmretry/engine.h"
#include "llmretry/policy.h"
#include "llmretry/group.h"
#include "llmretry/policies.h"
#include "llmretry/channel.h"
#include "llmretry/json.h"
#include "llmretry/host_io.h"
#include "llmretry/url.h"

/* The version this library was compiled as (LLMRETRY_VERSION then): tells a
 * program which core it runs against, whatever headers it was built with. */
const char *llmretry_version(void);

/* The version of the libcurl loaded at run time ("7.88.1"): a wheel bundles
 * its own copy, so the system's curl says nothing about it. */
const char *llmretry_libcurl_version(void);

#endif /* LLMRETRY_H */
