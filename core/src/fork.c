/* Forks: an engine belongs to the process that made it (its I/O thread
 * and sockets are that process's). Every public entry point asks lr_forked
 * before it touches an engine's locks: in a child, the parent's I/O thread
 * may have held them at the fork. */
#include "engine.h"

#include <pthread.h>
#include <stdatomic.h>

/* Bumped in every child of fork(): an engine made before the fork sees a
 * generation other than its own. Every entry point checks it (a batch
 * several times per call), so it is an atomic load here, not getpid(): a
 * system call each time, the calling thread's most frequent one. fork(),
 * os.fork() and multiprocessing run pthread_atfork handlers; only a raw
 * clone(2) would not, and nothing that clones so uses the engine after. */
static atomic_uint fork_generation;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void after_fork_in_child(void)
{
    atomic_fetch_add_explicit(&fork_generation, 1, memory_order_relaxed);
}

static void fork_watch(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

unsigned llmretry_fork_generation(void)
{
    pthread_once(&fork_once, fork_watch);
    return atomic_load_explicit(&fork_generation, memory_order_relaxed);
}

int lr_forked(const llmretry_engine *e)
{
    return atomic_load_explicit(&fork_generation, memory_order_relaxed) != e->fork_generation;
}

int llmretry_engine_forked(const llmretry_engine *e)
{
    return e && lr_forked(e);
}
