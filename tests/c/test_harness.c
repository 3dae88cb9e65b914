/* The harness itself: a mock that refuses its script is a failed test.
 * Before, th_mock_script only returned -1 and the tests that `goto out` on
 * it skipped every check and passed. */
#include "harness.h"

static th_mock mock;

int main(void)
{
    if (th_mock_start(&mock) != 0)
        return th_summary("test_harness");
    int before = th_failed;
    /* A status that is not a number: the mock answers 400. */
    int rc = th_mock_script(&mock, "refused", "{\"steps\": [{\"status\": \"soon\"}]}");
    int counted = th_failed - before;
    /* Take the expected failure back before judging it, so this test passes
     * only when the harness counted exactly one. */
    th_failed = before;
    CHECK_INT(rc, -1);
    CHECK_INT(counted, 1);
    /* A script the mock accepts counts nothing. */
    CHECK_INT(th_mock_script(&mock, "accepted", "{\"steps\": [{\"status\": 503}]}"), 0);
    CHECK_INT(th_failed, before);
    th_mock_stop(&mock);
    return th_summary("test_harness");
}
