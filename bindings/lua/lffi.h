/* The LuaJIT FFI entry points (ffi.c): one table of plain C functions,
 * handed to Lua by core._ffi(). lua/llmretry/ffi.lua declares the same
 * struct in its cdef (tests/lua/ffi_spec.lua checks that they agree): a
 * change here changes LR_FFI_ABI and the cdef with it. */
#ifndef LLMRETRY_LUA_LFFI_H
#define LLMRETRY_LUA_LFFI_H

#include "llmretry.h"

#include <stddef.h>
#include <stdint.h>
#pragma GCC visibility push(hidden)

#define LR_FFI_ABI 3
#define LR_FFI_OK 1
#define LR_FFI_RAW 2

/* The last six: io_loop "host" (llmretry/host_io.h: the engine's turn and
 * the attempts its host performs, ffi.c), then every field of an object at
 * once, for llmretry.ffi's generated builders. */
/* cdef begin */
struct lr_ffi_handle;
typedef struct lr_ffi_api {
    int abi;
    int (*drain)(void *handle);
    const void *(*result)(void *handle, const char **body, size_t *len, int *flags);
    void (*free)(void *handle);
    double (*key)(void *handle);
    size_t (*poll)(void *channel, double *keys, size_t max);
    ptrdiff_t (*text_len)(const char *s);
    int (*shape_field)(int shape, const void *obj, size_t i, llmretry_field *out);
    size_t (*shape_field_count)(int shape);
    const char *(*field_name)(int shape, size_t i);
    void *(*prep_new)(void);
    void (*prep_free)(void *prep);
    void (*prep_reset)(void *prep);
    const char *(*option)(size_t i, int *type);
    int (*set_int)(void *prep, const char *name, int64_t v, char *err, size_t errlen);
    int (*set_bool)(void *prep, const char *name, int v, char *err, size_t errlen);
    int (*set_text)(void *prep, const char *name, const char *v, char *err, size_t errlen);
    int (*set_number)(void *prep, const char *name, double v, char *err, size_t errlen);
    void (*set_body)(void *prep, const char *body, size_t len, int stream_usage, int validate,
                     int stream_chunks);
    struct lr_ffi_handle *(*submit)(void *engine, void *prep, void *channel,
                                    const char *table_model, char *err, size_t errlen);
    void (*handle_free)(void *handle);
    void (*cancel)(void *handle);
    const char *(*request_id)(void *handle);
    int (*run)(void *engine, double *next_ms);
    int (*exchange)(void *handle, llmretry_exchange *x);
    int (*feed)(void *handle, unsigned token, const char *data, size_t len);
    void (*failed)(void *handle, unsigned token, int why, int reused, const char *message);
    int (*field_type)(int shape, size_t i);
    int (*shape_values)(int shape, const void *obj, double *nums, const char **strs,
                        double *lens, const void **objs);
} lr_ffi_api;
/* cdef end */

#pragma GCC visibility pop
#endif
