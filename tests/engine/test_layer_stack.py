"""A step's decoder layers in one C call (layer_stack.c) against the same kernels called one by one
from Python, as the forward's loop calls them: bit for bit, biases included, in each build this
machine's CPU runs; and its AVX2 build against its VNNI build, bit for bit."""

from __future__ import annotations

import pytest
import torch

from inference.llm import decode_attention, q4_matmul
from inference.llm.layer_stack import LayerStack, LayerWeights
from inference.llm.weight_formats import int4_grid
from tests.engine.kernel_builds import assert_same_bits, vnni_and_avx2

HIDDEN, HEADS, KV_HEADS, DIM, INTER, LAYERS = 64, 4, 2, 16, 96, 3


def int4_blob(gen: torch.Generator, k: int, n: int, bits: int = 4) -> torch.Tensor:
    if bits in (5, 8):  # 5- and 8-bit groups, as a GGUF's Q5_0, Q5_1, Q5_K and Q6_K, Q8_0 weights run
        half = 2 ** (bits - 1)
        step = torch.rand(n, k // 32, generator=gen) * 0.002 * 128 / half + 1e-4
        q = torch.randint(0, 2 * half, (n, k // 32, 32), generator=gen)
        return q4_matmul.pack(step, -half * step, q, bits)
    w_t = torch.randn(k, n, generator=gen) * 0.2
    low, step, q = int4_grid(w_t)
    return q4_matmul.pack(step, low, torch.round(q).clamp_(0, 15))


def rope_tables(positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.arange(positions).unsqueeze(1) * (100.0 ** (-torch.arange(0, DIM, 2) / DIM)).repeat(2).unsqueeze(0)
    sin = angles.sin()
    return angles.cos().contiguous(), torch.cat([-sin[:, : DIM // 2], sin[:, DIM // 2 :]], dim=-1).contiguous()


def random_layers(gen: torch.Generator, biases: bool, mixed: bool = False) -> list[LayerWeights]:
    """``mixed``: 4-, 5- and 8-bit matrices in turn, as a GGUF's Q4_K_M file mixes Q4_K with Q5_0, Q6_K and
    Q8_0 (every width in every part over the layers: 4 parts a layer, 3 widths)."""
    made = 0

    def linear(k: int, n: int):
        nonlocal made
        made += 1
        bits = (4, 5, 8)[made % 3] if mixed else 4
        return int4_blob(gen, k, n, bits), n, (torch.randn(n, generator=gen) * 0.1 if biases else None)

    return [LayerWeights(qkv=linear(HIDDEN, (HEADS + 2 * KV_HEADS) * DIM), o=linear(HEADS * DIM, HIDDEN),
                         gate_up=linear(HIDDEN, 2 * INTER), down=linear(INTER, HIDDEN),
                         ln1=1 + 0.1 * torch.randn(HIDDEN, generator=gen), eps1=1e-5,
                         ln2=1 + 0.1 * torch.randn(HIDDEN, generator=gen), eps2=1e-6)
            for _ in range(LAYERS)]


def one_by_one(lib, layers: list[LayerWeights], x: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor,
               positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> None:
    def add(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return y if bias is None else y.add_(bias)

    for i, L in enumerate(layers):
        qkv = add(q4_matmul.matmul(lib, x, L.qkv[0], L.qkv[1], norm=(L.ln1, L.eps1)), L.qkv[2])
        att = decode_attention.attend(lib, qkv.view(len(x), HEADS + 2 * KV_HEADS, DIM), HEADS, KV_HEADS, kv[i],
                                      slots, positions, DIM**-0.5, rope=rope)
        add(q4_matmul.matmul(lib, att, L.o[0], HIDDEN, add_to=x), L.o[2])
        gate_up = add(q4_matmul.matmul(lib, x, L.gate_up[0], 2 * INTER, norm=(L.ln2, L.eps2)), L.gate_up[2])
        add(q4_matmul.matmul(lib, gate_up, L.down[0], HIDDEN, gated=True, add_to=x), L.down[2])


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("biases", [False, True])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_one_call_is_the_kernels_one_by_one_bit_for_bit(kernels, biases, kv_dtype, mixed):
    gen = torch.Generator().manual_seed(11 + biases)
    layers = random_layers(gen, biases, mixed)
    widths = {q4_matmul.bits_of(getattr(L, part)[0]) for L in layers for part in ("qkv", "o", "gate_up", "down")}
    assert widths == ({4, 5, 8} if mixed else {4})
    cos, sin_signed = rope_tables(64)
    stack = LayerStack(kernels, layers, heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, cos=cos,
                       sin_signed=sin_signed, scale=DIM**-0.5)
    kv = torch.randn(LAYERS, 2, 3, KV_HEADS, 64, DIM, generator=gen).to(kv_dtype)
    # Two decoding rows, then a prompt chunk of slot 1 at positions 5..9.
    slots = torch.tensor([0, 2, 1, 1, 1, 1, 1])
    positions = torch.tensor([30, 12, 5, 6, 7, 8, 9])
    x = torch.randn(7, HIDDEN, generator=gen)
    x_before, kv_before = x.clone(), kv.clone()
    want_x, want_kv = x.clone(), kv.clone()
    one_by_one(kernels, layers, want_x, want_kv, slots, positions, (cos, sin_signed))
    stack.run(x, kv, slots, positions)
    assert torch.equal(x, want_x) and torch.equal(kv, want_kv)
    # Not a tautology: the layers changed the stream and stored every row's key and value.
    assert (x - x_before).abs().min() > 0
    changed = (kv != kv_before).any(dim=-1)  # [layers, 2, slots, kv_heads, positions]
    assert changed[:, :, slots, :, positions].all() and changed.sum() == LAYERS * 2 * KV_HEADS * len(slots)


def test_bad_inputs_are_refused_before_the_c_code_reads_them(kernels):
    """Shapes and dtypes the C loop would misread, a slot or position outside the pool or beyond the
    rope tables, blobs and biases of other shapes, layers of different widths: each a ValueError."""
    gen = torch.Generator().manual_seed(3)
    layers = random_layers(gen, False)
    cos, sin_signed = rope_tables(16)
    stack = LayerStack(kernels, layers, heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, cos=cos,
                       sin_signed=sin_signed, scale=DIM**-0.5)
    kv = torch.zeros(LAYERS, 2, 2, KV_HEADS, 32, DIM)
    x = torch.randn(2, HIDDEN)
    one = torch.tensor([0, 1])
    empty = torch.empty(0, dtype=torch.int64)
    stack.run(torch.empty(0, HIDDEN), kv, empty, empty)  # no rows: nothing to do, nothing read
    assert not kv.any()
    with pytest.raises(ValueError, match="beyond the rope tables"):
        stack.run(x, kv, one, torch.tensor([3, 16]))
    with pytest.raises(ValueError, match="residual stream"):
        stack.run(x.double(), kv, one, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="KV pool"):
        stack.run(x, kv[:2], one, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="int64"):
        stack.run(x, kv, one.int(), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="outside the pool"):
        stack.run(x, kv, torch.tensor([0, 2]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="outside the pool"):
        stack.run(x, kv, one, torch.tensor([0, 32]))
    assert not kv.any()  # nothing was stored by the refused calls
    wrong_blob = LayerWeights(**{**layers[0].__dict__, "o": (layers[0].qkv[0], HIDDEN, None)})
    with pytest.raises(ValueError, match="not a q4_matmul blob"):
        LayerStack(kernels, [wrong_blob], heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, cos=cos,
                   sin_signed=sin_signed, scale=1.0)
    wrong_bias = LayerWeights(**{**layers[0].__dict__, "down": (layers[0].down[0], HIDDEN, torch.zeros(3))})
    with pytest.raises(ValueError, match="a bias of"):
        LayerStack(kernels, [wrong_bias], heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, cos=cos,
                   sin_signed=sin_signed, scale=1.0)
    with pytest.raises(ValueError, match="outputs"):
        LayerStack(kernels, [layers[0], LayerWeights(**{**layers[1].__dict__, "o": (layers[1].o[0], 32, None)})],
                   heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, cos=cos, sin_signed=sin_signed, scale=1.0)


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("biases", [False, True])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_the_avx2_build_gives_the_vnni_builds_bits(gateway_cache_dir, biases, kv_dtype, mixed):
    """1..9 and 17 rows over 3 slots (several rows of a slot at increasing positions, as a prompt chunk's):
    the residual stream and the KV pool after every layer, bit for bit."""
    vnni, avx2 = vnni_and_avx2(gateway_cache_dir)
    gen = torch.Generator().manual_seed(21 + biases)
    layers = random_layers(gen, biases, mixed)
    cos, sin_signed = rope_tables(64)
    stacks = [LayerStack(lib, layers, heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, cos=cos, sin_signed=sin_signed,
                         scale=DIM**-0.5) for lib in (vnni, avx2)]
    for rows in [*range(1, 10), 17]:
        slots = torch.arange(rows) % 3
        positions = 5 + torch.arange(rows) // 3 * 7
        x = torch.randn(rows, HIDDEN, generator=gen) * 3
        kv = torch.randn(LAYERS, 2, 3, KV_HEADS, 64, DIM, generator=gen).to(kv_dtype)
        results = []
        for stack in stacks:
            x_out, kv_out = x.clone(), kv.clone()
            stack.run(x_out, kv_out, slots, positions)
            results.append((x_out, kv_out))
        assert_same_bits(results[1][0], results[0][0])
        assert_same_bits(results[1][1], results[0][1])
