/*
 * prefill_hopper_trace.cuh -- an optional clock64 trace of the Hopper prefill kernel's phases,
 * per work item: where a short item's cycles go, which ncu's whole-kernel averages do not say
 * (bench/NOTES.md, v6.17: it found the epilogue's split stores).
 *
 * Built only with -DKVA__HP_TRACE (CMake option KVA_HP_TRACE, measurement builds: the stores
 * perturb timing slightly); otherwise every KVA__HP_TRACE_AT compiles to nothing. Blocks 0 and 1
 * record their first KVA__HP_TRACE_ITEMS work items: for each consumer warpgroup (its first
 * thread) the clock at each consumer point, for the producer (its first thread) the clock at each
 * producer point, and the item's tile count. Read back (and cleared) on the host with
 * kva__hp_trace_read (prefill_hopper_bf16.cu); printed by bench/hopper_trace/hopper_trace.c.
 * The clock is per SM, so only differences within one block mean anything.
 */
#ifndef KVA_PREFILL_HOPPER_TRACE_CUH
#define KVA_PREFILL_HOPPER_TRACE_CUH

enum {
    KVA__HP_TRACE_BLOCKS = 2,
    KVA__HP_TRACE_ROLES = 4, /* producer, consumer warpgroups 0, 1 (and 2 at d64) */
    KVA__HP_TRACE_ITEMS = 64,
    KVA__HP_TRACE_POINTS = 10
};
/* consumer points */
enum {
    KVA__HPT_TOP = 0,      /* item's top (its Q may still be in flight) */
    KVA__HPT_Q = 1,        /* its Q landed (the top again when the last item's tail took S_0) */
    KVA__HPT_S0 = 2,       /* S_0's softmax done */
    KVA__HPT_LOOP = 3,     /* steady loop done */
    KVA__HPT_TAIL = 4,     /* last P V done (with the cross-item tail: the next S_0's softmax too) */
    KVA__HPT_EPILOGUE = 5, /* epilogue done (staged O handed to the store warp) */
    KVA__HPT_TILES = 6,    /* the item's key tiles (a count, not a clock) */
    KVA__HPT_STAGED = 7,   /* the epilogue's O normalised and lse written (O staged in shared
                              memory; where o is stored directly, those stores too) */
    /* the gap from the epilogue to the next item's top, in parts: */
    KVA__HPT_GAP_DONE = 8, /* the item's record handed back (work_done) */
    KVA__HPT_GAP_NEXT = 9  /* the record after next tried early (cross-item tail; at d256
                              nothing happens between done and next), read before the next Q's
                              own copies, which count to the gap's top part: read at the loop's
                              end, after them, it made the d128 trace build spill 328 bytes and
                              the d64 one 1084, moving every phase */
};
/* producer warpgroup points (and KVA__HPT_TILES): the K producer's (warp 0; the V warp's copies
 * are not traced), the scheduler warp's (item
 * m's buffer free: its Q copy begins; the copy issued or the buffer passed on) and the store
 * warp's (item m's O handed over; its copies read and the buffer freed) */
enum {
    KVA__HPT_P_START = 0,
    KVA__HPT_P_FIRST = 1,
    KVA__HPT_P_LAST = 2,
    KVA__HPT_S_Q = 3,
    KVA__HPT_W_GOT = 4,
    KVA__HPT_W_DONE = 5,
    KVA__HPT_S_FREE = 7
};

#ifdef KVA__HP_TRACE
#ifdef __CUDACC_RTC__
/* (a variant's module, compiled in a trace build: one program per module, its buffer found by
 * this unmangled name -- kva__variant_trace_read, variant_load.cu) */
extern "C" {
__device__ long long kva__hp_trace_buf[KVA__HP_TRACE_BLOCKS][KVA__HP_TRACE_ROLES][KVA__HP_TRACE_ITEMS]
                                      [KVA__HP_TRACE_POINTS];
}
#else
static __device__ long long kva__hp_trace_buf[KVA__HP_TRACE_BLOCKS][KVA__HP_TRACE_ROLES][KVA__HP_TRACE_ITEMS]
                                             [KVA__HP_TRACE_POINTS];
#endif
#define KVA__HP_TRACE_AT(role, item, point, value)                                                        \
    do {                                                                                              \
        if (blockIdx.x < KVA__HP_TRACE_BLOCKS && (item) < KVA__HP_TRACE_ITEMS && (threadIdx.x & 127) == 0) \
            kva__hp_trace_buf[blockIdx.x][role][item][point] = (long long)(value);                    \
    } while (0)
/* (from lane 0 of a producer-warpgroup warp other than warp 0) */
#define KVA__HP_TRACE_WARP(item, point, value)                                                     \
    do {                                                                                           \
        if (blockIdx.x < KVA__HP_TRACE_BLOCKS && (item) < KVA__HP_TRACE_ITEMS && (threadIdx.x & 31) == 0) \
            kva__hp_trace_buf[blockIdx.x][0][item][point] = (long long)(value);                   \
    } while (0)
#else
#define KVA__HP_TRACE_AT(role, item, point, value) ((void)(item))
#define KVA__HP_TRACE_WARP(item, point, value) ((void)(item))
#endif

#endif /* KVA_PREFILL_HOPPER_TRACE_CUH */
