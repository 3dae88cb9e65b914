/* run_pool: worker(item, index) on min(limit, len(items)) C threads that
 * take the GIL in turn, with a deadline for the whole batch. The pacing is
 * the engine's (docs/design.md, one admission stage): calls made by workers find
 * their pool through a thread-local and are submitted into the pool's group
 * on their engine, so a 429 naming a wait pauses the pool's new calls and a
 * burst of them narrows its window, exactly as for call_many and for Lua's
 * map_with_concurrency. */
#include "pool.h"
#include "condvar.h"
#include "results.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

struct lr_pool {
    PyObject *items, *worker, *results, *stop_type, *not_started, *on_result;
    Py_ssize_t n, next;
    int return_exceptions;
    atomic_int stop;
    int64_t deadline_at;            /* monotonic ms, -1 = none */
    /* The first failure, raised once the running items finish. */
    PyObject *exc_type, *exc_value, *exc_tb;
    pthread_mutex_t mu;             /* guards everything below and the above */
    pthread_cond_t cv;
    int running;                    /* pool threads alive */
    int limit, adaptive;            /* of each group below */
    /* One group per engine the workers' calls use (usually one). */
    struct pool_group { llmretry_engine *engine; llmretry_group *group; } *groups;
    int n_groups;
    /* The interpreter run_pool was called in: its workers run there. */
    PyInterpreterState *interp;
};

/* Per thread, set only by the pool's own threads while they run. */
static _Thread_local lr_pool *tls_pool;

static int64_t mono_ms(void)
{
    return lr_cond_now_ms();
}

lr_pool *lr_pool_current(void)
{
    return tls_pool;
}

int lr_pool_stopping(lr_pool *p)
{
    return atomic_load(&p->stop);
}

PyObject *lr_pool_stop_type(lr_pool *p)
{
    return p->stop_type;
}

int64_t lr_pool_deadline_left(lr_pool *p)
{
    if (p->deadline_at < 0)
        return LLMRETRY_NO_DEADLINE;
    int64_t left = p->deadline_at - mono_ms();
    return left > 0 ? left : 0;
}

llmretry_group *lr_pool_group(lr_pool *p, llmretry_engine *e)
{
    llmretry_group *g = NULL;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_groups && !g; i++)
        if (p->groups[i].engine == e)
            g = p->groups[i].group;
    if (!g) {
        struct pool_group *more = realloc(p->groups, (size_t)(p->n_groups + 1) * sizeof *more);
        llmretry_group_options go;
        llmretry_group_options_defaults(&go);
        go.limit = p->limit;
        go.adaptive = p->adaptive;
        go.poll = 0;                /* each worker waits on its own call */
        if (more) {
            p->groups = more;
            if (llmretry_group_new(e, &go, &g, NULL, 0) == LLMRETRY_OK) {
                p->groups[p->n_groups].engine = e;
                p->groups[p->n_groups].group = g;
                p->n_groups++;
            }
        }
    }
    pthread_mutex_unlock(&p->mu);
    return g;                       /* NULL when out of memory: unpaced */
}

/* Claim the next index, or -1 when the pool is done or stopping. Each
 * pool thread runs one item at a time, so at most `limit` run at once; the
 * engine paces their calls (lr_pool_group). */
static Py_ssize_t pool_claim(lr_pool *p)
{
    Py_ssize_t i = -1;
    pthread_mutex_lock(&p->mu);
    if (!atomic_load(&p->stop) && p->next < p->n) {
        if (p->deadline_at >= 0 && mono_ms() >= p->deadline_at)
            p->next = p->n;         /* too late to start: the rest stays NOT_STARTED */
        else
            i = p->next++;
    }
    pthread_mutex_unlock(&p->mu);
    return i;
}

/* Remember the first failure (or keep it in place); the exception is the
 * current Python error. A failure of the pool's own reporter (fatal) always
 * stops the pool, whatever return_exceptions says. Returns the normalized
 * exception value (new ref). */
static PyObject *pool_record_failure(lr_pool *p, Py_ssize_t i, int fatal)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb && value)
        PyException_SetTraceback(value, tb);
    int is_exception = PyErr_GivenExceptionMatches(type, PyExc_Exception);
    int is_pool_stop = PyErr_GivenExceptionMatches(type, p->stop_type);
    PyObject *seen = value;
    Py_XINCREF(seen);
    pthread_mutex_lock(&p->mu);
    if (is_pool_stop || atomic_load(&p->stop)) {
        /* Stopped because of an earlier failure or Ctrl-C: not news. */
    } else if (p->return_exceptions && is_exception && !fatal) {
        Py_INCREF(value);
        PyObject *old = PyList_GET_ITEM(p->results, i);
        PyList_SET_ITEM(p->results, i, value);
        Py_DECREF(old);
    } else if (!p->exc_type) {
        p->exc_type = type;
        p->exc_value = value;
        p->exc_tb = tb;
        type = value = tb = NULL;
        atomic_store(&p->stop, 1);
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return seen;
}

static void pool_report(lr_pool *p, Py_ssize_t i, PyObject *value, int failed)
{
    if (p->on_result == Py_None || !value)
        return;
    PyObject *r = PyObject_CallFunction(p->on_result, "nOO", i, value,
                                        failed ? Py_True : Py_False);
    if (r)
        Py_DECREF(r);
    else
        Py_XDECREF(pool_record_failure(p, i, 1));    /* a broken reporter stops the pool */
}

static void *pool_thread(void *arg)
{
    lr_pool *p = arg;
    /* A thread state of the pool's own interpreter, not PyGILState_Ensure:
     * that one always attaches to the main interpreter, so a pool started
     * in a subinterpreter would run its workers (their imports, their
     * sys.modules) in the wrong one, and under a per-interpreter GIL
     * without the lock that guards the pool's objects. run_pool joins
     * every pool thread before it returns, so the interpreter outlives it. */
    PyThreadState *ts = PyThreadState_New(p->interp);
    if (!ts) {
        pthread_mutex_lock(&p->mu);
        p->running--;
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    PyEval_RestoreThread(ts);
    tls_pool = p;
    Py_ssize_t i;
    while ((i = pool_claim(p)) >= 0) {
        PyObject *index = PyLong_FromSsize_t(i);
        PyObject *r = index ? PyObject_CallFunctionObjArgs(p->worker, PyList_GET_ITEM(p->items, i),
                                                           index, NULL)
                            : NULL;
        Py_XDECREF(index);
        if (r) {
            pthread_mutex_lock(&p->mu);
            PyObject *old = PyList_GET_ITEM(p->results, i);
            PyList_SET_ITEM(p->results, i, r);
            pthread_mutex_unlock(&p->mu);
            Py_DECREF(old);
            pool_report(p, i, r, 0);
        } else {
            int stopping = atomic_load(&p->stop);
            PyObject *exc = pool_record_failure(p, i, 0);
            if (!stopping)
                pool_report(p, i, exc, 1);
            Py_XDECREF(exc);
        }
    }
    tls_pool = NULL;
    pthread_mutex_lock(&p->mu);
    p->running--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    PyThreadState_Clear(ts);
    PyThreadState_DeleteCurrent();     /* releases the GIL */
    return NULL;
}

/* Wait (GIL released, waking for signals) until every pool thread is done. */
static int pool_wait(lr_pool *p, pthread_t *threads, int n_threads)
{
    int interrupted = 0;
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    for (;;) {
        int running;
        Py_BEGIN_ALLOW_THREADS
        int64_t until = mono_ms() + WAKE_MS;
        pthread_mutex_lock(&p->mu);
        if (p->running > 0)
            lr_cond_wait_until(&p->cv, &p->mu, until);
        running = p->running;
        pthread_mutex_unlock(&p->mu);
        Py_END_ALLOW_THREADS
        if (running == 0)
            break;
        if (!interrupted && PyErr_CheckSignals() < 0) {
            /* Stop starting items; calls in flight in workers cancel. */
            interrupted = 1;
            atomic_store(&p->stop, 1);
            pthread_mutex_lock(&p->mu);
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            PyErr_Fetch(&type, &value, &tb);
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (int t = 0; t < n_threads; t++)
        pthread_join(threads[t], NULL);
    Py_END_ALLOW_THREADS
    if (interrupted)
        PyErr_Restore(type, value, tb);
    return interrupted ? -1 : 0;
}

static int start_threads(lr_pool *p, pthread_t *threads, int n_threads)
{
    /* Pool threads take no signals: Ctrl-C must reach the main thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int started = 0;
    for (; started < n_threads; started++) {
        pthread_mutex_lock(&p->mu);
        p->running++;
        pthread_mutex_unlock(&p->mu);
        if (pthread_create(&threads[started], NULL, pool_thread, p) != 0) {
            pthread_mutex_lock(&p->mu);
            p->running--;
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return started;
}

/* The pacing the engine did for the pool's calls, summed over its groups
 * (the smallest window): the core's group shape. */
static int fill_stats(const module_state *st, PyObject *stats, lr_pool *p)
{
    if (stats == Py_None)
        return 0;
    llmretry_group_stats sum = { .window = p->limit };
    for (int i = 0; i < p->n_groups; i++) {
        llmretry_group_stats gs;
        llmretry_group_stats_get(p->groups[i].group, &gs);
        sum.active += gs.active;
        sum.queued += gs.queued;
        sum.pauses += gs.pauses;
        sum.halvings += gs.halvings;
        if (gs.window < sum.window)
            sum.window = gs.window;
    }
    return lr_py_shape_into(st, stats, LLMRETRY_SHAPE_GROUP, &sum);
}

PyObject *lr_run_pool(PyObject *module, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "items", "limit", "worker", "return_exceptions", "deadline_ms",
                              "adaptive", "on_result", "stats", NULL };
    PyObject *items, *worker, *deadline = Py_None, *on_result = Py_None, *stats = Py_None;
    Py_ssize_t limit;
    int return_exceptions = 0, adaptive = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnO|p$OpOO!:run_pool", kwlist, &items, &limit,
                                     &worker, &return_exceptions, &deadline, &adaptive,
                                     &on_result, &PyDict_Type, &stats))
        return NULL;
    if (limit < 1) {
        PyErr_Format(PyExc_ValueError, "limit must be >= 1 (got %zd)", limit);
        return NULL;
    }
    if (!PyCallable_Check(worker)) {
        PyErr_SetString(PyExc_TypeError, "worker must be callable");
        return NULL;
    }
    if (on_result != Py_None && !PyCallable_Check(on_result)) {
        PyErr_SetString(PyExc_TypeError, "on_result must be callable or None");
        return NULL;
    }
    long long deadline_ms = -1;
    if (deadline != Py_None) {
        deadline_ms = PyLong_AsLongLong(deadline);
        if (deadline_ms == -1 && PyErr_Occurred())
            return NULL;
        if (deadline_ms < 0) {
            PyErr_Format(PyExc_ValueError, "deadline_ms must be >= 0 or None (got %lld)",
                         deadline_ms);
            return NULL;
        }
    }
    module_state *st = (module_state *)PyModule_GetState(module);
    lr_pool p;
    memset(&p, 0, sizeof p);
    p.items = PySequence_List(items);
    if (!p.items)
        return NULL;
    p.n = PyList_GET_SIZE(p.items);
    p.results = PyList_New(p.n);
    if (!p.results) {
        Py_DECREF(p.items);
        return NULL;
    }
    /* An item never started (a deadline, a stop) keeps NOT_STARTED. */
    for (Py_ssize_t i = 0; i < p.n; i++) {
        Py_INCREF(st->not_started);
        PyList_SET_ITEM(p.results, i, st->not_started);
    }
    p.interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    p.worker = worker;
    p.on_result = on_result;
    p.stop_type = st->pool_stop;
    p.not_started = st->not_started;
    p.return_exceptions = return_exceptions;
    p.deadline_at = deadline_ms < 0 ? -1 : mono_ms() + deadline_ms;
    p.limit = limit > 1000000 ? 1000000 : (int)limit;
    p.adaptive = adaptive;
    atomic_init(&p.stop, 0);
    pthread_mutex_init(&p.mu, NULL);
    lr_cond_init(&p.cv);

    int n_threads = (int)(limit < p.n ? limit : p.n);
    pthread_t *threads = PyMem_Calloc((size_t)(n_threads ? n_threads : 1), sizeof *threads);
    int rc = 0;
    if (!threads) {
        PyErr_NoMemory();
        rc = -1;
    } else {
        int started = start_threads(&p, threads, n_threads);
        if (started == 0 && n_threads > 0) {
            PyErr_SetString(PyExc_RuntimeError, "could not start any pool thread");
            rc = -1;
        }
        if (pool_wait(&p, threads, started) < 0)
            rc = -1;
    }
    PyMem_Free(threads);
    PyObject *out = NULL;
    if (rc == 0 && p.exc_type) {
        PyErr_Restore(p.exc_type, p.exc_value, p.exc_tb);
        p.exc_type = p.exc_value = p.exc_tb = NULL;
    } else if (rc == 0 && fill_stats(PyModule_GetState(module), stats, &p) == 0) {
        out = p.results;
        p.results = NULL;
    }
    Py_XDECREF(p.exc_type);
    Py_XDECREF(p.exc_value);
    Py_XDECREF(p.exc_tb);
    Py_XDECREF(p.results);
    Py_DECREF(p.items);
    /* Calls still in a group keep it alive; the pool's references end. */
    for (int i = 0; i < p.n_groups; i++)
        llmretry_group_free(p.groups[i].group);
    free(p.groups);
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    return out;
}
