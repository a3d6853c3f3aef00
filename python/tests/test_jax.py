"""JAX arrays (immutable: kvattn writes host outputs and hands back JAX arrays), CPU."""
import numpy as np
import pytest

jnp = pytest.importorskip("jax.numpy")

import kvattn  # noqa: E402
from reference import attention_ref, paged_pool  # noqa: E402


def test_attention_and_decode_with_jax_arrays():
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((7, 4, 64), dtype=np.float32))
    k = jnp.asarray(rng.standard_normal((9, 2, 64), dtype=np.float32))
    o, lse = kvattn.attention(q, k, k, causal=True, return_lse=True)
    assert type(o).__module__.split(".")[0] in ("jax", "jaxlib") and o.shape == (7, 4, 64)
    ro, rl = attention_ref(np.asarray(q), np.asarray(k), np.asarray(k), causal=True)
    np.testing.assert_allclose(np.asarray(o), ro, atol=2e-4, rtol=2e-4)
    np.testing.assert_allclose(np.asarray(lse), rl, atol=2e-4, rtol=2e-4)
    kp, vp, indptr, indices, last, ks, vs = paged_pool(rng, [3, 40], 16, 2, 64)
    w = kvattn.BatchDecodeWrapper()
    w.plan(jnp.asarray(indptr, dtype=jnp.int32), indices, last, 4, 2, 64, 16)
    qd = jnp.asarray(rng.standard_normal((2, 4, 64), dtype=np.float32))
    od = w.run(qd, (jnp.asarray(kp), jnp.asarray(vp)))
    for b in range(2):
        ro, _ = attention_ref(np.asarray(qd[b:b + 1]), ks[b], vs[b])
        np.testing.assert_allclose(np.asarray(od[b:b + 1]), ro, atol=2e-4, rtol=2e-4)
