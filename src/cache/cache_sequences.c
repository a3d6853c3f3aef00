/*
 * cache_sequences.c -- the life of a sequence slot: add (empty), fork (share every page of a
 * parent through reference counts) and free (drop its references; pages nobody lists any more
 * return to the free stack).
 */
#include "cache_internal.h"

#include <string.h>

/* Takes an unused slot; the caller has checked num_free_slots. */
static int32_t take_slot(kva_cache *c) {
    int32_t id = c->free_slots[--c->num_free_slots];
    kva__cache_seq *s = &c->seqs[id];
    s->live = true;
    s->len = 0;
    s->num_pages = 0;
    return id;
}

kva_status kva_cache_add_sequence(kva_cache *c, int32_t *seq_id) {
    KVA__CACHE_CHECK_NULL(c);
    KVA_CHECK_NULL(seq_id);
    if (c->num_free_slots == 0)
        return kva__fail(KVA_ERR_NO_SPACE, "kva_cache_add_sequence: all %d sequences are live",
                         c->cfg.max_sequences);
    *seq_id = take_slot(c);
    return KVA_OK;
}

kva_status kva_cache_free_sequence(kva_cache *c, int32_t seq_id) {
    KVA__CACHE_CHECK_NULL(c);
    KVA_TRY(kva__cache_check_seq(c, seq_id, "kva_cache_free_sequence"));
    kva__cache_seq *s = &c->seqs[seq_id];
    for (int32_t i = 0; i < s->num_pages; ++i) kva__cache_page_unref(c, s->pages[i]);
    c->num_tokens -= s->len;
    s->live = false;
    s->len = 0;
    s->num_pages = 0;
    c->free_slots[c->num_free_slots++] = seq_id;
    return KVA_OK;
}

kva_status kva_cache_fork(kva_cache *c, int32_t parent_id, int32_t *child_id) {
    KVA__CACHE_CHECK_NULL(c);
    KVA_CHECK_NULL(child_id);
    KVA_TRY(kva__cache_check_seq(c, parent_id, "kva_cache_fork"));
    if (c->num_free_slots == 0)
        return kva__fail(KVA_ERR_NO_SPACE, "kva_cache_fork: all %d sequences are live",
                         c->cfg.max_sequences);
    const kva__cache_seq *parent = &c->seqs[parent_id];
    /* Grow the slot that take_slot will hand out before anything visible changes. */
    kva__cache_seq *child = &c->seqs[c->free_slots[c->num_free_slots - 1]];
    KVA_TRY(kva__cache_seq_grow(c, child, parent->num_pages));

    int32_t id = take_slot(c);
    memcpy(child->pages, parent->pages, (size_t)parent->num_pages * sizeof(int32_t));
    child->num_pages = parent->num_pages;
    child->len = parent->len;
    for (int32_t i = 0; i < child->num_pages; ++i) kva__cache_page_ref(c, child->pages[i]);
    c->num_tokens += child->len;
    *child_id = id;
    return KVA_OK;
}
