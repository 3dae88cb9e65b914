/* A submit whose options were checked already: for a binding that keeps
 * one options struct from call to call (llmretry.ffi's prep, in
 * bindings/lua/ffi.c), not for the public API. Included by internal.h. */
#ifndef LLMRETRY_SUBMIT_CHECKED_H
#define LLMRETRY_SUBMIT_CHECKED_H

#include "llmretry.h"

/* A submit's flag of the core's own, never a caller's (llmretry_engine_submit
 * clears it): the options passed llmretry_options_check and have not changed
 * since but for the body, which each call sets anew and which alone is
 * checked again (lr_options_check_body). A gateway sends every call with
 * the options of the one before, and the whole check was ~1.5k
 * instructions a call (issue 36). */
#define LR_SUBMIT_CHECKED (1u << 31)

/* Private to the module, as internal.h's (it says why). */
#pragma GCC visibility push(hidden)
/* llmretry_engine_submit, LR_SUBMIT_CHECKED honoured. */
llmretry_status lr_engine_submit(llmretry_engine *e, const llmretry_options *opts,
                                 unsigned flags, llmretry_call **out, char *err, size_t errlen);
#pragma GCC visibility pop

#endif
