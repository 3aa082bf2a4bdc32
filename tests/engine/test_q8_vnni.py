"""The output head's int8 x 15-bit kernel (inference/llm/q8_vnni.c) against float64 and oneDNN's int8
GEMM, on this machine's CPU."""

from __future__ import annotations

import pytest
import torch

from inference.llm import q8_vnni
from inference.llm.forward import _lin_w8a8, _quantize_int8, _quantize_w8a8


@pytest.fixture(scope="module")
def head():
    """A [576, 4096] matrix's per-channel int8 weights, their float value, the blob and oneDNN's pack."""
    w_t = torch.randn(576, 4096, generator=torch.Generator().manual_seed(0)) * 0.05
    q, scale, _ = _quantize_int8(w_t, None, torch.float32)
    return (q.double() * scale.double()[:, None]).t(), q8_vnni.pack(q), scale, _quantize_w8a8(w_t, None)


@pytest.mark.parametrize("rows", [1, 8, 13])
def test_as_close_to_float64_as_onednn(kernels, head, rows):
    weights, blob, scale, onednn = head
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows))
    x[:, 5] *= 25.0  # an outlier channel
    exact = x.double() @ weights
    ours = q8_vnni.matmul(kernels, x, blob, scale)
    theirs = _lin_w8a8(x, onednn)
    err_ours = ((ours.double() - exact).norm() / exact.norm()).item()
    err_theirs = ((theirs.double() - exact).norm() / exact.norm()).item()
    assert err_ours < 1e-3 and err_ours < 1.5 * err_theirs, (err_ours, err_theirs)


def test_a_row_does_not_depend_on_the_batch(kernels, head):
    _, blob, scale, _ = head
    x = torch.randn(11, 576, generator=torch.Generator().manual_seed(3))
    batched = q8_vnni.matmul(kernels, x, blob, scale)
    alone = torch.cat([q8_vnni.matmul(kernels, x[i : i + 1], blob, scale) for i in range(11)])
    assert torch.equal(batched, alone) and not torch.equal(batched[0], batched[1])


def test_zero_rows(kernels, head):
    _, blob, scale, _ = head
    assert torch.equal(q8_vnni.matmul(kernels, torch.zeros(2, 576), blob, scale), torch.zeros(2, 4096))
    assert q8_vnni.matmul(kernels, torch.zeros(0, 576), blob, scale).shape == (0, 4096)


def test_shapes_it_takes():
    with pytest.raises(ValueError, match="multiples of 16"):
        q8_vnni.pack(torch.zeros(40, 576, dtype=torch.int8))


def test_operands_must_match_the_blob(kernels, head):
    _, blob, scale, _ = head
    with pytest.raises(ValueError, match="this blob takes"):
        q8_vnni.matmul(kernels, torch.randn(2, 592), blob, scale)
    with pytest.raises(ValueError, match="this blob takes"):
        q8_vnni.matmul(kernels, torch.randn(2, 576, dtype=torch.bfloat16), blob, scale)
