/*
 * cache_internal.h -- the state of a kva_cache and the small helpers its files share.
 *
 * Device memory holds only the page pool [num_layers][num_pages][2][page...]. Everything else is
 * host bookkeeping: a stack of free page ids, a reference count per page id (one count covers
 * that page in every layer), and a slot per sequence with its page list and length.
 *
 * Per-sequence page lists: a sequence never lists a page twice, so num_pages entries always
 * suffice, but preallocating max_sequences x num_pages entries is quadratic (256 sequences x
 * 500k pages of size 1 would be 500 MB of host memory). Instead each slot gets a fair share
 * (num_pages / max_sequences, at least a few entries) at create and grows geometrically, capped
 * at num_pages, inside kva_cache_reserve / kva_cache_fork BEFORE any visible state changes, so a
 * failed growth (KVA_ERR_OUT_OF_MEMORY) still leaves the cache untouched. A freed slot keeps its
 * array for the next sequence, so a serving loop stops allocating once lengths have peaked.
 * Nothing here touches device memory except the pool writes in append and copy-on-write.
 *
 * Conventions shared by every kva_cache_* entry point:
 *   - a sequence id outside 0..max_sequences-1 or not live: KVA_ERR_BAD_STATE;
 *   - a batch (reserve, append) naming one id twice: KVA_ERR_INVALID_ARG (two appends to the same
 *     slots would race on the GPU, and one reserve per id keeps the all-or-nothing rule simple);
 *   - every check runs before the first change, so a failing call changes nothing.
 * A cache is not thread-safe: calls on one cache must be serialised by the caller.
 */
#ifndef KVA_CACHE_INTERNAL_H
#define KVA_CACHE_INTERNAL_H

#include "../common/internal.h"

typedef struct kva__cache_seq {
    int32_t *pages;    /* [capacity] page ids in logical order; the first num_pages are used */
    int32_t num_pages; /* == ceil(len / page_size) */
    int32_t capacity;
    int32_t len;       /* tokens (reserved slots) */
    bool live;
} kva__cache_seq;

struct kva_cache {
    kva_context *ctx;
    kva_cache_config cfg;

    /* Device memory: the pool, and (CUDA only) device staging for append's slot numbers. */
    void *pool;
    size_t layer_bytes;      /* bytes of one layer's [num_pages][2][page...] */
    int64_t *slots_device;

    /* Host: page allocator. */
    int32_t *free_pages;     /* stack; free_pages[num_free - 1] is handed out next */
    int32_t num_free;
    int32_t *refcount;       /* [num_pages] sequences listing each page */

    /* Host: sequences. */
    kva__cache_seq *seqs;    /* [max_sequences] */
    int32_t *free_slots;     /* stack of unused sequence ids */
    int32_t num_free_slots;

    /* Host scratch, sized at create so no call on the append/reserve path allocates for it.
     * slots_host is ordinary (pageable) memory on purpose: on CUDA, kva__cuda_append uploads it
     * with cudaMemcpyAsync, which returns only once pageable source bytes have been staged, so
     * the next append may overwrite it at once (pinned memory would need an event per call). */
    int64_t *slots_host;     /* [max_append_tokens] slot = page * page_size + offset */
    uint32_t *batch_stamp;   /* [max_sequences] duplicate detection within one batch */
    uint32_t stamp;
    int32_t *cow_src;        /* [max_sequences] copy-on-write pairs of one reserve */
    int32_t *cow_dst;
    int32_t *cow_seq;        /* index in the batch of the sequence each pair belongs to */

    /* Statistics kept incrementally. */
    int32_t shared_pages;    /* pages with refcount > 1 */
    int32_t peak_used_pages;
    int64_t num_tokens;
    int64_t cow_copies;
};

/* A NULL cache argument: named as kvattn.h names it ("kva_cache_seq_len: cache is NULL"), where
 * KVA_CHECK_NULL(c) would name the local variable (c). Used in public entry points only. */
#define KVA__CACHE_CHECK_NULL(c)                                                               \
    do {                                                                                       \
        if ((c) == NULL) return kva__fail(KVA_ERR_INVALID_ARG, "%s: cache is NULL", __func__); \
    } while (0)

/* Checks that id names a live sequence (KVA_ERR_BAD_STATE otherwise). `what` names the caller. */
static inline kva_status kva__cache_check_seq(const kva_cache *c, int32_t id, const char *what) {
    if (id < 0 || id >= c->cfg.max_sequences)
        return kva__fail(KVA_ERR_BAD_STATE, "%s: sequence id %d outside 0..%d", what, id,
                         c->cfg.max_sequences - 1);
    if (!c->seqs[id].live)
        return kva__fail(KVA_ERR_BAD_STATE, "%s: sequence %d is not live (never added or freed)",
                         what, id);
    return KVA_OK;
}

/* Checks a batch of sequence ids: all live and none repeated. */
kva_status kva__cache_check_batch(kva_cache *c, int32_t n, const int32_t *ids, const char *what);

/* Makes room for at least `need` entries in a sequence's page list (need <= num_pages).
 * Changes only the capacity, which no caller can observe. */
kva_status kva__cache_seq_grow(kva_cache *c, kva__cache_seq *s, int32_t need);

/* Page reference counting, keeping shared_pages in step. */
static inline void kva__cache_page_ref(kva_cache *c, int32_t page) {
    if (++c->refcount[page] == 2) ++c->shared_pages;
}
static inline void kva__cache_page_unref(kva_cache *c, int32_t page) {
    int32_t r = --c->refcount[page];
    if (r == 1) --c->shared_pages;
    if (r == 0) c->free_pages[c->num_free++] = page;
}
/* Takes the next free page (the caller has checked num_free) with refcount 1. */
static inline int32_t kva__cache_page_take(kva_cache *c) {
    int32_t page = c->free_pages[--c->num_free];
    c->refcount[page] = 1;
    int32_t used = c->cfg.num_pages - c->num_free;
    if (used > c->peak_used_pages) c->peak_used_pages = used;
    return page;
}

#endif /* KVA_CACHE_INTERNAL_H */
