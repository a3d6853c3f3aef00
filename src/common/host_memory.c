/*
 * host_memory.c -- the memory of a CPU context (kva_malloc on the CPU): 64-byte aligned blocks;
 * blocks of 2 MB or more start on a 2 MB boundary and ask Linux for transparent huge pages.
 *
 * Why: decode reads K/V pages in a shuffled order, so with 4 KB pages nearly every 32 KB KV page
 * it touches is 8 TLB misses, and the page walks hold the same miss buffers the software
 * prefetches need. On a 2-vCPU Zen 5 (THP "madvise" mode) 2 MB pages made 2-thread decode from
 * DRAM 20-35% faster (bench/NOTES.md, "CPU decode II"). Advice is all it is: where the kernel
 * has no THP, or THP is "never", or no huge page is free, madvise fails or does nothing and the
 * block is ordinary 4 KB-paged memory. KVA_HUGE_PAGES=0 turns the advice off.
 */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

int kva__advise_huge_pages(void *p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    /* only whole 2 MB frames inside the block: advising a partial one would let the kernel
     * back memory past the block's end with a huge page */
    uintptr_t begin = kva__align_up((uintptr_t)p, KVA__HUGE_PAGE_BYTES);
    uintptr_t end = ((uintptr_t)p + bytes) / KVA__HUGE_PAGE_BYTES * KVA__HUGE_PAGE_BYTES;
    if (end <= begin) return -1;
    return madvise((void *)begin, end - begin, MADV_HUGEPAGE) == 0 ? 0 : -1;
#else
    (void)p;
    (void)bytes;
    return -1;
#endif
}

static int huge_pages_wanted(void) {
    const char *v = getenv("KVA_HUGE_PAGES");
    return !(v && strcmp(v, "0") == 0);
}

void *kva__host_memory_alloc(size_t bytes) {
    size_t n = bytes ? kva__align_up(bytes, 64) : 64;
    int huge = n >= KVA__HUGE_PAGE_BYTES && huge_pages_wanted();
    void *p = NULL;
    if (posix_memalign(&p, huge ? KVA__HUGE_PAGE_BYTES : 64, n) != 0) return NULL;
    if (huge) (void)kva__advise_huge_pages(p, n); /* a failure leaves 4 KB pages: still valid */
    return p;
}
