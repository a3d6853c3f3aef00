/*
 * thread_pool.h -- the CPU backend's worker threads: one pool per context, started at its first
 * threaded run, in place of OpenMP.
 *
 * Why not OpenMP: a team ends at a barrier that waits for every thread of the team, so a worker
 * that another process (or a second OpenMP runtime in the same process, PyTorch's) keeps off its
 * core holds the whole region for a scheduler time slice, and libgomp's default spin at that
 * barrier takes the core from the very thread it waits for: two test processes sharing this 2-core
 * machine ran a serving test in 15 s instead of 0.08 s. Here a run ends when its tasks are done: the
 * caller takes tasks too, a worker that wakes late finds none left and is never waited for; workers
 * spin for a short while after a run (back-to-back runs keep them awake), then sleep.
 */
#ifndef KVA_THREAD_POOL_H
#define KVA_THREAD_POOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kva__pool kva__pool;
typedef struct kva__tasks kva__tasks;

/* Called once on each thread that joins a run: the caller as thread 0, workers as 1 .. threads-1
 * (each index at most once per run, so per-thread scratch can be indexed by it; a worker that
 * joins late may find no task left). It takes tasks with kva__tasks_claim until none are left. */
typedef void (*kva__pool_body)(void *arg, int thread, kva__tasks *tasks);

/* Claims the next `chunk` (>= 1) tasks of the run, [*begin, *end); 0 when none are left. Claims
 * come in increasing order on every thread. */
int kva__tasks_claim(kva__tasks *tasks, int64_t chunk, int64_t *begin, int64_t *end);

/* Runs tasks [0, num_tasks) on the calling thread and up to threads - 1 workers of *pool (created
 * here, or re-created with more workers, when needed; if threads cannot be started the caller runs
 * every task alone). Returns when every task is done and every worker that joined has left body.
 * threads <= 1 or num_tasks <= 1 runs body on the caller only. One run at a time per pool. */
void kva__pool_run(kva__pool **pool, int threads, int64_t num_tasks, kva__pool_body body, void *arg);

/* A parallel loop: fn(arg, i, thread) for i in [0, n), chunk indices per claim. */
typedef void (*kva__pool_item)(void *arg, int64_t i, int thread);
void kva__pool_for(kva__pool **pool, int threads, int64_t n, int64_t chunk, kva__pool_item fn, void *arg);

/* Stops and joins the workers. NULL is fine. */
void kva__pool_destroy(kva__pool *pool);

#ifdef __cplusplus
}
#endif

#endif
