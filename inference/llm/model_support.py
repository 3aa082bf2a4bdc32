"""Which models the lean forward runs: Llama-family decoders (Llama, Mistral, Qwen2) with full attention
and a RoPE that depends on the position alone, checked before any weight is touched."""

from __future__ import annotations

from torch import nn

SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
# RoPE variants whose cos/sin depend only on the position (not on the current sequence length).
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


class UnsupportedModel(ValueError):
    """The model's architecture or configuration is not handled by the lean forward pass."""


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(params, dict):
        return str(params.get("rope_type") or params.get("type") or "default")
    return "default"


def check_supported(model: nn.Module) -> None:
    """Raise UnsupportedModel with a clear reason when the lean forward cannot run ``model`` exactly."""
    config = model.config
    mtype = getattr(config, "model_type", "?")
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(
            f"model_type {mtype!r} is not supported by the lean forward (supported: {sorted(SUPPORTED_MODEL_TYPES)})"
        )
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise UnsupportedModel(f"{type(model).__name__} does not have the Llama module layout")
    if not hasattr(model, "lm_head"):
        raise UnsupportedModel(f"{type(model).__name__} has no lm_head")
    window = getattr(config, "sliding_window", None)
    use_sw = getattr(config, "use_sliding_window", True)
    if window is not None and use_sw and window < getattr(config, "max_position_embeddings", 0):
        raise UnsupportedModel(f"sliding-window attention (window {window}) is not supported")
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise UnsupportedModel(f"layer types {sorted(set(layer_types))} are not supported (only full_attention)")
    rope = _rope_type(config)
    if rope not in STATIC_ROPE_TYPES:
        raise UnsupportedModel(f"rope type {rope!r} is not supported (supported: {sorted(STATIC_ROPE_TYPES)})")
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        raise UnsupportedModel("pretraining_tp > 1 is not supported")
    for i, layer in enumerate(base.layers):
        attn = getattr(layer, "self_attn", None)
        mlp = getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            raise UnsupportedModel(f"layer {i} has no self_attn/mlp")
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not isinstance(getattr(attn, name, None), nn.Linear):
                raise UnsupportedModel(f"layer {i}: self_attn.{name} is not an nn.Linear")
        for name in ("gate_proj", "up_proj", "down_proj"):
            if not isinstance(getattr(mlp, name, None), nn.Linear):
                raise UnsupportedModel(f"layer {i}: mlp.{name} is not an nn.Linear")
        for name in ("q_norm", "k_norm"):
            if getattr(attn, name, None) is not None:
                raise UnsupportedModel(f"layer {i}: per-head {name} (Qwen3/OLMo style) is not supported")
        if getattr(attn, "sliding_window", None):
            raise UnsupportedModel(f"layer {i}: sliding-window attention is not supported")
