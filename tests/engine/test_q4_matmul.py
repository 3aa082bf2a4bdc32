"""The int4 (and 5- and 8-bit group) x 15-bit kernel (inference/llm/q4_matmul.c) against float references, in
each build this machine's CPU runs, the widths against one another, and its AVX2 build against its VNNI build, bit
for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.llm import q4_matmul
from inference.llm.weight_formats import int4_grid, lin_int4, quantize_int4
from tests.engine.kernel_builds import assert_same_bits, vnni_and_avx2


def grid(k: int, n: int, seed: int, bits: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random ``[k, n]`` matrix on a grid of ``bits`` per weight in groups of 32 (fp16 steps and minimums,
    as a GGUF has): ``step``, ``low`` and ``q`` as :func:`q4_matmul.pack` takes them."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(k, n, generator=gen) * 0.05
    top = 2 ** bits - 1
    groups = w.t().reshape(n, -1, 32)
    low = groups.amin(dim=2).half().float()
    step = ((groups.amax(dim=2) - low) / top).clamp(min=1e-6).half().float()
    return step, low, torch.round((groups - low[..., None]) / step[..., None]).clamp_(0, top)


def on_grid(step: torch.Tensor, low: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The ``[k, n]`` float matrix of a grid."""
    n = q.shape[0]
    return (q * step[..., None] + low[..., None]).reshape(n, -1).t().contiguous()


def grid_matrix(k: int, n: int, seed: int, bits: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A random grid's float matrix, and its blob."""
    step, low, q = grid(k, n, seed, bits)
    return on_grid(step, low, q), q4_matmul.pack(step, low, q, bits)


def test_weights_come_back_through_the_kernel(kernels, lm):
    """The embedded model's Q4_1 weights, read back with identity rows, to float32 rounding."""
    w_t = lm.model.model.layers[0].mlp.down_proj.weight.data.t().contiguous()  # [in, out]
    low, step, q = int4_grid(w_t)
    blob = q4_matmul.pack(step, low, torch.round(q).clamp_(0, 15))
    back = q4_matmul.matmul(kernels, torch.eye(w_t.shape[0]), blob, w_t.shape[1])
    assert torch.allclose(back, w_t, rtol=1e-5, atol=1e-6 * w_t.abs().max().item()), (back - w_t).abs().max()


@pytest.mark.parametrize("bits", [5, 8])
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 70])
def test_5_and_8_bit_groups_are_as_close_to_float(kernels, rows, bits):
    """The 5- and 8-bit groups (a GGUF's Q5_0, Q5_1, Q5_K and Q8_0, held exactly): the only error is the 15-bit
    activations'."""
    w, blob = grid_matrix(576, 960, seed=rows, bits=bits)
    assert q4_matmul.bits_of(blob) == bits and q4_matmul.fits(blob, 576, 960)
    assert blob.shape[2] == {5: 384, 8: 576}[bits]  # 5.5 bits a weight for 5-bit groups, 9 for 8-bit ones
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(100 + rows))
    x[:, 7] *= 30.0
    exact = (x.double() @ w.double()).float()
    ours = q4_matmul.matmul(kernels, x, blob, 960)
    assert ((ours - exact).norm() / exact.norm()).item() < 2e-4
    # Not vacuous: the same weights read as 4 bits are not this product.
    assert not torch.allclose(ours, q4_matmul.matmul(kernels, x, grid_matrix(576, 960, seed=rows)[1], 960))


MODES = ["plain", "norm", "gated", "accumulate"]


def run_mode(lib, mode: str, x: torch.Tensor, blob: torch.Tensor, n: int, norm_w: torch.Tensor,
             residual: torch.Tensor) -> torch.Tensor:
    """The kernel plain, after a norm, gated (x of twice the inputs) or adding to a copy of ``residual``."""
    return q4_matmul.matmul(lib, x, blob, n, norm=(norm_w, 1e-5) if mode == "norm" else None,
                            gated=mode == "gated", add_to=residual.clone() if mode == "accumulate" else None)


@pytest.mark.parametrize("mode", MODES)
def test_5_bit_groups_give_the_8_bit_groups_bits(kernels, mode):
    """The same whole numbers 0..31 in 5-bit and in 8-bit groups give bit for bit the same product, for every
    row count of the kernel's row blocks (1..8) and beyond: the fifth bits are where the kernel adds them, and
    the integer sums are exact (on AVX2 too, where 8 quads of 5-bit products would overflow int16). Likewise
    4-bit numbers in 5-bit groups and in 4-bit ones."""
    k, n = 576, 96
    step, low, q = grid(k, n, seed=5, bits=5)
    q[0] = 31  # output 0: every weight the largest, every fifth bit set
    q[1] = 0
    q[2, :, 16:] = 31
    five, eight = q4_matmul.pack(step, low, q, 5), q4_matmul.pack(step, low, q, 8)
    q4 = q % 16
    four, four_as_five = q4_matmul.pack(step, low, q4, 4), q4_matmul.pack(step, low, q4, 5)
    gen = torch.Generator().manual_seed(6)
    norm_w = torch.rand(k, generator=gen) + 0.5
    for rows in [*range(1, 10), 17]:
        x = torch.randn(rows, 2 * k if mode == "gated" else k, generator=gen) * torch.logspace(-3, 3, rows)[:, None]
        x[:, 7] *= 30.0
        if mode == "gated":
            x[:, :k] = torch.rand(rows, k, generator=gen) * 200 - 100
        if mode != "gated":
            x[0, 64:] = 1.0  # row 0: equal inputs, every hi byte 127 in most groups
        residual = torch.randn(rows, n, generator=gen)
        got = run_mode(kernels, mode, x, five, n, norm_w, residual)
        assert_same_bits(got, run_mode(kernels, mode, x, eight, n, norm_w, residual))
        assert_same_bits(run_mode(kernels, mode, x, four_as_five, n, norm_w, residual),
                         run_mode(kernels, mode, x, four, n, norm_w, residual))
        # Not vacuous: the fifth bits change the product.
        assert not torch.equal(got, run_mode(kernels, mode, x, four_as_five, n, norm_w, residual))


def test_5_bit_groups_at_the_extremes_against_float(kernels):
    """Weights all 31 and inputs all of one size and sign (every activation byte 127, each int16 pair of the AVX2
    loop 2 * 31 * 127), and all 0: the product to the 15-bit activations' rounding, for 1..9 rows."""
    k, n = 1024, 32
    step = torch.full((n, k // 32), 0.01).half().float()
    low = torch.full((n, k // 32), -0.155).half().float()
    q = torch.zeros(n, k // 32, 32)
    q[:16] = 31
    blob = q4_matmul.pack(step, low, q, 5)
    w = on_grid(step, low, q).double()
    for rows in range(1, 10):
        x = torch.ones(rows, k) * torch.linspace(-2, 3, rows)[:, None]
        exact = x.double() @ w
        ours = q4_matmul.matmul(kernels, x, blob, n).double()
        assert (ours - exact).abs().max().item() <= 1e-5 * exact.abs().max().item()


def test_pack_refuses_other_widths_and_numbers_outside_them():
    step, low, q = grid(64, 32, seed=1, bits=5)
    with pytest.raises(ValueError, match="4-, 5- or 8-bit"):
        q4_matmul.pack(step, low, q, 6)
    with pytest.raises(ValueError, match="0..15"):
        q4_matmul.pack(step, low, q, 4)
    q[0, 0, 0] = -1
    with pytest.raises(ValueError, match="0..31"):
        q4_matmul.pack(step, low, q, 5)


@pytest.mark.parametrize("rows", [1, 3, 8, 13, 70])
def test_closer_to_float_than_torchs_int4_kernel(kernels, rows):
    """15-bit activations: the error against a float64 product is below that of torch's bfloat16 kernel."""
    w, blob = grid_matrix(576, 960, seed=rows)
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(100 + rows))
    x[:, 7] *= 30.0  # an outlier channel, as real activations have
    exact = (x.double() @ w.double()).float()
    ours = q4_matmul.matmul(kernels, x, blob, 960)
    theirs = lin_int4(x, quantize_int4(w, None, torch.bfloat16))
    err_ours = ((ours - exact).norm() / exact.norm()).item()
    err_theirs = ((theirs - exact).norm() / exact.norm()).item()
    assert err_ours < 2e-3 and err_ours < err_theirs / 2, (err_ours, err_theirs)


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_a_row_does_not_depend_on_the_batch(kernels, bits):
    w, blob = grid_matrix(1536, 576, seed=7, bits=bits)
    x = torch.randn(19, 1536, generator=torch.Generator().manual_seed(8))
    batched = q4_matmul.matmul(kernels, x, blob, 576)
    alone = torch.cat([q4_matmul.matmul(kernels, x[i : i + 1], blob, 576) for i in range(19)])
    assert torch.equal(batched, alone)
    # Not vacuous: the rows differ.
    assert not torch.equal(batched[0], batched[1])


def test_zero_rows_give_zero(kernels):
    _, blob = grid_matrix(576, 576, seed=3)
    out = q4_matmul.matmul(kernels, torch.zeros(2, 576), blob, 576)
    assert torch.equal(out, torch.zeros(2, 576))
    assert q4_matmul.matmul(kernels, torch.zeros(0, 576), blob, 576).shape == (0, 576)


def test_outputs_must_fill_whole_tiles():
    low, step, q = int4_grid(torch.randn(64, 24))
    with pytest.raises(ValueError, match="multiples of 16"):
        q4_matmul.pack(step, low, torch.round(q))


@pytest.mark.parametrize("bits", [4, 5, 8])
@pytest.mark.parametrize("rows", [1, 8, 21])
def test_fused_norm_gate_and_residual_add(kernels, rows, bits):
    """The forward's fused calls against torch's own ops followed by the plain product: a norm's and
    a gate's inputs agree to float32 rounding (so the products to that over the weights' scale), a
    residual add is exactly the sum of the plain product, and each stays batch-invariant."""
    gen = torch.Generator().manual_seed(rows)
    w, blob = grid_matrix(576, 576, seed=11, bits=bits)
    x = torch.randn(rows, 576, generator=gen) * 2
    norm_w = torch.rand(576, generator=gen) + 0.5
    tol = 1e-4 * (x.abs().max() * w.abs().sum(0).max()).item()

    normed = q4_matmul.matmul(kernels, x, blob, 576, norm=(norm_w, 1e-5))
    plain = q4_matmul.matmul(kernels, F.rms_norm(x, (576,), norm_w, 1e-5), blob, 576)
    assert (normed - plain).abs().max().item() < tol

    gate_up = torch.randn(rows, 1152, generator=gen) * 3
    gated = q4_matmul.matmul(kernels, gate_up, blob, 576, gated=True)
    plain = q4_matmul.matmul(kernels, F.silu(gate_up[:, :576]) * gate_up[:, 576:], blob, 576)
    assert (gated - plain).abs().max().item() < 1e-4 * (gate_up.abs().max() ** 2 * w.abs().sum(0).max()).item()

    residual = torch.randn(rows, 576, generator=gen)
    expected = residual + q4_matmul.matmul(kernels, x, blob, 576)
    out = q4_matmul.matmul(kernels, x, blob, 576, add_to=residual)
    assert out is residual and torch.equal(out, expected)

    for r in range(rows):
        assert torch.equal(q4_matmul.matmul(kernels, x[r : r + 1], blob, 576, norm=(norm_w, 1e-5))[0], normed[r])
        assert torch.equal(q4_matmul.matmul(kernels, gate_up[r : r + 1], blob, 576, gated=True)[0], gated[r])


def test_fused_calls_check_their_operands(kernels):
    _, blob = grid_matrix(576, 576, seed=3)
    x = torch.randn(2, 576)
    with pytest.raises(ValueError, match="norm"):
        q4_matmul.matmul(kernels, x, blob, 576, norm=(torch.ones(100), 1e-5))
    with pytest.raises(ValueError, match="add_to"):
        q4_matmul.matmul(kernels, x, blob, 576, add_to=torch.zeros(2, 576).t())
    # What the C loop would otherwise read past or misread: another width, another dtype, other outputs.
    with pytest.raises(ValueError, match="this blob takes"):
        q4_matmul.matmul(kernels, torch.randn(2, 608), blob, 576)
    with pytest.raises(ValueError, match="this blob takes"):
        q4_matmul.matmul(kernels, x.to(torch.bfloat16), blob, 576)
    with pytest.raises(ValueError, match="this blob takes"):
        q4_matmul.matmul(kernels, x, blob, 592)


@pytest.mark.parametrize("bits", [4, 5, 8])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("k", "n"), [(576, 960), (1536, 576), (64, 32)])
def test_the_avx2_build_gives_the_vnni_builds_bits(gateway_cache_dir, k, n, mode, bits):
    """Every row count up to two blocks of either build's rows (1..9) and 17, rows of scales from 1e-3
    to 1e3 with an outlier channel, a group of zeros (a zero step), and gates over [-100, 100]: exp
    clamped at both ends, sigmoids down to subnormal floats."""
    vnni, avx2 = vnni_and_avx2(gateway_cache_dir)
    _, blob = grid_matrix(k, n, seed=k + n, bits=bits)
    gen = torch.Generator().manual_seed(k * n)
    norm_w = torch.rand(k, generator=gen) + 0.5
    for rows in [*range(1, 10), 17]:
        x = torch.randn(rows, 2 * k if mode == "gated" else k, generator=gen) * torch.logspace(-3, 3, rows)[:, None]
        x[:, 7] *= 30.0
        x[0, 32:64] = 0.0
        if mode == "gated":
            x[:, :k] = torch.rand(rows, k, generator=gen) * 200 - 100
        residual = torch.randn(rows, n, generator=gen)
        assert_same_bits(run_mode(avx2, mode, x, blob, n, norm_w, residual),
                         run_mode(vnni, mode, x, blob, n, norm_w, residual))
