"""Tiny randomly initialised transformers models, built from configs (no download), by family name.

The reach command and the tests build them: hidden 64, 2 layers, 4 heads (2 key-value heads), a
vocabulary of 256. ``build("llama")`` returns the causal LM in fp32 with its config's defaults
otherwise. transformers is imported on the first call, and its absence named.
"""

from __future__ import annotations

from typing import Any

import torch

# The size of every tiny model: each key is set where the family's config has that attribute.
TINY = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 256,
    "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "n_inner": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "num_experts": 4,
    "num_local_experts": 4, "n_routed_experts": 4, "first_k_dense_replace": 1,
    "layer_types": None, "sliding_window": 64, "attention_chunk_size": 64,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}
# Families the reach command offers by name (any model type transformers knows is accepted too).
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "cohere",
            "granite", "gpt2")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError("tiny models need transformers: pip install transformers") from e
    return transformers


def config(family: str, **overrides: Any) -> Any:
    """The family's config with the tiny sizes (and ``overrides``) set where it has those attributes."""
    transformers = _transformers()
    known = transformers.CONFIG_MAPPING_NAMES if hasattr(transformers, "CONFIG_MAPPING_NAMES") else None
    mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    if family not in mapping:
        close = sorted(k for k in (known or mapping.keys()) if family[:3] in k)[:6]
        raise ValueError(f"no transformers model type is named {family!r}; built in: {list(FAMILIES)}"
                         + (f"; close: {close}" if close else ""))
    default = mapping[family]()
    settings = {k: v for k, v in {**TINY, **overrides}.items() if hasattr(default, k) and (v is not None or k in overrides)}
    if getattr(default, "layer_types", None) is not None and "layer_types" not in overrides:
        pattern = list(default.layer_types)
        settings["layer_types"] = (pattern * 2)[: settings.get("num_hidden_layers", 2)]
    return mapping[family](**{**default.to_dict(), **settings})


def build(family: str, *, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """The family's causal LM, tiny, randomly initialised (``seed``), in ``dtype``."""
    transformers = _transformers()
    cfg = config(family, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.to(dtype)


def example_inputs(model: torch.nn.Module, batch: int = 2, seq: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``labels`` (the same tokens: the model shifts them) for one training step."""
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    device = next(model.parameters()).device
    return {"input_ids": ids.to(device), "labels": ids.to(device)}
