/* The CPython binding's private header: what its files share.
 *   _llmretry.c     the module: the JSON helpers, setup
 *   shapes.c        C values to Python: every map the core hands over, walked
 *   describe.c      the core's tables whole, for the generator of the typed surface
 *   arguments.c     call keywords -> llmretry_options (checked here and by the core)
 *   engine_type.c   the Engine type: one call, its mailbox delivered on this thread
 *   mailbox.c       the one mailbox reader: events, validation, chunks, a raising logger
 *   batch.c         call_many: a batch on the engine thread (BatchRun)
 *   batch_items.c   a batch's items: slots, submission, totals (batch.h)
 *   pool.c          run_pool (threads), results.c (Result in C), policies.c
 *   json_decode.c   a 2xx body's bytes to Result.data (json.loads' values, keys kept)
 *   json_encode.c   a request body (dict) to the bytes json's encoder would send
 *   batch_encode.c  a listed batch's bodies encoded in one loop (dicts json_encode.c takes)
 *   call_type.c     Call: one call in flight whose mailbox the host reads (streams, loops)
 *   channel_type.c  Channel and Group: an event loop's view of the engine
 *   judge_answer.c  an answer got without an attempt (a Batch API line), judged */
#ifndef LLMRETRY_PY_BINDING_H
#define LLMRETRY_PY_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "llmretry.h"
#include "pool.h"

#include <pthread.h>
#include <sys/types.h>

typedef struct {
    PyObject_HEAD
    /* The lock keeps close() from freeing the engine under a submit; it is
     * never held while waiting. */
    pthread_mutex_t mu;
    llmretry_engine *engine;
    unsigned fork_gen;              /* llmretry_fork_generation() when it was made */
} EngineObject;

/* Arguments converted for the core; Python objects they borrow from are
 * kept alive here until the call is submitted (the core copies them). */
typedef struct {
    llmretry_options o;
    Py_buffer body;
    int have_body;
    PyObject *headers_fast;
    const char **header_lines;
    int as_result;                  /* successes as the package's Result (call_value) */
} call_args;

/* Where a call's mail goes: the host's on_event, for the events it asked
 * for (the engine paces pools itself: nothing here watches for 429s), and
 * its validator (None: none). Borrowed references. */
typedef struct {
    PyObject *on_event;
    unsigned mask;                  /* the events on_event asked for */
    const module_state *st;
    PyObject *validate;
} mail_route;

/* mailbox.c: the one mailbox reader. Take the call's items on this thread
 * until its mailbox is empty (LR_PY_MAIL_EMPTY), the call is done
 * (LR_PY_MAIL_DONE) or, when `chunk` is not NULL, a stream's chunk is taken
 * (LR_PY_MAIL_CHUNK: *chunk is a new (event, bytes) tuple; without `chunk`
 * chunks are dropped); -1 with the Python error set. `*reported` is the
 * call's own: 1 once its logger's first error has been reported. */
enum { LR_PY_MAIL_EMPTY = 0, LR_PY_MAIL_DONE = 1, LR_PY_MAIL_CHUNK = 2 };
int lr_py_read_mail(llmretry_call *c, const mail_route *rt, int *reported, PyObject **chunk);

/* The Engine type (engine_type.c). */
extern PyType_Spec Engine_spec;

PyObject *event_dict(const module_state *st, const llmretry_event *ev);
int lr_py_put(PyObject *d, const char *key, PyObject *v);
module_state *lr_py_state_of(PyObject *module);
void call_args_release(call_args *a);
int parse_call_args(PyObject *args, PyObject *kw, call_args *a,
                           PyObject **on_event, PyObject **validate);
/* A sequence of "Name: value" strs as C strings (borrowed from *fast, a
 * PySequence_Fast the caller releases, as it frees *lines with PyMem_Free
 * also on failure): their count, or -1 with an error naming `what`[i]. */
Py_ssize_t lr_py_header_lines(PyObject *seq, const char *what, PyObject **fast,
                               const char ***lines);
/* ValueError unless the options can be shared by the calls of a batch. */
int check_shared_args(const call_args *a);
/* check_options(**keywords): the batch check, for the package to run first. */
PyObject *lr_py_check_options(PyObject *module, PyObject *args, PyObject *kw);
/* options() -> ((name, type, flags), ...): the core's option table. */
PyObject *lr_py_options(PyObject *module, PyObject *unused);
const char *lr_py_option_type_name(llmretry_option_type t);
/* describe() -> dict: the core's tables whole, for tools/gen_surface.py (describe.c). */
PyObject *lr_py_describe(PyObject *module, PyObject *unused);
PyObject *call_value(const module_state *st, const llmretry_result *r,
                            PyObject *validate, int as_result);
int check_interrupts(void);
/* engine_type.c: submit converted arguments (NULL with the error set). */
llmretry_call *engine_submit(EngineObject *self, call_args *a);
/* call_type.c: the Call type (one call in flight whose mailbox the host
 * reads: a stream is a call that yields chunks) and Engine.stream. */
extern PyType_Spec Call_spec;
PyObject *lr_engine_stream(PyObject *self, PyObject *args, PyObject *kw);
PyObject *lr_start_call(EngineObject *eng, PyObject *args, PyObject *kw, int stream,
                        llmretry_channel *ch, llmretry_group *g);
/* channel_type.c: Engine.channel() and Engine.group(), for event loops. */
extern PyType_Spec Channel_spec, Group_spec;
PyObject *lr_engine_channel(PyObject *self, PyObject *unused);
PyObject *lr_engine_group(PyObject *self, PyObject *args, PyObject *kw);
PyObject *Engine_call_many(EngineObject *self, PyObject *args, PyObject *kw);
/* batch.c: Engine.batch, the BatchRun that call_many steps to its end. */
extern PyType_Spec BatchRun_spec;
extern PyType_Spec LazyMeta_spec;      /* results.c */
/* judge_answer.c: judge_answer(status, answer, body, **options), an answer
 * got without an attempt judged by the core as an attempt's. */
PyObject *lr_py_judge_answer(PyObject *module, PyObject *args, PyObject *kw);
PyObject *Engine_batch(EngineObject *self, PyObject *args, PyObject *kw);
/* batch_items.c: _batch_tally(values), a batch's values recorded at its end. */
PyObject *lr_py_batch_tally(PyObject *module, PyObject *values);
/* batch_encode.c: encode_bodies(bodies, url, encode_one). */
PyObject *lr_py_encode_bodies(PyObject *module, PyObject *args);

#endif
