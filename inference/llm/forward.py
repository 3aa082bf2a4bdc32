"""A lean, ragged-batch forward pass for Llama-family decoder models (Llama, Mistral, Qwen2).

It walks the model's own modules and weights, without transformers' per-call machinery (cache objects,
mask building, output classes), so one decoding step costs little more than reading the weights.

One step takes a *ragged* batch: the new tokens of every active request concatenated into one
``[T, hidden]`` sequence (1 token for a decoding request, a chunk of its prompt for a prefilling one).
Every linear layer then reads its weights once per step for all requests; attention is computed per
request against that request's own KV buffer. Logits are computed only for the rows that need
sampling (the 49152 x 576 ``lm_head`` is the single most expensive matmul of a decoding step).

At construction the q/k/v projections and the gate/up projections of every layer are fused into one
weight each (one matmul instead of three/two). The original modules' weights are re-pointed at views of
the fused tensors, so the model keeps working unchanged (``model.generate()`` still runs) and no weight
memory is duplicated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
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


class KVBuffer:
    """One request's keys and values for all layers: ``[layers, 2, kv_heads, capacity, head_dim]``.

    ``length`` tokens are valid. Capacity grows geometrically (one copy per growth, never per step).
    """

    __slots__ = ("data", "length", "max_capacity")

    def __init__(self, data: torch.Tensor, max_capacity: int) -> None:
        self.data = data
        self.length = 0
        self.max_capacity = max_capacity

    @property
    def capacity(self) -> int:
        return self.data.shape[3]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def ensure_capacity(self, needed: int) -> None:
        cap = self.capacity
        if needed <= cap:
            return
        if needed > self.max_capacity:
            raise ValueError(f"sequence of {needed} tokens exceeds the context window ({self.max_capacity})")
        new_cap = min(self.max_capacity, max(needed, cap * 2, 64))
        new_cap = min(self.max_capacity, -(-new_cap // 64) * 64) if new_cap < self.max_capacity else new_cap
        shape = list(self.data.shape)
        shape[3] = new_cap
        data = torch.empty(shape, dtype=self.data.dtype, device=self.data.device)
        if self.length:
            data[:, :, :, : self.length].copy_(self.data[:, :, :, : self.length])
        self.data = data

    def slice(self, start: int, stop: int) -> torch.Tensor:
        """A view of tokens [start, stop) for all layers: ``[layers, 2, kv_heads, n, head_dim]``."""
        return self.data[:, :, :, start:stop]

    def write(self, start: int, kv: torch.Tensor) -> None:
        """Copy ``kv`` (``[layers, 2, kv_heads, n, head_dim]``) to positions [start, start+n)."""
        n = kv.shape[3]
        self.ensure_capacity(start + n)
        self.data[:, :, :, start : start + n].copy_(kv)
        self.length = max(self.length, start + n)


@dataclass
class Segment:
    """One request's part of a step: ``n`` new tokens written to ``kv`` from position ``start``."""

    kv: KVBuffer
    start: int
    n: int


class _Layer:
    __slots__ = ("ln1", "ln2", "eps1", "eps2", "wqkv", "bqkv", "wo", "bo", "wgu", "bgu", "wdown", "bdown", "act")


def _fuse_linear(modules: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights of ``modules`` and re-point each module at a view of the result.

    Idempotent: weights that already are consecutive rows of one tensor are used in place.
    """
    weights = [m.weight.data for m in modules]
    first = weights[0]
    contiguous_run = all(w.is_contiguous() for w in weights) and all(
        w.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for w in weights
    ) and all(
        weights[i].data_ptr() + weights[i].numel() * weights[i].element_size() == weights[i + 1].data_ptr()
        for i in range(len(weights) - 1)
    )
    if contiguous_run:
        rows = sum(w.shape[0] for w in weights)
        fused = first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (rows, first.shape[1]))
    else:
        fused = torch.cat(weights, dim=0).contiguous()
    bias = None
    if any(m.bias is not None for m in modules):
        bias = torch.cat(
            [m.bias.data if m.bias is not None else torch.zeros(m.out_features, dtype=fused.dtype, device=fused.device)
             for m in modules]
        )
    offset = 0
    for m in modules:
        n = m.out_features
        m.weight = nn.Parameter(fused[offset : offset + n], requires_grad=False)
        if m.bias is not None:
            m.bias = nn.Parameter(bias[offset : offset + n], requires_grad=False)
        offset += n
    return fused, bias


class LeanForward:
    """Ragged-batch forward over a Llama-family ``*ForCausalLM`` model's own weights.

    Use :meth:`for_model` to share one instance per model (construction fuses the model's weights).
    """

    @classmethod
    def for_model(cls, model: nn.Module, context_window: int) -> "LeanForward":
        cached = getattr(model, "_lean_forward", None)
        if isinstance(cached, cls) and cached.context_window >= context_window:
            return cached
        inst = cls(model, context_window)
        model._lean_forward = inst
        return inst

    def __init__(self, model: nn.Module, context_window: int) -> None:
        check_supported(model)
        self.model = model
        config = model.config
        base = model.model
        p = base.embed_tokens.weight
        self.device = p.device
        self.dtype = p.dtype
        attn0 = base.layers[0].self_attn
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = int(getattr(attn0, "head_dim", config.hidden_size // self.num_heads))
        self.groups = self.num_heads // self.num_kv_heads
        self.scaling = float(getattr(attn0, "scaling", self.head_dim ** -0.5))
        self.hidden = config.hidden_size
        self.num_layers = len(base.layers)
        self.context_window = int(context_window)
        self.embed = base.embed_tokens.weight
        self.final_norm = base.norm.weight
        self.final_eps = float(getattr(base.norm, "variance_epsilon", getattr(base.norm, "eps", 1e-6)))
        self.lm_head = model.lm_head.weight
        self.lm_head_bias = getattr(model.lm_head, "bias", None)
        self.vocab_size = self.lm_head.shape[0]
        self.layers: list[_Layer] = []
        with torch.no_grad():
            for layer in base.layers:
                at, mlp = layer.self_attn, layer.mlp
                L = _Layer()
                L.ln1 = layer.input_layernorm.weight
                L.eps1 = float(getattr(layer.input_layernorm, "variance_epsilon", 1e-6))
                L.ln2 = layer.post_attention_layernorm.weight
                L.eps2 = float(getattr(layer.post_attention_layernorm, "variance_epsilon", 1e-6))
                L.wqkv, L.bqkv = _fuse_linear([at.q_proj, at.k_proj, at.v_proj])
                L.wo, L.bo = at.o_proj.weight, at.o_proj.bias
                L.wgu, L.bgu = _fuse_linear([mlp.gate_proj, mlp.up_proj])
                L.wdown, L.bdown = mlp.down_proj.weight, mlp.down_proj.bias
                L.act = mlp.act_fn
                self.layers.append(L)
            # cos/sin for every position, from the model's own rotary module (so rope scaling is its own).
            # rotate_half(x) * sin == roll(x, d/2) * [-sin_lo, sin_hi]: one op fewer per layer.
            pos = torch.arange(self.context_window, device=self.device).unsqueeze(0)
            cos, sin = base.rotary_emb(self.embed[:1].unsqueeze(0), pos)
            self.cos = cos[0].to(self.dtype).contiguous()
            sin = sin[0].to(self.dtype)
            half = self.head_dim // 2
            self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).contiguous()
        self._fp32 = self.dtype == torch.float32
        self._mask_cache: dict[tuple[int, int], torch.Tensor] = {}

    # -- KV buffers ---------------------------------------------------------------------------------
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8

    def new_kv(self, capacity: int) -> KVBuffer:
        capacity = max(1, min(int(capacity), self.context_window))
        data = torch.empty(
            (self.num_layers, 2, self.num_kv_heads, capacity, self.head_dim), dtype=self.dtype, device=self.device
        )
        return KVBuffer(data, self.context_window)

    # -- the step -------------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        if self._fp32:
            return F.rms_norm(x, (self.hidden,), w, eps)
        # As LlamaRMSNorm: normalise in float32, cast back, then scale.
        return w * F.rms_norm(x.float(), (self.hidden,), None, eps).to(self.dtype)

    def _causal_mask(self, start: int, n: int) -> torch.Tensor:
        key = (start, n)
        m = self._mask_cache.get(key)
        if m is None:
            q = torch.arange(start, start + n, device=self.device).unsqueeze(1)
            k = torch.arange(start + n, device=self.device).unsqueeze(0)
            m = k <= q
            if len(self._mask_cache) > 256:
                self._mask_cache.clear()
            self._mask_cache[key] = m
        return m

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        segments: Sequence[Segment],
        logit_rows: Sequence[int] | torch.Tensor,
    ) -> torch.Tensor:
        """Run one step. ``token_ids``/``positions``: ``[T]`` on the model's device, segment by segment.

        Writes each segment's keys/values into its KV buffer (capacity must already suffice; see
        :meth:`prepare`) and returns float32 logits for ``logit_rows`` (indices into the T rows).
        """
        H, KVH, D, G = self.num_heads, self.num_kv_heads, self.head_dim, self.groups
        T = token_ids.shape[0]
        x = F.embedding(token_ids, self.embed)
        cos = self.cos.index_select(0, positions).unsqueeze(1)
        sin = self.sin_signed.index_select(0, positions).unsqueeze(1)
        half = D // 2
        scale = self.scaling
        sdpa = F.scaled_dot_product_attention
        # Per segment: (row offset, n, kv data, start, end, mask-or-None, causal flag)
        plan = []
        a = 0
        for seg in segments:
            end = seg.start + seg.n
            if seg.n == 1:
                mask, causal = None, False
            elif seg.start == 0:
                mask, causal = None, True
            else:
                mask, causal = self._causal_mask(seg.start, seg.n), False
            plan.append((a, seg.n, seg.kv.data, seg.start, end, mask, causal))
            a += seg.n
        if a != T:
            raise ValueError(f"segments cover {a} rows, got {T} tokens")
        for li, L in enumerate(self.layers):
            h = self._norm(x, L.ln1, L.eps1)
            qkv = F.linear(h, L.wqkv, L.bqkv).view(T, H + 2 * KVH, D)
            qk = qkv[:, : H + KVH]
            rot = torch.roll(qk, half, -1).mul_(sin)
            qk.mul_(cos).add_(rot)
            kvnew = qkv[:, H:]  # [T, 2*KVH, D]: rotated keys then values
            outs = []
            for (r0, n, data, start, end, mask, causal) in plan:
                layer_kv = data[li].view(2 * KVH, data.shape[3], D)
                layer_kv[:, start:end].copy_(kvnew[r0 : r0 + n].transpose(0, 1))
                k = data[li, 0, :, :end].unsqueeze(0)
                v = data[li, 1, :, :end].unsqueeze(0)
                if n == 1:
                    # One query: group the G query heads of each KV head as G "positions" (no mask needed).
                    q = qkv[r0, :H].view(1, KVH, G, D)
                    o = sdpa(q, k, v, scale=scale)
                    outs.append(o.view(1, H * D))
                else:
                    q = qkv[r0 : r0 + n, :H].transpose(0, 1).unsqueeze(0)
                    o = sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=G > 1)
                    outs.append(o[0].transpose(0, 1).reshape(n, H * D))
            att = outs[0] if len(outs) == 1 else torch.cat(outs, 0)
            x = x + F.linear(att, L.wo, L.bo)
            h = self._norm(x, L.ln2, L.eps2)
            gu = F.linear(h, L.wgu, L.bgu)
            inter = gu.shape[1] // 2
            m = L.act(gu[:, :inter]).mul_(gu[:, inter:])
            x = x + F.linear(m, L.wdown, L.bdown)
        for (r0, n, data, start, end, mask, causal), seg in zip(plan, segments):
            seg.kv.length = max(seg.kv.length, end)
        if isinstance(logit_rows, torch.Tensor):
            rows = logit_rows
        else:
            if len(logit_rows) == 0:
                return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self.device)
            rows = torch.tensor(list(logit_rows), dtype=torch.long, device=self.device)
        hs = self._norm(x.index_select(0, rows), self.final_norm, self.final_eps)
        logits = F.linear(hs, self.lm_head, self.lm_head_bias)
        return logits.float()

    def prepare(self, segments: Sequence[Segment]) -> None:
        """Grow KV buffers so that every segment fits."""
        for seg in segments:
            seg.kv.ensure_capacity(seg.start + seg.n)
