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

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ..memory import return_freed_memory
from . import cpu_kernels, decode_attention, q4_matmul
from .gguf_blocks import GroupGrid
from .gguf_weights import GgufWeights
from .kernel_paths import KernelPaths
from .layer_stack import LayerStack, LayerWeights
from .model_support import UnsupportedModel, check_supported
from .sdpa_attention import SdpaAttention
from .step_plan import Segment, leading_decodes
from .threads import one_intra_op_thread
from .weight_formats import (
    WEIGHT_FORMATS,
    fuse_bias,
    fuse_linear,
    lin_int4,
    lin_int4_kernel,
    lin_int8,
    lin_native,
    lin_q8_kernel,
    lin_w8a8,
)

if TYPE_CHECKING:
    from .kv_manager import KVLayout, KVPool


class _Layer:
    """One decoder layer's weights as the forward runs them (each linear as its format's tuple)."""

    __slots__ = ("ln1", "ln2", "eps1", "eps2", "qkv", "o", "gu", "down", "act")
    ln1: torch.Tensor
    ln2: torch.Tensor
    eps1: float
    eps2: float
    qkv: tuple
    o: tuple
    gu: tuple
    down: tuple
    act: nn.Module


class LeanForward:
    """Ragged-batch forward over a Llama-family ``*ForCausalLM`` model's own weights.

    Use :meth:`for_model` to share one instance per model (construction re-lays the model's weights).
    """

    @classmethod
    def for_model(cls, model: nn.Module, context_window: int = 0, weight_format: str = "native",
                  kernel_dir: Path | None = None, kernels: str = "auto", gguf: GgufWeights | None = None) -> LeanForward:
        cache = getattr(model, "_lean_forward", None)
        if not isinstance(cache, dict):
            cache = {}
            setattr(model, "_lean_forward", cache)  # noqa: B010 - one forward per model and format
        key = (weight_format, kernels)
        cached = cache.get(key)
        if isinstance(cached, cls) and cached.max_positions >= context_window:
            return cached
        if getattr(model, "_lean_released", False):
            raise UnsupportedModel("the model's linear weights were released (LeanForward.release_model_weights)")
        with one_intra_op_thread():  # re-laying the weights must not leave an OpenMP pool on this thread
            inst = cls(model, context_window, weight_format=weight_format, kernel_dir=kernel_dir, kernels=kernels,
                       gguf=gguf)
        cache[key] = inst
        return inst

    def __init__(self, model: nn.Module, context_window: int = 0, *, weight_format: str = "native",
                 kernel_dir: Path | None = None, kernels: str = "auto", gguf: GgufWeights | None = None) -> None:
        """``weight_format``: "native" runs the model's own weights in their dtype (exact: the same tokens
        as ``generate()``). "int8" runs the linear weights as 8-bit groups of 32 (an asymmetric grid per
        group, computed at load) on the engine's kernels where they run, as int4 does; elsewhere symmetric
        per-channel int8 copies with bfloat16 activations and KV (torch's weight-only kernel). "int4" (CPU) runs the layers' linear
        weights as 4-bit groups of 32 (lossless for a Q4_1 GGUF such as the embedded model), on the
        engine's int4 kernel (15-bit activations; built into ``kernel_dir``) where the CPU runs one
        of its builds, else on torch's int4 kernel with bfloat16 matmul inputs; the residual stream,
        norms and attention stay in the model's float32, the KV is float16 where the engine's
        attention kernel runs. Both run the output head as int8, on the CPU with int8 activations
        too (the engine's q8 kernel, else :func:`lin_w8a8`). "gguf" (CPU, the engine's kernels) runs each
        linear weight of the GGUF file ``gguf`` in the grouped format that holds its own type, the output head
        too (floats where the file's head is floats), on the engine's kernels, with float32 activations
        elsewhere and float16 KV, as int4. ``kernels`` (``KERNEL_CHOICES``) picks the build of the engine's
        kernels, or torch's (see :func:`resolve_kernels`)."""
        check_supported(model)
        if weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"weight_format must be one of {WEIGHT_FORMATS}, not {weight_format!r}")
        if (weight_format == "gguf") != (gguf is not None):
            raise ValueError("the gguf weight format runs a GGUF file's blocks: pass the file's GgufWeights with it")
        self.model = model
        self.weight_format = weight_format
        # transformers' modules, read by name (their types say Tensor | Module for any attribute).
        config: Any = model.config
        base: Any = model.model
        p: torch.Tensor = base.embed_tokens.weight
        self.device: torch.device = p.device
        # int4 and the engine's kernels quantize only the matmuls (float32 elsewhere: with bfloat16 activations
        # throughout, the 135M model's greedy answers changed within the first tokens); torch's int8 kernel runs
        # in bfloat16 throughout (set below, where the engine's kernels do not run int8).
        self.dtype: torch.dtype = p.dtype
        attn0 = base.layers[0].self_attn
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(attn0, "head_dim", config.hidden_size // self.num_heads))
        self.groups = self.num_heads // self.num_kv_heads
        self.scaling = float(getattr(attn0, "scaling", self.head_dim ** -0.5))
        self.hidden = int(config.hidden_size)
        self.num_layers = len(base.layers)
        self.max_positions = max(int(context_window), int(getattr(config, "max_position_embeddings", 0) or 0))
        if self.max_positions <= 0:
            raise UnsupportedModel("the model config has no max_position_embeddings")
        self.final_norm = base.norm.weight
        self.final_eps = float(getattr(base.norm, "variance_epsilon", getattr(base.norm, "eps", 1e-6)))
        module_names = {id(m): n for n, m in model.named_modules()}
        self.gguf_formats: dict[str, set[str]] = {}  # part -> "TYPE as N-bit groups" (or "as floats"), under gguf

        def grids(part: str, modules: Sequence[nn.Module]) -> list[GroupGrid | None]:
            if gguf is None:
                return []
            found, kinds = [], []
            for m in modules:
                name = module_names[id(m)]
                tensor = gguf.tensor(name)
                grid = gguf.grid(name)
                if tensor is None or (grid is None and part != "head"):
                    raise UnsupportedModel(f"{gguf.path.name}: {name} is "
                                           f"{'missing' if tensor is None else tensor.kind.name} among quantized "
                                           "linear weights (a file that mixes float and quantized layers is not "
                                           "served; --llm-dtype float32 runs it de-quantized)")
                found.append(grid)
                kinds.append(tensor.kind.name)
            # The width the matrix runs in: a fused one's parts all in the widest of theirs (gguf_weights.stacked),
            # so a Q5_0 query beside a Q8_0 value runs in 8 bits and is said to.
            widths = [g.bits for g in found if g is not None]
            how = f"as {max(widths)}-bit groups" if widths else "as floats"
            self.gguf_formats.setdefault(part, set()).update(f"{kind} {how}" for kind in kinds)
            return found

        head: Any = model.lm_head
        self.lm_head_bias: torch.Tensor | None = getattr(head, "bias", None)
        # Under gguf the head multiplies the file's own blocks (its output.weight, or tied, its embedding) where
        # they are blocks: no float copy of it is made.
        head_grids: list[GroupGrid | None] = []
        if gguf is not None and int(head.out_features) % q4_matmul.TILE == 0:
            head_grids = grids("head", [head if gguf.tensor(module_names[id(head)]) is not None
                                        else base.embed_tokens])
        self.lm_head_t: torch.Tensor | None = None
        if head_grids and head_grids[0] is not None:
            self.vocab_size = int(head.out_features)
        else:
            # lm_head as a transposed [hidden, vocab] matrix too: for 4-8 rows the NN GEMM took half the time
            # of F.linear's (18 vs 35 ms for 8 rows on one core). A tied input embedding follows it (a row
            # lookup in the transposed view is a strided gather: negligible next to a step).
            if getattr(head, "_lean_fused", None) is None:
                tied = base.embed_tokens.weight is head.weight
                with torch.no_grad():
                    w_t = head.weight.data.t().contiguous()
                param = nn.Parameter(w_t.t(), requires_grad=False)
                head.weight = param
                if tied:
                    base.embed_tokens.weight = param
                head._lean_fused = (w_t, None)
            self.lm_head_t = head._lean_fused[0]
            self.vocab_size = int(self.lm_head_t.shape[1])
        self.embed: torch.Tensor = base.embed_tokens.weight
        linears = [m for layer in base.layers for m in layer.modules() if isinstance(m, nn.Linear)]
        def choose() -> KernelPaths:
            return KernelPaths.choose(kernels, kernel_dir, device=self.device, weight_format=weight_format,
                                      dtype=self.dtype, head_dim=self.head_dim, hidden=self.hidden,
                                      vocab_size=self.vocab_size, out_features=[m.out_features for m in linears])

        paths = choose()
        if weight_format == "int8" and paths.int4_lib is None:
            self.dtype = torch.bfloat16
            paths = choose()
        self.kernels, self.int4_kernel = paths.kernels, paths.int4_kernel
        self._int4_lib, self._head_lib, self._attention_lib = paths.int4_lib, paths.head_lib, paths.attention_lib
        self.decode_attention = "kernel" if self._attention_lib is not None else "sdpa"
        # int4 keeps its KV in float16 where that kernel reads it (llama.cpp's default too): half the
        # memory of the pool and of the prefix cache's budget per token. (It made no step faster.)
        self.kv_dtype = (torch.float16 if self._attention_lib is not None and (
            weight_format in ("int4", "gguf") or self._int4_lib is not None) else self.dtype)
        self.layers: list[_Layer] = []
        with torch.no_grad():
            for layer in base.layers:
                at, mlp = layer.self_attn, layer.mlp
                L = _Layer()
                L.ln1 = layer.input_layernorm.weight.to(self.dtype)
                L.eps1 = float(getattr(layer.input_layernorm, "variance_epsilon", 1e-6))
                L.ln2 = layer.post_attention_layernorm.weight.to(self.dtype)
                L.eps2 = float(getattr(layer.post_attention_layernorm, "variance_epsilon", 1e-6))
                qkv, gate_up = [at.q_proj, at.k_proj, at.v_proj], [mlp.gate_proj, mlp.up_proj]
                # Under gguf the file's blocks are multiplied, not the model's float weights: only the biases fuse.
                fuse = fuse_bias if gguf is not None else fuse_linear
                L.qkv = paths.prepare(fuse(qkv), grids=grids("qkv", qkv))
                L.o = paths.prepare(fuse([at.o_proj]), grids=grids("o", [at.o_proj]))
                L.gu = paths.prepare(fuse(gate_up), grids=grids("gate_up", gate_up))
                L.down = paths.prepare(fuse([mlp.down_proj]), grids=grids("down", [mlp.down_proj]))
                L.act = mlp.act_fn
                self.layers.append(L)
            self.final_norm = self.final_norm.to(self.dtype)
            self.head = paths.prepare((self.lm_head_t, self.lm_head_bias), head=True, grids=head_grids)
            # cos/sin for every position, from the model's own rotary module (so rope scaling is its own).
            # rotate_half(x) * sin == roll(x, d/2) * [-sin_lo, sin_hi]: one op fewer per layer.
            pos = torch.arange(self.max_positions, device=self.device).unsqueeze(0)
            cos, sin = base.rotary_emb(self.embed[:1].unsqueeze(0), pos)
            self.cos = cos[0].to(self.dtype).contiguous()
            sin = sin[0].to(self.dtype)
            half = self.head_dim // 2
            self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).contiguous()
        self._fp64 = self.dtype == torch.float64
        self.sdpa = SdpaAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.scaling, self.dtype, self.device)
        # Logits leave the forward in float32, or float64 for a float64 model: rounding them to float32
        # would put a float32 unit (6e-8 of a logit) on differences that float64 keeps at 1e-16, so a
        # float64 comparison could no longer tell a defect from a kernel chosen by the number of rows.
        self.logits_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self._silu_mlp = getattr(config, "hidden_act", None) in ("silu", "swish")
        # A step's layers in one C call where every part of them runs on the engine's kernels
        # (layer_stack.py); the loop in forward() otherwise.
        self._stack: LayerStack | None = None
        if self._int4_lib is not None and self._attention_lib is not None and self._silu_mlp:
            self._stack = LayerStack(
                self._int4_lib, [LayerWeights(qkv=L.qkv[1:], o=L.o[1:], gate_up=L.gu[1:], down=L.down[1:],
                                   ln1=L.ln1, eps1=L.eps1, ln2=L.ln2, eps2=L.eps2) for L in self.layers],
                heads=self.num_heads, kv_heads=self.num_kv_heads, head_dim=self.head_dim, cos=self.cos,
                sin_signed=self.sin_signed, scale=self.scaling)
        self._lin = {"native": lin_native, "int8": lin_int4_kernel if self._int4_lib is not None else lin_int8,
                     "gguf": lin_int4_kernel,
                     "int4": lin_int4_kernel if self._int4_lib is not None else lin_int4}[weight_format]
        if weight_format == "gguf":
            self._lin_head = lin_int4_kernel if len(self.head) == 4 else lin_native
        else:
            self._lin_head = lin_native if weight_format == "native" else (
                lin_q8_kernel if self._head_lib is not None else lin_w8a8 if self.device.type == "cpu" else lin_int8)
        self._cast_embed = self.embed.dtype != self.dtype
        if weight_format != "native":
            try:  # fail at load time, not in the first step, where the kernel is missing
                probe = torch.zeros(1, self.hidden, dtype=self.dtype, device=self.device)
                self._lin(probe, self.layers[0].o)
                self._lin_head(probe, self.head)
            except Exception as exc:  # pragma: no cover - depends on the torch build/device
                raise UnsupportedModel(f"{weight_format} weights are not supported on {self.device}: {exc}") from exc

    def release_model_weights(self) -> int:
        """Free the model's own float copies of its layers' linear weights, which a quantized forward
        never reads (it multiplies its int4 or int8 copies): 424 MB of float32 for the embedded model,
        a fifth of the gateway's memory. The modules are left with empty weights, so ``generate()`` and
        new forwards of the model stop working; this forward does not change. For a process that only
        ever runs this forward (the gateway). Returns the bytes freed."""
        if self.weight_format == "native":
            raise ValueError("a native forward multiplies the model's own weights")
        cache = getattr(self.model, "_lean_forward", {})
        if any(f is not self and f.weight_format == "native" for f in cache.values()):
            raise ValueError("a native forward of this model still multiplies its weights")
        freed = 0
        fused_seen: set[int] = set()
        base: Any = self.model.model
        linears = [m for layer in base.layers for m in layer.modules() if isinstance(m, nn.Linear)]
        head: Any = self.model.lm_head
        if self.lm_head_t is None and head.weight is not base.embed_tokens.weight:
            linears.append(head)  # under gguf a head that runs from the file's blocks
        for m in linears:
            fused = getattr(m, "_lean_fused", None)
            if fused is not None and id(fused[0]) not in fused_seen:
                fused_seen.add(id(fused[0]))
                freed += fused[0].numel() * fused[0].element_size()
            elif fused is None:
                freed += m.weight.numel() * m.weight.element_size()
            setattr(m, "_lean_fused", None)  # noqa: B010
            m.weight = nn.Parameter(m.weight.new_empty(0), requires_grad=False)
        setattr(self.model, "_lean_released", True)  # noqa: B010
        return_freed_memory()
        return freed

    def describe(self) -> dict[str, str]:
        """What each part of a step runs on, for /healthz, the log and the benchmarks' JSON, so that a
        slower path is never taken silently: the instruction sets this CPU runs the engine's kernels
        with (``cpu_isas``), the build in use (``kernels``), and per part ``vnni`` / ``avx2`` (that
        build of the engine's kernels), ``torch`` or ``onednn`` (torch's own kernels) or ``sdpa``."""
        if self._head_lib is not None or self._lin_head is lin_int4_kernel:
            head = self.kernels
        else:
            head = "onednn" if self._lin_head is lin_w8a8 else "torch"
        described = {
            "device": self.device.type,
            "cpu_isas": ",".join(cpu_kernels.supported_isas()) or "none",
            "kernels": self.kernels,
            "weights": self.weight_format,
            "matmul": self.int4_kernel or "torch",
            "attention": self.kernels if self._attention_lib is not None else "sdpa",
            "head": head,
            "layers_in_one_call": str(self._stack is not None).lower(),
        }
        if self.weight_format == "int8":
            described["int8"] = ("8-bit groups of 32" if self._int4_lib is not None
                                 else "per output channel, bfloat16")
        if self.device.type == "cpu" and self.dtype == torch.bfloat16:
            described["bfloat16"] = ("native" if cpu_kernels.has_bfloat16_instructions() else
                                     "emulated: this CPU has no bfloat16 instructions (avx512_bf16, amx_bf16), so "
                                     "each step is many times slower than float32 or int4")
        # Under gguf, per part which of the file's types runs in which format ("Q5_0 as 5-bit groups").
        for part, formats in self.gguf_formats.items():
            described[f"gguf_{part}"] = ", ".join(sorted(formats))
        return described

    def kv_bytes_per_token(self) -> int:
        return self.kv_layout.bytes_per_token

    @property
    def kv_layout(self) -> KVLayout:
        """What the KV of a token of this forward looks like (the KV manager allocates by it)."""
        from .kv_manager import KVLayout

        return KVLayout(self.num_layers, self.num_kv_heads, self.head_dim, self.kv_dtype, self.device,
                        self.max_positions)

    # -- the step -------------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm in one kernel: F.rms_norm with the weight, in the activations' dtype (it sums in
        float32; LlamaRMSNorm casts back before the weight, one rounding more in bfloat16, and three
        kernels more). float64 normalizes in float32 as LlamaRMSNorm does: the float64 tests compare
        with transformers' forward to 1e-9."""
        if not self._fp64:
            return F.rms_norm(x, (self.hidden,), w, eps)
        return w * F.rms_norm(x.float(), (self.hidden,), None, eps).to(self.dtype)

    def _residual_add(self, x: torch.Tensor, inp: torch.Tensor, weights: tuple) -> torch.Tensor:
        """``x += lin(inp)`` in place: for native weights one GEMM that adds into ``x`` (addmm_), the
        stream's own tensor in decode_static."""
        if self.weight_format == "native":
            w_t, b = weights
            x.addmm_(inp, w_t)
            return x if b is None else x.add_(b)
        return x.add_(self._lin(inp, weights))

    def _lin_into(self, inp: torch.Tensor, weights: tuple, out: torch.Tensor) -> None:
        """``out[:] = lin(inp)``: for native weights the GEMM writes ``out`` itself (a view whose rows
        are strided), a copy otherwise."""
        if self.weight_format == "native":
            w_t, b = weights
            if b is None:
                torch.mm(inp, w_t, out=out)
            else:
                torch.addmm(b, inp, w_t, out=out)
        else:
            out.copy_(self._lin(inp, weights))

    def _norm_lin(self, x: torch.Tensor, w: torch.Tensor, eps: float, weights: tuple) -> torch.Tensor:
        """``lin(rms_norm(x))``; the VNNI kernel normalizes the rows as it quantizes them."""
        if self._int4_lib is not None:
            return lin_int4_kernel(x, weights, norm=(w, eps))
        return self._lin(self._norm(x, w, eps), weights)

    def _residual_lin(self, x: torch.Tensor, inp: torch.Tensor, weights: tuple, gate: nn.Module | None = None
                      ) -> torch.Tensor:
        """``x + lin(inp)``, or with ``gate``, ``x + lin(gate(inp[:, :i]) * inp[:, i:])`` (a gated MLP's
        down projection). The VNNI kernel gates a SiLU MLP's rows as it quantizes them and adds its
        product to ``x`` in place (``x`` is the step's own residual stream)."""
        if self._int4_lib is not None and (gate is None or self._silu_mlp):
            return lin_int4_kernel(inp, weights, gated=gate is not None, add_to=x)
        if gate is not None:
            inter = inp.shape[1] // 2
            inp = gate(inp[:, :inter]).mul_(inp[:, inter:])
        return x + self._lin(inp, weights)

    @torch.inference_mode()
    def forward(
        self,
        pool: KVPool,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        segments: Sequence[Segment],
        logit_rows: Sequence[int] | torch.Tensor,
    ) -> torch.Tensor:
        """Run one step over ``T`` new tokens and return the logits of ``logit_rows`` (float32; float64
        for a float64 model: ``logits_dtype``).

        ``token_ids``/``positions`` (``[T]``, on the model's device) list the new tokens segment by
        segment. Single-token segments (decoding) come first, in increasing slot order; prompt chunks
        (``n > 1``) follow. Each segment's keys/values are written to its slot of ``pool`` (its capacity
        must suffice: :meth:`KVPool.ensure_capacity`), and the slot lengths are updated at the end, so a
        step that raises commits nothing and can be retried.
        """
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        T = token_ids.shape[0]
        data = pool.data
        if data is None:
            raise ValueError("the pool has no KV tensor (no slot was ever acquired)")
        n_dec = leading_decodes(segments)
        dec = segments[:n_dec]
        chunks = segments[n_dec:]
        dec_slots = [s.slot for s in dec]
        if any(b <= a for a, b in zip(dec_slots, dec_slots[1:])):
            raise ValueError("single-token segments must come first, in increasing slot order")
        if any(s.n < 1 for s in chunks):
            raise ValueError("empty segment")
        if n_dec + sum(s.n for s in chunks) != T:
            raise ValueError(f"segments cover {n_dec + sum(s.n for s in chunks)} rows, got {T} tokens")
        kernel = self._attention_lib
        if kernel is not None:
            # Every row, decoding or prompt, attends on the kernel over its own slot up to its own
            # position (a prompt row sees the rows of its chunk before it: the kernel stores them all
            # first). So a row's result is the same whatever else the step holds, and a prompt's
            # chunks need no masks.
            row_slots = torch.tensor(dec_slots + [s.slot for s in chunks for _ in range(s.n)], dtype=torch.long)
        else:
            plan = self.sdpa.plan(pool, dec, chunks, positions)

        x = F.embedding(token_ids, self.embed)
        if self._cast_embed:
            x = x.to(self.dtype)
        if kernel is None:
            cos = self.cos.index_select(0, positions).unsqueeze(1)
            sin = self.sin_signed.index_select(0, positions).unsqueeze(1)
        if self._stack is not None:
            self._stack.run(x, data, row_slots, positions)
        else:
            for li, L in enumerate(self.layers):
                qkv = self._norm_lin(x, L.ln1, L.eps1, L.qkv).view(T, H + 2 * KVH, D)
                layer = data[li]  # [2, slots, KVH, cap, D]
                if kernel is not None:
                    # The kernel rotates the queries and keys itself (torch's roll, products and sum had cost
                    # a step 0.35-0.4 ms, for one row as for eight).
                    att = decode_attention.attend(kernel, qkv, H, KVH, layer, row_slots, positions, self.scaling,
                                                  rope=(self.cos, self.sin_signed))
                else:
                    qk = qkv[:, : H + KVH]
                    rot = torch.roll(qk, D // 2, -1).mul_(sin)
                    qk.mul_(cos).add_(rot)
                    att = self.sdpa.attend(layer, qkv, plan)
                x = self._residual_lin(x, att, L.o)
                gu = self._norm_lin(x, L.ln2, L.eps2, L.gu)
                x = self._residual_lin(x, gu, L.down, gate=L.act)
        for s in segments:
            pool.commit(s.slot, s.start + s.n)
        if isinstance(logit_rows, torch.Tensor):
            rows = logit_rows
        else:
            if len(logit_rows) == 0:
                return torch.empty((0, self.vocab_size), dtype=self.logits_dtype, device=self.device)
            rows = torch.tensor(list(logit_rows), dtype=torch.long, device=self.device)
        hs = self._norm(x.index_select(0, rows), self.final_norm, self.final_eps)
        logits = self._lin_head(hs, self.head)
        return logits.to(self.logits_dtype)

    @torch.inference_mode()
    def decode_static(self, kv: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
                      write_slots: torch.Tensor, seq_lens: torch.Tensor, length: int,
                      out: torch.Tensor | None = None) -> torch.Tensor:
        """One decoding step of ``B`` rows over inputs of fixed shapes, so that it can be captured as a
        CUDA graph and replayed (``model_runner.py``); on torch's kernels and sdpa only.

        Row ``i`` is slot ``i``: it attends positions ``[0, length)`` of that slot, masked to its first
        ``seq_lens[i]``, after its new key and value are stored at ``positions[i]`` of
        ``write_slots[i]`` (a padding row writes the pool's scratch slot and reads one position).
        Nothing reads a host value, and every shape depends only on ``(B, length)``. ``kv`` is the
        pool's tensor; positions ``[0, length)`` of slots ``0..B-1`` must hold finite numbers. Returns
        logits ``[B, vocab]`` in ``logits_dtype`` (written into ``out`` where given: every graph of a batch
        bucket writes the one buffer the device sampler's graph reads); the caller records the slots' new
        lengths."""
        if self._attention_lib is not None:
            raise ValueError("decode_static runs on sdpa; this forward attends on the engine's kernels")
        H, KVH, D, G = self.num_heads, self.num_kv_heads, self.head_dim, self.groups
        B = token_ids.shape[0]
        x = F.embedding(token_ids, self.embed)
        if self._cast_embed:
            x = x.to(self.dtype)
        # Every launch counts in a replayed graph (tests/engine/test_model_runner.py bounds them per layer),
        # so a layer runs the forward's arithmetic in 11 kernels instead of 22: each RMSNorm one kernel
        # (_norm), RoPE one batched matmul by each row's rotation (built here once a step: cos on the
        # diagonal, the signed sin D/2 off it, as torch.roll placed it), the key and the value stored by
        # one indexed write, and the residual adds inside the GEMMs (addmm_ into the stream).
        rot = torch.diag_embed(self.cos.index_select(0, positions))
        rot.add_(torch.diag_embed(self.sin_signed.index_select(0, positions)).roll(D // 2, -2))
        keep = torch.arange(length, device=self.device).unsqueeze(0) < seq_lens.unsqueeze(1)
        mask = self.sdpa.additive(keep).view(B, 1, 1, length)
        # One buffer a row holds the rotated queries and keys, then the qkv GEMM's output, written in
        # place (out=): the rotated keys (head H) and the values (head 2H + 2KVH) then lie a fixed
        # stride apart in every row, so that one strided view of both, [B, 2, KVH, D], is stored with
        # one indexed write (the pool's layer is [2, slots + 1, KVH, cap, D]).
        rotated, T = H + KVH, H + 2 * KVH
        z = torch.empty((B, rotated + T, D), dtype=self.dtype, device=self.device)
        qkv_out = z.as_strided((B, T * D), (z.stride(0), 1), rotated * D)
        new_kv = z.as_strided((B, 2, KVH, D), (z.stride(0), (H + 2 * KVH) * D, D, 1), H * D)
        q = z[:, :H].view(B, KVH, G, D)
        for li, L in enumerate(self.layers):
            self._lin_into(self._norm(x, L.ln1, L.eps1), L.qkv, qkv_out)
            torch.bmm(z[:, rotated : 2 * rotated], rot, out=z[:, :rotated])
            layer = kv[li]  # [2, slots + 1, KVH, cap, D]
            layer[:, write_slots, :, positions] = new_kv
            o = F.scaled_dot_product_attention(q, layer[0, :B, :, :length], layer[1, :B, :, :length],
                                               attn_mask=mask, scale=self.scaling)
            x = self._residual_add(x, o.reshape(B, H * D), L.o)
            gu = self._lin(self._norm(x, L.ln2, L.eps2), L.gu)
            inter = gu.shape[1] // 2
            x = self._residual_add(x, L.act(gu[:, :inter]).mul_(gu[:, inter:]), L.down)
        hs = self._norm(x, self.final_norm, self.final_eps)
        if out is None:
            return self._lin_head(hs, self.head).to(self.logits_dtype)
        if self.weight_format == "native" and self.dtype == self.logits_dtype:
            self._lin_into(hs, self.head, out)  # the GEMM writes the buffer itself
        else:
            out.copy_(self._lin_head(hs, self.head))  # the cast to logits_dtype is the copy
        return out
