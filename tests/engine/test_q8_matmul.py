"""The output head's int8 x 15-bit kernel (inference/llm/q8_matmul.c) against float64 and oneDNN's int8
GEMM, in each build this machine's CPU runs, and its AVX2 build against its VNNI build, bit for bit."""

from __future__ import annotations

import pytest
import torch

from inference.llm import q8_matmul
from inference.llm.weight_formats import lin_w8a8, quantize_int8, quantize_w8a8
from tests.engine.kernel_builds import assert_same_bits, vnni_and_avx2


@pytest.fixture(scope="module")
def head():
    """A [576, 4096] matrix's per-channel int8 weights, their float value, the blob and oneDNN's pack."""
    w_t = torch.randn(576, 4096, generator=torch.Generator().manual_seed(0)) * 0.05
    q, scale, _ = quantize_int8(w_t, None, torch.float32)
    return (q.double() * scale.double()[:, None]).t(), q8_matmul.pack(q), scale, quantize_w8a8(w_t, None)


@pytest.mark.parametrize("rows", [1, 8, 13])
def test_as_close_to_float64_as_onednn(kernels, head, rows):
    weights, blob, scale, onednn = head
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows))
    x[:, 5] *= 25.0  # an outlier channel
    exact = x.double() @ weights
    ours = q8_matmul.matmul(kernels, x, blob, scale)
    theirs = lin_w8a8(x, onednn)
    err_ours = ((ours.double() - exact).norm() / exact.norm()).item()
    err_theirs = ((theirs.double() - exact).norm() / exact.norm()).item()
    assert err_ours < 1e-3 and err_ours < 1.5 * err_theirs, (err_ours, err_theirs)


def test_a_row_does_not_depend_on_the_batch(kernels, head):
    _, blob, scale, _ = head
    x = torch.randn(11, 576, generator=torch.Generator().manual_seed(3))
    batched = q8_matmul.matmul(kernels, x, blob, scale)
    alone = torch.cat([q8_matmul.matmul(kernels, x[i : i + 1], blob, scale) for i in range(11)])
    assert torch.equal(batched, alone) and not torch.equal(batched[0], batched[1])


def test_zero_rows(kernels, head):
    _, blob, scale, _ = head
    assert torch.equal(q8_matmul.matmul(kernels, torch.zeros(2, 576), blob, scale), torch.zeros(2, 4096))
    assert q8_matmul.matmul(kernels, torch.zeros(0, 576), blob, scale).shape == (0, 4096)


def test_shapes_it_takes():
    with pytest.raises(ValueError, match="multiples of 16"):
        q8_matmul.pack(torch.zeros(40, 576, dtype=torch.int8))


def test_operands_must_match_the_blob(kernels, head):
    _, blob, scale, _ = head
    with pytest.raises(ValueError, match="this blob takes"):
        q8_matmul.matmul(kernels, torch.randn(2, 592), blob, scale)
    with pytest.raises(ValueError, match="this blob takes"):
        q8_matmul.matmul(kernels, torch.randn(2, 576, dtype=torch.bfloat16), blob, scale)


@pytest.mark.parametrize(("k", "n"), [(576, 4096), (48, 32)])
def test_the_avx2_build_gives_the_vnni_builds_bits(gateway_cache_dir, k, n):
    """Rows 1..9 and 17 of scales from 1e-3 to 1e3, a zero row, and the int8 range's ends: outputs whose
    weights are +-127 (and -128) times their rows' signs, so that every product is +-127 * 127, the
    most the AVX2 loop's int16 pairs take."""
    vnni, avx2 = vnni_and_avx2(gateway_cache_dir)
    gen = torch.Generator().manual_seed(k)
    signs = torch.where(torch.rand(k, generator=gen) < 0.5, -1, 1)
    q = torch.randint(-127, 128, (n, k), generator=gen)
    q[0], q[1], q[2] = 127 * signs, -127 * signs, -128
    blob = q8_matmul.pack(q.to(torch.int8))
    scale = torch.rand(n, generator=gen) * 0.01
    for rows in [*range(1, 10), 17]:
        x = torch.randn(rows, k, generator=gen) * torch.logspace(-3, 3, rows)[:, None]
        x[:, 5] *= 25.0
        x[0] = signs * 3.0
        if rows > 1:
            x[1] = 0.0
        assert_same_bits(q8_matmul.matmul(avx2, x, blob, scale), q8_matmul.matmul(vnni, x, blob, scale))
