/* Every wait is a timer: each call has at most one entry in the engine's
 * timer heap, and where it sits follows from the call's state. A call in
 * backoff wakes when its wait ends; a call waiting for admission (a free
 * slot, its batch's pacer, later a rate budget) wakes at its deadline, so a
 * deadline ends the call wherever it waits. A running stream wakes for
 * its first chunk, its idle gaps and its deadline (stream.c). Other running
 * and validating calls need none: libcurl's timeout is already cut to the
 * deadline, and a validator is the host's. */
#include "engine.h"
#include "stream.h"

#include <stdlib.h>

static void swap(llmretry_engine *e, size_t a, size_t b)
{
    llmretry_call *t = e->heap[a];
    e->heap[a] = e->heap[b];
    e->heap[b] = t;
    e->heap[a]->heap_index = a;
    e->heap[b]->heap_index = b;
}

static void sift_up(llmretry_engine *e, size_t i)
{
    while (i > 0 && e->heap[(i - 1) / 2]->wake_at > e->heap[i]->wake_at) {
        swap(e, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void sift_down(llmretry_engine *e, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < e->heap_len && e->heap[l]->wake_at < e->heap[m]->wake_at)
            m = l;
        if (r < e->heap_len && e->heap[r]->wake_at < e->heap[m]->wake_at)
            m = r;
        if (m == i)
            return;
        swap(e, i, m);
        i = m;
    }
}

static int push(llmretry_engine *e, llmretry_call *c)
{
    if (e->heap_len == e->heap_cap) {
        size_t cap = e->heap_cap ? e->heap_cap * 2 : 64;
        llmretry_call **h = realloc(e->heap, cap * sizeof *h);
        if (!h)
            return -1;
        e->heap = h;
        e->heap_cap = cap;
    }
    c->heap_index = e->heap_len;
    e->heap[e->heap_len++] = c;
    sift_up(e, c->heap_index);
    return 0;
}

void lr_timer_remove(llmretry_engine *e, llmretry_call *c)
{
    size_t i = c->heap_index;
    if (i == LR_NO_TIMER)
        return;
    c->heap_index = LR_NO_TIMER;
    e->heap_len--;
    if (i != e->heap_len) {
        e->heap[i] = e->heap[e->heap_len];
        e->heap[i]->heap_index = i;
        sift_up(e, i);
        sift_down(e, e->heap[i]->heap_index);
    }
}

/* When the call's state needs the loop, or -1 for never. */
static int64_t due_at(llmretry_call *c)
{
    switch (c->state) {
    case LR_RUNNING:
        /* A streaming request's first chunk, its gaps and its deadline
         * (stream.c); other attempts have libcurl's timeout. */
        return c->stream_req || c->st ? lr_stream_due_at(c) : -1;
    case LR_WAITING:
        /* The policy never schedules a retry past the deadline, but a
         * deadline is a deadline: whichever comes first. */
        return c->deadline_at >= 0 && c->deadline_at < c->retry_at ? c->deadline_at
                                                                   : c->retry_at;
    case LR_GROUP_QUEUED:
    case LR_QUEUED:
    case LR_HELD:
    case LR_BUDGET:
        return c->deadline_at;
    default:
        return -1;
    }
}

int lr_timer_update(llmretry_engine *e, llmretry_call *c)
{
    int64_t at = due_at(c);
    if (at < 0) {
        lr_timer_remove(e, c);
        return 0;
    }
    if (c->heap_index != LR_NO_TIMER) {
        int64_t old = c->wake_at;
        c->wake_at = at;
        if (at < old)
            sift_up(e, c->heap_index);
        else if (at > old)
            sift_down(e, c->heap_index);
        return 0;
    }
    c->wake_at = at;
    if (push(e, c) != 0) {
        c->heap_index = LR_NO_TIMER;
        return -1;
    }
    return 0;
}

llmretry_call *lr_timer_take_due(llmretry_engine *e, int64_t now)
{
    if (e->heap_len == 0 || e->heap[0]->wake_at > now)
        return NULL;
    llmretry_call *c = e->heap[0];
    lr_timer_remove(e, c);
    return c;
}

int64_t lr_timer_due_in(const llmretry_engine *e, int64_t now, int64_t cap)
{
    if (e->heap_len == 0)
        return cap;
    int64_t t = e->heap[0]->wake_at - now;
    return t <= 0 ? 0 : t < cap ? t : cap;
}
