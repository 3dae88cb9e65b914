/* Shared budgets' numbers (core/src/shared.c) and their shm store
 * (core/src/shared_shm.c): GCRA buckets, the retry budget's window, the
 * breaker's probe lease, and a store that processes really share. */
#include "harness.h"
#include "shared.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_gcra(void)
{
    lr_shared_ep ep;
    lr_shared_ep_init(&ep, 7);
    /* 1 per ms, no burst: now, then 1000 us later. */
    CHECK_INT(lr_shared_gcra_take(&ep.req_tat_us, 0, 1000, 1, 0), 0);
    CHECK_INT(lr_shared_gcra_take(&ep.req_tat_us, 0, 1000, 1, 0), 1000);
    CHECK_INT(lr_shared_gcra_take(&ep.req_tat_us, 400, 1000, 1, 0), 600);
    CHECK_INT(lr_shared_gcra_take(&ep.req_tat_us, 1000, 1000, 1, 0), 0);
    /* An idle bucket is full, not owed a backlog: after 10 s idle, one
     * goes and the next waits a whole interval. */
    CHECK_INT(lr_shared_gcra_take(&ep.req_tat_us, 10000000, 1000, 1, 0), 0);
    CHECK_INT(lr_shared_gcra_take(&ep.req_tat_us, 10000000, 1000, 1, 0), 1000);
    /* A burst tolerance of 2 intervals admits 3 at once. */
    CHECK_INT(lr_shared_gcra_take(&ep.tok_tat_us, 0, 1000, 1, 2000), 0);
    CHECK_INT(lr_shared_gcra_take(&ep.tok_tat_us, 0, 1000, 1, 2000), 0);
    CHECK_INT(lr_shared_gcra_take(&ep.tok_tat_us, 0, 1000, 1, 2000), 0);
    CHECK_INT(lr_shared_gcra_take(&ep.tok_tat_us, 0, 1000, 1, 2000), 1000);
    /* A call larger than the bucket goes once it is full, in debt... */
    lr_shared_ep_init(&ep, 7);
    CHECK_INT(lr_shared_gcra_take(&ep.tok_tat_us, 0, 10, 500, 1000), 0);
    CHECK_INT(lr_shared_gcra_take(&ep.tok_tat_us, 0, 10, 1, 1000), 4000);
    /* ... and usage that says it cost less gives the difference back. */
    lr_shared_gcra_adjust(&ep.tok_tat_us, -300 * 10);
    CHECK_INT(lr_shared_gcra_take(&ep.tok_tat_us, 0, 10, 1, 1000), 1000);
}

static void test_retry_budget(void)
{
    lr_shared_ep ep;
    lr_shared_ep_init(&ep, 7);
    for (int i = 0; i < 10; i++)
        lr_shared_budget_request(&ep, 5000 + i * 100);
    int taken = 0;
    for (int i = 0; i < 10; i++)
        taken += lr_shared_budget_take(&ep, 6000, 0.2, 2);
    CHECK_INT(taken, 4);                 /* 0.2 x 10 + 2 */
    int64_t req, ret;
    lr_shared_budget_window(&ep, 6000, &req, &ret);
    CHECK_INT(req, 10);
    CHECK_INT(ret, 4);
    /* Ten seconds on, the window has forgotten them. */
    lr_shared_budget_window(&ep, 16000, &req, &ret);
    CHECK_INT(req, 0);
    CHECK_INT(ret, 0);
    CHECK_INT(lr_shared_budget_take(&ep, 16000, 0.2, 2), 1);
    /* A slot reused for a later second starts again. */
    lr_shared_budget_request(&ep, 15000);
    lr_shared_budget_window(&ep, 15000, &req, &ret);
    CHECK_INT(req, 1);
}

static void test_breaker(void)
{
    lr_shared_ep ep;
    lr_shared_ep_init(&ep, 7);
    int probe;
    CHECK_INT(lr_shared_breaker_admits(&ep, 0, 1000, &probe), 1);
    CHECK_INT(probe, 0);
    CHECK_INT(lr_shared_breaker_failed(&ep, 0, 2, 500, 0), 0);
    CHECK_INT(lr_shared_breaker_failed(&ep, 10, 2, 500, 0), 1);      /* opens */
    CHECK_INT(lr_shared_breaker_failed(&ep, 20, 2, 500, 0), 0);      /* already open */
    CHECK_INT(lr_shared_breaker_state(&ep, 100), LR_SHARED_OPEN);
    CHECK_INT(lr_shared_breaker_admits(&ep, 100, 1000, &probe), 0);
    /* After the cooldown: one probe, the others fail fast. */
    CHECK_INT(lr_shared_breaker_state(&ep, 510), LR_SHARED_HALF_OPEN);
    CHECK_INT(lr_shared_breaker_admits(&ep, 510, 1000, &probe), 1);
    CHECK_INT(probe, 1);
    CHECK_INT(lr_shared_breaker_admits(&ep, 520, 1000, &probe), 0);
    /* The prober died: its lease lapses and another may probe. */
    CHECK_INT(lr_shared_breaker_admits(&ep, 1511, 1000, &probe), 1);
    CHECK_INT(probe, 1);
    CHECK_INT(lr_shared_breaker_failed(&ep, 1600, 2, 500, 1), 1);    /* reopens */
    CHECK_INT(lr_shared_breaker_state(&ep, 1700), LR_SHARED_OPEN);
    CHECK_INT(lr_shared_breaker_admits(&ep, 2100, 1000, &probe), 1);
    lr_shared_breaker_succeeded(&ep);
    CHECK_INT(lr_shared_breaker_state(&ep, 2200), LR_SHARED_CLOSED);
    CHECK_INT(lr_shared_breaker_admits(&ep, 2200, 1000, &probe), 1);
    CHECK_INT(probe, 0);
}

/* Four processes counting in one endpoint of one store: nothing lost. */
static void test_store_across_processes(const char *spec)
{
    char err[256];
    lr_shared_store *s = NULL;
    CHECK_MSG(lr_shared_store_open(spec, &s, err, sizeof err) == 0, "open: %s", err);
    if (!s)
        return;
    struct stat st;
    CHECK(stat(lr_shared_store_path(s), &st) == 0 && (st.st_mode & 0777) == 0600);
    enum { KIDS = 4, EACH = 20000 };
    pid_t kids[KIDS];
    for (int k = 0; k < KIDS; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            /* A process of its own opening the store by name. */
            lr_shared_store *mine = NULL;
            if (lr_shared_store_open(spec, &mine, err, sizeof err) != 0)
                _exit(2);
            lr_shared_ep *ep = lr_shared_store_endpoint(mine, 0xfeedULL);
            if (!ep)
                _exit(3);
            for (int i = 0; i < EACH; i++) {
                lr_shared_gcra_take(&ep->req_tat_us, 0, 1, 1, (int64_t)1 << 40);
                lr_shared_budget_request(ep, 7000);
            }
            lr_shared_store_close(mine);
            _exit(0);
        }
    }
    int ok = 1;
    for (int k = 0; k < KIDS; k++) {
        int status = 0;
        waitpid(kids[k], &status, 0);
        ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    CHECK_MSG(ok, "a child failed");
    lr_shared_ep *ep = lr_shared_store_endpoint(s, 0xfeedULL);
    CHECK(ep != NULL);
    if (ep) {
        CHECK_INT(atomic_load(&ep->req_tat_us), KIDS * EACH);
        int64_t req, ret;
        lr_shared_budget_window(ep, 7000, &req, &ret);
        CHECK_INT(req, KIDS * EACH);
    }
    /* Other endpoints get slots of their own; the same id the same slot. */
    lr_shared_ep *other = lr_shared_store_endpoint(s, 0xbeefULL);
    CHECK(other != NULL && other != ep && atomic_load(&other->req_tat_us) == 0);
    CHECK(lr_shared_store_endpoint(s, 0xbeefULL) == other);
    lr_shared_store_close(s);
}

static void test_refused(void)
{
    char err[256];
    lr_shared_store *s = NULL;
    const char *bad[] = { "shm:", "shm:../etc", "shm:a/b", "shm:.hidden", "redis-ish", "shm:x y" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        CHECK_MSG(lr_shared_store_open(bad[i], &s, err, sizeof err) == -1 && !s,
                  "%s was accepted", bad[i]);
        CHECK_MSG(strstr(err, "shared") != NULL, "%s: %s", bad[i], err);
    }
    /* A file of the right size that is not a store. */
    char name[64], path[96];
    snprintf(name, sizeof name, "test-foreign-%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm/llmretry-%s", name);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0);
    char spec[80];
    snprintf(spec, sizeof spec, "shm:%s", name);
    lr_shared_store *good = NULL;
    /* Its size from a real store of another name. */
    char gname[80];
    snprintf(gname, sizeof gname, "shm:test-size-%d", (int)getpid());
    CHECK(lr_shared_store_open(gname, &good, err, sizeof err) == 0);
    struct stat st;
    CHECK(good && stat(lr_shared_store_path(good), &st) == 0);
    if (good) {
        CHECK(ftruncate(fd, st.st_size) == 0);
        CHECK(write(fd, "not a store", 11) == 11);
        unlink(lr_shared_store_path(good));
        lr_shared_store_close(good);
    }
    close(fd);
    CHECK(lr_shared_store_open(spec, &s, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, path) != NULL && strstr(err, "another layout") != NULL, "%s", err);
    /* Readable by others: not a private file. */
    chmod(path, 0644);
    CHECK(lr_shared_store_open(spec, &s, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "0600") != NULL, "%s", err);
    unlink(path);
}

int main(void)
{
    test_gcra();
    test_retry_budget();
    test_breaker();
    char spec[64];
    snprintf(spec, sizeof spec, "shm:test-shared-%d", (int)getpid());
    test_store_across_processes(spec);
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/llmretry-%s", spec + 4);
    unlink(path);
    test_refused();
    return th_summary("test_shared");
}
