"""Block routing for sparse recipes: Sol (exact / summary routes) and VSA (top-k tiles).

Both return a boolean block map [B, H, n_qblocks, n_kblocks]: True where the (query block, key
block) pair is computed exactly. Blocks are contiguous runs of ``sol_block`` / ``vsa_tile`` rows
starting at row 0; the last block may be partial. VSA's cube tiles (4,4,4) / (4,8,8) are contiguous
only after the video rows are permuted into tile order: ``tile_order`` gives that permutation.
"""

from __future__ import annotations

import math

import torch

from workbench.recipes import AttentionRecipe

from .layout import SegmentLayout

LOG2E = 1.4426950408889634


def block_reduce(
    x: torch.Tensor, block: int, op: str = "mean"
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, S, H, D] -> ([B, H, nb, D] per-block mean or sum over real rows, lengths [nb])."""
    B, S, H, D = x.shape
    nb = math.ceil(S / block)
    pad = nb * block - S
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    full = S // block
    # sum the whole blocks through a view, the partial tail separately (no padded copy)
    sums = x[:, : full * block].reshape(B, full, block, H, D).sum(dim=2, dtype=dt)
    if pad:
        tail = x[:, full * block :].sum(dim=1, dtype=dt)[:, None]
        sums = torch.cat([sums, tail], 1)
    sums = sums.transpose(1, 2)  # [B, H, nb, D]
    lens = torch.full((nb,), float(block), device=x.device, dtype=dt)
    lens[-1] = S - (nb - 1) * block
    if op == "sum":
        return sums, lens
    return sums / lens[:, None], lens


def _expand(t: torch.Tensor, group: int) -> torch.Tensor:
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def sol_threshold(
    qbar: torch.Tensor, kcent: torch.Tensor, tau: float, mode: str, c: float
) -> torch.Tensor:
    """theta_i = mu + tau * sigma per query block. qbar [B, H, nq, D], kcent [B, H, nk, D]."""
    kmean = kcent.mean(dim=2)  # [B, H, D]
    mu = (qbar * kmean[:, :, None]).sum(-1) * c
    if math.isinf(tau):
        return torch.full_like(mu, tau)
    dev = kcent - kmean[:, :, None]
    if mode == "exact":
        cov = dev.transpose(-1, -2) @ dev / kcent.shape[2]  # [B, H, D, D]
        var = ((qbar @ cov) * qbar).sum(-1)
    else:
        var = (qbar**2 * (dev**2).mean(dim=2)[:, :, None]).sum(-1)
    sigma = var.clamp(min=0).sqrt() * c
    return mu + tau * sigma


def sol_scores(
    qbar: torch.Tensor, kcent: torch.Tensor, recipe: AttentionRecipe, c: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sol's coarse scores and thresholds in the log2 domain from FP32 block means.

    qbar [B, H, nq, D], kcent [B, H, nk, D] (K block means, one K/V head per query head) ->
    (scores qbar_i . kc_j * c [B, H, nq, nk], theta [B, H, nq]).
    """
    scores = (qbar @ kcent.transpose(-1, -2)) * c
    theta = sol_threshold(qbar, kcent, recipe.sol_tau, recipe.sol_threshold, c)
    return scores, theta


def sol_exact(
    scores: torch.Tensor, theta: torch.Tensor, recipe: AttentionRecipe, prefix_len: int
) -> torch.Tensor:
    """Sol decisions [B, H, nq, nk] bool: score above theta, the diagonal band, or the sink (key
    blocks holding prefix rows); with ``prefix_blocks_exact`` also every pair of a query block
    holding prefix rows."""
    exact = scores > theta[..., None]
    nq, nk = scores.shape[-2:]
    i = torch.arange(nq, device=scores.device)[:, None]
    j = torch.arange(nk, device=scores.device)[None, :]
    exact |= (i - j).abs() <= recipe.sol_band
    exact |= j * recipe.sol_block < prefix_len
    return exact_prefix_blocks(exact, recipe, recipe.sol_block, prefix_len)


def prefix_query_blocks(recipe: AttentionRecipe, prefix_len: int, block: int, nq: int) -> int:
    """Leading query blocks (of nq) routed to every key block: those holding prefix rows (i *
    block < prefix_len) when the recipe has ``prefix_blocks_exact``, else none."""
    if not recipe.prefix_blocks_exact or prefix_len <= 0:
        return 0
    return min(nq, -(-prefix_len // block))


def exact_prefix_blocks(exact: torch.Tensor, recipe: AttentionRecipe, block: int,
                        prefix_len: int) -> torch.Tensor:
    """exact [..., nq, nk] with the rows of the ``prefix_query_blocks`` all True."""
    n = prefix_query_blocks(recipe, prefix_len, block, exact.shape[-2])
    if not n:
        return exact
    exact = exact.clone()
    exact[..., :n, :] = True
    return exact


def sol_block_map(
    q: torch.Tensor,
    k_smoothed: torch.Tensor,
    v_smoothed: torch.Tensor,
    recipe: AttentionRecipe,
    layout: SegmentLayout,
    scale: float,
    group: int = 1,
):
    """Sol routing. q [B, S, H, D]; k/v (after smoothing) [B, S, Hkv, D], FP32.

    Pair (i, j) is exact if qbar_i . kc_j * c > theta_i, or |i - j| <= band, or key block j holds
    prefix rows (the sink). Returns (block_map [B, H, nq, nk], kc [B, Hkv, nk, D] block means of K,
    vc [B, Hkv, nk, D] block sums of V, block lengths [nk]).
    """
    blk = recipe.sol_block
    c = scale * LOG2E
    qbar, _ = block_reduce(q, blk, "mean")
    kcent, lens = block_reduce(k_smoothed, blk, "mean")
    vsum, _ = block_reduce(v_smoothed, blk, "sum")
    scores, theta = sol_scores(qbar, _expand(kcent, group), recipe, c)
    return sol_exact(scores, theta, recipe, layout.prefix_len), kcent, vsum, lens


def vsa_block_map(
    q: torch.Tensor,
    k: torch.Tensor,
    recipe: AttentionRecipe,
    layout: SegmentLayout,
    scale: float,
    group: int = 1,
) -> torch.Tensor:
    """VSA tile selection: coarse scores qbar . kbar * scale; keep ceil(keep * n) key tiles.

    "exempt": every tile holding prefix rows is kept, and the top ceil(keep * n_video_tiles) video
    tiles; "compete": the top ceil(keep * n_tiles) of all tiles; with ``prefix_blocks_exact``
    the query tiles holding prefix rows keep every tile. Returns [B, H, nq, nk] bool.
    """
    T = recipe.vsa_tile
    qbar, _ = block_reduce(q, T, "mean")
    kbar, _ = block_reduce(k, T, "mean")
    scores = (qbar @ _expand(kbar, group).transpose(-1, -2)) * scale
    return vsa_select(scores, recipe, layout.prefix_len)


def vsa_select(scores: torch.Tensor, recipe: AttentionRecipe, prefix_len: int) -> torch.Tensor:
    """VSA's top-k per query tile from coarse scores [B, H, nq, nk] -> kept tiles, bool."""
    T = recipe.vsa_tile
    nk = scores.shape[-1]
    prefix = torch.arange(nk, device=scores.device) * T < prefix_len
    keep = vsa_keep_count(recipe, nk, int(prefix.sum()))
    if recipe.vsa_prefix == "exempt" and bool(prefix.any()):
        scores = scores.masked_fill(prefix, -math.inf)
    top = scores.topk(keep, dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True)
    if recipe.vsa_prefix == "exempt":
        mask |= prefix
    return exact_prefix_blocks(mask, recipe, T, prefix_len)


def vsa_keep_count(recipe: AttentionRecipe, n_tiles: int, n_prefix_tiles: int) -> int:
    """Key tiles chosen by score per query tile: ceil(keep * n) of the video tiles ("exempt",
    prefix tiles are kept besides) or of all tiles ("compete"), at least 1."""
    if recipe.vsa_prefix == "exempt" and n_prefix_tiles:
        keep = math.ceil(recipe.vsa_keep * (n_tiles - n_prefix_tiles))
    else:
        keep = math.ceil(recipe.vsa_keep * n_tiles)
    return max(1, min(keep, n_tiles))


def tile_order(frames: int, height: int, width: int, tile=(4, 4, 4)) -> torch.Tensor:
    """Permutation of raster-ordered video rows (t, h, w) into contiguous VSA cube tiles.

    Dimensions must be divisible by the tile. Apply as ``video_rows[:, perm]``.
    """
    tt, th, tw = tile
    if frames % tt or height % th or width % tw:
        raise ValueError(f"video grid {(frames, height, width)} is not divisible by tile {tile}")
    idx = torch.arange(frames * height * width).view(frames, height, width)
    idx = idx.view(frames // tt, tt, height // th, th, width // tw, tw)
    return idx.permute(0, 2, 4, 1, 3, 5).reshape(-1)
