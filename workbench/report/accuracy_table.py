"""The seed PR's "Smooth Attention Kernel Accuracy" table for any two recipes.

Defaults match the seed: heads 0-3, 64 evenly spaced query rows, the full K/V context, float64
dense reference. Rows: quanted K, dequanted V, dequanted V's mean, attention output (against
dense); columns A MSE | B MSE | Benefit; then cosine, relative L2 and SQNR of the output. The
output benefit carries a paired bootstrap interval over the sampled rows, because a few dozen rows
can flip the sign of a small benefit.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workbench.attention import SegmentLayout, select_heads
from workbench.cli_args import MAX_RESULT_JSON, json_has_keys
from workbench.evaluate import TABLE_ROWS, Comparison, evaluate
from workbench.metrics import (
    BOUNDARY_LABELS,
    benefit_pct,
    channel_groups,
    fmt,
    fmt_benefit,
    json_safe,
)
from workbench.recipes import AttentionRecipe, get_recipe

TABLE_HEADING = "### Smooth Attention Kernel Accuracy"  # first line of to_markdown
# keys of to_dict that tell an earlier table JSON from another JSON file
TABLE_JSON_KEYS = ("source", "recipe_a", "recipe_b", "boundaries", "output", "reference")


@dataclass
class AccuracyTable:
    recipe_a: AttentionRecipe
    recipe_b: AttentionRecipe
    source: str
    heads: list[int]
    query_rows: list[int]
    seq_len: int
    rows: list[dict]  # boundary, label, mse_a, mse_b, benefit_pct
    output: dict  # {metric: {"a": x, "b": y}}
    output_benefit_ci: tuple[float, float]
    exact_fraction: dict
    drift: dict
    per_head: dict  # {"a"|"b": {boundary: {metric: [..]}}}
    seconds: float = 0.0
    extras: dict = field(default_factory=dict)
    head_dim: int = 128
    causal: bool = False
    # {segment: {"rows": sampled rows, "start", "stop", "a": mse, "b": mse}} in sequence order
    segments: dict = field(default_factory=dict)
    # (step, layer) the recipes' dense policies were applied at, None: not applied (each recipe
    # ran its own numerics, whatever its dense_steps / dense_layers say)
    policy_at: tuple | None = None

    def row(self, boundary: str) -> dict:
        return next(r for r in self.rows if r["boundary"] == boundary)

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "recipe_a": {"name": self.recipe_a.name, "spec": self.recipe_a.to_string(),
                         "json": self.recipe_a.to_dict()},
            "recipe_b": {"name": self.recipe_b.name, "spec": self.recipe_b.to_string(),
                         "json": self.recipe_b.to_dict()},
            "heads": self.heads,
            "query_rows": self.query_rows,
            "seq_len": self.seq_len,
            "reference": "float64 dense attention over the full K/V context",
            "boundaries": {r["boundary"]: r for r in self.rows},
            "output": self.output,
            "output_benefit_ci95": list(self.output_benefit_ci),
            "exact_fraction": self.exact_fraction,
            "token_mean_drift": self.drift,
            "output_mse_by_segment": self.segments,
            "head_dim": self.head_dim,
            "causal": self.causal,
            "per_head": self.per_head,
            "dense_policy_at": list(self.policy_at) if self.policy_at is not None else None,
            "seconds": self.seconds,
            **self.extras,
        }

    def _policy_note(self, r: AttentionRecipe) -> str:
        """Say so where a recipe's dense policy did not apply (the description lists it)."""
        if not (r.dense_steps or r.dense_layers) or self.policy_at is not None:
            return ""
        return " (its dense policy not applied here: the recipe's own numerics ran)"

    def to_json(self) -> str:
        return json.dumps(json_safe(self.to_dict()), indent=2)

    def to_markdown(self) -> str:
        a, b = self.recipe_a, self.recipe_b
        la, lb = a.label(), b.label()
        heads = _ranges(self.heads)
        lines = [
            TABLE_HEADING,
            "",
            f"Input: {self.source}. Heads {heads}, {len(self.query_rows)} evenly spaced query "
            f"positions, full K/V context ({self.seq_len:,} keys"
            + ("; causal: each row attends to the keys up to itself" if self.causal else "")
            + "), float64 dense reference.",
            "",
            f"- A = `{a.to_string()}`: {a.describe()}{self._policy_note(a)}",
            f"- B = `{b.to_string()}`: {b.describe()}{self._policy_note(b)}",
            "",
            f"| Boundary | A `{la}` MSE | B `{lb}` MSE | Benefit |",
            "|---|---|---|---|",
        ]
        for r in self.rows:
            ben = fmt_benefit(r["benefit_pct"])
            if r["boundary"] == "attention_output":
                lo, hi = self.output_benefit_ci
                ben += f" (95% CI {fmt_benefit(lo)} to {fmt_benefit(hi)})"
            lines.append(f"| {r['label']} | {_e(r['mse_a'])} | {_e(r['mse_b'])} | {ben} |")
        o = self.output
        lines += [
            "",
            f"| Attention output | A `{la}` | B `{lb}` |",
            "|---|---|---|",
        ]
        for key, label in (("cosine", "cosine"), ("rel_l2", "relative L2"),
                           ("sqnr_db", "SQNR (dB)"), ("max_abs", "max abs error")):
            lines.append(f"| {label} | {fmt(o[key]['a'], key)} | {fmt(o[key]['b'], key)} |")
        lines.append(f"| exact-route block fraction | {fmt(self.exact_fraction['a'], 'fraction')}"
                     f" | {fmt(self.exact_fraction['b'], 'fraction')} |")
        if len(self.segments) > 1:  # one segment: the overall row above says it all
            lines += ["", f"| Attention output MSE by segment | sampled rows | A `{la}` | "
                          f"B `{lb}` | Benefit |", "|---|---|---|---|---|"]
            for name, sg in self.segments.items():
                lines.append(f"| {name} (rows {sg['start']:,}-{sg['stop'] - 1:,}) | {sg['rows']} "
                             f"| {_e(sg['a'])} | {_e(sg['b'])} | "
                             f"{fmt_benefit(benefit_pct(sg['a'], sg['b']))} |")
        d = self.drift
        lines += [
            "",
            f"| Token-mean drift (mean abs, per channel) | A `{la}` | B `{lb}` |",
            "|---|---|---|",
        ]
        for t in ("K", "V"):
            for key, label, _, _ in channel_groups(d["rotated"], self.head_dim, t):
                k = f"{t.lower()}_{key}"
                lines.append(f"| {t}, {label} | {_e(d[k]['a'])} | {_e(d[k]['b'])} |")
        ph_a = self.per_head["a"]["attention_output"]["mse"]
        ph_b = self.per_head["b"]["attention_output"]["mse"]
        lines += ["", "| Head | " + " | ".join(str(h) for h in self.heads) + " |",
                  "|---|" + "---|" * len(self.heads)]
        lines.append("| output MSE A | " + " | ".join(_e(x) for x in ph_a) + " |")
        lines.append("| output MSE B | " + " | ".join(_e(x) for x in ph_b) + " |")
        lines.append(
            "| benefit | " + " | ".join(fmt_benefit(benefit_pct(x, y)) for x, y in
                                        zip(ph_a, ph_b)) + " |"
        )
        return "\n".join(lines) + "\n"


def _e(x: float) -> str:
    return fmt(x, "mse")


def _ranges(h: list[int]) -> str:
    if h and h == list(range(h[0], h[-1] + 1)) and len(h) > 2:
        return f"{h[0]}-{h[-1]}"
    return ",".join(map(str, h))


def table_from_comparison(c: Comparison, a: str, b: str, *, source: str = "",
                          head_labels: list[int] | None = None) -> AccuracyTable:
    """The seed table of B (candidate) against A (baseline) from one evaluated comparison."""
    ea, eb = c.evals[a], c.evals[b]
    rows = []
    for bd in TABLE_ROWS:
        ma, mb = ea.overall[bd]["mse"], eb.overall[bd]["mse"]
        rows.append({"boundary": bd, "label": BOUNDARY_LABELS[bd], "mse_a": ma, "mse_b": mb,
                     "benefit_pct": benefit_pct(ma, mb)})
    output = {m: {"a": ea.overall["attention_output"][m], "b": eb.overall["attention_output"][m]}
              for m in ("mse", "cosine", "rel_l2", "sqnr_db", "max_abs")}
    # keys k_rot / k_pass / v_rot / v_pass (those of the non-empty channel groups)
    drift: dict = {"rotated": c.rotated}
    for key in ea.drift_summary:
        drift[key] = {"a": ea.drift_summary[key], "b": eb.drift_summary[key]}
    bands = {n: (lo, hi) for n, lo, hi in c.layout.bands()}
    segments = {n: {"rows": sa["rows"], "start": bands[n][0], "stop": bands[n][1],
                    "a": sa["mse"], "b": eb.segments[n]["mse"]}
                for n, sa in ea.segments.items()}
    return AccuracyTable(
        recipe_a=ea.recipe,
        recipe_b=eb.recipe,
        source=source or "q/k/v tensors",
        heads=list(head_labels) if head_labels is not None else list(c.heads),
        query_rows=list(c.query_rows),
        seq_len=c.seq_len,
        rows=rows,
        output=output,
        output_benefit_ci=c.benefit_ci(a, b),
        exact_fraction={"a": ea.exact_fraction, "b": eb.exact_fraction},
        drift=drift,
        per_head={"a": ea.heads, "b": eb.heads},
        seconds=c.seconds,
        head_dim=c.head_dim,
        causal=c.causal,
        segments=segments,
    )


def accuracy_table(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipe_a: AttentionRecipe | str = "fp8_sol_unsmoothed",
    recipe_b: AttentionRecipe | str = "fp8_sol_kv_corrected",
    *,
    layout: SegmentLayout | None = None,
    heads: list[int] | None = None,
    head_labels: list[int] | None = None,
    n_queries: int = 64,
    query_index=None,
    rotated: int | None = None,
    source: str = "",
    step: int | None = None,
    layer: int | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> AccuracyTable:
    """Build the table. q [B, S, H, D], k/v [B, S, Hkv, D]; `heads` selects query heads.

    step/layer are passed to the recipes (their dense policy applies) only when given.
    rotated: RoPE channels per head, 0..D (None: not known; drift over all channels).
    causal / scale: the model's mask and softmax scale (``evaluate``).
    """
    t0 = time.perf_counter()
    a, b = get_recipe(recipe_a), get_recipe(recipe_b)
    q, k, v = select_heads(q, k, v, heads)
    labels = head_labels or (list(heads) if heads is not None else list(range(q.shape[2])))
    c = evaluate(q, k, v, {"a": a, "b": b}, layout=layout, n_queries=n_queries,
                 query_index=query_index, heads=labels, rotated=rotated, step=step, layer=layer,
                 causal=causal, scale=scale)
    table = table_from_comparison(c, "a", "b", source=source)
    table.policy_at = (step, layer) if step is not None or layer is not None else None
    table.seconds = time.perf_counter() - t0
    return table


# the lines ``AccuracyTable.to_markdown`` writes after its heading (besides blank ones)
_TABLE_LINE_STARTS = ("|", "Input: ", "- A = `", "- B = `")


def is_table_markdown(path) -> bool:
    """Whether ``path`` is an earlier markdown table: the table's heading, then only the lines
    ``to_markdown`` writes (its input line, the recipe lines, table rows; the boundary table
    among them). A user's notes under the same heading are not a table, and are not replaced."""
    try:
        p = Path(path)
        if p.stat().st_size > MAX_RESULT_JSON:
            return False
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):  # unreadable or not UTF-8: not a table
        return False
    return (bool(lines) and lines[0] == TABLE_HEADING
            and any(x.startswith("| Boundary |") for x in lines)
            and all(not x.strip() or x.startswith(_TABLE_LINE_STARTS) for x in lines[1:]))


def is_table_json(path) -> bool:
    """Whether ``path`` is an earlier table JSON (``AccuracyTable.to_json``)."""
    return json_has_keys(path, TABLE_JSON_KEYS)


def write_table(table: AccuracyTable, md_path: Path | None, json_path: Path | None) -> None:
    if md_path:
        Path(md_path).parent.mkdir(parents=True, exist_ok=True)
        Path(md_path).write_text(table.to_markdown())
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(table.to_json())
