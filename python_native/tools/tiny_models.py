"""Tiny randomly initialised transformers models, built from configs (no download), by model type.

The reach command and the tests build them: hidden 64, 2 layers, 4 heads (2 key-value heads), a
vocabulary of 256, 4 experts of which 2 per token. Each size is passed to the config class's own
constructor, and only where that constructor takes it: a config computes what it derives from them
(head dims, layer patterns) itself, and a property without a setter is never written. A model
type that cannot be a tiny decoder-only causal LM is refused in one line saying why
(``Unbuildable``). transformers is imported on the first call, and its absence named.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

# The size of every tiny model: each key is passed where the config class's constructor takes it.
TINY = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_kv_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 256,
    "unpadded_vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "n_inner": 128, "n_ctx": 256,
    "d_model": 64, "n_layers": 2, "n_heads": 4, "num_layers": 2, "ffn_hidden_size": 128, "ffn_dim": 128,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "num_experts": 4, "num_local_experts": 4,
    "n_routed_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2, "moe_k": 2, "moe_topk": 2,
    "top_k_experts": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "decoder_sparse_step": 1,
    "rotary_dim": 8, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "sliding_window": 64, "attention_chunk_size": 64, "state_size": 8, "ssm_state_size": 8,
    "mamba_d_state": 8, "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_head_dim": 32, "mamba_n_groups": 1,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "use_cache": False,  # a training step keeps no cache
}
# Offered by name in the command's help (any model type transformers knows is tried).
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "cohere",
            "granite", "gpt2", "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss")


class Unbuildable(ValueError):
    """A known model type that no tiny decoder-only causal LM is built for; the message says why."""


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError("tiny models need transformers: pip install transformers") from e
    return transformers


def _auto() -> tuple[Any, Any]:
    from transformers.models.auto import configuration_auto, modeling_auto

    return configuration_auto.CONFIG_MAPPING, modeling_auto


def decoder_only(family: str) -> str | None:
    """None where ``family`` has a decoder-only causal LM in transformers; else why not (one line)."""
    mapping, auto = _auto()
    if family not in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return f"model type {family!r} has no causal-LM class in transformers"
    if family in getattr(auto, "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", {}):
        return f"model type {family!r} is an encoder-decoder model, not a decoder-only one"
    if family in getattr(auto, "MODEL_FOR_MASKED_LM_MAPPING_NAMES", {}):
        return f"model type {family!r} is a masked-LM encoder (its causal LM is that encoder run as a decoder)"
    sub = getattr(mapping[family], "sub_configs", None) or {}
    if "text_config" in sub:
        return (f"model type {family!r} is multimodal (its config nests {', '.join(sorted(sub))}); "
                f"give its text model's type")
    if sub:
        return f"model type {family!r} nests its sizes in sub-configs ({', '.join(sorted(sub))}) that no tiny size reaches"
    return None


def _layer_types(cls: type, settings: dict[str, Any]) -> list[str] | None:
    """Each kind of layer of the default pattern once (the tiny model then has every kind)."""
    try:
        pattern = cls().layer_types
    except Exception:  # a config whose defaults do not build without the sizes given
        return None
    if not isinstance(pattern, (list, tuple)) or not pattern:
        return None
    kinds = list(dict.fromkeys(pattern))
    layers = max(len(kinds), settings.get("num_hidden_layers", 2))
    return (kinds * layers)[:layers]


def config(family: str, **overrides: Any) -> Any:
    """The type's config built through its class's constructor with the tiny sizes (and
    ``overrides``) it takes. Raises ``ValueError`` for an unknown type, ``Unbuildable`` for a known
    one that is no decoder-only causal LM."""
    _transformers()
    mapping, _ = _auto()
    if family not in mapping:
        close = sorted(k for k in mapping.keys() if family[:3] in k)[:6]
        raise ValueError(f"no transformers model type is named {family!r}; built in: {list(FAMILIES)}"
                         + (f"; close: {close}" if close else ""))
    why = decoder_only(family)
    if why is not None:
        raise Unbuildable(why)
    cls = mapping[family]
    takes = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(overrides) - set(takes))
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in takes.values()):
        raise ValueError(f"{cls.__name__} takes no argument {', '.join(unknown)}")
    settings = {k: v for k, v in TINY.items() if k in takes}
    if "kv_lora_rank" in takes and "num_attention_heads" in settings:  # latent attention: one key-value head per head
        settings["num_key_value_heads"] = settings["num_attention_heads"]
    if "layer_types" in takes and "layer_types" not in overrides:
        kinds = _layer_types(cls, settings)
        if kinds is not None:
            settings.update(layer_types=kinds, num_hidden_layers=len(kinds))
    settings.update(overrides)
    try:
        return cls(**settings)
    except Exception as e:
        raise Unbuildable(f"{cls.__name__} refuses the tiny sizes: {type(e).__name__}: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    """The error's own words in one line (a config validator's: the line naming the check)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Class validation error"):
        lines = lines[1:]
    return (lines or [""])[0][:200]


def build(family: str, *, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """The type's causal LM, tiny, randomly initialised (``seed``), in ``dtype``."""
    transformers = _transformers()
    cfg = config(family, **overrides)
    torch.manual_seed(seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    except Exception as e:
        raise Unbuildable(f"{family!r}: its causal LM does not build from the tiny config: "
                          f"{type(e).__name__}: {_first_line(e)}") from e
    return model.to(dtype)


def example_inputs(model: torch.nn.Module, batch: int = 2, seq: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``labels`` (the same tokens: the model shifts them) for one training step."""
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    device = next(model.parameters()).device
    return {"input_ids": ids.to(device), "labels": ids.to(device)}
