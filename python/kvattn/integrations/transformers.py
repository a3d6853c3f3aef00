"""kvattn inside Hugging Face transformers: an attention implementation plus a paged KV cache.

    import kvattn.integrations.transformers as kt
    kt.register()                                   # attn_implementation "kvattn"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="kvattn")   # or
    model.set_attn_implementation("kvattn")
    cache = kt.KvattnCache(model.config, max_batch_size=4, max_cache_len=1024)
    out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=64)

How it fits transformers' flow: a decoder layer calls cache.update(k, v, layer) and then the
attention function with the new tokens' q, k, v. KvattnCache.update keeps nothing itself; it
returns the new K/V unchanged and makes itself the cache of the attention call that follows. The
attention function drops padding tokens (the "kvattn" mask function hands it the 2-D padding
mask), appends the real tokens' K/V to the paged cache (kvattn.PagedKVCache, one sequence per
batch row) and runs kvattn's chunked prefill or batched decode over the cache; the plan is made
once per step and reused by every layer. Padded positions get zero outputs.

Without a KvattnCache (use_cache=False) the function computes causal attention over the given
k/v with kvattn.attention_varlen (CPU in this version).
"""
import threading

import torch
from transformers import AttentionInterface, Cache
from transformers.cache_utils import DynamicLayer

try:  # transformers >= 4.53
    from transformers.masking_utils import AttentionMaskInterface
except ImportError:  # pragma: no cover
    AttentionMaskInterface = None

import kvattn

NAME = "kvattn"
_current = threading.local()


class KvattnCache(Cache):
    """A transformers Cache whose K/V live in a kvattn.PagedKVCache (one sequence per batch row).

    max_batch_size rows, each up to max_cache_len tokens; page_size tokens per page. Pages are
    shared out on demand, so rows of different lengths use only what they need. dtype and device
    come from the first update (the model's).
    """

    def __init__(self, config, max_batch_size=8, max_cache_len=4096, page_size=16, num_pages=None, **kwargs):
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.num_layers = text.num_hidden_layers
        self.num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        self.page_size = page_size
        self.num_pages = num_pages or max_batch_size * (-(-max_cache_len // page_size) + 1)
        self.kv = None        # the kvattn.PagedKVCache, made at the first update
        self.seq_ids = None   # one sequence per batch row
        self._seen = 0        # columns seen so far, padding included (transformers' positions)
        super().__init__(layers=[DynamicLayer() for _ in range(self.num_layers)])

    # ---- what transformers asks a cache ----------------------------------------------------
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Called by each layer with the new tokens' [B, Hk, L, D] K/V. The attention function
        that follows appends them; here the cache only makes itself current."""
        if self.kv is None:
            self._allocate(key_states)
        if layer_idx == 0:
            self._seen += key_states.shape[-2]
        _current.cache = self
        return key_states, value_states

    def get_seq_length(self, layer_idx=0, *args, **kwargs):
        return self._seen

    def get_query_offset(self, layer_idx=0):
        return self._seen

    def get_mask_sizes(self, query_length, layer_idx=0, *args, **kwargs):
        if not isinstance(query_length, int):  # older transformers pass cache_position
            query_length = query_length.shape[-1]
        return self._seen + query_length, 0

    def get_max_length(self, *args, **kwargs):
        return -1

    def get_max_cache_shape(self, *args, **kwargs):
        return -1

    @property
    def is_compileable(self):
        return False

    def reset(self):
        if self.kv is not None:
            for s in self.seq_ids:
                self.kv.free(s)
        self.kv, self.seq_ids, self._seen = None, None, 0

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("KvattnCache: beam search is not supported (fork sequences instead)")

    def crop(self, max_length):
        raise NotImplementedError("KvattnCache: crop is not supported")

    # ---- kvattn side -------------------------------------------------------------------------
    def _allocate(self, key_states):
        B = key_states.shape[0]
        if B > self.max_batch_size:
            raise ValueError("KvattnCache: batch %d > max_batch_size %d" % (B, self.max_batch_size))
        dev = key_states.device
        self.kv = kvattn.PagedKVCache(self.num_layers, self.num_kv_heads, self.head_dim, self.page_size,
                                      self.num_pages, dtype=key_states.dtype,
                                      device="cpu" if dev.type == "cpu" else "cuda:%d" % (dev.index or 0),
                                      max_sequences=self.max_batch_size,
                                      max_append_tokens=max(8192, B * self.max_cache_len))
        self.seq_ids = [self.kv.add_sequence() for _ in range(B)]


def _padding_mask(batch_size, q_length=None, kv_length=None, attention_mask=None, **kwargs):
    """The "kvattn" mask function: hands the 2-D padding mask [B, kv_length] (True = real token)
    through to the attention function, or None when nothing is padded."""
    if attention_mask is None or attention_mask.ndim != 2:
        return attention_mask
    if kv_length is not None and attention_mask.shape[-1] != kv_length:
        attention_mask = attention_mask[:, -kv_length:]
    if bool(attention_mask.all()):
        return None
    return attention_mask.to(torch.bool)


def kvattn_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             softcap=None, sliding_window=None, **kwargs):
    """transformers attention function. query [B, Hq, L, D], key/value [B, Hk, L, D] (the new
    tokens; KvattnCache.update returns them unchanged). Returns ([B, L, Hq, D], None)."""
    if dropout and module.training:
        raise NotImplementedError("kvattn: attention dropout (training) is not supported")
    B, Hq, L, D = query.shape
    window = sliding_window - 1 if sliding_window else -1
    cap = float(softcap or 0.0)
    if attention_mask is not None and attention_mask.ndim == 2:
        real = attention_mask[:, -L:].to(torch.bool)
    else:
        real = None
    q = query.transpose(1, 2)
    k = key.transpose(1, 2)
    v = value.transpose(1, 2)
    if real is not None:
        counts = real.sum(dim=1).tolist()
        q, k, v = q[real], k[real], v[real]
    else:
        counts = [L] * B
        q, k, v = q.reshape(B * L, Hq, D), k.reshape(B * L, -1, D), v.reshape(B * L, -1, D)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()

    cache = getattr(_current, "cache", None)
    _current.cache = None
    if cache is not None:
        layer = module.layer_idx
        o = kvattn.attention_with_kv_cache(q, k, v, cache.kv, cache.seq_ids, layer=layer, num_new=counts,
                                           sm_scale=scaling, causal=True, window_left=window, soft_cap=cap)
    else:
        if real is not None:
            raise NotImplementedError("kvattn without a KvattnCache: padded batches are not supported")
        cu = [i * L for i in range(B + 1)]
        o = kvattn.attention_varlen(q, k, v, cu, cu, causal=True, sm_scale=scaling, window_left=window,
                                    soft_cap=cap)
    if real is None:
        return o.reshape(B, L, Hq, D), None
    out = query.new_zeros((B, L, Hq, D))
    out[real] = o
    return out, None


def register(name=NAME):
    """Registers kvattn as attention implementation `name` (and its mask function)."""
    AttentionInterface.register(name, kvattn_attention_forward)
    if AttentionMaskInterface is not None:
        AttentionMaskInterface.register(name, _padding_mask)
    return name
