/* Channels (core/src/channel.c): first in, first out; a call listed once
 * however often it has news; never a call its host freed or whose DONE the
 * host has read; the notifier readable exactly while the list is not empty. */
#include "harness.h"
#include "internal.h"

#include <poll.h>
#include <stdlib.h>

static int readable(const lr_channel *r)
{
    struct pollfd p = { .fd = r->notifier.rfd, .events = POLLIN };
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static llmretry_call *new_call(void)
{
    llmretry_call *c = calloc(1, sizeof *c);
    CHECK_MSG(c != NULL, "calloc");
    return c;
}

static void test_fifo_once_and_fd(void)
{
    lr_channel r;
    CHECK_INT(lr_channel_init(&r), 0);
    llmretry_call *a = new_call(), *b = new_call(), *c = new_call();
    CHECK_INT(readable(&r), 0);
    CHECK_INT(lr_channel_add(&r, a), 1);
    CHECK_INT(lr_channel_add(&r, b), 1);
    CHECK_INT(lr_channel_add(&r, a), 0);         /* already listed */
    CHECK_INT(lr_channel_add(&r, c), 1);
    CHECK_INT(readable(&r), 1);
    llmretry_call *got[4];
    CHECK_INT((int)lr_channel_take(&r, got, 2), 2);
    CHECK_MSG(got[0] == a && got[1] == b, "calls come out in the order they had news");
    CHECK_INT(readable(&r), 1);                /* c is still listed */
    CHECK_INT((int)lr_channel_take(&r, got, 4), 1);
    CHECK_MSG(got[0] == c, "the last call");
    CHECK_INT(readable(&r), 0);
    CHECK_INT(lr_channel_add(&r, a), 1);         /* taken, so it can be listed again */
    lr_channel_remove(&r, a);
    CHECK_INT(readable(&r), 0);
    CHECK_INT((int)lr_channel_take(&r, got, 4), 0);
    lr_channel_close(&r);
    free(a);
    free(b);
    free(c);
}

static void test_freed_and_done_read_are_not_reported(void)
{
    lr_channel r;
    CHECK_INT(lr_channel_init(&r), 0);
    llmretry_call *freed = new_call(), *read = new_call(), *late = new_call();
    freed->host_freed = 1;
    CHECK_INT(lr_channel_add(&r, freed), 0);
    atomic_store(&read->done_read, 1);
    CHECK_INT(lr_channel_add(&r, read), 0);
    CHECK_INT(readable(&r), 0);
    /* Listed while the host was draining it, then its DONE was read: the
     * entry has nothing new and is dropped when taken. */
    CHECK_INT(lr_channel_add(&r, late), 1);
    atomic_store(&late->done_read, 1);
    llmretry_call *got[4];
    CHECK_INT((int)lr_channel_take(&r, got, 4), 0);
    CHECK_INT(readable(&r), 0);
    CHECK_INT(late->in_ready, 0);
    lr_channel_close(&r);
    free(freed);
    free(read);
    free(late);
}

int main(void)
{
    test_fifo_once_and_fd();
    test_freed_and_done_read_are_not_reported();
    return th_summary("test_ready");
}
