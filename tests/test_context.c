/*
 * test_context.c -- a CPU context's thread count: the cores its creating thread may run on (its
 * affinity mask, as taskset or a container's cpuset sets it), not the machine's; set_threads(0)
 * returns to that count, which stays fixed for the context (the split policy and so workspace
 * sizes depend on it).
 */
#define _GNU_SOURCE
#include "harness.h"
#include "test_util.h"

#include <pthread.h>
#include <sched.h>

typedef struct pinned_result {
    int pinned, threads_at_create, threads_after_reset, status;
} pinned_result;

/* On a thread pinned to one core: a new context's threads, and again after set_threads(3, 0). */
static void *pinned_thread(void *arg) {
    pinned_result *r = (pinned_result *)arg;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return NULL;
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
        if (CPU_ISSET(c, &set)) first = c;
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    if (first < 0 || sched_setaffinity(0, sizeof set, &set) != 0) return NULL;
    r->pinned = 1;
    kva_context *ctx = NULL;
    r->status = kva_context_create(KVA_DEVICE_CPU, 0, &ctx);
    if (r->status != KVA_OK) return NULL;
    r->threads_at_create = kva_context_threads(ctx);
    if (kva_context_set_threads(ctx, 3) == KVA_OK && kva_context_set_threads(ctx, 0) == KVA_OK)
        r->threads_after_reset = kva_context_threads(ctx);
    kva_context_destroy(ctx);
    return NULL;
}

KVA_TEST(context_threads_follow_the_affinity_mask) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        kva_test_skip("sched_getaffinity failed");
        return;
    }
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    CHECK_MSG(kva_context_threads(ctx) == CPU_COUNT(&set), "context threads %d, affinity mask %d cores",
              kva_context_threads(ctx), CPU_COUNT(&set));
    kva_context_destroy(ctx);

    pinned_result r = {0, 0, 0, 0};
    pthread_t t;
    if (pthread_create(&t, NULL, pinned_thread, &r) != 0) {
        kva_test_fail(__FILE__, __LINE__, "pthread_create failed");
        return;
    }
    pthread_join(t, NULL);
    if (!r.pinned) {
        kva_test_skip("could not pin a thread to one core");
        return;
    }
    CHECK_MSG(r.status == KVA_OK, "kva_context_create on the pinned thread: %s", kva_status_str(r.status));
    CHECK_MSG(r.threads_at_create == 1 && r.threads_after_reset == 1,
              "pinned to one core: %d threads at creation, %d after set_threads(0)", r.threads_at_create,
              r.threads_after_reset);
}
