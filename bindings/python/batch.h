/* What batch.c (BatchRun: arguments, stepping, the type) and
 * batch_items.c (a batch's items: slots, submission, totals) share. */
#ifndef LLMRETRY_PY_BATCH_H
#define LLMRETRY_PY_BATCH_H

#include "binding.h"

/* A submitted, unfinished call: its item's index (what on_result gets) and
 * its place in the submission order (lr_batch_cancel_all). */
typedef struct {
    llmretry_call *call;            /* NULL: a free slot */
    Py_ssize_t index;
    unsigned long long seq;
    int logger_reported;            /* lr_py_read_mail's: its logger's error reported */
} batch_slot;

/* A batch's items come from sequences (a list or tuple of bodies, checked
 * whole before anything is sent: the fast path) or from an iterator that
 * hands over one (index, body bytes, model, key) tuple at a time, as the
 * pacer wants more (an iterable read lazily: only what is in flight is
 * held). Either way only the calls in flight have a slot: at most `ahead`,
 * whatever the batch's length. */
typedef struct {
    PyObject *bodies, *models, *keys; /* sequences (PySequence_Fast); models, keys optional */
    PyObject *tokens;               /* estimated_tokens per item (ints), optional */
    PyObject *item_headers;         /* item_headers(index) -> header lines or None, optional */
    PyObject *iter;                 /* or: the iterator of tuples */
    Py_ssize_t n;                   /* sequences: their length */
    Py_ssize_t next;                /* sequences: the next to submit */
    int exhausted;                  /* nothing more to submit */
    batch_slot *slots;              /* cap of them; user_data = the slot's number */
    Py_ssize_t *free;               /* the free slots' numbers (a stack) */
    Py_ssize_t cap, nfree, in_flight;
    unsigned long long seq;
} batch;

/* What a batch adds up as its items finish, for the batch summary. */
typedef struct {
    long long attempts, retries, resends;
    llmretry_usage tokens;          /* every attempt's, failed calls' too: what is billed */
} batch_totals;

void lr_batch_cancel_all(batch *b);
void lr_batch_slot_release(batch *b, Py_ssize_t s);
void lr_batch_totals_add(batch_totals *t, const llmretry_result *r);
int lr_batch_put_stats(const module_state *st, PyObject *stats, llmretry_group *g,
                       const batch_totals *t);
int lr_batch_check(batch *b);
int lr_batch_submit(EngineObject *self, batch *b, llmretry_options *o, Py_ssize_t want);

#endif
