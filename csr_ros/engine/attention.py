"""SDPA with native grouped-query attention, registered as one more transformers attention kind.

transformers' "sdpa" expands K/V to every query head (`repeat_kv`, a copy of the whole cached
history per layer) whenever a mask is needed, which is exactly the case of a query: M > 1 new
tokens on top of N cached ones. `enable_gqa=True` lets SDPA read the K/V heads in place, so the
per-query work is the attention itself, with no O(N) copy. Masks are the ones "sdpa" builds
(a [1, 1, M, N + M] boolean mask, none for single-token decode or an empty cache).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SDPA_GQA = "csr_sdpa_gqa"


def sdpa_gqa_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                               value: torch.Tensor, attention_mask: torch.Tensor | None,
                               dropout: float = 0.0, scaling: float | None = None,
                               is_causal: bool | None = None, **kwargs):
    # query: [1, H, q, D]; key/value: [1, H_kv, kv, D] (views of the preallocated buffers)
    q_length = query.shape[2]
    groups = getattr(module, "num_key_value_groups", 1)
    if groups == 1 or q_length == 1 or kwargs.get("position_bias") is not None:
        # Decode already avoids the copy in transformers (it packs the query heads).
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = causal and attention_mask is None
    # Without a mask the cache was empty, so SDPA's top-left causal alignment is the right one.
    assert not causal or key.shape[2] == q_length, "unmasked causal attention on a non-empty cache"
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=causal, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None     # [1, q, H, D]


def register() -> str:
    """Make SDPA_GQA known to transformers (idempotent); returns its name."""
    AttentionInterface.register(SDPA_GQA, sdpa_gqa_attention_forward)
    AttentionMaskInterface.register(SDPA_GQA, sdpa_mask)
    return SDPA_GQA
