/*
 * test_context.c -- a CPU context's thread count: the cores its creating thread may run on (its
 * affinity mask, as taskset or a container's cpuset sets it), not the machine's; set_threads(0)
 * returns to that count, which stays fixed for the context (the split policy and so workspace
 * sizes depend on it). set_threads is what threads and kva_context_info report, stops the workers
 * of the old count, and leaves workspace sizes alone; kva_memcpy copies every kind on the CPU; the
 * context's name is the CPU model.
 */
#define _GNU_SOURCE
#include "harness.h"
#include "test_util.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

/* set_threads(n) is what kva_context_threads and kva_context_info's num_sms report afterwards;
 * set_threads(0) goes back to the core count the context was created with. */
KVA_TEST(context_set_threads_is_reported_and_zero_restores_the_cores) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    const int cores = kva_context_threads(ctx);
    const int counts[] = {cores + 2, 1, 0, 5, 3, 0};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; ++i) {
        CHECK_OK(kva_context_set_threads(ctx, counts[i]));
        const int want = counts[i] ? counts[i] : cores;
        kva_device_info info;
        memset(&info, 0xff, sizeof info);
        CHECK_OK(kva_context_info(ctx, &info));
        CHECK_MSG(kva_context_threads(ctx) == want && info.num_sms == want,
                  "set_threads(%d) on %d cores: %d threads, info.num_sms %d (want %d)", counts[i], cores,
                  kva_context_threads(ctx), info.num_sms, want);
    }
    kva_context_destroy(ctx);
}

/* Threads of this process (/proc/self/task), or -1 where that cannot be read. */
static int process_threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') ++n;
    closedir(d);
    return n;
}

/* Waits (up to 5 s) for the process to have `want` threads: a joined thread leaves
 * /proc/self/task a moment after pthread_join returns. Returns the last count seen. */
static int await_process_threads(int want) {
    int n = process_threads();
    for (int i = 0; i < 5000 && n != want; ++i) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        n = process_threads();
    }
    return n;
}

/* Stores the thread's kernel id (its /proc/self/task entry). */
static void *note_tid(void *arg) {
    *(long *)arg = (long)syscall(SYS_gettid);
    return NULL;
}

/* Waits (up to 5 s) for thread `tid` to leave /proc/self/task. */
static void await_thread_gone(long tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld", tid);
    for (int i = 0; i < 5000 && access(path, F_OK) == 0; ++i) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* A threaded run starts the context's workers; changing the thread count stops them (the next
 * threaded run starts as many as it needs) rather than leaving them idle for the context's life. */
KVA_TEST(context_set_threads_stops_the_old_workers) {
    if (process_threads() < 1) {
        kva_test_skip("/proc/self/task cannot be read");
        return;
    }
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    /* a merge large enough to be split across threads (cpu_merge.c) */
    const int32_t rows = 700, states = 2, D = 64;
    float *v = kva_test_alloc(sizeof(float) * (size_t)rows * states * D);
    float *lse = kva_test_alloc(sizeof(float) * (size_t)rows * states);
    float *out = kva_test_alloc(sizeof(float) * (size_t)rows * D);
    kva_fill_random(&rng, v, KVA_F32, (size_t)rows * states * D, -1.0f, 1.0f);
    kva_fill_random(&rng, lse, KVA_F32, (size_t)rows * states, -3.0f, 3.0f);
    /* a thread started and joined first: ThreadSanitizer starts a background thread of its own at
     * the process's first pthread_create, which must not count as a worker */
    pthread_t dummy;
    long dummy_tid = 0;
    if (pthread_create(&dummy, NULL, note_tid, &dummy_tid) == 0) {
        pthread_join(dummy, NULL);
        if (dummy_tid > 0) await_thread_gone(dummy_tid);
    }
    const int before = process_threads();
    REQUIRE_OK(kva_context_set_threads(ctx, 4));
    CHECK_OK(kva_merge_states(ctx, rows, states, D, KVA_F32, v, lse, out, NULL));
    const int running = process_threads();
    CHECK_MSG(running == before + 3, "%d threads before, %d after a 4-thread run (want 3 workers)", before,
              running);
    REQUIRE_OK(kva_context_set_threads(ctx, 1));
    const int after = await_process_threads(before);
    CHECK_MSG(after == before, "set_threads(1) left %d of the run's %d threads (%d before it)", after, running,
              before);
    /* and a later threaded run starts workers again */
    REQUIRE_OK(kva_context_set_threads(ctx, 2));
    CHECK_OK(kva_merge_states(ctx, rows, states, D, KVA_F32, v, lse, out, NULL));
    CHECK_MSG(process_threads() == before + 1, "a 2-thread run: %d threads, %d before", process_threads(), before);
    kva_context_destroy(ctx);
    CHECK_MSG(await_process_threads(before) == before, "kva_context_destroy left workers running");
    free(v);
    free(lse);
    free(out);
}

/* Workspace sizes depend on the core count the context was created with, never on
 * kva_context_set_threads: a workspace sized once stays valid whatever the thread count. */
KVA_TEST(context_workspace_sizes_do_not_follow_set_threads) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_plan_limits lim;
    memset(&lim, 0, sizeof lim);
    lim.max_batch = 16;
    lim.max_total_pages = 4096;
    lim.max_total_kv = 65536;
    lim.max_total_qo = 4096;
    lim.num_qo_heads = 8;
    lim.num_kv_heads = 2;
    lim.head_dim = 128;
    lim.page_size = 16;
    size_t dd0 = 0, dh0 = 0, pd0 = 0, ph0 = 0;
    REQUIRE_OK(kva_decode_workspace_size(ctx, &lim, &dd0, &dh0));
    REQUIRE_OK(kva_prefill_workspace_size(ctx, &lim, &pd0, &ph0));
    const int counts[] = {1, 7, 64, 0};
    for (int i = 0; i < 4; ++i) {
        REQUIRE_OK(kva_context_set_threads(ctx, counts[i]));
        size_t dd = 0, dh = 0, pd = 0, ph = 0;
        CHECK_OK(kva_decode_workspace_size(ctx, &lim, &dd, &dh));
        CHECK_OK(kva_prefill_workspace_size(ctx, &lim, &pd, &ph));
        CHECK_MSG(dd == dd0 && dh == dh0 && pd == pd0 && ph == ph0,
                  "set_threads(%d) changed workspace sizes: decode %zu+%zu -> %zu+%zu, prefill %zu+%zu -> "
                  "%zu+%zu",
                  counts[i], dd0, dh0, dd, dh, pd0, ph0, pd, ph);
    }
    kva_context_destroy(ctx);
}

/* On the CPU every copy kind is a host copy, bytes exactly. */
KVA_TEST(context_memcpy_copies_every_kind_on_the_cpu) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_rng rng;
    kva_rng_seed(&rng, kva_test_seed());
    const kva_copy_kind kinds[3] = {KVA_COPY_HOST_TO_DEVICE, KVA_COPY_DEVICE_TO_HOST, KVA_COPY_DEVICE_TO_DEVICE};
    const size_t n = 4096 + 77;
    unsigned char *src = kva_test_alloc(n), *dst = kva_test_alloc(n + 16);
    for (int k = 0; k < 3; ++k) {
        for (size_t i = 0; i < n; ++i) src[i] = (unsigned char)kva_rng_int(&rng, 0, 255);
        kva_poison(dst, n + 16);
        CHECK_OK(kva_memcpy(ctx, dst, src, n, kinds[k]));
        bool tail = true;
        for (size_t i = n; i < n + 16; ++i) tail = tail && dst[i] == 0xFF;
        CHECK_MSG(memcmp(dst, src, n) == 0 && tail, "kind %d: copy differs or wrote past its end", (int)kinds[k]);
    }
    free(src);
    free(dst);
    kva_context_destroy(ctx);
}

/* A CPU context's name is the CPU's model as /proc/cpuinfo gives it ("model name : ..."), or
 * "CPU" where there is none. */
KVA_TEST(context_info_names_the_cpu_model) {
    char want[128] = "CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0) continue;
            const char *v = strchr(line, ':');
            if (v) {
                ++v;
                while (*v == ' ' || *v == '\t') ++v;
                snprintf(want, sizeof want, "%.*s", (int)strcspn(v, "\n"), v);
            }
            break;
        }
        fclose(f);
    }
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    kva_device_info info;
    memset(&info, 0xff, sizeof info);
    CHECK_OK(kva_context_info(ctx, &info));
    CHECK_MSG(memchr(info.name, 0, sizeof info.name) != NULL && strcmp(info.name, want) == 0,
              "context name \"%.*s\", /proc/cpuinfo model name \"%s\"", (int)sizeof info.name, info.name, want);
    kva_context_destroy(ctx);
}

/* The queries on a context: its device, and for NULL the documented answers (CPU, 0 threads). */
KVA_TEST(context_queries_and_null) {
    kva_context *ctx = NULL;
    REQUIRE_OK(kva_context_create(KVA_DEVICE_CPU, 0, &ctx));
    CHECK(kva_context_device(ctx) == KVA_DEVICE_CPU);
    CHECK(kva_context_device(NULL) == KVA_DEVICE_CPU);
    CHECK(kva_context_threads(NULL) == 0);
    kva_context_destroy(ctx);
    if (kva_cuda_available()) {
        REQUIRE_OK(kva_context_create(KVA_DEVICE_CUDA, 0, &ctx));
        CHECK(kva_context_device(ctx) == KVA_DEVICE_CUDA);
        kva_context_destroy(ctx);
    }
}
