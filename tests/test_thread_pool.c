/*
 * test_thread_pool.c -- the CPU backend's worker pool (src/common/thread_pool.c): every task of a
 * run runs exactly once, on a thread index below the run's thread count that no other thread holds
 * at the same time (per-thread scratch depends on it); back-to-back runs with different bodies
 * never mix (a worker late for one run must not take the next run's tasks with the old body);
 * workers that went to sleep wake for the next run; more threads than cores; two pools at once; a
 * forked child runs and destroys a pool inherited from its parent without hanging; runs with
 * fewer threads than the pool has workers; runs when no worker thread can start. `make
 * test-tsan` runs these under ThreadSanitizer too.
 */
#include "harness.h"
#include "test_util.h"
#include "../src/common/thread_pool.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { TP_MAX_TASKS = 5000, TP_MAX_THREADS = 16 };

#define TP_REQUIRE(cond)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            kva_test_fail(__FILE__, __LINE__, "%s", #cond);                                    \
            return;                                                                            \
        }                                                                                      \
    } while (0)

typedef struct tp_run {
    int id; /* which run wrote a task's mark */
    int threads;
    int work; /* busy iterations per task: long enough for workers to join and hold tasks */
    int await_workers; /* thread 0 takes no task until every worker index has entered the body */
    _Atomic int count[TP_MAX_TASKS];
    _Atomic int mark[TP_MAX_TASKS];
    _Atomic int busy[TP_MAX_THREADS]; /* 1 while a thread index is inside the body */
    _Atomic int bad_index, shared_index, out_of_order;
    _Atomic int workers_joined; /* bodies entered by threads other than the caller */
    _Atomic int await_timed_out;
} tp_run;

/* How long an awaited run's caller waits for its workers: a woken worker on a loaded machine gets
 * a core within milliseconds, so only one that is never woken (or never started) takes this long. */
#define TP_AWAIT_NS ((int64_t)10 * 1000000000)

static int64_t tp_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void tp_body(void *arg, int thread, kva__tasks *tasks) {
    tp_run *r = (tp_run *)arg;
    if (thread < 0 || thread >= r->threads || thread >= TP_MAX_THREADS) {
        atomic_fetch_add(&r->bad_index, 1);
        return;
    }
    if (atomic_exchange(&r->busy[thread], 1) != 0) atomic_fetch_add(&r->shared_index, 1);
    if (thread > 0) atomic_fetch_add(&r->workers_joined, 1);
    if (thread == 0 && r->await_workers) {
        /* the run stays open while the caller is in here: every worker, spinning or asleep, must
         * come (not a matter of timing unless a wake-up is lost) */
        const int64_t t0 = tp_now_ns();
        while (atomic_load(&r->workers_joined) < r->threads - 1) {
            if (tp_now_ns() - t0 > TP_AWAIT_NS) {
                atomic_store(&r->await_timed_out, 1);
                break;
            }
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL); /* leave the core to the workers */
        }
    }
    int64_t b, e, last = -1;
    while (kva__tasks_claim(tasks, 1 + (thread % 3), &b, &e)) {
        if (b <= last) atomic_fetch_add(&r->out_of_order, 1);
        last = b;
        for (int64_t i = b; i < e; ++i) {
            for (volatile int w = 0; w < r->work; ++w) {
            }
            atomic_fetch_add(&r->count[i], 1);
            atomic_store(&r->mark[i], r->id);
        }
    }
    atomic_store(&r->busy[thread], 0);
}

/* One run of n tasks on `threads` threads, checked; returns how many workers joined it. With
 * `await_workers` (n > 1), every worker must join it (the caller waits for them, up to 10 s). */
static int tp_check_run_ex(kva__pool **pool, tp_run *r, int id, int threads, int n, int work, int await_workers) {
    memset(r, 0, sizeof *r);
    r->id = id;
    r->threads = threads;
    r->work = work;
    r->await_workers = await_workers;
    kva__pool_run(pool, threads, n, tp_body, r);
    int bad = 0;
    for (int i = 0; i < n; ++i)
        if (atomic_load(&r->count[i]) != 1 || atomic_load(&r->mark[i]) != id) ++bad;
    CHECK_MSG(bad == 0, "run %d (%d threads, %d tasks): %d tasks not run exactly once by this run", id, threads, n,
              bad);
    CHECK_MSG(atomic_load(&r->bad_index) == 0, "run %d: a thread index outside 0..%d", id, threads - 1);
    CHECK_MSG(atomic_load(&r->shared_index) == 0, "run %d: two threads inside the body with one index", id);
    CHECK_MSG(atomic_load(&r->out_of_order) == 0, "run %d: a thread's claims went backwards", id);
    for (int t = 0; t < TP_MAX_THREADS; ++t)
        CHECK_MSG(atomic_load(&r->busy[t]) == 0, "run %d: thread %d still inside the body after the run", id, t);
    CHECK_MSG(atomic_load(&r->await_timed_out) == 0, "run %d: %d of its %d workers joined in %d s (a lost wake-up?)",
              id, atomic_load(&r->workers_joined), threads - 1, (int)(TP_AWAIT_NS / 1000000000));
    return atomic_load(&r->workers_joined);
}

static int tp_check_run(kva__pool **pool, tp_run *r, int id, int threads, int n, int work) {
    return tp_check_run_ex(pool, r, id, threads, n, work, 0);
}

KVA_TEST(thread_pool_runs_every_task_once) {
    static tp_run r; /* ~60 KB */
    kva__pool *pool = NULL;
    const int threads[] = {1, 2, 3, 5, 16};
    const int tasks[] = {0, 1, 2, 7, 64, 1000, TP_MAX_TASKS};
    int id = 0;
    for (int a = 0; a < 5; ++a)
        for (int b = 0; b < 7; ++b)
            for (int rep = 0; rep < 4; ++rep)
                /* (the caller alone would pass every check: the first of each four has every worker
                 * in it, awaited rather than hoped for, which failed on a loaded machine) */
                tp_check_run_ex(&pool, &r, ++id, threads[a], tasks[b], rep & 1 ? 500 : 0,
                                rep == 0 && threads[a] > 1 && tasks[b] > 1 && kva_test_failures == 0);
    kva__pool_destroy(pool);
}

/* Back to back, alternating two run records: a worker that wakes late for run k must find it
 * closed rather than work on run k+1's tasks under run k's body and record. */
KVA_TEST(thread_pool_back_to_back_runs_do_not_mix) {
    static tp_run r[2];
    kva__pool *pool = NULL;
    for (int k = 1; k <= 3000 && kva_test_failures == 0; ++k)
        tp_check_run(&pool, &r[k & 1], k, 4, 1 + k % 9, k % 3 ? 0 : 300);
    kva__pool_destroy(pool);
}

/* Idle past the spin: workers sleep, then must wake for the next run, every one of them (the
 * caller waits for them: a run completes without its workers, so only that can see a lost
 * wake-up). */
KVA_TEST(thread_pool_wakes_sleeping_workers) {
    static tp_run r;
    kva__pool *pool = NULL;
    for (int k = 1; k <= 6 && kva_test_failures == 0; ++k) {
        tp_check_run_ex(&pool, &r, k, 3, 200, 300, 1);
        struct timespec ts = {0, 2000000 * k}; /* 2..12 ms: beyond the workers' 0.2 ms of polling */
        nanosleep(&ts, NULL);
    }
    kva__pool_destroy(pool);
    kva__pool_destroy(NULL);
}

typedef struct tp_thread_arg {
    int failures;
} tp_thread_arg;

static void *tp_pool_user(void *p) {
    tp_thread_arg *a = (tp_thread_arg *)p;
    tp_run *r = (tp_run *)malloc(sizeof *r);
    kva__pool *pool = NULL;
    const int before = kva_test_failures;
    for (int k = 1; k <= 3000 && r; ++k) tp_check_run(&pool, r, k, 6, 37, k & 1 ? 200 : 0);
    a->failures = kva_test_failures - before; /* (the counter is shared: only a hint) */
    kva__pool_destroy(pool);
    free(r);
    return NULL;
}

/* Two pools of 6 threads each, from two threads at once, on however few cores: more threads
 * than cores, each pool's caller finishing runs its late workers never joined. */
KVA_TEST(thread_pool_two_pools_oversubscribed) {
    pthread_t t[2];
    tp_thread_arg a[2] = {{0}, {0}};
    for (int i = 0; i < 2; ++i) TP_REQUIRE(pthread_create(&t[i], NULL, tp_pool_user, &a[i]) == 0);
    for (int i = 0; i < 2; ++i) pthread_join(t[i], NULL);
}

typedef struct tp_loop {
    int64_t n;
    _Atomic int count[TP_MAX_TASKS];
} tp_loop;

static void tp_item(void *arg, int64_t i, int thread) {
    (void)thread;
    tp_loop *L = (tp_loop *)arg;
    if (i >= 0 && i < L->n) atomic_fetch_add(&L->count[i], 1);
}

KVA_TEST(thread_pool_for_covers_the_range_in_chunks) {
    static tp_loop L;
    kva__pool *pool = NULL;
    const int64_t ns[] = {0, 1, 5, 16, 17, 999, TP_MAX_TASKS};
    const int64_t chunks[] = {0, 1, 3, 16, 10000};
    for (int a = 0; a < 7; ++a)
        for (int c = 0; c < 5; ++c) {
            memset(&L, 0, sizeof L);
            L.n = ns[a];
            kva__pool_for(&pool, 4, ns[a], chunks[c], tp_item, &L);
            int bad = 0;
            for (int64_t i = 0; i < ns[a]; ++i) bad += atomic_load(&L.count[i]) != 1;
            CHECK_MSG(bad == 0, "n %lld, chunk %lld: %d items not run exactly once", (long long)ns[a],
                      (long long)chunks[c], bad);
        }
    kva__pool_destroy(pool);
}

#if defined(__SANITIZE_THREAD__)
#define TP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TP_TSAN 1
#endif
#endif

/* A forked child inherits the pool's record but none of its threads: its runs must complete and
 * start workers of its own (an awaited run), and destroying the inherited pool must not wait for
 * the parent's threads. The child is killed after 30 s, which fails the test. */
KVA_TEST(thread_pool_survives_fork) {
#ifdef TP_TSAN
    kva_test_skip("fork of a multi-threaded process under ThreadSanitizer");
#else
    static tp_run r;
    kva__pool *pool = NULL;
    tp_check_run(&pool, &r, 1, 3, 100, 300);
    fflush(stdout);
    pid_t pid = fork();
    TP_REQUIRE(pid >= 0);
    if (pid == 0) {
        alarm(30);
        const int before = kva_test_failures;
        /* awaited: the child's runs get workers of its own (the parent's are not there to join) */
        tp_check_run_ex(&pool, &r, 2, 3, 200, 500, 1);
        tp_check_run(&pool, &r, 3, 3, 1000, 300);
        kva__pool_destroy(pool);
        _exit(kva_test_failures == before ? 0 : 1);
    }
    int status = 0;
    TP_REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child: %s %d",
              WIFEXITED(status) ? "exit status" : "killed by signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    tp_check_run(&pool, &r, 4, 3, 100, 300); /* the parent's pool still works */
    kva__pool_destroy(pool);
#endif
}

/* A pool started for more threads than a later run asks for: that run's workers are thread 1 ..
 * threads-1 only; the pool's other workers may join the run but never enter its body. The caller
 * holds each run open (up to 20 ms after its own workers came, or until a wrong index shows) so
 * that the extra workers, spinning or woken, come by while it is open. */
typedef struct tp_linger {
    tp_run *r;
} tp_linger;

static void tp_body_lingering(void *arg, int thread, kva__tasks *tasks) {
    tp_run *r = ((tp_linger *)arg)->r;
    if (thread == 0) {
        const int64_t t0 = tp_now_ns();
        while (tp_now_ns() - t0 < 20000000 && atomic_load(&r->bad_index) == 0) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
    tp_body(r, thread, tasks);
}

KVA_TEST(thread_pool_fewer_threads_than_workers) {
    static tp_run r;
    kva__pool *pool = NULL;
    tp_check_run_ex(&pool, &r, 1, 6, 100, 0, 1); /* five workers */
    const int threads[] = {2, 3, 5, 4, 2, 3};
    for (int k = 0; k < 6 && kva_test_failures == 0; ++k) {
        memset(&r, 0, sizeof r);
        r.id = 2 + k;
        r.threads = threads[k];
        r.await_workers = 1;
        tp_linger L = {&r};
        kva__pool_run(&pool, threads[k], 64, tp_body_lingering, &L);
        int bad = 0;
        for (int i = 0; i < 64; ++i) bad += atomic_load(&r.count[i]) != 1 || atomic_load(&r.mark[i]) != r.id;
        CHECK_MSG(bad == 0, "%d-thread run on a 6-thread pool: %d tasks not run once", threads[k], bad);
        CHECK_MSG(atomic_load(&r.bad_index) == 0, "%d-thread run on a 6-thread pool: a worker entered the body as "
                  "a thread index outside 0..%d", threads[k], threads[k] - 1);
        CHECK_MSG(atomic_load(&r.await_timed_out) == 0, "%d-thread run: its workers did not all come", threads[k]);
    }
    kva__pool_destroy(pool);
}

#if defined(__SANITIZE_ADDRESS__) || defined(TP_TSAN)
#define TP_NO_RLIMIT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define TP_NO_RLIMIT 1
#endif
#endif

#if !defined(TP_NO_RLIMIT)
#include <sys/resource.h>
static int tp_block_fd = -1;
static void *tp_blocker(void *arg) {
    char c;
    while (read(tp_block_fd, &c, 1) < 0) {
    }
    return arg;
}
#endif

/* When no worker thread can be started, every run still completes, on the caller alone. Here: a
 * forked child limits its address space to what it uses plus 1 MB (no room for a new thread
 * stack), then starts blocked threads until that fails, so that no stack glibc kept from earlier
 * threads is left either. */
KVA_TEST(thread_pool_runs_alone_when_no_thread_starts) {
#if defined(TP_NO_RLIMIT)
    kva_test_skip("address space limits under a sanitizer");
#else
    static tp_run r;
    fflush(stdout);
    pid_t pid = fork();
    TP_REQUIRE(pid >= 0);
    if (pid == 0) {
        alarm(30);
        int fds[2];
        FILE *f = fopen("/proc/self/statm", "r");
        unsigned long pages = 0;
        if (pipe(fds) != 0 || !f || fscanf(f, "%lu", &pages) != 1) _exit(77);
        fclose(f);
        tp_block_fd = fds[0];
        struct rlimit lim = {(rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)1 << 20), RLIM_INFINITY};
        if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(77);
        enum { MAX_BLOCKERS = 64 };
        pthread_t blockers[MAX_BLOCKERS];
        int nb = 0;
        while (nb < MAX_BLOCKERS && pthread_create(&blockers[nb], NULL, tp_blocker, NULL) == 0) ++nb;
        if (nb == MAX_BLOCKERS) _exit(77); /* the limit does not stop threads here */
        const int before = kva_test_failures;
        kva__pool *pool = NULL;
        for (int k = 1; k <= 3; ++k) tp_check_run(&pool, &r, k, 4, 300, 0);
        kva__pool_destroy(pool);
        close(fds[1]);
        for (int i = 0; i < nb; ++i) pthread_join(blockers[i], NULL);
        _exit(kva_test_failures == before ? 0 : 1);
    }
    int status = 0;
    TP_REQUIRE(waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
        kva_test_skip("could not keep threads from starting");
        return;
    }
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child without threads: %s %d",
              WIFEXITED(status) ? "exit status" : "killed by signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
#endif
}
