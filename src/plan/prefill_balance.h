/*
 * prefill_balance.h -- an even last wave for the persistent (Hopper) prefill launch.
 *
 * The launch walks (KV head, work item) pairs, heads outer, items from the plan's last to its
 * first, on a fixed number of persistent blocks that each take the next pair when they finish
 * one. With equal items (full attention over equal requests) N pairs on B blocks take
 * ceil(N / B) item-times, the mean only N / B: 16384 tokens x 32 query heads at d128 are 4096
 * pairs on 132 SMs, 31.03 waves run in 32 (3% of every such row, whatever its length). Cutting
 * the item the launch runs last into a few key pieces, whose partial states the split merge
 * combines, lets the last wave end within a piece of the mean.
 *
 * Pure arithmetic on the host (no device state); the CUDA prefill policy enables it for the
 * persistent kernel, and plans ask for it with KVA_PLAN_FULL_ATTENTION (the cost model counts
 * every key of an item). Plans without it may run causal: their last wave is evened out by order
 * instead (kva__balance_causal_tail), on every launch that walks the plan from its last item.
 */
#ifndef KVA_PREFILL_BALANCE_H
#define KVA_PREFILL_BALANCE_H

#include <stdint.h>

typedef struct kva__balance_problem {
    int32_t num_items;       /* whole work items, one per (request, query tile) */
    const int32_t *item_keys; /* [num_items] keys each item attends to */
    int32_t num_kv_heads;    /* pairs = num_items x num_kv_heads */
    int32_t blocks;          /* persistent blocks (0: no balancing) */
    int32_t tile_keys;       /* keys per kernel tile: pieces are whole tiles */
    int32_t max_parts;       /* pieces an item may become (the plan's partial-state slots) */
    int32_t min_cut_tiles;   /* items shorter than this stay whole (0: KVA__BALANCE_MIN_CUT_TILES) */
} kva__balance_problem;

/* Only items of 96 tiles or more are cut (the kernel's tiles: 128 keys, 64 at d256). The model
 * assumes exact costs, so its cut lines the last wave up to the tile; the real blocks drift by a
 * fraction of an item, which shorter items do not absorb. Measured (H200, bench/NOTES.md): 16-tile
 * items (8 x 2048 at d128, 32 x 512 at d256) 2-4% slower cut; 64-tile items (2 x 8192) level in
 * paired rounds, -8..+15% across head dims in one table run; 128-tile items (16k at d128) +3-5%
 * in paired rounds. */
#define KVA__BALANCE_MIN_CUT_TILES 96

/* Pairs above which the simulation is skipped: with that many waves the last one is < 1% of
 * the run. Below it a plan costs up to 7 simulations of O(pairs log blocks) (~1 ms at 4096
 * pairs), after an O(items) bound that skips them when no cut can gain enough. */
#define KVA__BALANCE_MAX_PAIRS (1 << 17)

/* The cut that shortens the simulated launch most: *which = the item to cut (the longest),
 * returns its number of pieces (2 .. max_parts, a power of two), or 0 when no cut gains more
 * than the merge it adds. The pieces of item `which`, moved to the front of the plan (run last
 * in every head), are kva__balance_piece(keys, parts, tile_keys, j) for j = 0 .. parts - 1. */
int32_t kva__balance_last_wave(const kva__balance_problem *p, int32_t *which);

/* Piece j of an item of `keys` keys cut into `parts`: [*beg, *end), whole tiles except the
 * last piece's end; the pieces cover [0, keys) once, in order. */
void kva__balance_piece(int32_t keys, int32_t parts, int32_t tile_keys, int32_t j, int32_t *beg, int32_t *end);

/* The plan's work lists rewritten for the cut: item `which` of the w whole items (req / qt / kt:
 * request, query tile and key tile of each, kt all 0; gi: the groups' first items, one item per
 * group) becomes `parts` pieces at positions 0 .. parts - 1 (the same request and query tile,
 * key piece j = kt), forming group 0; the other items follow in their order, one group each.
 * The arrays hold >= w + parts - 1 entries (gi one more). Returns the new work count. */
int64_t kva__balance_apply_cut(int64_t w, int32_t which, int32_t parts, int32_t *req, int32_t *qt, int32_t *kt,
                               int32_t *gi);

/* Causal plans: the keys query tile t of a request of qo_len queries over kv_len keys sees at
 * most under a bottom-right causal mask (its last query's keys; 0 when the queries outnumber the
 * keys that far), the length the launch's walk meets it with. */
int32_t kva__balance_causal_keys(int32_t qo_len, int32_t kv_len, int32_t qo_tile, int32_t t);

/* The launch's last wave for plans that may run causal (those without KVA_PLAN_FULL_ATTENTION).
 * In plan order a batch of requests repeats each request's tiles long to short, so the last wave
 * mixes long and short items (32 x 512 at d128: 1 to 4 key tiles) and the blocks that draw a long
 * one end up to an item after the others. The plan's leading groups -- every head's walk runs them
 * last -- are reordered so that the walk meets them longest first: stably by their causal keys in
 * whole tiles, fewest first in the plan. Only when it can gain and costs no locality:
 *   - only groups starting within the first `window` work items move (a few waves of the launch);
 *   - only when the longest of them has at least twice the tiles of the shortest (a chunked
 *     prefill over long contexts, all its tiles alike, keeps its order);
 *   - only when the K/V of the requests they belong to fits in `cache_bytes`: moved, one
 *     request's tiles no longer run side by side, and its K/V must stay in the cache between them.
 * Split groups move whole, their items together and in order. */
typedef struct kva__causal_tail {
    const int32_t *qo_len, *kv_len; /* [batch] queries and keys per request */
    int32_t qo_tile;                /* query tokens per group */
    int32_t tile_keys;              /* the launch's keys per tile */
    int64_t window;                 /* work items from the plan's front that may move */
    int64_t kv_bytes_per_key;       /* K and V bytes of one key of one KV head */
    int64_t cache_bytes;            /* what the window's K/V may take (<= 0: never reorder) */
} kva__causal_tail;

#define KVA__BALANCE_TAIL_WAVES 4 /* the window, in the launch's blocks: the model gains as much as from ordering all */

/* Reorders as above; req / qt / kt / gi: the plan's work lists (w items, g groups), rewritten in
 * place; scratch >= 4 * g + 3 * w + 1 ints (4 per moving group and 3 per moving item, + 1).
 * Returns the number of groups ordered (0: nothing moved). */
int64_t kva__balance_causal_tail(const kva__causal_tail *p, int64_t w, int64_t g, int32_t *req, int32_t *qt,
                                 int32_t *kt, int32_t *gi, int32_t *scratch);

/* The launch's simulated length in tile-times (the cost model of the .c file), for tests:
 * items walked as the launch walks them, item `which` cut into `parts` (parts <= 1: whole). */
double kva__balance_makespan(const kva__balance_problem *p, int32_t which, int32_t parts);

#endif /* KVA_PREFILL_BALANCE_H */
