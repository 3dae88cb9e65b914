/* spares.c — freed objects kept for the next of their kind: call records
 * (call.c) and a host engine's exchanges (host_io.c). Each kind is a list
 * linked through the first pointer-sized bytes of its objects, at most
 * `max` long, under the engine's spare_mu (any thread frees a call, any
 * thread submits one). Nothing is kept or taken in a forked child:
 * spare_mu may have been held by the parent's I/O thread at the fork, and
 * a child touches nothing of the parent's engine anyway. */
#include "engine.h"

#include <string.h>

/* How many of a kind an engine keeps: as many as it runs at once
 * (max_in_flight), 256 at the least and 4,096 at the most. A list never
 * holds more than were alive at once: an object is only made when the
 * list is empty. A gateway's engine holds a thousand calls and frees them
 * in bursts; kept to 256, 1.5 records a call were made anew (issue 36). */
int lr_spares_cap(const llmretry_engine *e)
{
    int n = e ? e->max_in_flight : 0;
    return n < 256 ? 256 : n > 4096 ? 4096 : n;
}

void *lr_spares_take(llmretry_engine *e, lr_spares *s)
{
    void *p = NULL;
    if (lr_forked(e))
        return NULL;
    pthread_mutex_lock(&e->spare_mu);
    if ((p = s->head) != NULL) {
        memcpy(&s->head, p, sizeof s->head);
        s->n--;
    }
    pthread_mutex_unlock(&e->spare_mu);
    return p;
}

int lr_spares_put(llmretry_engine *e, lr_spares *s, void *p, int max)
{
    int kept = 0;
    if (lr_forked(e))
        return 0;
    pthread_mutex_lock(&e->spare_mu);
    if (s->n < max) {
        memcpy(p, &s->head, sizeof s->head);
        s->head = p;
        s->n++;
        kept = 1;
    }
    pthread_mutex_unlock(&e->spare_mu);
    return kept;
}

void *lr_spares_pop(lr_spares *s)
{
    void *p = s->head;
    if (p) {
        memcpy(&s->head, p, sizeof s->head);
        s->n--;
    }
    return p;
}
