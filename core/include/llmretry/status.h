/* llmretry/status.h — status codes and the error buffer size.
 * Part of the public API: include <llmretry.h>, which includes every part. */
#ifndef LLMRETRY_STATUS_H
#define LLMRETRY_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Status codes returned by API functions.                             */
/* ------------------------------------------------------------------ */
typedef enum llmretry_status {
    LLMRETRY_OK = 0,
    LLMRETRY_EINVAL,    /* bad argument: the message names the field */
    LLMRETRY_ENOMEM,
    LLMRETRY_ESTATE,    /* engine shut down, or used after fork() */
    LLMRETRY_ETIMEDOUT, /* a wait ran out of time; the call goes on */
    LLMRETRY_EINTERNAL  /* a system call failed (thread, eventfd...) */
} llmretry_status;

const char *llmretry_status_name(llmretry_status s);

/* Size of the message buffers the API writes argument errors into. */
#define LLMRETRY_ERRBUF 512

/* A fresh UUID v4 (36 characters and a NUL) from the system's CSPRNG: the
 * ids the engine makes, for hosts that need one (an idempotency key). */
llmretry_status llmretry_uuid4(char out[37]);

#ifdef __cplusplus
}
#endif
#endif /* LLMRETRY_STATUS_H */
