"""kvattn as a transformers attention implementation with its paged cache, against sdpa.

A Llama-architecture model from a config with random weights (no download): GQA 32/8 heads,
head dim 128, 2 layers, seeded. A batch of prompts of different lengths (left padded):
teacher-forced logits of every step equal sdpa's within dtype tolerance, and greedy generation
of 64 tokens gives the same tokens (in bf16, where the two differ, kvattn's token must be a
near-tie of sdpa's own logits). CPU float32 and bfloat16 (when torch and transformers are
installed); CUDA bfloat16 too when a GPU is present.
"""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvattn  # noqa: E402

import kvattn.integrations.transformers as kt  # noqa: E402

DEVICES = [("cpu", torch.float32, 1e-4), ("cpu", torch.bfloat16, 3e-2)]
if torch.cuda.is_available() and kvattn.cuda_available():
    DEVICES.append(("cuda", torch.bfloat16, 3e-2))


def require_prefill(device):
    """The integration runs prefill through kvattn: skip on a device whose build lacks it."""
    if device == "cpu":
        return
    x = torch.zeros((1, 2, 128), device=device, dtype=torch.bfloat16)
    try:
        kvattn.attention(x, x, x, causal=True)
    except kvattn.KvattnError as e:
        if e.status_name == "KVA_ERR_UNSUPPORTED":
            pytest.skip("kvattn prefill on %s: %s" % (device, e.message))
        raise


def tiny_llama(device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    # random weights at a scale that keeps logits spread out (no near-ties in greedy decoding)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.06)
    return model.to(device=device, dtype=dtype).eval()


def twin(model, impl):
    """The same weights under another attention implementation."""
    import copy
    other = type(model)(copy.deepcopy(model.config)).to(device=model.device, dtype=model.dtype).eval()
    other.load_state_dict(model.state_dict())
    other.set_attn_implementation(impl) if hasattr(other, "set_attn_implementation") else \
        setattr(other.config, "_attn_implementation", impl)
    return other


def batch(device):
    g = torch.Generator().manual_seed(1)
    lens = [11, 4, 17]
    T = max(lens)
    ids = torch.zeros((3, T), dtype=torch.long)
    mask = torch.zeros((3, T), dtype=torch.long)
    for b, n in enumerate(lens):  # left padding, as generate expects
        ids[b, T - n:] = torch.randint(1, 512, (n,), generator=g)
        mask[b, T - n:] = 1
    return ids.to(device), mask.to(device)


@pytest.fixture(scope="module", autouse=True)
def registered():
    kt.register()


@pytest.mark.parametrize("device,dtype,tol", DEVICES)
def test_teacher_forced_logits_match_sdpa(device, dtype, tol):
    from transformers import DynamicCache
    require_prefill(device)
    ref = tiny_llama(device, dtype)
    ours = twin(ref, "kvattn")
    ids, mask = batch(device)
    follow = torch.randint(1, 512, (3, 12), generator=torch.Generator().manual_seed(2)).to(device)
    cache_ref = DynamicCache(config=ref.config)
    cache = kt.KvattnCache(ours.config, max_batch_size=4, max_cache_len=64)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        a = ref(ids, attention_mask=mask, position_ids=pos, past_key_values=cache_ref, use_cache=True).logits
        b = ours(ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True).logits
        real = mask.bool()
        scale = a[real].abs().max().item()
        torch.testing.assert_close(b[real].float(), a[real].float(), atol=tol * scale, rtol=tol)
        for t in range(follow.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = pos[:, -1:] + 1
            x = follow[:, t:t + 1]
            a = ref(x, attention_mask=mask, position_ids=pos, past_key_values=cache_ref, use_cache=True).logits
            b = ours(x, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True).logits
            torch.testing.assert_close(b.float(), a.float(), atol=tol * scale, rtol=tol, msg="step %d" % t)
    st = cache.kv.stats()
    assert st["num_tokens"] == 11 + 4 + 17 + 3 * 12


@pytest.mark.parametrize("device,dtype,tol", DEVICES)
def test_greedy_generation_matches_sdpa(device, dtype, tol):
    require_prefill(device)
    ref = tiny_llama(device, dtype)
    ours = twin(ref, "kvattn")
    ids, mask = batch(device)
    kw = dict(attention_mask=mask, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        a = ref.generate(ids, **kw)
        cache = kt.KvattnCache(ours.config, max_batch_size=3, max_cache_len=128)
        b = ours.generate(ids, past_key_values=cache, **kw)
    assert a.shape == b.shape == (3, ids.shape[1] + 64)
    if dtype == torch.float32 or torch.equal(a, b):
        assert torch.equal(a, b), "first difference at %s" % ((a != b).nonzero()[:1].tolist(),)
    else:
        # bf16: a different token is allowed only where sdpa itself has a near-tie: at the first
        # difference of each row, kvattn's token must be within tolerance of sdpa's best logit.
        T0 = ids.shape[1]
        full_mask = torch.cat([mask, torch.ones((3, 64), dtype=mask.dtype, device=mask.device)], dim=1)
        for r in range(3):
            diff = (a[r] != b[r]).nonzero()
            if len(diff) == 0:
                continue
            t = int(diff[0])
            assert t >= T0
            m = full_mask[r:r + 1, :t]
            with torch.no_grad():
                logits = ref(a[r:r + 1, :t], attention_mask=m,
                             position_ids=(m.cumsum(-1) - 1).clamp(min=0)).logits[0, -1].float()
            spread = (logits.max() - logits.min()).item()
            gap = (logits.max() - logits[b[r, t]]).item()
            assert gap <= tol * spread, "row %d step %d: kvattn's token is %.4f below sdpa's best (spread %.2f)" % (
                r, t - T0, gap, spread)
    # kvattn's cache held every real token: prompts without padding, then 63 fed-back tokens each
    assert cache.kv.stats()["num_tokens"] == 11 + 4 + 17 + 3 * 63


def test_no_cache_forward_matches_sdpa():
    ref = tiny_llama("cpu", torch.float32)
    ours = twin(ref, "kvattn")
    ids = torch.randint(1, 512, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = ref(ids, use_cache=False).logits
        b = ours(ids, use_cache=False).logits
    torch.testing.assert_close(b, a, atol=1e-4 * a.abs().max().item(), rtol=1e-4)
