/* The batch pacer: how many items of a batch may run now. Pure: the
 * caller passes the clock, so the rules are unit-tested without waiting. */
#include "llmretry.h"

void llmretry_pacer_init(llmretry_pacer *p, int limit, int adaptive)
{
    p->limit = limit < 1 ? 1 : limit;
    p->adaptive = adaptive != 0;
    p->window = p->limit;
    p->credit = 0;
    p->paused_until_ms = 0;
    p->last_halving_ms = -1;
    p->pauses = p->halvings = 0;
}

int llmretry_pacer_allowed(const llmretry_pacer *p, int64_t now_ms)
{
    if (now_ms < p->paused_until_ms)
        return 0;
    return p->window;
}

int64_t llmretry_pacer_paused_ms(const llmretry_pacer *p, int64_t now_ms)
{
    return now_ms < p->paused_until_ms ? p->paused_until_ms - now_ms : 0;
}

void llmretry_pacer_on_429(llmretry_pacer *p, int64_t now_ms, int64_t wait_ms)
{
    /* A wait too long to add to the clock pauses "for ever" (saturated). */
    int64_t until = wait_ms > INT64_MAX - now_ms ? INT64_MAX : now_ms + wait_ms;
    if (wait_ms > 0 && until > p->paused_until_ms) {
        /* A pause only grows: an earlier, longer wait still stands. */
        if (now_ms >= p->paused_until_ms)
            p->pauses++;
        p->paused_until_ms = until;
    }
    /* 429s from one burst arrive together; halving for each would drop
     * the window to 1 on a single overload. */
    if (p->adaptive && (p->last_halving_ms < 0 ||
                        now_ms - p->last_halving_ms >= LLMRETRY_PACER_COOLDOWN_MS)) {
        /* A window already at 1 does not shrink: not a halving. */
        if (p->window > 1) {
            p->window /= 2;
            p->halvings++;
        }
        p->credit = 0;
        p->last_halving_ms = now_ms;
    }
}

void llmretry_pacer_on_success(llmretry_pacer *p)
{
    if (!p->adaptive || p->window >= p->limit)
        return;
    if (++p->credit >= p->window) {
        p->window++;
        p->credit = 0;
    }
}
