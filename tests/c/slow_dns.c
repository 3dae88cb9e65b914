/* An LD_PRELOAD shim for test_dns: getaddrinfo() for SLOW_DNS_NAME sleeps
 * SLOW_DNS_MS and then fails, like a DNS server that never answers; every
 * other name goes to the real resolver (dlsym RTLD_NEXT). The test finds
 * slow_dns_active() to know the shim is loaded, and polls
 * slow_dns_resolving() (lookups of the name under way) instead of sleeping
 * until one has started or all have ended. */
#include <dlfcn.h>
#include <netdb.h>
#include <string.h>
#include <time.h>

#define SLOW_DNS_NAME "never.invalid"
#define SLOW_DNS_MS 3000

static int resolving;

int slow_dns_resolving(void);
int slow_dns_resolving(void)
{
    return __atomic_load_n(&resolving, __ATOMIC_SEQ_CST);
}

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

int slow_dns_active(void);
int slow_dns_active(void)
{
    return SLOW_DNS_MS;
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    if (node && strcmp(node, SLOW_DNS_NAME) == 0) {
        __atomic_add_fetch(&resolving, 1, __ATOMIC_SEQ_CST);
        /* The DNS server that never answers: this time is the test's subject. */
        struct timespec ts = { SLOW_DNS_MS / 1000, (SLOW_DNS_MS % 1000) * 1000000L };
        while (nanosleep(&ts, &ts) != 0)
            ;
        __atomic_sub_fetch(&resolving, 1, __ATOMIC_SEQ_CST);
        return EAI_AGAIN;
    }
    gai_fn real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    return real ? real(node, service, hints, res) : EAI_FAIL;
}
