"""Block routing on the GPU path (workbench.kernels.routing) against its torch twins
(workbench.attention.sparsity.sol_block_map / vsa_block_map).

CPU tests run the Triton block-sum pass in Triton's interpreter (TRITON_INTERPRET=1) at small
shapes; the GPU test runs the compiled pass at the H3 shape. The maps must be equal except for
pairs whose coarse score lies within float rounding of the decision threshold (the block sums are
added in another order than torch's): those are counted and bounded, every other pair must agree.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from workbench.attention import SegmentLayout  # noqa: E402
from workbench.attention.sparsity import (  # noqa: E402
    LOG2E,
    block_reduce,
    prefix_query_blocks,
    sol_block_map,
    sol_exact,
    sol_scores,
    vsa_block_map,
    vsa_keep_count,
    vsa_select,
)
from workbench.kernels import routing  # noqa: E402
from workbench.kernels.config import QuantConfig, RoutingConfig  # noqa: E402
from workbench.kernels.attention_fp8_ws_lists import summary_tiles  # noqa: E402
from workbench.kernels.quantize import (  # noqa: E402
    quantize_qkv,
    quantize_tokens,
    v_channel_scales,
)
from workbench.recipes import get_recipe  # noqa: E402
from workbench.synthetic import small_config, synthetic_qkv  # noqa: E402

# A pair within this fraction of the largest |score| of its head from the threshold counts as a
# rounding tie (FP32 block sums in another order move scores by ~1e-7 relative). At the H3 shape
# (8 heads of the synthetic input, interpreter, 2026-11-30, 5fd5ff3) 110-380 of 2.08M pairs fall
# in the band and none of them is decided differently.
ROUNDING_BAND = 1e-5
FAST = RoutingConfig(block_rows=64)  # one sub-tile per block: fewer interpreter steps

cpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="interpreter tests; the GPU test covers CUDA")


def synthetic(S, H, Hkv, D, seed=0, prefix=(0, 0), device=None):
    """Synthetic H3-like q/k/v (RMS-normed, RoPE, K/V channel biases, locality) and a layout with
    `prefix` = (text, audio) rows."""
    cfg = small_config(S, heads=H, kv_heads=Hkv, head_dim=D, rotated=96 if D >= 128 else 48,
                       seed=seed)
    text, audio = prefix
    layout = SegmentLayout(text=text, audio=audio, video=S - text - audio)
    q, k, v = synthetic_qkv(cfg, device=device)
    # synthetic_qkv gives each query head its K/V head; keep one per GQA group (real GQA)
    k, v = k[:, :, :: H // Hkv].contiguous(), v[:, :, :: H // Hkv].contiguous()
    return q, k, v, layout


def twin_sol(q, k, v, recipe, layout):
    """The twin's block map and its margins |score - theta| [B, H, nq, nk] and score scale."""
    D, group = q.shape[-1], q.shape[2] // k.shape[2]
    kf, vf = k.float(), v.float()
    kc = kf - kf.mean(1, keepdim=True) if recipe.smooth_k else kf
    vc = vf - vf.mean(1, keepdim=True) if recipe.smooth_v else vf
    bmap, kcent, vsum, lens = sol_block_map(q.float(), kc, vc, recipe, layout, D**-0.5, group)
    qbar, _ = block_reduce(q.float(), recipe.sol_block)
    scores, theta = sol_scores(qbar, kcent.repeat_interleave(group, 1), recipe,
                               D**-0.5 * LOG2E)
    margin = (scores - theta[..., None]).abs()
    return bmap, margin, scores, (kcent, vsum, lens)


def twin_vsa(q, k, recipe, layout):
    D, group = q.shape[-1], q.shape[2] // k.shape[2]
    bmap = vsa_block_map(q.float(), k.float(), recipe, layout, D**-0.5, group)
    qbar, _ = block_reduce(q.float(), recipe.vsa_tile)
    kbar, _ = block_reduce(k.float(), recipe.vsa_tile)
    scores = qbar @ kbar.repeat_interleave(group, 1).transpose(-1, -2) * D**-0.5
    nk = scores.shape[-1]
    prefix = torch.arange(nk, device=scores.device) * recipe.vsa_tile < layout.prefix_len
    competing = scores
    if recipe.vsa_prefix == "exempt" and bool(prefix.any()):
        competing = scores.masked_fill(prefix, -math.inf)
    keep = vsa_keep_count(recipe, nk, int(prefix.sum()))
    # the decision threshold: midway between the k-th and (k+1)-th largest competing score
    vals = competing.topk(min(keep + 1, nk), dim=-1).values
    theta = (vals[..., keep - 1 : keep] + vals[..., keep:]) / 2 if keep < nk else -math.inf
    margin = (competing - theta).abs()
    margin = margin.masked_fill(~torch.isfinite(margin), math.inf)
    return bmap, margin, scores


def disagreements(ours, twin, margin, scores):
    """(pairs that differ, of them outside the rounding band, pairs inside the band)."""
    scale = scores.abs().amax(dim=(-2, -1), keepdim=True)
    near = margin <= ROUNDING_BAND * scale
    diff = ours != twin
    return int(diff.sum()), int((diff & ~near).sum()), int(near.sum())


def check_lists(r: routing.BlockRouting):
    """blocks is a permutation per query block: the exact blocks ascending, then the others."""
    nk = r.exact.shape[-1]
    assert r.blocks.dtype == torch.int32 and r.counts.dtype == torch.int32
    assert torch.equal(r.counts, r.exact.sum(-1).int())
    srt, _ = r.blocks.long().sort(-1)
    assert torch.equal(srt, torch.arange(nk).expand_as(srt))
    pos = torch.arange(nk)
    head = pos < r.counts[..., None]  # positions holding the exact list
    is_exact = torch.gather(r.exact, -1, r.blocks.long())
    assert torch.equal(is_exact, head)
    step = r.blocks[..., 1:] - r.blocks[..., :-1]
    boundary = pos[1:] == r.counts[..., None]  # where the exact list ends and the rest begins
    assert bool(((step > 0) | boundary).all())


@cpu_only
@pytest.mark.parametrize("S,H,Hkv,D", [(1100, 4, 2, 64), (577, 4, 4, 128)])
def test_block_sums_match_torch_and_are_deterministic(S, H, Hkv, D):
    q, k, v, _ = synthetic(S, H, Hkv, D, seed=S)
    a = routing.block_sums(q, k, v, minmax=True, config=FAST)
    b = routing.block_sums(q, k, v, minmax=True)  # default launch: 2-row sub-tiles
    qbar, lens = block_reduce(q.float(), 64)
    ksum, _ = block_reduce(k.float(), 64, "sum")
    vsum, _ = block_reduce(v.float(), 64, "sum")
    assert torch.equal(a.lens, lens) and a.lens[-1] == S - (S - 1) // 64 * 64
    torch.testing.assert_close(a.qbar, qbar, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a.ksum, ksum, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(a.vsum, vsum, rtol=1e-6, atol=1e-5)
    vb = v.float()[:, : (S // 64) * 64].unflatten(1, (S // 64, 64))
    assert torch.equal(a.vmax[:, :, : S // 64], vb.amax(2).transpose(1, 2))
    assert torch.equal(a.vmin[:, :, -1], v.float()[:, S // 64 * 64 :].amin(1))
    for x, y in zip((a.qsum, a.ksum, a.vsum), (b.qsum, b.ksum, b.vsum)):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-5)  # other sub-tile order
    c = routing.block_sums(q, k, v, minmax=True, config=FAST)
    for x, y in zip((a.qsum, a.ksum, a.vsum, a.vmax), (c.qsum, c.ksum, c.vsum, c.vmax)):
        assert torch.equal(x, y)  # fixed order: bitwise the same run to run
    mu_k, mu_v, v_amax = a.kv_moments()
    torch.testing.assert_close(mu_k, k.double().mean(1).float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mu_v, v.double().mean(1).float(), rtol=1e-5, atol=1e-6)
    assert torch.equal(v_amax, (v.float() - mu_v[:, None]).abs().amax(1))  # exact given mu
    plain = a.kv_moments(smooth_k=False, smooth_v=False)
    assert not plain[0].any() and torch.equal(plain[2], v.float().abs().amax(1))
    # groups of 4 heads (with Hkv = 2 one partial K / V group): the same sums up to the
    # addition order, the same extremes, bitwise the same run to run
    cols = RoutingConfig(block_rows=4, group_heads=4, block_warps=2)
    d = routing.block_sums(q, k, v, minmax=True, config=cols)
    e = routing.block_sums(q, k, v, minmax=True, config=cols)
    for x, y, z in zip((a.qsum, a.ksum, a.vsum), (d.qsum, d.ksum, d.vsum),
                       (e.qsum, e.ksum, e.vsum)):
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-5)
        assert torch.equal(y, z)
    assert torch.equal(d.vmax, a.vmax) and torch.equal(d.vmin, a.vmin)
    assert torch.equal(d.lens, a.lens)
    # Q's codes from the read that sums Q (a sparse FP8 call): the quantizer's codes and scales
    # bitwise, Q's sums up to the addition order, K / V's and the lengths unchanged
    f = routing.block_sums(q, k, v, minmax=True, config=FAST, q_codes=QuantConfig())
    q8, q_scale = quantize_tokens(q)
    assert torch.equal(f.q8.view(torch.uint8), q8.view(torch.uint8))
    assert torch.equal(f.q_scale, q_scale) and a.q8 is None
    torch.testing.assert_close(f.qsum, a.qsum, rtol=1e-6, atol=1e-5)
    assert not torch.equal(f.qsum, torch.zeros_like(f.qsum))
    for x, y in zip((a.ksum, a.vsum, a.vmax, a.vmin, a.lens), (f.ksum, f.vsum, f.vmax, f.vmin,
                                                              f.lens)):
        assert torch.equal(x, y)
    moments = f.kv_moments()
    flags = dict(smooth_k=True, smooth_v=True, v_bias_correction=True)
    with pytest.raises(ValueError, match="q_codes"):  # codes of other operands: refused
        quantize_qkv(q, k, v, *moments, **flags, q_codes=(f.q8[:, :1], f.q_scale))
    with pytest.raises(ValueError, match="scales: the reciprocals"):
        quantize_qkv(q, k, v, *moments, **flags, v_scales=(moments[2], moments[2][..., :8]))
    with pytest.raises(ValueError, match="sums"):
        quantize_tokens(q, sums=f.qsum[:, :, :1])


@cpu_only
def test_block_sums_over_head_groups_and_batches():
    """Programs over groups of 8 heads: two query-head groups (the second partial), one K/V
    group, two batch entries, a partial last block; each block's sums, means and extremes are
    torch's at their place."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 200, 12, 64, generator=g).bfloat16()
    k = torch.randn(2, 200, 4, 64, generator=g).bfloat16()
    v = torch.randn(2, 200, 4, 64, generator=g).bfloat16()
    sums = routing.block_sums(q, k, v, minmax=True, config=RoutingConfig(block_rows=8))

    def blocks(x, op):  # [B, S, H, D] -> [B, H, nb, D] per 64-token block
        pad = -x.shape[1] % 64
        xf = x.float().transpose(1, 2)
        fill = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}[op]
        xf = torch.nn.functional.pad(xf, (0, 0, 0, pad), value=fill).unflatten(2, (-1, 64))
        return {"sum": xf.sum(3), "max": xf.amax(3), "min": xf.amin(3)}[op]

    torch.testing.assert_close(sums.qsum, blocks(q, "sum"), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(sums.ksum, blocks(k, "sum"), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(sums.vsum, blocks(v, "sum"), rtol=1e-6, atol=1e-5)
    assert torch.equal(sums.vmax, blocks(v, "max")) and torch.equal(sums.vmin, blocks(v, "min"))
    assert sums.lens.tolist() == [64.0, 64.0, 64.0, 8.0]


CASES = [  # (S, H, Hkv, D, recipe, (text, audio))
    (1100, 4, 2, 64, "fp8_sol_kv_corrected", (14, 60)),
    (577, 4, 4, 128, "fp8_sol_k:sol_threshold=diag,sol_tau=0.5", (9, 30)),
    (700, 4, 2, 128, "fp8_sol_unsmoothed:sol_tau=-0.3,sol_band=2", (0, 0)),
    (1000, 4, 4, 64, "fp8_sol_kv_corrected:sol_tau=2.5", (3, 200)),
    (577, 2, 2, 64, "fp8_sol_kv_corrected:dense_prefix=false,prefix_blocks_exact=true", (9, 100)),
]


@cpu_only
@pytest.mark.parametrize("S,H,Hkv,D,name,prefix", CASES)
def test_sol_routing_equals_the_twin_up_to_rounding_ties(S, H, Hkv, D, name, prefix):
    q, k, v, layout = synthetic(S, H, Hkv, D, seed=S + D, prefix=prefix)
    rec = get_recipe(name)
    sums = routing.block_sums(q, k, v, config=FAST)
    r = routing.sol_routing(q, k, v, rec, layout=layout, sums=sums)
    twin, margin, scores, (kcent, vsum, lens) = twin_sol(q, k, v, rec, layout)
    n_diff, n_outside, n_near = disagreements(r.exact, twin, margin, scores)
    print(f"sol {name} S={S}: {n_diff} rounding disagreements, {n_near} pairs in the band, "
          f"of {twin.numel()}; density {r.density:.4f}")
    assert n_outside == 0
    assert n_near <= 1e-3 * twin.numel()  # the band stays a rounding band
    assert 0.05 < r.density < 1.0
    assert abs(r.density - float(twin.double().mean())) <= n_diff / twin.numel() + 1e-12
    check_lists(r)
    # what the summary route reads: smoothed K block means, smoothed V block sums, lengths
    torch.testing.assert_close(r.kc, kcent, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(r.vc, vsum, rtol=1e-5, atol=1e-4)
    assert torch.equal(r.lens, lens.float())
    # the sink: every key block holding a prefix row is exact for every query block
    n_sink = -(-layout.prefix_len // 64)
    assert bool(r.exact[..., :n_sink].all())
    band = (torch.arange(r.exact.shape[-2])[:, None] - torch.arange(r.exact.shape[-1])).abs()
    assert bool(r.exact[..., band <= rec.sol_band].all())


@cpu_only
@pytest.mark.parametrize("S,H,Hkv,D,name,prefix", CASES + [
    (300, 2, 2, 64, "fp8_sol_k:sol_tau=-inf", (0, 70))])
def test_sol_front_in_one_launch_equals_the_torch_front(S, H, Hkv, D, name, prefix):
    """``RoutingConfig.sol_front="triton"``: the statistics, kc / vc, the query block means and
    theta from one launch equal the torch ops' up to the order of FP32 additions, and the
    routing equals the twin up to rounding ties, as the torch front's does."""
    q, k, v, layout = synthetic(S, H, Hkv, D, seed=S + D, prefix=prefix)
    rec = get_recipe(name)
    sums = routing.block_sums(q, k, v, minmax=True, config=FAST)
    scale = D**-0.5
    mu_k, mu_v, v_amax = sums.kv_moments(smooth_k=rec.smooth_k, smooth_v=rec.smooth_v)
    kc, vc = routing.sol_centred(sums, mu_k, mu_v)
    kh = routing._expand(kc, H // Hkv)
    _, theta = sol_scores(sums.qbar, kh, rec, scale * LOG2E)
    full = routing.sol_front(sums, rec, scale)
    front = full.twin_values()
    # several programs per K/V head, each a share of the rows: the same bits as one (at the
    # same ROWS, so the same order of additions)
    one = routing.sol_front(sums, rec, scale, rows=4, parts=1, tiles=True)
    parts = routing.sol_front(sums, rec, scale, rows=4, parts=3, tiles=True)
    # the summary tiles too (the last part writes their padding)
    for a, b in zip(one.twin_values() + (one.v_scale, one.v_rcp, one.tiles.skc),
                    parts.twin_values() + (parts.v_scale, parts.v_rcp, parts.tiles.skc)):
        assert (a is None and b is None) or torch.equal(a, b)
    for t in ("kc8", "vc8t"):
        assert torch.equal(getattr(one.tiles, t).float(), getattr(parts.tiles, t).float()), t
    # 256 rows per step: the last step runs past the tiles' 128-block padding (masked stores;
    # other sums' order, so compared with its own kc)
    wide = routing.sol_front(sums, rec, scale, rows=256, parts=1, tiles=True)
    nk = wide.kc.shape[2]
    skc = wide.tiles.skc.view(wide.kc.shape[0], wide.kc.shape[1], 1, 1)
    assert torch.equal(wide.tiles.kc8[:, :, :nk].float(),
                       (wide.kc / skc).to(torch.float8_e4m3fn).float())
    assert not wide.tiles.kc8[:, :, nk:].float().any()
    # V's channel scales: the quantizer's own, bitwise, from the front's absmax
    assert all(torch.equal(a, b) for a, b in zip((full.v_scale, full.v_rcp),
                                                 v_channel_scales(full.v_amax)))
    # theta: the diagonal threshold's, or tau where infinite; the exact one is the list pass's
    exact_thr = rec.sol_threshold == "exact" and math.isfinite(rec.sol_tau)
    assert (front[6] is None) == exact_thr
    for name_, want, got in zip(("mu_k", "mu_v", "v_amax", "kc", "vc", "qbar", "theta"),
                                (mu_k, mu_v, v_amax, kc, vc, sums.qbar, theta), front):
        if got is None:
            continue
        assert got.shape == want.shape and got.dtype == torch.float32, name_
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()),
                                   msg=name_)
    if exact_thr:  # the exact threshold is the mean + tau x the std of each row's scores
        scores = (sums.qbar @ kh.transpose(-1, -2)) * (scale * LOG2E)
        row = scores.mean(-1) + rec.sol_tau * scores.std(-1, unbiased=False)
        torch.testing.assert_close(row, theta, rtol=1e-4, atol=1e-5 * float(scores.abs().max()))
        with pytest.raises(ValueError, match="theta or tau"):
            routing.sol_lists(scores, theta, rec.sol_band, 0, tau=rec.sol_tau)
    f_mu_k, f_mu_v, f_amax, r = routing.sol_routing_fused(sums, rec, layout=layout, scale=scale,
                                                          config=FAST)
    for a, b in zip((f_mu_k, f_mu_v, f_amax, r.kc, r.vc), front[:5]):
        assert torch.equal(a, b)  # run to run the same bits
    twin, margin, scores, _ = twin_sol(q, k, v, rec, layout)
    n_diff, n_outside, n_near = disagreements(r.exact, twin, margin, scores)
    assert n_outside == 0 and n_near <= 1e-3 * twin.numel()
    check_lists(r)
    if math.isinf(rec.sol_tau):
        assert bool(r.exact.all())


@cpu_only
def test_sol_tau_edges_and_density_search():
    q, k, v, layout = synthetic(640, 4, 2, 64, seed=5, prefix=(10, 60))
    sums = routing.block_sums(q, k, v, config=FAST)
    rec = get_recipe("fp8_sol_kv_corrected")
    every = routing.sol_routing(q, k, v, rec.with_(sol_tau=-math.inf), layout=layout, sums=sums)
    assert bool(every.exact.all()) and every.density == 1.0
    assert torch.equal(every.blocks, torch.arange(10, dtype=torch.int32).expand_as(every.blocks))
    floor = routing.sol_routing(q, k, v, rec.with_(sol_tau=math.inf), layout=layout, sums=sums)
    twin, *_ = twin_sol(q, k, v, rec.with_(sol_tau=math.inf), layout)
    assert torch.equal(floor.exact, twin)  # band + sink only: no score decides
    # 10 x 10 blocks: the band |i - j| <= 1 (28 pairs) and the sink columns 0, 1 (70 prefix
    # rows; 20 pairs, 5 of them in the band)
    assert floor.density == pytest.approx(43 / 100)
    assert routing.sol_tau_for_density(q, k, v, rec, 1.0, layout=layout, sums=sums) == -math.inf
    assert routing.sol_tau_for_density(q, k, v, rec, 0.1, layout=layout, sums=sums) == math.inf
    for target in (0.6, 0.75):
        tau = routing.sol_tau_for_density(q, k, v, rec, target, layout=layout, sums=sums)
        r = routing.sol_routing(q, k, v, rec.with_(sol_tau=tau), layout=layout, sums=sums)
        assert abs(r.density - target) <= 0.02, (target, tau, r.density)  # 400 pairs a head
    with pytest.raises(ValueError, match="target"):
        routing.sol_tau_for_density(q, k, v, rec, 1.5, layout=layout, sums=sums)


VSA_CASES = [
    (1100, 4, 2, 64, "vsa_bf16", (14, 60)),
    (640, 4, 4, 128, "vsa_bf16:vsa_prefix=compete,vsa_keep=0.3", (20, 50)),
    (577, 4, 2, 64, "fp8_dense_kv_corrected:sparsity=vsa,vsa_keep=0.15", (0, 0)),
    (577, 2, 2, 64, "vsa_bf16:prefix_blocks_exact=true", (9, 100)),
]


@cpu_only
@pytest.mark.parametrize("S,H,Hkv,D,name,prefix", VSA_CASES)
def test_vsa_routing_equals_the_twin_up_to_rounding_ties(S, H, Hkv, D, name, prefix):
    q, k, v, layout = synthetic(S, H, Hkv, D, seed=S + 1, prefix=prefix)
    rec = get_recipe(name)
    r = routing.vsa_routing(q, k, v, rec, layout=layout,
                            sums=routing.block_sums(q, k, v, config=FAST))
    twin, margin, scores = twin_vsa(q, k, rec, layout)
    n_diff, n_outside, n_near = disagreements(r.exact, twin, margin, scores)
    print(f"vsa {name} S={S}: {n_diff} rounding disagreements, {n_near} pairs in the band")
    assert n_outside == 0 and n_near <= 1e-3 * twin.numel()
    nk = twin.shape[-1]
    n_prefix = -(-layout.prefix_len // 64)
    keep = vsa_keep_count(rec, nk, n_prefix)
    extra = n_prefix if rec.vsa_prefix == "exempt" else 0
    routed = n_prefix if rec.prefix_blocks_exact else 0  # query tiles before it keep every tile
    assert bool((r.counts[..., routed:] == keep + extra).all())  # top-k: one count per tile
    assert bool((r.counts[..., :routed] == nk).all())
    check_lists(r)
    assert r.kc is None and r.vc is None


def random_masks(shape, seed):
    """bool [..., nk] with a random density per row, the first row all true, the second all
    false."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(shape, generator=g) < torch.rand((*shape[:-1], 1), generator=g)
    flat = m.view(-1, shape[-1])
    flat[0] = True
    if flat.shape[0] > 1:
        flat[1] = False
    return m


@cpu_only
@pytest.mark.parametrize("shape", [(1, 2, 3, 37), (5, 510), (7, 1), (2, 64), (3, 4, 5, 100)])
@pytest.mark.parametrize("rows", [1, 4])
def test_list_pass_equals_compact_blocks(shape, rows):
    m = random_masks(shape, seed=sum(shape) + rows)
    blocks, counts = routing.mask_lists(m, config=RoutingConfig(list_rows=rows))
    ref_blocks, ref_counts = routing.compact_blocks(m)
    assert blocks.dtype == torch.int32 and counts.dtype == torch.int32
    assert blocks.shape == m.shape and counts.shape == m.shape[:-1]
    assert torch.equal(blocks, ref_blocks) and torch.equal(counts, ref_counts)
    # a strided (non-contiguous) mask reads the same
    wide = torch.zeros((*shape[:-1], 2 * shape[-1]), dtype=torch.bool)
    wide[..., ::2] = m
    blocks, counts = routing.mask_lists(wide[..., ::2], config=RoutingConfig(list_rows=rows))
    assert torch.equal(blocks, ref_blocks) and torch.equal(counts, ref_counts)


@cpu_only
@pytest.mark.parametrize("nq,nk", [(6, 37), (3, 510), (11, 11)])
@pytest.mark.parametrize("band,prefix_len", [(0, 0), (1, 70), (3, 64), (2, 1)])
@pytest.mark.parametrize("prefix_exact", [False, True])
def test_sol_list_pass_equals_sol_exact_and_compact_blocks(nq, nk, band, prefix_len,
                                                           prefix_exact):
    g = torch.Generator().manual_seed(nq * nk + band + prefix_len)
    scores = torch.randn((2, 3, nq, nk), generator=g)
    theta = torch.randn((2, 3, nq), generator=g)
    # ties (score == theta is not exact), infinite thresholds and a NaN score
    scores[0, 0, :, 0] = theta[0, 0]
    theta[0, 1, 0], theta[0, 2, 0], scores[1, 0, 0, 1] = -math.inf, math.inf, math.nan
    rec = get_recipe("fp8_sol_k").with_(sol_band=band, dense_prefix=False,
                                        prefix_blocks_exact=prefix_exact)
    twin = sol_exact(scores, theta, rec, prefix_len)
    n_rows = prefix_query_blocks(rec, prefix_len, rec.sol_block, nq)
    assert n_rows == (min(nq, -(-prefix_len // 64)) if prefix_exact else 0)
    if n_rows:  # those query blocks hold every key block, the others do not
        assert bool(twin[..., :n_rows, :].all()) and not bool(twin[..., n_rows:, :].all())
    blocks, counts, exact = routing.sol_lists(scores, theta, band,
                                              routing.sink_blocks(prefix_len, rec.sol_block),
                                              exact_rows=n_rows,
                                              config=RoutingConfig(list_rows=2))
    assert exact.dtype == torch.bool and torch.equal(exact, twin)
    ref_blocks, ref_counts = routing.compact_blocks(twin)
    assert torch.equal(blocks, ref_blocks) and torch.equal(counts, ref_counts)


@cpu_only
@pytest.mark.parametrize("nk,prefix_len", [(37, 0), (37, 130), (510, 370), (11, 64)])
@pytest.mark.parametrize("mode,keep", [("exempt", 0.1), ("compete", 0.3), ("exempt", 0.999)])
@pytest.mark.parametrize("prefix_exact", [False, True])
def test_vsa_list_pass_equals_vsa_select_and_compact_blocks(nk, prefix_len, mode, keep,
                                                            prefix_exact):
    """VSA's top-k from one sort per row: the twin's map on tie-free scores, including a row
    whose prefix tiles score highest (exempt: they do not take a top-k place); with
    ``prefix_blocks_exact`` the query tiles holding prefix rows keep every tile."""
    g = torch.Generator().manual_seed(nk + prefix_len)
    scores = torch.randn((2, 5, nk), generator=g)
    scores[0, 0, :3] = 10.0 + torch.arange(3.0)
    rec = get_recipe("vsa_bf16").with_(vsa_prefix=mode, vsa_keep=keep,
                                       prefix_blocks_exact=prefix_exact)
    twin = vsa_select(scores, rec, prefix_len)
    n_sink = min(nk, routing.sink_blocks(prefix_len, rec.vsa_tile))
    exempt = mode == "exempt" and n_sink > 0
    n_rows = prefix_query_blocks(rec, prefix_len, rec.vsa_tile, 5)
    if n_rows:  # those query tiles keep every tile (the others keep ~keep of them)
        assert bool(twin[:, :n_rows].all())
        assert keep > 0.9 or n_rows == 5 or not bool(twin[:, n_rows:].all())
    blocks, counts, exact = routing.vsa_lists(scores, vsa_keep_count(rec, nk, n_sink), n_sink,
                                              exempt, exact_rows=n_rows,
                                              config=RoutingConfig(list_rows=2))
    assert exact.dtype == torch.bool and torch.equal(exact, twin)
    ref_blocks, ref_counts = routing.compact_blocks(twin)
    assert torch.equal(blocks, ref_blocks) and torch.equal(counts, ref_counts)
    with pytest.raises(ValueError, match="keep"):
        routing.vsa_lists(scores, nk + 1, n_sink, exempt)


@cpu_only
def test_sol_routing_decides_as_sol_exact_on_its_own_scores():
    """The list pass makes the same decisions as ``sol_exact`` on the scores and thresholds that
    ``sol_routing`` computes (only the block sums' order may differ from the twin)."""
    q, k, v, layout = synthetic(1100, 4, 2, 64, seed=3, prefix=(14, 60))
    rec = get_recipe("fp8_sol_kv_corrected:sol_band=2")
    sums = routing.block_sums(q, k, v, minmax=True, config=FAST)
    r = routing.sol_routing(q, k, v, rec, layout=layout, sums=sums)
    _, qbar, kc, _, c, group = routing._sol_inputs(q, k, v, rec, None, sums, None, None)
    scores, theta = sol_scores(qbar, kc.repeat_interleave(group, 1), rec, c)
    exact = sol_exact(scores, theta, rec, layout.prefix_len)
    assert torch.equal(r.exact, exact)
    blocks, counts = routing.compact_blocks(exact)
    assert torch.equal(r.blocks, blocks) and torch.equal(r.counts, counts)


@cpu_only
def test_bad_inputs_are_refused_with_the_name():
    q, k, v, layout = synthetic(200, 4, 2, 64)
    with pytest.raises(ValueError, match="sparsity is 'dense'"):
        routing.sol_routing(q, k, v, "fp8_dense", layout=layout)
    with pytest.raises(ValueError, match="dense recipes"):
        routing.route(q, k, v, "fp8_dense")
    with pytest.raises(ValueError, match="layout"):
        routing.route(q, k, v, "fp8_sol_k", layout=SegmentLayout(video=100))
    with pytest.raises(ValueError, match="k and v"):
        routing.block_sums(q, k[:, :, :, :32], v)
    with pytest.raises(ValueError, match="block"):
        routing.block_sums(q, k, v, block=48)
    sums = routing.block_sums(q, k, v, block=32, config=FAST)
    with pytest.raises(ValueError, match="sums"):
        routing.sol_routing(q, k, v, "fp8_sol_k", sums=sums)
    with pytest.raises(ValueError, match="minmax"):
        sums.kv_moments()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_h3_shape_routing_on_the_gpu_matches_the_twin():
    """(1, 32626, 56, 128) synthetic H3 input, the live layout's 370-row sink: Sol exact / diag
    and VSA maps against the twin on CUDA; prints the rounding-disagreement counts."""
    from workbench.synthetic import H3_SYNTHETIC

    q, k, v = (t.contiguous() for t in synthetic_qkv(H3_SYNTHETIC, device="cuda"))
    layout = H3_SYNTHETIC.layout
    sums = routing.block_sums(q, k, v, minmax=True)
    mu_k, mu_v, _ = sums.kv_moments()
    torch.testing.assert_close(mu_k, k.double().mean(1).float(), rtol=1e-5, atol=1e-5)
    # Q's codes in the read that sums Q: the quantizer's codes bitwise, the same sums up to
    # the order of additions
    with_q = routing.block_sums(q, k, v, minmax=True, q_codes=QuantConfig())
    q8, q_scale = quantize_tokens(q)
    assert torch.equal(with_q.q8.view(torch.uint8), q8.view(torch.uint8))
    assert torch.equal(with_q.q_scale, q_scale) and torch.equal(with_q.ksum, sums.ksum)
    torch.testing.assert_close(with_q.qsum, sums.qsum, rtol=1e-5, atol=1e-3)
    del with_q, q8
    total = 0
    for name in ("fp8_sol_kv_corrected", "fp8_sol_kv_corrected:sol_threshold=diag",
                 "fp8_sol_kv_corrected:sol_tau=0.2"):
        rec = get_recipe(name)
        r = routing.sol_routing(q, k, v, rec, layout=layout, sums=sums)
        twin, margin, scores, (kcent, _, _) = twin_sol(q, k, v, rec, layout)
        n_diff, n_outside, n_near = disagreements(r.exact, twin, margin, scores)
        print(f"H3 {name}: density {r.density:.4f} (twin {float(twin.float().mean()):.4f}), "
              f"{n_diff} rounding disagreements, {n_near} pairs in the band of {twin.numel()}")
        assert n_outside == 0 and n_near <= 1e-3 * twin.numel()
        mu_kf, mu_vf, amax_f, rf = routing.sol_routing_fused(sums, rec, layout=layout,
                                                             tiles=True)  # the kernel front
        f_diff, f_outside, _ = disagreements(rf.exact, twin, margin, scores)
        print(f"H3 {name}, kernel front: {f_diff} rounding disagreements")
        assert f_outside == 0
        # its summary tiles and V scales: bitwise what the list kernel's launcher and the
        # quantizer make from the front's kc / vc / absmax (FMA contraction on the GPU too)
        qf = quantize_qkv(q, k, v, mu_kf, mu_vf, amax_f, smooth_k=True, smooth_v=True,
                          v_bias_correction=True, v_scales=rf.v_scales)
        assert all(torch.equal(a, b) for a, b in zip(rf.v_scales, v_channel_scales(amax_f)))
        want = summary_tiles(qf, rf)
        assert rf.tiles.fits(qf)
        assert torch.equal(rf.tiles.skc, want.skc)
        for t in ("kc8", "vc8t"):
            assert torch.equal(getattr(rf.tiles, t).view(torch.uint8),
                               getattr(want, t).view(torch.uint8)), t
        del qf
        torch.testing.assert_close(r.kc, kcent, rtol=1e-4, atol=1e-5)
        blocks, counts = routing.compact_blocks(r.exact)  # the list pass against its twin
        assert torch.equal(r.blocks, blocks) and torch.equal(r.counts, counts)
        total += n_diff
        del twin, margin, scores
    rec = get_recipe("vsa_bf16")
    r = routing.vsa_routing(q, k, v, rec, layout=layout)
    twin, margin, scores = twin_vsa(q, k, rec, layout)
    n_diff, n_outside, n_near = disagreements(r.exact, twin, margin, scores)
    print(f"H3 vsa_bf16: density {r.density:.4f}, {n_diff} rounding disagreements, "
          f"{n_near} in the band")
    assert n_outside == 0 and n_near <= 1e-3 * twin.numel()
    blocks, counts = routing.compact_blocks(r.exact)
    assert torch.equal(r.blocks, blocks) and torch.equal(r.counts, counts)
    check_lists_gpu = r.blocks.sort(-1).values
    assert torch.equal(check_lists_gpu,
                       torch.arange(r.exact.shape[-1], device="cuda", dtype=torch.int32)
                       .expand_as(check_lists_gpu))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_routing_replays_from_a_cuda_graph():
    """The bench's GPU time of the routing (``harness.graph_median_ms``) captures Sol's routing
    and the block sums in CUDA graphs: capture succeeds (a float: no host copy or
    synchronization inside) and a replay writes the eager call's lists and counts."""
    from workbench.bench.harness import graph_median_ms

    q, k, v, layout = synthetic(3000, 4, 2, 128, prefix=(14, 100), device="cuda")
    rec = get_recipe("fp8_sol_kv_corrected")
    sums = routing.block_sums(q, k, v, minmax=True)
    eager = routing.sol_routing(q, k, v, rec, layout=layout, sums=sums)
    out = {}

    def call():
        out["r"] = routing.sol_routing(q, k, v, rec, layout=layout, sums=sums)

    ms = graph_median_ms(call, rep_ms=20)
    assert ms is not None and 0 < ms < 50
    # the block sums too (their last block's length is a fill, not a host copy)
    assert graph_median_ms(lambda: routing.block_sums(q, k, v, minmax=True), rep_ms=20)
    assert torch.equal(routing.block_sums(q, k, v, minmax=True).lens, sums.lens)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    captured = out["r"]
    captured.blocks.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.blocks, eager.blocks)
    assert torch.equal(captured.counts, eager.counts)
