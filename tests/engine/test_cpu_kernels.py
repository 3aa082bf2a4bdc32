"""The engine's C kernel library (inference/llm/cpu_kernels.py): its builds and their ctypes signatures,
and the step rows' attention (decode_attention.c) against a float64 reference in each build this
machine's CPU runs, and its AVX2 build against its VNNI build, bit for bit."""

from __future__ import annotations

import ctypes
import logging
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from inference.llm import cpu_kernels, decode_attention
from tests.engine.kernel_builds import assert_same_bits, vnni_and_avx2


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


@pytest.mark.parametrize("isa", cpu_kernels.ISAS)
def test_without_a_compiler_the_kernels_are_not_used(monkeypatch, tmp_path, caplog, isa):
    monkeypatch.setattr(cpu_kernels.shutil, "which", lambda name: None)
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: cpu_kernels.REQUIRED_CPU_FLAGS[isa])
    monkeypatch.setattr(cpu_kernels.platform, "machine", lambda: "x86_64")
    with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
        assert cpu_kernels.load(tmp_path, isa) is None
    assert "no gcc" in caplog.text
    assert not (tmp_path / "kernels").exists()


def test_a_build_the_cpu_cannot_run_is_not_loaded(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: cpu_kernels.REQUIRED_CPU_FLAGS["avx2"])
    with caplog.at_level(logging.INFO, logger=cpu_kernels.__name__):
        assert cpu_kernels.load(tmp_path, "vnni") is None
    assert "lacks" in caplog.text and "avx512_vnni" in caplog.text
    assert not (tmp_path / "kernels").exists()
    with pytest.raises(ValueError, match="isa must be one of"):
        cpu_kernels.load(tmp_path, "sse2")


@pytest.mark.parametrize("isa", cpu_kernels.ISAS)
def test_builds_into_the_cache_dir_and_drops_older_builds_of_its_own(tmp_path, isa):
    """A new build removes this instruction set's older builds and those of the single-build layout,
    and keeps the other instruction set's."""
    if isa not in cpu_kernels.supported_isas() or shutil.which("gcc") is None:
        pytest.skip(f"this machine cannot build and run the {isa} build")
    other = next(o for o in cpu_kernels.ISAS if o != isa)
    folder = tmp_path / "kernels"
    folder.mkdir()
    stale = [folder / f"cpu_kernels-{isa}-0000000000000000.so", folder / "cpu_kernels-0000000000000000.so",
             folder / "q4_vnni-00.so"]
    kept = folder / f"cpu_kernels-{other}-0000000000000000.so"
    for path in [*stale, kept]:
        path.write_bytes(b"an older source's build")
    built = cpu_kernels.load(tmp_path, isa)
    assert built is not None and Path(built._name).name.startswith(f"cpu_kernels-{isa}-")
    assert sorted(p.name for p in folder.iterdir()) == sorted([Path(built._name).name, kept.name])


@pytest.mark.parametrize("isa", cpu_kernels.ISAS)
def test_every_build_compiles_with_warnings_as_errors_on_any_cpu(tmp_path, isa):
    """Compiling needs gcc, not the instructions: each build is checked wherever the tests run."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    target = tmp_path / f"{isa}.so"
    try:
        cpu_kernels.compile_library(isa, target)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"the {isa} build does not compile:\n{exc.stderr}")
    assert "-Werror" in cpu_kernels.COMPILE_FLAGS and "-Wextra" in cpu_kernels.COMPILE_FLAGS
    assert target.stat().st_size > 0


def test_supported_isas_from_the_cpu_flags():
    vnni = cpu_kernels.REQUIRED_CPU_FLAGS["vnni"] | {"avx", "avx2", "sse4_2", "avx512_bf16"}  # e.g. Sapphire Rapids
    epyc = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})  # AMD EPYC Zen 2/3: no AVX512
    assert cpu_kernels.supported_isas(vnni, "x86_64") == ("vnni", "avx2")
    assert cpu_kernels.supported_isas(epyc, "x86_64") == ("avx2",)
    assert cpu_kernels.supported_isas(epyc - {"f16c"}, "x86_64") == ()
    assert cpu_kernels.supported_isas(epyc - {"fma"}, "x86_64") == ()
    assert cpu_kernels.supported_isas(frozenset(), "x86_64") == ()
    assert cpu_kernels.supported_isas(vnni, "aarch64") == ()


def test_the_ctypes_signatures_are_kernels_h_prototypes(kernels):
    """kernels.h declares every function the sources export (their others are static), with the
    arguments each defines; the loaded library's functions take exactly those ctypes."""
    entry_points = {"q4_matmul", "q5g_matmul", "q8g_matmul", "q8_matmul", "decode_attention", "layer_stack"}
    assert set(cpu_kernels.SIGNATURES) == entry_points
    defined: dict[str, list[type]] = {}
    for source in cpu_kernels.SOURCES:
        defined |= cpu_kernels.c_functions(source.read_text())
    assert defined == cpu_kernels.SIGNATURES
    for name, argtypes in cpu_kernels.SIGNATURES.items():
        fn = getattr(kernels, name)
        assert fn.argtypes == argtypes and fn.restype is ctypes.c_int
    assert cpu_kernels.SIGNATURES["q4_matmul"][7] is ctypes.c_float  # eps, not a pointer
    assert cpu_kernels.SIGNATURES["layer_stack"][22] is ctypes.c_size_t  # kv_layer_bytes
    with pytest.raises(ValueError, match="ctypes is not told"):
        cpu_kernels.c_functions("int f(double x);")


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


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 2, 128), (6, 6, 48), (2, 1, 256), (8, 4, 16)])
def test_the_avx2_build_gives_the_vnni_builds_bits(gateway_cache_dir, heads, kv_heads, dim, kv_dtype, rope):
    """Decoding rows over 1, 15, 17, 34 and 300 positions and a 12-row prompt chunk (17 rows), one row's
    queries 100 times larger (softmax weights clamped to exp(-87) and below: subnormal floats): the
    output, the stored KV and the rotated rows, bit for bit."""
    vnni, avx2 = vnni_and_avx2(gateway_cache_dir)
    gen = torch.Generator().manual_seed(dim + heads)
    layer = torch.randn(2, 6, kv_heads, 300, dim, generator=gen).to(kv_dtype)
    slots = torch.tensor([0, 1, 2, 3, 4, *[5] * 12])
    positions = torch.tensor([0, 14, 16, 33, 299, *range(20, 32)])
    qkv = torch.randn(len(slots), heads + 2 * kv_heads, dim, generator=gen) * 4
    qkv[3, :heads] *= 100.0
    angles = torch.arange(300).unsqueeze(1) * (10000.0 ** (-torch.arange(0, dim, 2) / dim)).repeat(2).unsqueeze(0)
    sin = angles.sin()
    tables = (angles.cos().contiguous(), torch.cat([-sin[:, : dim // 2], sin[:, dim // 2 :]], dim=-1).contiguous())
    results = []
    for lib in (vnni, avx2):
        rows, pool = qkv.clone(), layer.clone()
        out = decode_attention.attend(lib, rows, heads, kv_heads, pool, slots, positions, dim**-0.5,
                                      rope=tables if rope else None)
        results.append((out, pool, rows))
    for got, want in zip(results[1], results[0]):
        assert_same_bits(got, want)
