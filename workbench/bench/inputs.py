"""Benchmark and test inputs: bf16 q/k/v [B, S, H, D] drawn fresh from a seed (never zeros).

- ``make_inputs``: randn with a per-(head, channel) bias on K and V, what smoothing removes; the
  inputs of every side-by-side table.
- ``sink_inputs``: attention dominated by a few "sink" keys 2^gap above the rest, so most of each
  row's probability mass sits in many small P values (2^-gap each): where P's E4M3 scaling
  matters (``p_scaling``). With an unsmoothed V bias, P values that round to zero take their share
  of the bias with them.
"""

from __future__ import annotations

import math

import torch


def make_inputs(B, S, H, D, n_sets=2, seed=0, device="cuda"):
    """`n_sets` tuples of bf16 q/k/v [B, S, H, D]; K and V carry a per-(head, channel) bias."""
    g = torch.Generator(device=device).manual_seed(seed)
    sets = []
    for _ in range(n_sets):
        q = torch.randn(B, S, H, D, device=device, generator=g, dtype=torch.bfloat16)
        k = torch.randn(B, S, H, D, device=device, generator=g, dtype=torch.bfloat16)
        v = torch.randn(B, S, H, D, device=device, generator=g, dtype=torch.bfloat16)
        k += 2 * torch.randn(H, D, device=device, generator=g, dtype=torch.bfloat16)
        v += torch.randn(H, D, device=device, generator=g, dtype=torch.bfloat16)
        sets.append((q, k, v))
    return sets


def sink_inputs(B, S, H, D, *, gap=10.5, every=128, first=5, v_bias=2.0, seed=0, device="cpu"):
    """bf16 q/k/v [B, S, H, D]: every query points along one direction u per head; keys
    first, first + every, ... carry u with a score `gap` log2 units above the other keys (small
    random keys), so each row's other S - S/every probabilities are about 2^-gap of its max.
    V has a per-(head, channel) bias of size `v_bias` (left in V by recipes without V smoothing).
    """
    g = torch.Generator(device=device).manual_seed(seed)
    u = torch.nn.functional.normalize(torch.randn(H, D, device=device, generator=g), dim=-1)
    q_norm = 8.0
    q = torch.randn(B, S, H, D, device=device, generator=g) * 0.5 + q_norm * u
    k = torch.randn(B, S, H, D, device=device, generator=g) * 0.1
    v = torch.randn(B, S, H, D, device=device, generator=g)
    v += v_bias * torch.randn(H, D, device=device, generator=g)
    # score q . k / sqrt(D) = gap * ln 2 for the sinks, about 0 for the rest
    k[:, first::every] += u * (gap * math.log(2) * math.sqrt(D) / q_norm)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()
