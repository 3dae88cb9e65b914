/* Waiting on a condition variable until a time on the monotonic clock, so
 * that a wall-clock jump (NTP, a suspended laptop) neither cuts a wait short
 * nor stretches it. POSIX systems give the condition that clock
 * (pthread_condattr_setclock); macOS has no such call, and waits with the
 * relative pthread_cond_timedwait_relative_np instead, which the wall clock
 * does not affect either. Header-only: the Python binding's pool uses it too. */
#ifndef LR_CONDVAR_H
#define LR_CONDVAR_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline int64_t lr_cond_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int lr_cond_init(pthread_cond_t *cv)
{
#if defined(__APPLE__)
    return pthread_cond_init(cv, NULL);
#else
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc == 0)
        rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
#endif
}

/* Wait until signalled or until `until_ms` (lr_cond_now_ms's clock): 0, or
 * ETIMEDOUT once that time has come. Spurious wake-ups return 0, as
 * pthread_cond_wait's do: callers loop on their condition. */
static inline int lr_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ms)
{
    int64_t now = lr_cond_now_ms();
    if (until_ms <= now)
        return ETIMEDOUT;
#if defined(__APPLE__)
    int64_t left = until_ms - now;
    struct timespec rel = { (time_t)(left / 1000), (long)(left % 1000) * 1000000L };
    return pthread_cond_timedwait_relative_np(cv, mu, &rel);
#else
    struct timespec at = { (time_t)(until_ms / 1000), (long)(until_ms % 1000) * 1000000L };
    return pthread_cond_timedwait(cv, mu, &at);
#endif
}

#endif
