"""The engine's C kernel library (inference/llm/cpu_kernels.py): its build, and the decoding rows'
attention (decode_attention.c) against a float64 reference, on this machine's CPU."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from inference.llm import cpu_kernels, decode_attention


def reference(qkv: torch.Tensor, layer: torch.Tensor, slots: list[int], positions: list[int],
              heads: int, kv_heads: int) -> torch.Tensor:
    """Each row alone, in float64: its new key and value at its position, then softmax attention."""
    dim = qkv.shape[2]
    out = []
    for r, (slot, pos) in enumerate(zip(slots, positions)):
        k = layer[0, slot, :, : pos + 1].double().clone()
        v = layer[1, slot, :, : pos + 1].double().clone()
        k[:, pos] = qkv[r, heads : heads + kv_heads].double()
        v[:, pos] = qkv[r, heads + kv_heads :].double()
        q = qkv[r, :heads].double().view(kv_heads, heads // kv_heads, dim)
        out.append(F.scaled_dot_product_attention(q, k, v, scale=dim**-0.5).reshape(heads * dim))
    return torch.stack(out)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 2, 128), (6, 6, 48)])
def test_matches_float64_and_stores_the_new_kv(kernels, heads, kv_heads, dim, kv_dtype):
    gen = torch.Generator().manual_seed(dim)
    layer = torch.randn(2, 5, kv_heads, 300, dim, generator=gen).to(kv_dtype)
    slots, positions = [3, 0, 4], [0, 137, 299]  # a first token, ragged lengths, the last position
    qkv = torch.randn(3, heads + 2 * kv_heads, dim, generator=gen) * 3
    stored = qkv.clone()  # the new keys and values as the pool holds them (rounded to float16)
    stored[:, heads:] = stored[:, heads:].to(kv_dtype).float()
    want = reference(stored, layer, slots, positions, heads, kv_heads)
    before = layer.clone()
    got = decode_attention.attend(kernels, qkv, heads, kv_heads, layer, torch.tensor(slots), torch.tensor(positions),
                                  dim**-0.5)
    assert (got.double() - want).abs().max().item() < 2e-6
    for r, (slot, pos) in enumerate(zip(slots, positions)):
        assert torch.equal(layer[0, slot, :, pos], qkv[r, heads : heads + kv_heads].to(kv_dtype))
        assert torch.equal(layer[1, slot, :, pos], qkv[r, heads + kv_heads :].to(kv_dtype))
        before[:, slot, :, pos] = layer[:, slot, :, pos]
    assert torch.equal(layer, before)  # nothing else written


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_a_rows_output_does_not_depend_on_the_batch(kernels, kv_dtype):
    gen = torch.Generator().manual_seed(1)
    layer = torch.randn(2, 8, 3, 256, 64, generator=gen).to(kv_dtype)
    rows = torch.randn(8, 15, 64, generator=gen)
    slots, positions = torch.arange(8), torch.tensor([5, 200, 17, 99, 1, 255, 64, 128])
    together = decode_attention.attend(kernels, rows, 9, 3, layer, slots, positions, 0.125)
    for r in range(8):
        alone = decode_attention.attend(kernels, rows[r : r + 1], 9, 3, layer, slots[r : r + 1], positions[r : r + 1], 0.125)
        assert torch.equal(alone[0], together[r])


def test_strided_rows_of_a_wider_projection(kernels):
    """The forward passes a view of its fused q/k/v output: rows further apart than their heads."""
    gen = torch.Generator().manual_seed(2)
    layer = torch.randn(2, 2, 1, 64, 64, generator=gen)
    wide = torch.randn(2, 10, 64, generator=gen)
    got = decode_attention.attend(kernels, wide[:, :6], 4, 1, layer.clone(), torch.tensor([1, 0]), torch.tensor([9, 40]),
                                  0.125)
    want = decode_attention.attend(kernels, wide[:, :6].contiguous(), 4, 1, layer.clone(), torch.tensor([1, 0]),
                                   torch.tensor([9, 40]), 0.125)
    assert torch.equal(got, want)


def test_only_float32_activations_on_the_cpu_and_head_dims_it_takes():
    cpu = torch.device("cpu")
    assert decode_attention.supported(64, torch.float32, cpu)
    assert not decode_attention.supported(64, torch.bfloat16, cpu)
    assert not decode_attention.supported(72, torch.float32, cpu)
    assert not decode_attention.supported(64, torch.float32, torch.device("meta"))


def test_without_a_compiler_the_kernels_are_not_used(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(cpu_kernels.shutil, "which", lambda name: None)
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: cpu_kernels.REQUIRED_CPU_FLAGS)
    monkeypatch.setattr(cpu_kernels.platform, "machine", lambda: "x86_64")
    with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
        assert cpu_kernels.load(tmp_path) is None
    assert "no gcc" in caplog.text
    assert not (tmp_path / "kernels").exists()


def test_builds_into_the_cache_dir_and_drops_older_builds(kernels, tmp_path):
    stale = [tmp_path / "kernels" / "cpu_kernels-0000000000000000.so", tmp_path / "kernels" / "q4_vnni-00.so"]
    stale[0].parent.mkdir()
    for path in stale:
        path.write_bytes(b"an older source's build")
    built = cpu_kernels.load(tmp_path)
    assert built is not None and built is not kernels
    names = [p.name for p in (tmp_path / "kernels").iterdir()]
    assert names == [Path(built._name).name] and names[0].startswith("cpu_kernels-")


def test_prompt_rows_see_the_rows_of_their_chunk_before_them(kernels):
    """A chunk of one slot's prompt (rows at consecutive positions) beside a decoding row of another
    slot: each prompt row attends over the cached prefix and the chunk's rows up to its own."""
    gen = torch.Generator().manual_seed(5)
    layer = torch.randn(2, 2, 3, 64, 64, generator=gen)
    rows = torch.randn(6, 15, 64, generator=gen)
    slots, positions = [1, 0, 0, 0, 0, 0], [20, 10, 11, 12, 13, 14]  # slot 0 holds 10 cached tokens
    want = []
    cache = layer.double().clone()
    for r, (slot, pos) in enumerate(zip(slots, positions)):
        cache[0, slot, :, pos] = rows[r, 9:12].double()
        cache[1, slot, :, pos] = rows[r, 12:].double()
    for r, (slot, pos) in enumerate(zip(slots, positions)):
        q = rows[r, :9].double().view(3, 3, 64)
        k, v = cache[0, slot, :, : pos + 1], cache[1, slot, :, : pos + 1]
        want.append(F.scaled_dot_product_attention(q, k, v, scale=0.125).reshape(576))
    got = decode_attention.attend(kernels, rows, 9, 3, layer, torch.tensor(slots), torch.tensor(positions), 0.125)
    assert (got.double() - torch.stack(want)).abs().max().item() < 2e-6


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_rotating_in_the_kernel_is_torchs_rotation_bit_for_bit(kernels, kv_dtype):
    """With rope tables the kernel rotates queries and keys itself, exactly as the forward's torch ops
    (x * cos + roll(x, d/2) * sin) would before a call without them."""
    gen = torch.Generator().manual_seed(7)
    heads, kv_heads, dim = 9, 3, 64
    angles = torch.arange(300).unsqueeze(1) * (10000.0 ** (-torch.arange(0, dim, 2) / dim)).repeat(2).unsqueeze(0)
    cos, sin = angles.cos().contiguous(), angles.sin()
    sin_signed = torch.cat([-sin[:, : dim // 2], sin[:, dim // 2 :]], dim=-1).contiguous()
    layer = torch.randn(2, 4, kv_heads, 300, dim, generator=gen).to(kv_dtype)
    qkv = torch.randn(5, heads + 2 * kv_heads, dim, generator=gen)
    slots, positions = torch.tensor([2, 0, 0, 0, 3]), torch.tensor([17, 40, 41, 42, 299])
    rotated = qkv.clone()
    qk = rotated[:, : heads + kv_heads]
    rot = torch.roll(qk, dim // 2, -1).mul_(sin_signed[positions].unsqueeze(1))
    qk.mul_(cos[positions].unsqueeze(1)).add_(rot)
    want_layer = layer.clone()
    want = decode_attention.attend(kernels, rotated, heads, kv_heads, want_layer, slots, positions, 0.125)
    got_qkv = qkv.clone()
    got = decode_attention.attend(kernels, got_qkv, heads, kv_heads, layer, slots, positions, 0.125,
                                  rope=(cos, sin_signed))
    assert torch.equal(got, want) and torch.equal(layer, want_layer) and torch.equal(got_qkv, rotated)
    with pytest.raises(ValueError, match="beyond the rope tables"):
        decode_attention.attend(kernels, qkv.clone(), heads, kv_heads, layer, slots, positions + 1, 0.125,
                                rope=(cos, sin_signed))
