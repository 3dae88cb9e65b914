/* The batch pacer: pauses on a 429's wait, halves once per burst, grows
 * back additively, stays within [1, limit]. */
#include "harness.h"
#include "llmretry.h"

static void test_init_and_bounds(void)
{
    llmretry_pacer p;
    llmretry_pacer_init(&p, 8, 1);
    CHECK_INT(llmretry_pacer_allowed(&p, 0), 8);
    CHECK_INT(llmretry_pacer_paused_ms(&p, 0), 0);
    llmretry_pacer_init(&p, 0, 1);
    CHECK_INT(llmretry_pacer_allowed(&p, 0), 1);   /* a limit below 1 means 1 */
    llmretry_pacer_on_success(&p);
    CHECK_INT(llmretry_pacer_allowed(&p, 0), 1);
}

static void test_pause_on_retry_after(void)
{
    llmretry_pacer p;
    llmretry_pacer_init(&p, 8, 0);
    llmretry_pacer_on_429(&p, 1000, 500);
    CHECK_INT(llmretry_pacer_allowed(&p, 1000), 0);
    CHECK_INT(llmretry_pacer_allowed(&p, 1499), 0);
    CHECK_INT(llmretry_pacer_paused_ms(&p, 1200), 300);
    CHECK_INT(llmretry_pacer_allowed(&p, 1500), 8);   /* not adaptive: window kept */
    CHECK_INT(p.pauses, 1);
    /* A shorter wait never cuts a longer pause short. */
    llmretry_pacer_on_429(&p, 2000, 1000);
    llmretry_pacer_on_429(&p, 2100, 100);
    CHECK_INT(llmretry_pacer_paused_ms(&p, 2100), 900);
    CHECK_INT(p.pauses, 2);
    /* Extending a running pause is the same pause. */
    llmretry_pacer_on_429(&p, 2500, 2000);
    CHECK_INT(llmretry_pacer_paused_ms(&p, 2500), 2000);
    CHECK_INT(p.pauses, 2);
    /* No wait named: no pause. */
    llmretry_pacer_init(&p, 8, 0);
    llmretry_pacer_on_429(&p, 0, -1);
    llmretry_pacer_on_429(&p, 0, 0);
    CHECK_INT(llmretry_pacer_allowed(&p, 0), 8);
    CHECK_INT(p.pauses, 0);
}

static void test_halving_once_per_burst(void)
{
    llmretry_pacer p;
    llmretry_pacer_init(&p, 64, 1);
    for (int i = 0; i < 20; i++)            /* one burst: 20 429s within 1 s */
        llmretry_pacer_on_429(&p, 10000 + i * 10, -1);
    CHECK_INT(llmretry_pacer_allowed(&p, 10500), 32);
    CHECK_INT(p.halvings, 1);
    llmretry_pacer_on_429(&p, 11000, -1);   /* the cool-down has passed */
    CHECK_INT(llmretry_pacer_allowed(&p, 11000), 16);
    for (int k = 0; k < 10; k++)
        llmretry_pacer_on_429(&p, 12000 + k * 1000, -1);
    CHECK_INT(llmretry_pacer_allowed(&p, 30000), 1);   /* never below 1 */
    /* 64 -> 32 -> 16 -> 8 -> 4 -> 2 -> 1: six halvings; the 429s that found
     * the window already at 1 shrank nothing and are not counted. */
    CHECK_INT(p.halvings, 6);
    llmretry_pacer_init(&p, 1, 1);
    llmretry_pacer_on_429(&p, 0, -1);
    CHECK_INT(llmretry_pacer_allowed(&p, 0), 1);
    CHECK_INT(p.halvings, 0);
}

static void test_additive_recovery(void)
{
    llmretry_pacer p;
    llmretry_pacer_init(&p, 16, 1);
    llmretry_pacer_on_429(&p, 0, -1);
    CHECK_INT(llmretry_pacer_allowed(&p, 0), 8);
    /* One slot back per window-full of successes: 8 successes -> 9. */
    for (int i = 0; i < 7; i++)
        llmretry_pacer_on_success(&p);
    CHECK_INT(llmretry_pacer_allowed(&p, 0), 8);
    llmretry_pacer_on_success(&p);
    CHECK_INT(llmretry_pacer_allowed(&p, 0), 9);
    /* A 429 also forfeits the credit gathered towards the next slot. */
    for (int i = 0; i < 8; i++)
        llmretry_pacer_on_success(&p);
    llmretry_pacer_on_429(&p, 5000, -1);
    CHECK_INT(llmretry_pacer_allowed(&p, 5000), 4);
    CHECK_INT(p.credit, 0);
    for (int i = 0; i < 4; i++)
        llmretry_pacer_on_success(&p);
    CHECK_INT(llmretry_pacer_allowed(&p, 5000), 5);
    for (int i = 0; i < 1000; i++)
        llmretry_pacer_on_success(&p);
    CHECK_INT(llmretry_pacer_allowed(&p, 0), 16);   /* never above the limit */
    CHECK_INT(p.window, 16);
}

int main(void)
{
    test_init_and_bounds();
    test_pause_on_retry_after();
    test_halving_once_per_burst();
    test_additive_recovery();
    return th_summary("test_pacer");
}
