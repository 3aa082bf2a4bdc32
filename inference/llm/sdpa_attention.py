"""Attention on torch's sdpa, where the engine's attention kernel does not run (a GPU, or float16/bfloat16
activations): a step's layout planned once (:meth:`SdpaAttention.plan`) and each layer's queries attending
the pool's KV after their new keys and values are stored (:meth:`SdpaAttention.attend`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from .kv_manager import KVPool


class Span(Protocol):
    """A request's new tokens in a step (step_plan.Segment)."""

    slot: int
    start: int
    n: int


@dataclass
class SdpaPlan:
    """A step's attention layout for sdpa, the same in every layer (see SdpaAttention.plan)."""

    n_dec: int = 0
    used: int = 0
    dense: bool = True
    lmax: int = 0
    dec_mask: torch.Tensor | None = None
    slot_idx: torch.Tensor | None = None
    pos_idx: torch.Tensor | None = None
    chunks: list[tuple[int, int, int, int, int, torch.Tensor | None]] = field(default_factory=list)


@dataclass(frozen=True)
class SdpaAttention:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    dtype: torch.dtype
    device: torch.device

    @property
    def groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    def plan(self, pool: KVPool, dec: Sequence[Span], chunks: Sequence[Span], positions: torch.Tensor) -> SdpaPlan:
        """What sdpa needs each layer: decoding rows share one call over slots ``0..used-1`` (padded to
        the longest and masked), prompt chunks attend per request."""
        plan = SdpaPlan()
        n_dec, used = len(dec), pool.used
        dec_slots = [s.slot for s in dec]
        if n_dec:
            plan.dense = dec_slots == list(range(used))  # every used slot decodes: no gather/scatter of queries
            if plan.dense:
                ends = [s.start + 1 for s in dec]
            else:
                ends = [1] * used
                for s in dec:
                    ends[s.slot] = s.start + 1
            plan.lmax = max(ends)
            if min(ends) < plan.lmax:
                # Padded positions are masked, but must hold finite numbers (0 * NaN is NaN).
                for slot, e in enumerate(ends):
                    if e < plan.lmax:
                        pool.sanitize(slot, plan.lmax)
                lens = torch.tensor(ends, device=self.device).view(used, 1, 1, 1)
                plan.dec_mask = self.additive(torch.arange(plan.lmax, device=self.device).view(1, 1, 1, plan.lmax) < lens)
            plan.slot_idx = torch.tensor(dec_slots, dtype=torch.long, device=self.device)
            plan.pos_idx = positions[:n_dec]
        plan.n_dec, plan.used = n_dec, used
        r0 = n_dec
        for s in chunks:
            mask = None if s.start == 0 else self.causal_mask(s.start, s.n)
            plan.chunks.append((r0, s.n, s.slot, s.start, s.start + s.n, mask))
            r0 += s.n
        return plan

    def attend(self, layer: torch.Tensor, qkv: torch.Tensor, plan: SdpaPlan) -> torch.Tensor:
        """One layer's attention on torch's sdpa (where the kernel does not run); stores the new KV."""
        H, KVH, D, G = self.num_heads, self.num_kv_heads, self.head_dim, self.groups
        sdpa, scale, n_dec = F.scaled_dot_product_attention, self.scaling, plan.n_dec
        kvnew = qkv[:, H:]  # [T, 2*KVH, D]: rotated keys, then values
        outs = []
        if n_dec:
            layer[:, plan.slot_idx, :, plan.pos_idx] = kvnew[:n_dec].view(n_dec, 2, KVH, D)
            k = layer[0, : plan.used, :, : plan.lmax]
            v = layer[1, : plan.used, :, : plan.lmax]
            q = qkv[:n_dec, :H].view(n_dec, KVH, G, D)
            if plan.dense:
                o = sdpa(q, k, v, attn_mask=plan.dec_mask, scale=scale)
                outs.append(o.reshape(n_dec, H * D))
            else:
                qf = q.new_zeros((plan.used, KVH, G, D))
                qf[plan.slot_idx] = q
                o = sdpa(qf, k, v, attn_mask=plan.dec_mask, scale=scale)
                # reshape, not view: CUDA's float32/float64 sdpa returns a non-contiguous output.
                outs.append(o[plan.slot_idx].reshape(n_dec, H * D))
        for c0, n, slot, start, end, mask in plan.chunks:
            layer[:, slot, :, start:end] = kvnew[c0 : c0 + n].view(n, 2, KVH, D).permute(1, 2, 0, 3)
            k = layer[0, slot, :, :end].unsqueeze(0)
            v = layer[1, slot, :, :end].unsqueeze(0)
            q = qkv[c0 : c0 + n, :H].transpose(0, 1).unsqueeze(0)
            o = sdpa(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=G > 1)
            outs.append(o[0].transpose(0, 1).reshape(n, H * D))
        return outs[0] if len(outs) == 1 else torch.cat(outs, 0)

    def causal_mask(self, start: int, n: int) -> torch.Tensor:
        q = torch.arange(start, start + n, device=self.device).unsqueeze(1)
        k = torch.arange(start + n, device=self.device).unsqueeze(0)
        return self.additive(k <= q)

    def additive(self, keep: torch.Tensor) -> torch.Tensor:
        """A boolean attention mask as sdpa would turn it into one, 0 or -inf, made once per step
        instead of in each of the layers' sdpa calls."""
        return torch.zeros(keep.shape, dtype=self.dtype, device=self.device).masked_fill_(~keep, float("-inf"))
