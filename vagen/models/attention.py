"""Grouped-query attention on the CPU without copying keys and values: the attention every model vagen loads runs.

transformers' `sdpa` path repeats each key/value head `num_key_value_groups` times (a full copy of the KV cache at
every decode step) whenever an attention mask is passed, which in our left-padded batches is always; it asks torch to
do grouped-query attention itself only without a mask, because CUDA's fast kernels do not take both. On the CPU,
`scaled_dot_product_attention(..., enable_gqa=True)` takes a mask and gives the same outputs, bit for bit (gradients
agree to float rounding: tests/test_engine_hf.py), and a decode step of tiny_vl's batch attends 12× faster. Every
other case (GPU, no grouped heads, no mask, paged caches, position biases) is transformers' own `sdpa`, unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "vagen_sdpa"


def sdpa_gqa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query (B, H, Lq, D), key/value (B, H_kv, L, D); returns (B, Lq, H, D)."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = kwargs.get("cache") is None and kwargs.get("position_bias") is None and not kwargs.get("output_attentions")
    if not (grouped and plain and attention_mask is not None and query.device.type == "cpu"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, sdpa_gqa_forward)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def use_fast_attention(model: torch.nn.Module) -> None:
    """Switch a model that runs transformers' `sdpa` attention (the default) to `ATTENTION`; others are left as they
    are (an explicit `eager` choice, a model without the attention interface)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION)
