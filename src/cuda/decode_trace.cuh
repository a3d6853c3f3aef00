/*
 * decode_trace.cuh -- an optional trace of the decode kernel's fixed costs, per block: when it
 * starts, when its first unit's plan record, programmatic-dependency wait, first tile, loop and
 * combined state are done, and when it exits (after any merge). A small batch's call is mostly
 * these (bench/NOTES.md, "The sub-group round's test", calls 3 and 4: 32/8 d128 1 x 8192 streams
 * its 33.5 MB in ~8 us of ~17.8), which event times alone do not split.
 *
 * Built only with -DKVA__DECODE_TRACE (CMake option KVA_DECODE_TRACE, measurement builds; the
 * bf16 kernels only); otherwise KVA__DT_AT compiles to nothing. Thread 0 of each of the first
 * KVA__DT_BLOCKS blocks records, at each point, %globaltimer (ns, one clock for the whole device:
 * blocks compare) and clock64 (cycles of its SM: finer, within the block only). A block with no
 * unit records its entry and exit only (units 0). Read back (and cleared) on the host with
 * kva__decode_trace_read (decode_bf16.cu); printed by bench/decode_trace/decode_trace.c.
 */
#ifndef KVA_DECODE_TRACE_CUH
#define KVA_DECODE_TRACE_CUH

enum { KVA__DT_BLOCKS = 512, KVA__DT_POINTS = 8 };
enum {
    KVA__DT_ENTRY = 0, /* the kernel's first instruction in this block */
    KVA__DT_REC = 1,   /* the first unit's record decoded (its load landed) */
    KVA__DT_WAIT = 2,  /* past the programmatic-dependency wait (no PDL: the prologue's loads issued) */
    KVA__DT_FIRST = 3, /* the first tile of warp 0 landed */
    KVA__DT_LOOP = 4,  /* warp 0's tiles of the first unit done */
    KVA__DT_COMB = 5,  /* the first unit's warps combined, o or its partial state written */
    KVA__DT_EXIT = 6,  /* the block's last unit done, its merge too */
    KVA__DT_UNITS = 7  /* units the block ran (a count) */
};

#ifdef KVA__DECODE_TRACE
static __device__ unsigned long long kva__dt_ns[KVA__DT_BLOCKS][KVA__DT_POINTS];
static __device__ long long kva__dt_clk[KVA__DT_BLOCKS][KVA__DT_POINTS];
/* (dep: a value the point must follow -- the clocks are read after it is available, since the
 * asm takes it as an operand; the memory clobber keeps loads and stores on their side) */
__device__ __forceinline__ void kva__dt_record(int point, int dep) {
    if (threadIdx.x == 0 && blockIdx.x < KVA__DT_BLOCKS) {
        unsigned long long t;
        long long c;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(dep) : "memory");
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) : "r"(dep) : "memory");
        kva__dt_ns[blockIdx.x][point] = t;
        kva__dt_clk[blockIdx.x][point] = c;
    }
}
#define KVA__DT_AT(cond, point, dep)                 \
    do {                                             \
        if (cond) kva__dt_record(point, (int)(dep)); \
    } while (0)
#define KVA__DT_COUNT(value)                                                                    \
    do {                                                                                        \
        if (threadIdx.x == 0 && blockIdx.x < KVA__DT_BLOCKS) kva__dt_clk[blockIdx.x][KVA__DT_UNITS] = (value); \
    } while (0)
#else
#define KVA__DT_AT(cond, point, dep) ((void)0)
#define KVA__DT_COUNT(value) ((void)0)
#endif

#endif /* KVA_DECODE_TRACE_CUH */
