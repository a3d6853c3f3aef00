/*
 * thread_pool.c -- see thread_pool.h.
 *
 * One word holds the pool's run state: generation << 32 | closed << 31 | joined workers. The
 * caller publishes a run by writing its fields and then a new generation (open, none joined); a
 * worker joins by a compare-and-swap that finds that generation still open, so it reads the run's
 * fields only while the caller cannot have moved on. When the caller's own body finds no task
 * left, it closes the run (no more joins) and waits for the joined workers to leave: they hold
 * only tasks they have claimed.
 */
#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#define KVA__POOL_CLOSED ((uint64_t)1 << 31)
#define KVA__POOL_JOINED_MASK (KVA__POOL_CLOSED - 1)
/* How long an idle worker polls for the next run before it sleeps: runs of one step of a model
 * (layers of decode, append, merge) follow each other within microseconds, and a sleeping worker
 * takes ~10-50 us to wake; longer idle spells should not hold a core that others may want. */
#define KVA__POOL_SPIN_NS 200000

struct kva__tasks {
    _Atomic int64_t next;
    int64_t end;
};

typedef struct worker {
    kva__pool *pool;
    int index; /* thread index in runs: 1 .. workers */
    pthread_t tid;
} worker;

struct kva__pool {
    unsigned fork_epoch; /* fork_epoch at creation: a forked child has none of these threads */
    int num_workers;
    int asked_workers; /* what creation asked for (fewer start if pthread_create fails) */
    worker *workers;
    /* the run (written by the caller before it publishes a generation) */
    kva__pool_body body;
    void *arg;
    int threads;
    kva__tasks tasks;
    _Atomic uint64_t state;
    _Atomic int sleepers;
    _Atomic int stop;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
};

static inline uint32_t generation_of(uint64_t s) { return (uint32_t)(s >> 32); }

/* Bumped in the child of every fork (pthread_atfork; a getpid per run cost as much as the run) */
static _Atomic unsigned fork_epoch;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void after_fork_in_child(void) { atomic_fetch_add(&fork_epoch, 1); }
static void register_atfork(void) { (void)pthread_atfork(NULL, NULL, after_fork_in_child); }
static bool forked_since_creation(const kva__pool *p) { return p->fork_epoch != atomic_load(&fork_epoch); }

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int kva__tasks_claim(kva__tasks *t, int64_t chunk, int64_t *begin, int64_t *end) {
    /* a plain read first: threads that find the run drained do not keep growing the counter */
    if (atomic_load_explicit(&t->next, memory_order_relaxed) >= t->end) return 0;
    const int64_t i = atomic_fetch_add_explicit(&t->next, chunk, memory_order_relaxed);
    if (i >= t->end) return 0;
    *begin = i;
    *end = t->end - i < chunk ? t->end : i + chunk;
    return 1;
}

/* The state once its generation differs from `seen` (or the pool stops): polls, yielding the core
 * now and then, for KVA__POOL_SPIN_NS, then sleeps on the condition variable. */
static uint64_t wait_for_run(kva__pool *p, uint32_t seen) {
    const int64_t t0 = now_ns();
    for (uint32_t i = 1;; ++i) {
        const uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
        if (generation_of(s) != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return s;
        relax();
        if ((i & 63) == 0) {
            if (now_ns() - t0 > KVA__POOL_SPIN_NS) break;
            sched_yield(); /* a thread that wants this core (the caller's own, another process's) gets it */
        }
    }
    pthread_mutex_lock(&p->mutex);
    /* sleepers before the generation check, the caller's store before its sleepers check (both
     * sequentially consistent): one of the two sees the other, so no wake-up is lost */
    atomic_fetch_add(&p->sleepers, 1);
    while (generation_of(atomic_load(&p->state)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->mutex);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mutex);
    return atomic_load_explicit(&p->state, memory_order_acquire);
}

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    kva__pool *p = w->pool;
    uint32_t seen = 0; /* the pool starts at generation 0, which is no run */
    for (;;) {
        uint64_t s = wait_for_run(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
        seen = generation_of(s);
        /* join the run if it is still open */
        bool joined = false;
        while (!(s & KVA__POOL_CLOSED) && generation_of(s) == seen) {
            if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acquire,
                                                      memory_order_acquire)) {
                joined = true;
                break;
            }
        }
        if (!joined) continue;
        if (w->index < p->threads) p->body(p->arg, w->index, &p->tasks);
        atomic_fetch_sub_explicit(&p->state, 1, memory_order_release); /* leave */
    }
    return NULL;
}

void kva__pool_destroy(kva__pool *p) {
    if (!p) return;
    if (forked_since_creation(p)) { /* the workers exist in the parent only: nothing to join */
        free(p->workers);
        free(p);
        return;
    }
    pthread_mutex_lock(&p->mutex);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mutex);
    for (int i = 0; i < p->num_workers; ++i) pthread_join(p->workers[i].tid, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mutex);
    free(p->workers);
    free(p);
}

/* A pool of `workers` threads, or NULL when none could be started. */
static kva__pool *pool_create(int workers) {
    kva__pool *p = (kva__pool *)calloc(1, sizeof *p);
    if (!p) return NULL;
    p->workers = (worker *)calloc((size_t)workers, sizeof *p->workers);
    if (!p->workers || pthread_mutex_init(&p->mutex, NULL) != 0) {
        free(p->workers);
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->wake, NULL) != 0) {
        pthread_mutex_destroy(&p->mutex);
        free(p->workers);
        free(p);
        return NULL;
    }
    pthread_once(&atfork_once, register_atfork);
    p->fork_epoch = atomic_load(&fork_epoch);
    p->asked_workers = workers;
    atomic_init(&p->state, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->tasks.next, 0);
    for (int i = 0; i < workers; ++i) {
        p->workers[i].pool = p;
        p->workers[i].index = i + 1;
        if (pthread_create(&p->workers[i].tid, NULL, worker_main, &p->workers[i]) != 0) break;
        p->num_workers = i + 1;
    }
    if (p->num_workers == 0) {
        kva__pool_destroy(p);
        return NULL;
    }
    return p;
}

void kva__pool_run(kva__pool **pool, int threads, int64_t num_tasks, kva__pool_body body, void *arg) {
    if (*pool && forked_since_creation(*pool)) { /* a forked child: start its own workers */
        kva__pool_destroy(*pool);
        *pool = NULL;
    }
    /* (a pool whose threads did not all start is not re-created for every run) */
    if (threads > 1 && num_tasks > 1 && (!*pool || (*pool)->asked_workers < threads - 1)) {
        kva__pool_destroy(*pool);
        *pool = pool_create(threads - 1);
    }
    kva__pool *p = *pool;
    if (threads <= 1 || num_tasks <= 1 || !p) {
        kva__tasks alone;
        atomic_init(&alone.next, 0);
        alone.end = num_tasks;
        body(arg, 0, &alone);
        return;
    }
    p->body = body;
    p->arg = arg;
    p->threads = threads;
    atomic_store_explicit(&p->tasks.next, 0, memory_order_relaxed);
    p->tasks.end = num_tasks;
    /* publish: a new generation, open, nobody joined (the last run left it closed and empty) */
    const uint64_t s = atomic_load_explicit(&p->state, memory_order_relaxed);
    atomic_store(&p->state, (uint64_t)(generation_of(s) + 1) << 32);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mutex);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mutex);
    }
    body(arg, 0, &p->tasks);
    /* every task is claimed: close the run, then wait for the workers inside it */
    uint64_t cur = atomic_load_explicit(&p->state, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&p->state, &cur, cur | KVA__POOL_CLOSED, memory_order_acquire,
                                                  memory_order_relaxed)) {
    }
    for (uint32_t i = 1; atomic_load_explicit(&p->state, memory_order_acquire) & KVA__POOL_JOINED_MASK; ++i) {
        relax();
        if ((i & 63) == 0) sched_yield(); /* a joined worker may be waiting for this core */
    }
}

typedef struct loop_arg {
    kva__pool_item fn;
    void *arg;
    int64_t chunk;
} loop_arg;

static void loop_body(void *arg, int thread, kva__tasks *tasks) {
    const loop_arg *L = (const loop_arg *)arg;
    int64_t b, e;
    while (kva__tasks_claim(tasks, L->chunk, &b, &e))
        for (int64_t i = b; i < e; ++i) L->fn(L->arg, i, thread);
}

void kva__pool_for(kva__pool **pool, int threads, int64_t n, int64_t chunk, kva__pool_item fn, void *arg) {
    loop_arg L = {fn, arg, chunk > 0 ? chunk : 1};
    /* one chunk stays on the caller */
    kva__pool_run(pool, n > L.chunk ? threads : 1, n > 0 ? n : 0, loop_body, &L);
}
