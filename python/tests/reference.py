"""float64 numpy reference of what kvattn computes (the oracle of the Python tests)."""
import math

import numpy as np


def attention_ref(q, k, v, causal=False, sm_scale=None, window_left=-1, soft_cap=0.0, score_mod=None):
    """q [Lq, Hq, D], k/v [Lk, Hk, D] -> (o [Lq, Hq, D] float64, lse [Lq, Hq]); queries aligned
    bottom-right (query i at position Lk - Lq + i). score_mod(s, q_pos, kv_pos, head): the
    modifier of a variant, vectorised (s [Lq, Lk] of one query head, q_pos [Lq, 1], kv_pos
    [1, Lk]), applied after the soft cap and before the masks, as the library does."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    Lq, Hq, D = q.shape
    Lk, Hk, _ = k.shape
    g = Hq // Hk
    scale = sm_scale if sm_scale else 1.0 / math.sqrt(D)
    o = np.zeros((Lq, Hq, D))
    lse = np.full((Lq, Hq), -np.inf)
    qpos = np.arange(Lq)[:, None] + Lk - Lq
    kpos = np.arange(Lk)[None, :]
    mask = np.zeros((Lq, Lk), dtype=bool)
    if causal:
        mask |= kpos > qpos
    if window_left >= 0:
        mask |= kpos < qpos - window_left
    for h in range(Hq):
        s = q[:, h] @ k[:, h // g].T * scale
        if soft_cap > 0:
            s = soft_cap * np.tanh(s / soft_cap)
        if score_mod is not None:
            s = score_mod(s, qpos, kpos, h)
        s = np.where(mask, -np.inf, s)
        m = s.max(axis=1, keepdims=True)
        ok = np.isfinite(m[:, 0])
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m)
        l = p.sum(axis=1, keepdims=True)
        o[ok, h] = (p[ok] / l[ok]) @ v[:, h // g]
        lse[ok, h] = (np.log(l[ok]) + m[ok])[:, 0]
    return o, lse


def paged_pool(rng, lens, page_size, hk, d, dtype=np.float32, hnd=False, extra_pages=3):
    """Random K/V for requests of lengths `lens` scattered over shuffled pages.
    Returns (k_pages, v_pages, indptr, indices, last_page_len, k_list, v_list)."""
    npages = [(n + page_size - 1) // page_size for n in lens]
    total = sum(npages) + extra_pages
    perm = rng.permutation(total).astype(np.int32)
    shape = (total, hk, page_size, d) if hnd else (total, page_size, hk, d)
    kp = rng.standard_normal(shape).astype(dtype)
    vp = rng.standard_normal(shape).astype(dtype)
    indptr, indices, last, ks, vs = [0], [], [], [], []
    at = 0
    for n, p in zip(lens, npages):
        ids = perm[at:at + p]
        at += p
        indices += [int(x) for x in ids]
        indptr.append(len(indices))
        last.append(n - (p - 1) * page_size if p else 0)
        if hnd:
            kk = kp[ids].transpose(0, 2, 1, 3).reshape(p * page_size, hk, d)[:n]
            vv = vp[ids].transpose(0, 2, 1, 3).reshape(p * page_size, hk, d)[:n]
        else:
            kk = kp[ids].reshape(p * page_size, hk, d)[:n]
            vv = vp[ids].reshape(p * page_size, hk, d)[:n]
        ks.append(kk)
        vs.append(vv)
    return kp, vp, indptr, indices, last, ks, vs


def tol(dtype):
    return {np.dtype(np.float32): 2e-4, np.dtype(np.float16): 2e-2}[np.dtype(dtype)]
