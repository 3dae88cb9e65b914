/* libFuzzer target: llmretry_extract_json and llmretry_assert_shape of
 * json.c on arbitrary text (model output is server data).
 *
 * extract_json: on OK the span [start, start+len) lies inside the text,
 * is non-empty, and parses with cJSON_ParseWithLength; on EINVAL a
 * message is written. The whole input is the text (libFuzzer hands it in
 * an exact-size buffer with no NUL, so over-reads are caught by ASan).
 *
 * assert_shape: the input is split at its first NUL byte (else at half)
 * into json and shape halves, each copied to its own exact-size buffer.
 * The first byte also picks a small err buffer size, so messages cut
 * mid-UTF-8 are exercised. Build: tools/fuzz.sh. */
#include "llmretry.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

/* err must be NUL-terminated within errlen. */
static void check_err(const char *err, size_t errlen)
{
    if (memchr(err, '\0', errlen) == NULL)
        fail("err is not NUL-terminated within errlen");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[LLMRETRY_ERRBUF];
    size_t start = (size_t)-1, len = (size_t)-1;

    /* extract_json over the whole input. */
    memset(err, 'x', sizeof err);
    err[sizeof err - 1] = '\0';
    llmretry_status st = llmretry_extract_json((const char *)data, size, &start, &len, err,
                                               sizeof err);
    if (st == LLMRETRY_OK) {
        if (start > size || len > size - start)
            fail("extract_json span outside the text");
        if (len == 0)
            fail("extract_json span is empty");
        cJSON *v = cJSON_ParseWithLength((const char *)data + start, len);
        if (v == NULL)
            fail("extract_json span does not parse with cJSON_ParseWithLength");
        cJSON_Delete(v);
    } else if (st != LLMRETRY_EINVAL) {
        fail("extract_json returned neither OK nor EINVAL");
    } else {
        check_err(err, sizeof err);
        if (err[0] == '\0')
            fail("extract_json EINVAL without a message");
    }

    /* assert_shape: json half, shape half. */
    size_t cut;
    const uint8_t *nul = size ? memchr(data, '\0', size) : NULL;
    size_t skip = 0;
    if (nul) {
        cut = (size_t)(nul - data);
        skip = 1;
    } else {
        cut = size / 2;
    }
    char *json = copy(data, cut);
    char *shape = copy(data + cut + skip, size - cut - skip);
    size_t errlen = size && (data[0] & 1) ? 1 + data[size - 1] % 48 : sizeof err;
    memset(err, 'x', sizeof err);
    st = llmretry_assert_shape(json, cut, shape, size - cut - skip, NULL, err, errlen);
    if (st != LLMRETRY_OK && st != LLMRETRY_EINVAL)
        fail("assert_shape returned neither OK nor EINVAL");
    if (st == LLMRETRY_EINVAL)
        check_err(err, errlen);
    /* The shape half checked against itself under a long root path: more
     * shapes reach value_ok, and paths get cut at the err buffer. */
    st = llmretry_assert_shape(shape, size - cut - skip, shape, size - cut - skip,
                               "root.a.very.long.path.prefix.that.takes.room", err, sizeof err);
    if (st != LLMRETRY_OK && st != LLMRETRY_EINVAL)
        fail("assert_shape (self) returned neither OK nor EINVAL");
    free(json);
    free(shape);
    return 0;
}
