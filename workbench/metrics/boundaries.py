"""Metrics at each boundary of a recipe run, per head, plus token-mean drift and error by position.

Boundaries (the seed PR's table rows):
- ``quanted_k``: dequantized K (+ mu_K) against K;
- ``dequanted_v``: effective dequantized V (+ mu_V or + the correction) against V;
- ``v_mean``: token mean of the effective dequantized V against V's token mean;
- ``attention_output``: the recipe's output against float64 dense attention;
- ``quanted_q``: dequantized Q rows against Q (sampled rows only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.layout import SegmentLayout, channel_groups, check_rotated
from workbench.attention.reference import AttentionResult

from .tensor import stats_overall_and_per_head

BOUNDARIES = ("quanted_q", "quanted_k", "dequanted_v", "v_mean", "attention_output")
BOUNDARY_LABELS = {
    "quanted_q": "quanted Q",
    "quanted_k": "quanted K",
    "dequanted_v": "dequanted V",
    "v_mean": "dequanted V's mean",
    "attention_output": "attention output (against dense)",
}


def boundary_tensors(
    res: AttentionResult, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ref_out: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{boundary: (value, reference)} with [B, *, H, D] layout (v_mean as [B, 1, H, D]).

    References keep the input's dtype (the metrics difference them in float64): a float32 copy
    would round float64 inputs and give an exact recipe a nonzero error."""
    return {
        "quanted_q": (res.q_dq, q[:, res.query_index]),
        "quanted_k": (res.k_dq, k),
        "dequanted_v": (res.v_dq, v),
        "v_mean": (res.v_dq.double().mean(1, keepdim=True), v.double().mean(1, keepdim=True)),
        "attention_output": (res.out, ref_out),
    }


@dataclass
class BoundaryMetrics:
    """overall[boundary][metric] over all selected heads; heads[boundary][metric] = [per head]."""

    overall: dict[str, dict[str, float]]
    heads: dict[str, dict[str, list[float]]]
    row_sq_err: torch.Tensor  # [n] mean squared output error per sampled row (over B, H, D)

    def to_dict(self) -> dict:
        return {"overall": self.overall, "per_head": self.heads}


def boundary_metrics(
    res: AttentionResult, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ref_out: torch.Tensor
) -> BoundaryMetrics:
    tensors = boundary_tensors(res, q, k, v, ref_out)
    overall, heads = {}, {}
    for b, (x, r) in tensors.items():
        overall[b], heads[b] = stats_overall_and_per_head(x, r)
    row_err = (res.out.double() - ref_out.double()).pow(2).mean(dim=(0, 2, 3))
    return BoundaryMetrics(overall=overall, heads=heads, row_sq_err=row_err)


def drift_summary(per_channel: torch.Tensor, rotated: int | None) -> dict[str, float]:
    """{key: mean drift over the group's channels} for each ``channel_groups`` group, from the
    [..., D] per-channel drift of ``token_mean_drift``."""
    D = per_channel.shape[-1]
    return {key: float(per_channel[..., a:b].mean())
            for key, _, a, b in channel_groups(rotated, D)}


def token_mean_drift(
    x_dq: torch.Tensor, x: torch.Tensor, rotated: int = 96
) -> dict[str, torch.Tensor | float]:
    """|mean_t(dequant(x)) - mean_t(x)| per (batch, head, channel), from [B, S, H, D] tensors.

    Returns {"per_channel": [B, H, D], "rotated": mean over channels < rotated,
    "passthrough": mean over channels >= rotated}; a group without channels gives nan (labels
    come from ``channel_groups``, which leaves it out).
    """
    check_rotated(rotated, x.shape[-1])
    d = (x_dq.double().mean(1) - x.double().mean(1)).abs()
    rot = float(d[..., :rotated].mean()) if rotated > 0 else float("nan")
    pas = float(d[..., rotated:].mean()) if rotated < d.shape[-1] else float("nan")
    return {"per_channel": d, "rotated": rot, "passthrough": pas}


def channel_mean_norms(x: torch.Tensor, rotated: int = 96) -> dict[str, float]:
    """Norm of the token mean over rotated vs pass-through channels, and its share of energy."""
    xf = x.double()
    mu = xf.mean(1)  # [B, H, D]
    energy = xf.pow(2).mean(1)  # [B, H, D]
    out = {}
    for name, sl in (("rotated", slice(0, rotated)), ("passthrough", slice(rotated, None))):
        m = mu[..., sl]
        if m.numel() == 0:
            continue
        out[f"{name}_mean_norm"] = float(m.pow(2).sum(-1).sqrt().mean())
        out[f"{name}_mean_energy_frac"] = float(m.pow(2).sum() / energy[..., sl].sum())
    return out


def error_by_segment(along: dict) -> dict[str, dict]:
    """{segment: {"rows": sampled rows in it, "mse": their mean output MSE}} in sequence order,
    from an ``error_along_tokens`` dict (every row holds B*H*D elements, so the mean of the row
    MSEs is the segment's MSE over its sampled rows). Segments without a sampled row are left
    out."""
    out: dict[str, dict] = {}
    for name, _, _ in along["bands"]:
        errs = [e for s, e in zip(along["segment"], along["mse"]) if s == name]
        if errs:
            out[name] = {"rows": len(errs), "mse": sum(errs) / len(errs)}
    return out


def error_along_tokens(
    res: AttentionResult, ref_out: torch.Tensor, layout: SegmentLayout
) -> dict[str, list]:
    """Output error per sampled row, with the segment each row belongs to.

    Returns {"row": [...], "mse": [...], "rel_l2": [...], "segment": [...], "bands": [...]}.
    """
    d = (res.out.double() - ref_out.double()).pow(2)
    mse = d.mean(dim=(0, 2, 3))
    rel = (d.sum(dim=(0, 2, 3)) / ref_out.double().pow(2).sum(dim=(0, 2, 3))).sqrt()
    rows = res.query_index.cpu()
    return {
        "row": rows.tolist(),
        "mse": mse.cpu().tolist(),
        "rel_l2": rel.cpu().tolist(),
        "segment": layout.segment_of(rows),
        "bands": layout.bands(),
    }
