"""The block-sparse FP8 attention kernel (Sol and VSA on routing lists) against its torch twin,
``recipe_attention`` with the sparse recipe, and against the dense kernel.

CPU tests run the kernels in Triton's interpreter at small shapes (partial last blocks, odd list
lengths, GQA, prefix rows); the GPU tests (marked) run the compiled kernels at larger shapes.
Tolerance rule, as for the dense kernel: the kernel's relative L2 error against float64 is at most
1.25x the emulation's own error.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from workbench.attention import (  # noqa: E402
    SegmentLayout,
    dense_attention_f64,
    evenly_spaced_rows,
    recipe_attention,
)
from workbench.kernels import attention_fp8_ws_lists as ws_lists  # noqa: E402
from workbench.kernels import dispatch, routing  # noqa: E402
from workbench.kernels.attention_fp8 import fp8_attention_fwd  # noqa: E402
from workbench.kernels.config import DEFAULT, QuantConfig, SparseConfig  # noqa: E402
from workbench.kernels.quantize import quantize_qkv  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402
from workbench.synthetic import small_config, synthetic_qkv  # noqa: E402

cpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="interpreter tests; the GPU tests cover CUDA")


def synthetic(S, H, Hkv, D, seed=0, prefix=(10, 40), device=None):
    cfg = small_config(S, heads=H, kv_heads=Hkv, head_dim=D, rotated=96 if D >= 128 else 48,
                       seed=seed)
    q, k, v = synthetic_qkv(cfg, device=device)
    # synthetic_qkv gives each query head its K/V head; keep one per GQA group (real GQA)
    k, v = k[:, :, :: H // Hkv].contiguous(), v[:, :, :: H // Hkv].contiguous()
    text, audio = prefix
    return q, k, v, SegmentLayout(text=text, audio=audio, video=S - text - audio)


def rel_l2(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


def operands(q, k, v, recipe, layout):
    """The quantized operands and the routing of a sparse recipe, as the dispatch makes them."""
    mu_k, mu_v, v_amax, route = dispatch.sparse_routing(q, k, v, recipe, layout,
                                                        q.shape[-1] ** -0.5)
    qkv = quantize_qkv(q, k, v, mu_k, mu_v, v_amax, smooth_k=recipe.smooth_k,
                       smooth_v=recipe.smooth_v, v_bias_correction=recipe.v_bias_correction)
    return qkv, route


@cpu_only
@pytest.mark.parametrize("S,block_n,tma,schedule", [
    (330, 128, True, "heavy_first"),  # partial last block, an odd list: the masked half tile
    (320, 64, False, "rows"),  # 64-key tiles, gathered loads, full blocks
    (384, 128, False, "heavy_first"),  # S a multiple of the 128-key tile
])
def test_every_block_exact_is_the_dense_kernel_bitwise(S, block_n, tma, schedule):
    """tau = -inf routes every block exactly: the list walk visits the dense kernel's tiles in its
    order with its masks, so output and LSE are the same bits (one KV part)."""
    q, k, v, layout = synthetic(S, 2, 1, 64, seed=S)
    rec = get_recipe("fp8_sol_kv_corrected:sol_tau=-inf")
    qkv, route = operands(q, k, v, rec, layout)
    assert route.density == 1.0
    att = replace(DEFAULT.attention, block_n=block_n, use_tma=False)
    dense, dense_lse = fp8_attention_fwd(qkv, num_heads=2, scale=1 / 8, return_lse=True,
                                         config=att)
    sparse = SparseConfig(schedule=schedule, kv_splits=1, tma=tma)
    out, lse = fp8_attention_fwd(qkv, num_heads=2, scale=1 / 8, return_lse=True, config=att,
                                 routing=route, sparse=sparse)
    if tma and block_n == 128:
        # 128-key tiles from two 64-key TMA boxes: the same products; the row sum is added per
        # 64-key half, so l, the LSE and the BF16 output may differ in their last bits
        assert float((lse - dense_lse).abs().max()) < 1e-5
        assert bool((bf16_ulps(out, dense) <= 1).all())
        assert float((out != dense).float().mean()) < 0.05
    else:
        assert torch.equal(out, dense) and torch.equal(lse, dense_lse)


def bf16_ulps(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|x - ref| in units of BF16's spacing at |ref| (at least 2^-14)."""
    spacing = 2.0 ** (torch.frexp(ref.float().abs().clamp(min=2.0**-6)).exponent - 8)
    return (x.float() - ref.float()).abs() / spacing


CASES = [  # (S, H, Hkv, D, recipe)
    (400, 4, 2, 64, "fp8_sol_kv_corrected"),
    (333, 2, 2, 128, "fp8_sol_k:sol_threshold=diag,sol_tau=0.5,p_scaling=exp2_offset8"),
    (400, 2, 2, 64, "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.3"),
    # the row sum of the E4M3 P (exact tiles; Sol's summary route keeps its FP32 sum)
    (400, 4, 2, 64, "fp8_sol_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand"),
    (333, 2, 2, 128, "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.3,row_sum=p_operand"),
    # P's E4M3 codes without an exponential (p_exp "log_linear")
    (400, 4, 2, 64, "fp8_sol_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand,"
                    "p_exp=log_linear"),
    # the BF16 baselines on the same loop (BF16 operands and P, no quantizer)
    (400, 2, 2, 64, "vsa_bf16:vsa_keep=0.3"),
    (333, 2, 1, 128, "bf16:sparsity=sol,sol_tau=0.5"),
    (333, 2, 1, 128, "bf16:sparsity=sol,sol_tau=0.5,prefix_blocks_exact=true"),
]


@cpu_only
@pytest.mark.parametrize("S,H,Hkv,D,name", CASES)
def test_sparse_kernel_error_within_125_percent_of_the_emulation(S, H, Hkv, D, name):
    q, k, v, layout = synthetic(S, H, Hkv, D, seed=S + D)
    ref, _ = dense_attention_f64(q, k, v)
    emu = recipe_attention(q, k, v, name, layout=layout)
    out, lse = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, return_lse=True,
                                             config=DEFAULT.with_sparse(kv_splits=1,
                                                                        summary_precision="ieee"))
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    e_k, e_e = rel_l2(out, ref), rel_l2(emu.out, ref)
    print(f"{name}: kernel {e_k:.4e}, emulation {e_e:.4e}, density {emu.exact_fraction:.3f}")
    assert 0.05 < emu.exact_fraction < 0.95  # a sparse case: both routes run
    assert e_k <= 1.25 * e_e
    assert rel_l2(out, emu.out.double()) < 0.3 * e_e  # the twin, up to FP8 rounding
    rows = slice(layout.prefix_len, None)  # prefix rows: the kernel's LSE is of its FP8 rows
    lse_k = lse.transpose(1, 2)[:, rows].double()
    assert float((lse_k - emu.lse[:, rows].double()).abs().max()) < 2e-2


PREFIX_EXACT = "fp8_sol_kv_corrected:dense_prefix=false,prefix_blocks_exact=true"
LL = "fp8_sol_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand,p_exp=log_linear"


def check_prefix_blocks(name, S, H, Hkv, D, device=None):
    """A Sol or VSA recipe with ``prefix_blocks_exact`` on 114 prefix rows: the rows of the
    query blocks holding them as accurate as the dense FP8 recipe's (within the 1.25x rule) and
    more accurate than the same blocks routed, the whole output within the rule of its
    emulation. Returns (kernel out, f64 reference, emulation, routed kernel out, those rows)."""
    q, k, v, layout = synthetic(S, H, Hkv, D, seed=S + 5, prefix=(14, 100), device=device)
    ref, _ = dense_attention_f64(q, k, v)
    emu = recipe_attention(q, k, v, name, layout=layout)
    dense = recipe_attention(q, k, v, "fp8_dense_kv_corrected", layout=layout)
    out = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout)
    routed_name = name.replace("prefix_blocks_exact=true", "prefix_blocks_exact=false")
    routed = dispatch.fp8_recipe_attention(q, k, v, routed_name, layout=layout)
    pre = slice(0, -(-layout.prefix_len // 64) * 64)
    e_pre, e_dense = rel_l2(out[:, pre], ref[:, pre]), rel_l2(dense.out[:, pre], ref[:, pre])
    e_routed = rel_l2(routed[:, pre], ref[:, pre])
    e_k, e_e = rel_l2(out, ref), rel_l2(emu.out, ref)
    print(f"{device or 'cpu'} {name}: prefix blocks {e_pre:.4e} (dense FP8 emulation "
          f"{e_dense:.4e}, routed {e_routed:.4e}); all rows kernel {e_k:.4e} emulation {e_e:.4e}")
    assert e_pre <= 1.25 * e_dense and e_pre < 0.8 * e_routed
    assert e_k <= 1.25 * e_e
    return out, ref, emu, routed, pre


def test_heavy_groups_count_the_ctas_of_the_dense_rows():
    """The CTAs (three query blocks each) holding the blocks routed to every key block start
    first; none when there are no such blocks or when they fill the head."""
    assert [ws_lists.heavy_groups(n, 170) for n in (0, 1, 3, 4, 6, 7)] == [0, 1, 1, 2, 2, 3]
    assert ws_lists.heavy_groups(6, 2) == 0 and ws_lists.heavy_groups(6, 3) == 2


@cpu_only
@pytest.mark.parametrize("name", [PREFIX_EXACT,
                                  "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.2,"
                                  "dense_prefix=false,prefix_blocks_exact=true"])
def test_prefix_blocks_exact_rows_are_the_dense_fp8_rows(name):
    """``prefix_blocks_exact``: the query blocks holding the 114 prefix rows take every key
    block on the FP8 loop (no BF16 replacement; ``check_prefix_blocks``), the other rows are
    the routed call's bits."""
    out, ref, emu, routed, pre = check_prefix_blocks(name, 400, 2, 2, 64)
    assert rel_l2(out, emu.out.double()) < 0.3 * rel_l2(emu.out, ref)  # the twin, up to FP8
    # rows after the prefix blocks: the same routing and operands as the routed call
    post = slice(pre.stop, None)
    assert torch.equal(out[:, post], routed[:, post])


@cpu_only
@pytest.mark.parametrize("name", ["fp8_sol_kv_corrected",
                                  "fp8_sol_k:sol_threshold=diag,sol_tau=0.5"])
def test_sol_front_in_one_launch_gives_the_calls_accuracy(name):
    """``RoutingConfig.sol_front="triton"`` in a whole call: within 1.25x of the emulation's
    error, and within a fraction of it of the call with the torch front (its statistics differ
    only in the order of FP32 additions)."""
    q, k, v, layout = synthetic(400, 4, 2, 64, seed=7)
    ref, _ = dense_attention_f64(q, k, v)
    emu = recipe_attention(q, k, v, name, layout=layout)
    cfg = DEFAULT.with_sparse(kv_splits=1, summary_precision="ieee")
    base = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout,
                                         config=cfg.with_routing(sol_front="torch"))
    fused = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout,
                                          config=cfg.with_routing(sol_front="triton"))
    e_e = rel_l2(emu.out, ref)
    assert rel_l2(fused, ref) <= 1.25 * e_e
    assert rel_l2(fused, base.double()) < 0.1 * e_e


@cpu_only
def test_kv_parts_summary_precisions_and_schedules_agree():
    """The heavy-first work list gives the grid order's bits (gathered loads). KV parts (2, 4 +
    the combine pass) round P against each part's own running max, BF16 summary operands round
    the summary weights and TMA tiles add the row sum per 64-key half: FP8-level or last-bit
    differences, each within the tolerance rule and far closer to the one-part result than
    either is to float64."""
    q, k, v, layout = synthetic(330, 2, 1, 64, seed=9)
    rec = get_recipe("fp8_sol_kv_corrected:sol_tau=0.5,dense_prefix=false")
    ref, _ = dense_attention_f64(q, k, v)
    e_emu = rel_l2(recipe_attention(q, k, v, rec, layout=layout).out, ref)
    qkv, route = operands(q, k, v, rec, layout)
    kw = dict(num_heads=2, scale=1 / 8, return_lse=True, routing=route)
    base, base_lse = fp8_attention_fwd(qkv, sparse=SparseConfig(
        schedule="rows", kv_splits=1, summary_precision="ieee", tma=False), **kw)
    same, _ = fp8_attention_fwd(qkv, sparse=SparseConfig(
        schedule="heavy_first", kv_splits=1, summary_precision="ieee", tma=False), **kw)
    assert torch.equal(same, base)
    e_base = rel_l2(base, ref)
    for sparse in (SparseConfig(kv_splits=2, summary_precision="ieee"),
                   SparseConfig(kv_splits=4, summary_chunk=16, summary_precision="ieee"),
                   SparseConfig(kv_splits=1, summary_precision="bf16"),
                   SparseConfig(kv_splits=1, summary_precision="ieee")):
        out, lse = fp8_attention_fwd(qkv, sparse=sparse, **kw)
        assert rel_l2(out, ref) <= 1.25 * e_emu, sparse
        assert rel_l2(out, base.double()) < 0.2 * e_base, sparse
        assert float((lse - base_lse).abs().max()) < 1e-2


@cpu_only
@pytest.mark.parametrize("name", ["fp8_sol_kv_corrected:sol_tau=0.5",
                                  "fp8_dense_kv_corrected:dense_prefix=true",
                                  "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.3"])
def test_prefix_blocks_skipped_without_lse_same_output(name):
    """Without an LSE the FP8 programs of query blocks made only of dense-prefix rows return at
    once (their rows are the BF16 prefix rows'): the output is bitwise the one of the call that
    writes the LSE and so runs them, also in the summary pass and with two KV parts (whose
    combine pass skips those blocks too: their parts are never written); with a prefix of 150
    rows, two of seven 64-row blocks are skipped."""
    q, k, v, layout = synthetic(420, 2, 1, 64, seed=4, prefix=(30, 120))
    for cfg in (DEFAULT, DEFAULT.with_sparse(kv_splits=2)):
        full, _ = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, return_lse=True,
                                                config=cfg)
        skipped = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, config=cfg)
        assert torch.equal(full, skipped), (name, cfg.sparse.kv_splits)
        ref = dispatch.dense_prefix_rows(q, k, v, layout.prefix_len, 64**-0.5)
        assert torch.equal(skipped[:, :layout.prefix_len], ref)


@cpu_only
def test_summary_tiles_round_the_route_operands_as_documented():
    """The E4M3 operands of Sol's summary route as tiles of the list kernel (``summary_tiles``,
    host side): kc8 * skc and vc8 * 256 s_v decode to the routing's FP32 block means and sums
    within E4M3's rounding (half a step: 1/16 of the value, or the subnormal step), skc puts
    each head's largest |kc| at 448, vc's codes stay within 64 x 448 / 256 = 112, the short
    last block's sum (40 of 64 rows) stored times 64 / 40, nothing past the key blocks, and V^T's
    columns are in P's register order (``quantize.v_token_order``); the kernel (one launch)
    gives its torch twin's values."""
    from workbench.kernels.attention_fp8_ws_lists import (
        last_block_rows,
        summary_tiles,
        summary_tiles_torch,
    )
    from workbench.kernels.quantize import v_token_order

    q, k, v, layout = synthetic(1000, 2, 1, 128, seed=5)
    qkv, route = operands(q, k, v, get_recipe("fp8_sol_kv_corrected"), layout)
    t = summary_tiles(qkv, route)
    B, Hkv, nk, D = route.kc.shape
    assert nk == 16 and t.kc8.shape == (B, Hkv, 128, D) and t.vc8t.shape == (B, Hkv, D, 128)
    skc = t.skc.view(B, Hkv, 1, 1)
    kc = t.kc8[:, :, :nk].float() * skc
    assert bool(((kc - route.kc).abs() <= route.kc.abs() / 16 + skc * 2**-9).all())
    peak = route.kc.abs().amax(dim=(-2, -1)) / t.skc.view(B, Hkv)
    assert float((peak - 448).abs().max()) < 1e-3, peak
    assert float(t.kc8[:, :, nk:].float().abs().max()) == 0
    natural = torch.empty_like(t.vc8t)
    natural[..., v_token_order(128, qkv.v_perm)] = t.vc8t
    codes = natural.float()
    assert qkv.v_perm and 0 < float(codes.abs().max()) <= 112
    assert float(codes[..., nk:].abs().max()) == 0
    step = 256 * qkv.v_scale[:, :, None, :]
    assert last_block_rows(1000) == 40 and last_block_rows(1024) == 64
    vc = codes[..., :nk].transpose(-1, -2) * step
    vc[:, :, -1] *= 40 / 64
    assert bool(((vc - route.vc).abs() <= route.vc.abs() / 16 + step * 2**-9).all())
    # the last block's codes are its sum's times 64 / 40, not its sum's
    plain = (route.vc[:, :, -1] / step[:, :, 0]).abs()
    assert float(codes[..., nk - 1].abs().amax() / plain.amax()) > 1.4
    # the kernel's operands are its torch twin's values (a zero's sign may differ: the
    # interpreter's explicit rounding gives +0 where torch's cast keeps -0)
    twin = summary_tiles_torch(qkv, route)
    for name in ("kc8", "vc8t"):
        assert torch.equal(getattr(t, name).float(), getattr(twin, name).float()), name
    assert torch.equal(t.skc, twin.skc)
    # a Sol call's routing front makes them (and V's scales) from the block sums: the same
    # values, for operands quantized with those scales, in both column orders
    rec = get_recipe("fp8_sol_kv_corrected")
    sums = dispatch.sparse_block_sums(q, k, v)
    for perm in (True, False):
        mu_k, mu_v, v_amax, r = routing.sol_routing_fused(sums, rec, layout=layout,
                                                          tiles=True, v_perm=perm)
        qf = quantize_qkv(q, k, v, mu_k, mu_v, v_amax, smooth_k=True, smooth_v=True,
                          v_bias_correction=True, config=QuantConfig(v_perm=perm),
                          v_scales=r.v_scales)
        assert r.tiles.fits(qf) and not r.tiles.fits(qkv)
        want = summary_tiles(qf, r)
        for name in ("kc8", "vc8t", "skc"):
            assert torch.equal(getattr(r.tiles, name).float(), getattr(want, name).float()), \
                (name, perm)
        assert r.tiles.last_log2 == want.last_log2


def test_sparse_config_rules_and_refusals():
    assert SparseConfig().splits_for(28560, 132) == 1  # H3: 72 waves of 3 programs per SM
    assert SparseConfig().splits_for(500, 132) == 2 and SparseConfig().splits_for(50, 132) == 4
    assert SparseConfig(kv_splits=2).splits_for(28560, 132) == 2
    for bad in (dict(schedule="random"), dict(kv_splits=3), dict(summary_precision="fp8"),
                dict(summary_chunk=48), dict(ws_grouping="random"),
                dict(summary_kernel="cuda")):
        with pytest.raises(ValueError, match="SparseConfig"):
            SparseConfig(**bad)
    cfg = DEFAULT.from_overrides({"sparse": {"kv_splits": 4}})
    assert cfg.sparse.kv_splits == 4 and cfg.attention == DEFAULT.attention
    with pytest.raises(ValueError, match="section"):
        DEFAULT.from_overrides({"sparsity": {}})


def test_ws_query_order_groups_blocks_of_like_list_length():
    """The warp-specialized exact tiles' CTA grouping: per head a permutation of the query
    blocks, longest list first, ties in sequence order; "consecutive" is one shared order."""
    from workbench.kernels.attention_fp8_ws_lists import query_order

    counts = torch.tensor([[[3, 9, 9, 1, 5], [2, 2, 2, 2, 2]]], dtype=torch.int32)
    order = query_order(counts, "by_length")
    assert order.dtype == torch.int32 and order.tolist() == [[1, 2, 4, 0, 3], [0, 1, 2, 3, 4]]
    assert query_order(counts, "consecutive").tolist() == [[0, 1, 2, 3, 4]]
    # many ties over more than one chunk of the sorting kernel, against torch's stable sort
    many = torch.randint(0, 7, (3, 1, 70), generator=torch.Generator().manual_seed(2),
                         dtype=torch.int32)
    want = torch.argsort(many.reshape(3, 70), dim=1, descending=True, stable=True)
    assert torch.equal(query_order(many, "by_length").long(), want)
    longer = torch.randint(0, 40, (2, 1, 1100), generator=torch.Generator().manual_seed(3),
                           dtype=torch.int32)  # more blocks than one comparison step (512)
    want = torch.argsort(longer.reshape(2, 1100), dim=1, descending=True, stable=True)
    assert torch.equal(query_order(longer, "by_length").long(), want)
    with pytest.raises(ValueError, match="grouping"):
        query_order(counts, "random")


def test_bf16_baselines_are_supported_only_as_they_are_emulated():
    q, k, v, _ = synthetic(200, 2, 2, 64)
    ok = dispatch.unsupported_reason
    assert ok(q, k, v, get_recipe("vsa_bf16")) is None
    assert ok(q, k, v, get_recipe("bf16:sparsity=sol")) is None
    assert "unsmoothed" in ok(q, k, v, get_recipe("bf16:sparsity=sol,smoothing=kv"))
    assert "bf16 operands" in ok(q.half(), k.half(), v.half(), get_recipe("vsa_bf16"))
    assert "fp8_e4m3" in ok(q, k, v, get_recipe("bf16"))  # dense BF16: SDPA's job
    assert "row_sum" in ok(q, k, v, get_recipe("vsa_bf16:row_sum=p_operand"))
    # the kernel entry refuses it too (its row sum would round P to E4M3, P @ V takes BF16 P)
    from workbench.kernels.quantize import bf16_operands

    with pytest.raises(ValueError, match="row_sum='p_operand' with BF16 operands"):
        fp8_attention_fwd(bf16_operands(q, k, v), num_heads=2, scale=0.125,
                          row_sum="p_operand")


def test_bf16_operands_keep_the_values_in_the_kernel_layouts():
    from workbench.kernels.quantize import bf16_operands, padded_len

    q, k, v, _ = synthetic(200, 4, 2, 64)
    ops = bf16_operands(q, k, v)
    S_pad = padded_len(200)
    assert ops.q8.shape == (1, 4, S_pad, 64) and ops.k8.shape == (1, 2, S_pad, 64)
    assert ops.v8t.shape == (1, 2, 64, S_pad) and not ops.v_perm and ops.seq_len == 200
    assert torch.equal(ops.q8[:, :, :200], q.transpose(1, 2))
    assert torch.equal(ops.v8t[..., :200], v.permute(0, 2, 3, 1))
    assert not ops.k8[:, :, 200:].any() and not ops.v8t[..., 200:].any()
    assert bool((ops.q_scale == 1).all() and (ops.v_scale == 1).all()) and not ops.v_corr.any()


@cpu_only
def test_sparse_launch_refuses_mismatched_routing_and_tiles():
    q, k, v, layout = synthetic(200, 2, 2, 64)
    rec = get_recipe("fp8_sol_kv_corrected")
    qkv, route = operands(q, k, v, rec, layout)
    with pytest.raises(ValueError, match="block_m"):
        fp8_attention_fwd(qkv, num_heads=2, scale=1 / 8, routing=route,
                          config=replace(DEFAULT.attention, block_m=128))
    q2, k2, v2, layout2 = synthetic(300, 2, 2, 64)
    qkv2, _ = operands(q2, k2, v2, rec, layout2)
    with pytest.raises(ValueError, match="routing: lists"):
        fp8_attention_fwd(qkv2, num_heads=2, scale=1 / 8, routing=route)
    with pytest.raises(ValueError, match="block_m"):
        dispatch.fp8_recipe_attention(q, k, v, rec, layout=layout,
                                      config=DEFAULT.with_attention(block_m=128))


# ------------------------------------------------------------------------------------------------
# GPU (compiled kernels)

hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="needs a Hopper (sm_90+) CUDA GPU")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape,name,sparse", [
    ((4111, 4, 4, 128), "fp8_sol_kv_corrected", SparseConfig()),
    ((4111, 4, 4, 128), "fp8_sol_kv_corrected:sol_threshold=diag,sol_tau=0.3",
     SparseConfig(kv_splits=1, summary_precision="tf32")),
    ((2000, 4, 2, 64), "fp8_sol_k:sol_tau=1.5", SparseConfig(kv_splits=4, tma=False)),
    ((4111, 4, 4, 128), "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.2",
     SparseConfig(kv_splits=1, schedule="rows")),
    ((2000, 4, 2, 64), "fp8_sol_kv_corrected:p_scaling=exp2_offset8",
     SparseConfig(kv_splits=2, summary_precision="ieee")),
    ((4111, 4, 4, 128), "bf16:sparsity=sol", SparseConfig()),
    ((2000, 4, 2, 64), "vsa_bf16:vsa_keep=0.2", SparseConfig(kv_splits=2)),
    # the warp-specialized exact tiles (one KV part: at this size the split rule picks two)
    ((4111, 4, 2, 128), "fp8_sol_kv_corrected",
     SparseConfig(schedule="warp_specialized", kv_splits=1)),
    ((4111, 4, 4, 128), "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.2",
     SparseConfig(schedule="warp_specialized", kv_splits=1)),
    # Sol's summary route as E4M3 tiles of that kernel: one tile with a short last block, two
    # tiles ending on a full one (8320 = 130 blocks of 64; 8192, 128 blocks, is one tile), a
    # denser route; with a scaled P (the first summary tile divides the exact tiles' state by 2^8)
    ((4111, 4, 2, 128), "fp8_sol_kv_corrected",
     SparseConfig(kv_splits=1, summary_kernel="fp8_tiles")),
    ((8320, 2, 2, 128), "fp8_sol_kv_corrected",
     SparseConfig(kv_splits=1, summary_kernel="fp8_tiles")),
    ((8192, 2, 1, 128), "fp8_sol_kv_corrected:sol_threshold=diag,sol_tau=0.3",
     SparseConfig(kv_splits=1, summary_kernel="fp8_tiles")),
    ((2000, 4, 2, 128), "fp8_sol_kv_corrected:p_scaling=exp2_offset8",
     SparseConfig(kv_splits=1, summary_kernel="fp8_tiles")),
    # the row sum of the E4M3 P: P @ ones in the warp-specialized exact tiles (Sol with its
    # summary tiles, with its own summary pass, VSA), FP32 adds in the programs kernel
    ((4111, 4, 2, 128), "fp8_sol_kv_corrected:row_sum=p_operand",
     SparseConfig(kv_splits=1, summary_kernel="fp8_tiles")),
    ((4111, 4, 2, 128), "fp8_sol_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand",
     SparseConfig(kv_splits=1, schedule="warp_specialized")),
    ((4111, 4, 4, 128), "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.2,row_sum=p_operand",
     SparseConfig(schedule="warp_specialized", kv_splits=1)),
    ((2000, 4, 2, 64), "fp8_sol_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand",
     SparseConfig(kv_splits=2, summary_precision="ieee")),
    # whole CTAs of prefix blocks on the dense kernel, on a side stream, with P @ ones too
    ((4111, 4, 2, 128), PREFIX_EXACT + ",row_sum=p_operand", SparseConfig(kv_splits=1)),
    # P's E4M3 codes without an exponential (p_exp "log_linear"): the list kernel with its
    # summary tiles and with the summary pass, VSA, the prefix blocks on the dense kernel, the
    # programs kernel in two KV parts
    ((4111, 4, 2, 128), LL, SparseConfig(kv_splits=1, summary_kernel="fp8_tiles")),
    ((8300, 2, 2, 128), LL, SparseConfig(kv_splits=1, summary_kernel="fp8_tiles")),
    ((4111, 4, 2, 128), LL, SparseConfig(kv_splits=1, schedule="warp_specialized",
                                         summary_kernel="gluon")),
    ((4111, 4, 4, 128), LL + ",sparsity=vsa,vsa_keep=0.2",
     SparseConfig(schedule="warp_specialized", kv_splits=1)),
    ((4111, 4, 2, 128), LL + ",dense_prefix=false,prefix_blocks_exact=true",
     SparseConfig(kv_splits=1)),
    ((2000, 4, 2, 64), LL, SparseConfig(kv_splits=2, summary_precision="ieee")),
])
def test_gpu_sparse_kernel_error_within_125_percent_of_the_emulation(shape, name, sparse):
    S, H, Hkv, D = shape
    q, k, v, layout = synthetic(S, H, Hkv, D, seed=S + D, prefix=(14, 100), device="cuda")
    idx = evenly_spaced_rows(S, 256).cuda()
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    emu = recipe_attention(q, k, v, name, query_index=idx, layout=layout)
    out = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout,
                                        config=replace(DEFAULT, sparse=sparse))
    assert out.isfinite().all()
    e_k, e_e = rel_l2(out[:, idx], ref), rel_l2(emu.out, ref)
    print(f"GPU {name} {shape} {sparse}: kernel {e_k:.4e} emulation {e_e:.4e} "
          f"density {emu.exact_fraction:.3f}")
    assert e_k <= 1.25 * e_e, (e_k, e_e)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("name", ["fp8_sol_kv_corrected",
                                  "fp8_dense_kv_corrected:dense_prefix=true",
                                  "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.2"])
def test_gpu_prefix_blocks_skipped_without_lse_same_output(name):
    """As the CPU test, on the compiled kernels (the warp-specialized ones included): 314
    prefix rows, so 4 of 65 query blocks of 64 rows (1 of 22 dense CTAs of 192) return at
    once; the output equals the LSE-writing call's bitwise."""
    q, k, v, layout = synthetic(4111, 4, 2, 128, seed=3, prefix=(14, 300), device="cuda")
    full, _ = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, return_lse=True)
    skipped = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout)
    print(f"GPU prefix skip {name}: {int((full != skipped).sum())} of {full.numel()} differ")
    assert torch.equal(full, skipped)


@pytest.mark.gpu
@hopper
def test_gpu_summary_tiles_skip_prefix_blocks_and_keep_the_lse():
    """Sol's summary route as E4M3 tiles (``summary_kernel="fp8_tiles"``): the output without
    the LSE (4 prefix blocks of 65 skipped) equals the LSE-writing call's bitwise, and its LSE
    is the summary pass's to 0.02 (the route's operands in E4M3 instead of BF16)."""
    q, k, v, layout = synthetic(4111, 4, 2, 128, seed=3, prefix=(14, 300), device="cuda")
    name = "fp8_sol_kv_corrected"
    tiles = DEFAULT.with_sparse(summary_kernel="fp8_tiles", kv_splits=1)  # the list kernel
    full, lse = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, return_lse=True,
                                              config=tiles)
    skipped = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, config=tiles)
    pass_cfg = DEFAULT.with_sparse(kv_splits=1, summary_kernel="gluon")
    _, lse_pass = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, return_lse=True,
                                                config=pass_cfg)
    diff = float((lse - lse_pass).abs().max())
    print(f"GPU summary tiles: {int((full != skipped).sum())} differ without the LSE; LSE max "
          f"|diff| vs the pass {diff:.2e}")
    assert torch.equal(full, skipped) and lse.isfinite().all() and 0 < diff < 0.02


@pytest.mark.gpu
@hopper
def test_gpu_summary_tiles_with_a_scaled_p_agree_with_the_summary_pass():
    """With ``p_scaling="exp2_offset8"`` the exact tiles' state is 2^8 times the unit P's and
    the summary tiles (whose P stays 256 w) divide it back before adding their blocks: against
    the summary as its own pass (which merges in log2 units) the tiles stay as close as with the
    unit P (a missing or doubled factor 2^8 would weigh the route's blocks 256x off), the
    output without the LSE equals the LSE-writing call's bitwise, and the LSE (natural log)
    is the pass's to 0.02 as for the unit P."""
    q, k, v, layout = synthetic(4111, 4, 2, 128, seed=5, prefix=(14, 100), device="cuda")
    tiles = DEFAULT.with_sparse(summary_kernel="fp8_tiles", kv_splits=1)
    pass_cfg = DEFAULT.with_sparse(summary_kernel="gluon", kv_splits=1)
    gaps = {}
    for p_scaling in ("unit", "exp2_offset8"):
        name = f"fp8_sol_kv_corrected:p_scaling={p_scaling},row_sum=p_operand"
        a, lse_a = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, config=tiles,
                                                 return_lse=True)
        a0 = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, config=tiles)
        b, lse_b = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout,
                                                 config=pass_cfg, return_lse=True)
        assert torch.equal(a, a0), p_scaling
        gaps[p_scaling] = (rel_l2(a, b), float((lse_a - lse_b).abs().max()))
    print(f"GPU summary tiles vs pass (rel-L2, LSE max |diff|): {gaps}")
    (g_unit, l_unit), (g_scaled, l_scaled) = gaps["unit"], gaps["exp2_offset8"]
    assert 0 < g_scaled < 1.5 * g_unit + 1e-4 and g_scaled < 0.01, gaps
    assert l_scaled < 0.02 and l_unit < 0.02, gaps


@pytest.mark.gpu
@hopper
def test_gpu_summary_tiles_weigh_the_short_last_block():
    """The sequence's last key block holds 15 of 64 rows (S = 4111): in the E4M3 summary tiles
    its weight carries 15 / 64 through its score bias and its vc8 column is its sum times
    64 / 15. Its values are shifted by 8 so that it matters: on the rows whose query block
    takes it through the summary route the shift moves the output by ~2.6% (emulation, CPU),
    and a weight off by 64 / 15 would put the tiles ~3x that away from the summary pass (FP32
    route). Asserted: the tiles within 0.4x the shift's effect of the pass, and within 1.25x
    the emulation's error against float64 on those rows."""
    q, k, v, layout = synthetic(4111, 4, 2, 128, seed=11, prefix=(14, 100), device="cuda")
    name = "fp8_sol_kv_corrected"
    _, route = operands(q, k, v, get_recipe(name), layout)
    shifted = v.clone()
    shifted[:, 4096:] += 8.0
    rows = evenly_spaced_rows(4111, 256).cuda()
    summ = ~route.exact[0, :, rows // 64, -1]  # [H, rows]: the last block by the summary route
    sel = summ.T[None, :, :, None].expand(1, rows.numel(), 4, 128)
    tiles = DEFAULT.with_sparse(summary_kernel="fp8_tiles", kv_splits=1)
    pass_cfg = DEFAULT.with_sparse(summary_kernel="gluon", kv_splits=1)
    a = dispatch.fp8_recipe_attention(q, k, shifted, name, layout=layout, config=tiles)[:, rows]
    b = dispatch.fp8_recipe_attention(q, k, shifted, name, layout=layout,
                                      config=pass_cfg)[:, rows]
    b0 = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, config=pass_cfg)[:, rows]
    ref, _ = dense_attention_f64(q, k, shifted, query_index=rows)
    emu = recipe_attention(q, k, shifted, name, query_index=rows, layout=layout).out

    def rel(x, y):
        return float((x.double() - y.double())[sel].norm() / y.double()[sel].norm())

    d_tiles, effect = rel(a, b), rel(b0, b)
    e_k, e_e = rel(a, ref), rel(emu, ref)
    print(f"GPU summary tiles, short last block: {int(summ.sum())} of {summ.numel()} (head, row) "
          f"by the route; tiles vs pass {d_tiles:.3e}, the shift's effect {effect:.3e}; vs f64 "
          f"kernel {e_k:.4e} emulation {e_e:.4e}")
    assert summ.float().mean() > 0.5 and effect > 0.01, effect
    assert d_tiles < 0.4 * effect and e_k <= 1.25 * e_e, (d_tiles, effect, e_k, e_e)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("name,chunk", [
    ("fp8_sol_kv_corrected", 32),
    ("fp8_sol_kv_corrected:sol_threshold=diag,sol_tau=0.3,p_scaling=exp2_offset8", 16),
    ("fp8_sol_kv_corrected:sol_tau=-inf", 32),  # no summary block at all
])
def test_gpu_summary_pass_gluon_matches_triton(name, chunk, monkeypatch):
    """Sol's summary pass in Gluon against the Triton pass on the same lists: the same products
    in the same chunks, summed into the rescaled accumulator instead of a fresh one, so the
    outputs agree to float rounding (H200, 2026-12-01: the same output bits and LSE in every
    case)."""
    from workbench.kernels import summary_gluon

    calls = []
    real = summary_gluon.summary_pass
    monkeypatch.setattr(summary_gluon, "summary_pass",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v, layout = synthetic(4111, 4, 2, 128, seed=7, prefix=(14, 100), device="cuda")
    rec = get_recipe(name)
    qkv, route = operands(q, k, v, rec, layout)
    outs = [fp8_attention_fwd(qkv, num_heads=4, scale=128**-0.5, routing=route,
                              return_lse=True, p_scaling=rec.p_scaling,
                              sparse=SparseConfig(summary_kernel=kern, summary_chunk=chunk))
            for kern in ("gluon", "triton")]
    assert calls == [1]  # the Gluon pass ran once, the Triton one the other time
    (a, lse_a), (b, lse_b) = outs
    assert a.isfinite().all()
    ulps = bf16_ulps(a, b)
    print(f"GPU summary pass gluon vs triton {name} (chunk {chunk}, density "
          f"{route.density:.3f}): {int((ulps > 0).sum())} of {a.numel()} differ, max "
          f"{float(ulps.max()):.0f} BF16 ulp, LSE max |diff| "
          f"{float((lse_a - lse_b).abs().max()):.2e}")
    assert float(ulps.max()) <= 1 and float((ulps > 0).float().mean()) < 1e-3
    torch.testing.assert_close(lse_a, lse_b, rtol=0, atol=1e-5)


@pytest.mark.gpu
@hopper
def test_gpu_every_block_exact_is_the_dense_kernel_bitwise():
    q, k, v, layout = synthetic(4111, 4, 2, 128, seed=1, device="cuda")
    rec = get_recipe("fp8_sol_kv_corrected:sol_tau=-inf")
    qkv, route = operands(q, k, v, rec, layout)
    dense, _ = fp8_attention_fwd(qkv, num_heads=4, scale=128**-0.5)
    for tma in (True, False):
        out, _ = fp8_attention_fwd(qkv, num_heads=4, scale=128**-0.5, routing=route,
                                   sparse=SparseConfig(kv_splits=1, tma=tma))
        ulps = bf16_ulps(out, dense)
        print(f"GPU all-exact vs dense (tma={tma}): {int((ulps > 0).sum())} of {ulps.numel()} "
              f"differ, max {float(ulps.max()):.0f} BF16 ulp")
        assert bool((ulps <= 1).all())  # the last bit of BF16 at most


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("summary_kernel", ["gluon", "fp8_tiles"])
def test_gpu_h3_rows_sol_against_the_emulation(summary_kernel):
    """8 heads of the synthetic H3 input at its full length: Sol at tau = 1 on 256 rows, the
    summary route as its own pass or as E4M3 tiles of the exact-tile kernel."""
    from workbench.synthetic import H3_SYNTHETIC

    q, k, v = (t.contiguous() for t in synthetic_qkv(H3_SYNTHETIC, heads=range(8),
                                                     device="cuda"))
    layout = H3_SYNTHETIC.layout
    idx = evenly_spaced_rows(q.shape[1], 256).cuda()
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    emu = recipe_attention(q, k, v, "fp8_sol_kv_corrected", query_index=idx, layout=layout)
    cfg = replace(DEFAULT, sparse=replace(DEFAULT.sparse, summary_kernel=summary_kernel))
    out = dispatch.fp8_recipe_attention(q, k, v, "fp8_sol_kv_corrected", layout=layout,
                                        config=cfg)
    e_k, e_e = rel_l2(out[:, idx], ref), rel_l2(emu.out, ref)
    print(f"GPU H3 8 heads ({summary_kernel}): kernel {e_k:.4e} emulation {e_e:.4e} density "
          f"{emu.exact_fraction:.4f}")
    assert e_k <= 1.25 * e_e and math.isfinite(e_k)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("name", [PREFIX_EXACT,
                                  "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.2,"
                                  "dense_prefix=false,prefix_blocks_exact=true"])
def test_gpu_prefix_blocks_exact_rows_are_the_dense_fp8_rows(name, monkeypatch):
    """As the CPU test on the compiled kernels (the two query blocks holding the 114 prefix
    rows walk lists of all 65 key blocks); then the warp-specialized paths, one KV part (at this
    size the split rule would pick two, and the programs kernel): 314 prefix rows in a batch of
    two, so 5 such blocks per head, the first three (a whole CTA) on the dense kernel on a side
    stream (``SparseConfig.dense_rows_kernel``), the other two in the list kernel, their CTAs
    first (``heavy_groups``); with the LSE all five in the list kernel."""
    check_prefix_blocks(name, 4111, 4, 2, 128, "cuda")

    from workbench.kernels import attention_fp8_ws

    parts = [synthetic(4111, 4, 2, 128, seed=4111 + b, prefix=(14, 300), device="cuda")
             for b in (5, 6)]
    q, k, v = (torch.cat([p[i] for p in parts]) for i in range(3))
    qkv, route = operands(q, k, v, get_recipe(name), parts[0][3])
    assert route.dense_rows == 5
    one_part = replace(DEFAULT.sparse, kv_splits=1)
    lists_only = replace(one_part, dense_rows_kernel=False)
    row_ends, heavy = [], []
    real_ws, real_heavy = attention_fp8_ws.fp8_attention_fwd_ws, ws_lists.heavy_groups

    def spy_ws(*a, **kw):
        row_ends.append(kw.get("row_end"))
        return real_ws(*a, **kw)

    def spy_heavy(n, groups):
        heavy.append(real_heavy(n, groups))
        return heavy[-1]

    monkeypatch.setattr(attention_fp8_ws, "fp8_attention_fwd_ws", spy_ws)
    monkeypatch.setattr(ws_lists, "heavy_groups", spy_heavy)
    kw = dict(num_heads=4, scale=128**-0.5)
    first, lse1 = fp8_attention_fwd(qkv, routing=route, return_lse=True, sparse=one_part, **kw)
    grid, lse0 = fp8_attention_fwd(qkv, routing=replace(route, dense_rows=0), return_lse=True,
                                   sparse=one_part, **kw)
    assert heavy == [2, 0] and row_ends == []  # the list kernel, its CTAs reordered or not
    assert torch.equal(first, grid) and torch.equal(lse1, lse0)  # CTA order: the same bits
    split, _ = fp8_attention_fwd(qkv, routing=route, sparse=one_part, **kw)
    assert row_ends == [192]  # the dense kernel took the first CTA's rows
    lists, _ = fp8_attention_fwd(qkv, routing=route, sparse=lists_only, **kw)
    assert row_ends == [192] and torch.equal(lists, first)
    # the dense kernel adds each 128-key tile's row sum at once, the list kernel per 64-key box
    ulps = bf16_ulps(split[:, :192], lists[:, :192])
    print(f"GPU dense-kernel rows: {int((ulps > 0).sum())} of {ulps.numel()} differ, max "
          f"{float(ulps.max()):.0f} BF16 ulp")
    assert bool((ulps <= 1).all()) and float((ulps > 0).float().mean()) < 0.05
    assert torch.equal(split[:, 192:], lists[:, 192:])
    for _ in range(2):  # the side stream's rows are joined before the call returns
        assert torch.equal(fp8_attention_fwd(qkv, routing=route, sparse=one_part, **kw)[0],
                           split)


@pytest.mark.gpu
@hopper
def test_gpu_prefix_rows_on_a_side_stream_give_the_same_bits():
    """The BF16 prefix rows computed concurrently on a side stream (the default) equal the
    rows computed after the FP8 passes, and every row is written, for a Sol recipe and a dense
    one with a dense prefix, twice in a row (the side stream's memory is reused safely)."""
    q, k, v, layout = synthetic(4111, 4, 2, 128, seed=3, prefix=(14, 100), device="cuda")
    serial = replace(DEFAULT, attention=replace(DEFAULT.attention, prefix_stream=False))
    for name in ("fp8_sol_kv_corrected", "fp8_dense_kv_corrected:dense_prefix=true"):
        a = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout, config=serial)
        for _ in range(2):
            b = dispatch.fp8_recipe_attention(q, k, v, name, layout=layout)
            assert torch.equal(a, b), name
        assert a.isfinite().all()


@cpu_only
def test_log_linear_codes_in_two_kv_parts():
    """p_exp="log_linear" with the exact tiles in two KV parts (each part's state divided by
    the codes' bias and taken to its own row max before the combine pass): within the 1.25x
    rule, its LSE within 2e-2 of the emulation's like one part's (measured 7.6e-3 for both),
    and no invalid arithmetic for a part without tiles (its row max -inf)."""
    import warnings

    name = "fp8_sol_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand,p_exp=log_linear"
    q, k, v, layout = synthetic(400, 4, 2, 64, seed=5)
    ref, _ = dense_attention_f64(q, k, v)
    emu = recipe_attention(q, k, v, name, layout=layout)
    rows = slice(layout.prefix_len, None)
    for splits in (1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            out, lse = dispatch.fp8_recipe_attention(
                q, k, v, name, layout=layout, return_lse=True,
                config=DEFAULT.with_sparse(kv_splits=splits, summary_precision="ieee"))
        e_k, e_e = rel_l2(out, ref), rel_l2(emu.out, ref)
        d_lse = float((lse.transpose(1, 2)[:, rows].double()
                       - emu.lse[:, rows].double()).abs().max())
        print(f"log_linear, {splits} KV parts: kernel {e_k:.4e} emulation {e_e:.4e}, "
              f"LSE {d_lse:.2e}")
        assert e_k <= 1.25 * e_e and d_lse < 2e-2, (splits, e_k, e_e, d_lse)
