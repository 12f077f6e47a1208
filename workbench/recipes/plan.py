"""RecipePlan: a recipe per (step, layer), accepted wherever a recipe is.

A plan is what ``workbench plan`` derives from a scan: for each (step, layer) entry the recipe that
runs there, plus a default recipe for entries the plan does not cover. ``plan.at(step, layer)``
returns that entry's ``AttentionRecipe``, so ``run_attention``, ``recipe_attention`` and
``workbench generate / compare`` use a plan exactly as they use a recipe with a dense policy.
``get_recipe`` recognises a plan from its JSON text or file (the ``"workbench_plan"`` key)::

    workbench generate --recipe plan.json ...
    workbench compare --recipes bf16,plan.json ...

Plan JSON::

    {"workbench_plan": 1, "name": "...", "default": "bf16",
     "recipes": {"fp8_dense_k": {...recipe fields...}, "bf16": {...}},
     "entries": [{"step": 0, "layer": 1, "recipe": "fp8_dense_k", "cost": 0.716, "note": "..."}],
     "rule": {...}, "source": {...}, "expected_cost": {...}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .recipe import AttentionRecipe, RecipeError, entry_index, full_recipe

PLAN_MARKER = "workbench_plan"
PLAN_VERSION = 1


@dataclass(frozen=True)
class PlanEntry:
    """The recipe (a label of ``RecipePlan.recipes``) planned at one (step, layer)."""

    step: int
    layer: int
    recipe: str
    cost: float | None = None  # expected attention cost relative to dense BF16 (None: not
    # given; NaN made two equal plans unequal and wrote non-strict JSON)
    note: str = ""  # why the rule chose it (e.g. "SQNR 31.2 dB >= 30")


@dataclass(frozen=True)
class RecipePlan:
    """A recipe per (step, layer) entry, with a default for entries not listed.

    recipes: {label: AttentionRecipe}; entries: one PlanEntry per planned (step, layer); default:
    the label used elsewhere. rule / source / expected_cost: how the plan was made (kept in the
    JSON for the reader; they do not change what runs).
    """

    recipes: Mapping[str, AttentionRecipe]
    entries: tuple[PlanEntry, ...]
    default: str = "bf16"
    name: str = "plan"
    rule: Mapping[str, Any] = field(default_factory=dict, compare=False)
    source: Mapping[str, Any] = field(default_factory=dict, compare=False)
    expected_cost: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.default not in self.recipes:
            raise RecipeError(f"plan {self.name!r}: default recipe {self.default!r} is not in "
                              f"its recipes {sorted(self.recipes)}")
        seen = set()
        for e in self.entries:
            if e.recipe not in self.recipes:
                raise RecipeError(f"plan {self.name!r}: entry (step {e.step}, layer {e.layer}) "
                                  f"names recipe {e.recipe!r}, not in {sorted(self.recipes)}")
            if (e.step, e.layer) in seen:
                raise RecipeError(f"plan {self.name!r}: entry (step {e.step}, layer {e.layer}) "
                                  "is listed twice")
            seen.add((e.step, e.layer))

    @cached_property
    def _by_entry(self) -> dict[tuple[int, int], str]:
        return {(e.step, e.layer): e.recipe for e in self.entries}

    # -- what runs where ----------------------------------------------------------------------
    def label_at(self, step: int | None, layer: int | None) -> str:
        """The label of the recipe at (step, layer); the default where the plan has no entry
        (including calls without a step or layer). step / layer: indices (ints, numpy or
        torch integers, whole floats) or None."""
        # a torch step hashed by identity found no entry: the default ran, silently
        key = (entry_index("step", step), entry_index("layer", layer))
        return self._by_entry.get(key, self.default)

    def at(self, step: int | None = None, layer: int | None = None) -> AttentionRecipe:
        """The AttentionRecipe that runs at (step, layer)."""
        return self.recipes[self.label_at(step, layer)].at(step, layer)

    def is_dense_at(self, step: int | None, layer: int | None) -> bool:
        """True when the recipe at (step, layer) is dense BF16 attention."""
        r = self.at(step, layer)
        return (r.sparsity == "dense" and r.qk_format == "bf16" and r.v_format == "bf16"
                and r.p_format == "bf16")

    def with_(self, **overrides: Any) -> RecipePlan:
        raise RecipeError(
            f"plan {self.name!r}: a plan fixes the recipe of every entry; the override(s) "
            f"{sorted(overrides)} do not apply to it (edit the plan JSON instead)")

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for e in self.entries:
            counts[e.recipe] = counts.get(e.recipe, 0) + 1
        mix = ", ".join(f"{n} x {lab}" for lab, n in sorted(counts.items(), key=lambda x: -x[1]))
        cost = self.expected_cost.get("relative_to_bf16")
        tail = f"; expected cost {cost:.3f} x dense BF16" if isinstance(cost, float) else ""
        return f"plan {self.name}: {len(self.entries)} entries ({mix}), default " \
               f"{self.default}{tail}"

    # -- serialization ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            PLAN_MARKER: PLAN_VERSION,
            "name": self.name,
            "default": self.default,
            "recipes": {lab: r.to_dict() for lab, r in self.recipes.items()},
            "entries": [{"step": e.step, "layer": e.layer, "recipe": e.recipe, "cost": e.cost,
                         "note": e.note} for e in self.entries],
            "rule": dict(self.rule),
            "source": dict(self.source),
            "expected_cost": dict(self.expected_cost),
        }

    def to_json(self, indent: int | None = None) -> str:
        from workbench.jsonutil import json_safe

        return json.dumps(json_safe(self.to_dict()), sort_keys=indent is None, indent=indent)

    def to_string(self) -> str:
        """The plan's JSON text (what ``get_recipe`` reads back)."""
        return self.to_json()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "plan",
                  base: str | None = None) -> RecipePlan:
        """base: the plan file's folder; a recipe given as a relative .json path is read from
        there (not from the current folder)."""
        version = data.get(PLAN_MARKER)
        if isinstance(version, bool) or not isinstance(version, int) or version != PLAN_VERSION:
            raise RecipeError(f"{where}: '{PLAN_MARKER}' is {version!r}; this workbench reads "
                              f"version {PLAN_VERSION}")
        for key in ("recipes", "entries"):
            if key not in data:
                raise RecipeError(f"{where}: missing field {key!r}")
        shapes = {"recipes": (Mapping, "an object {label: recipe}"),
                  "entries": (list, "a list of {step, layer, recipe} objects"),
                  "default": (str, "a recipe label"), "name": (str, "a string"),
                  "rule": (Mapping, "an object"), "source": (Mapping, "an object"),
                  "expected_cost": (Mapping, "an object")}
        for key, (kind, what) in shapes.items():
            if key in data and not isinstance(data[key], kind):
                raise RecipeError(f"{where}: field {key!r} must be {what}, got "
                                  f"{type(data[key]).__name__} {data[key]!r:.60}")
        unknown = sorted(set(data) - {PLAN_MARKER, *shapes})
        if unknown:  # a misspelt "defualt" left every unlisted entry on BF16
            raise RecipeError(f"{where}: unknown field(s) {unknown}; a plan has "
                              f"{sorted({PLAN_MARKER, *shapes})}")
        if not data["recipes"]:
            raise RecipeError(f"{where}: field 'recipes' is empty")
        recipes = {lab: _plan_recipe(lab, r, where, base) for lab, r in data["recipes"].items()}
        entries = []
        for i, e in enumerate(data["entries"]):
            extra = sorted(set(e) - {"step", "layer", "recipe", "cost", "note"}) \
                if isinstance(e, Mapping) else []
            if extra:
                raise RecipeError(f"{where}: entries[{i}] has unknown field(s) {extra}; an entry "
                                  "has step, layer, recipe (cost, note)")
            try:
                step, layer = _entry_index(e, "step"), _entry_index(e, "layer")
                entries.append(PlanEntry(step=step, layer=layer, recipe=str(e["recipe"]),
                                         cost=_entry_cost(e.get("cost")),
                                         note=str(e.get("note", ""))))
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                raise RecipeError(f"{where}: entries[{i}] is not a plan entry ({exc!r}): "
                                  f"{e!r:.80}") from None
        try:
            return cls(recipes=recipes, entries=tuple(entries),
                       default=data.get("default", "bf16"), name=data.get("name", "plan"),
                       rule=data.get("rule", {}), source=data.get("source", {}),
                       expected_cost=data.get("expected_cost", {}))
        except RecipeError as exc:
            raise RecipeError(f"{where}: {exc}") from None

    @classmethod
    def from_json(cls, text: str, where: str = "plan") -> RecipePlan:
        return cls.from_dict(json.loads(text), where)


def _plan_recipe(label: str, spec: Any, where: str, base: str | None = None) -> AttentionRecipe:
    """A plan's recipe: a full recipe object (as ``workbench plan`` writes) or a recipe string
    ('fp8_dense', 'fp8_dense:qk_block=32', a .json file, relative to the plan's folder `base`);
    errors name the file and the label."""
    from pathlib import Path

    from .recipe import get_recipe

    try:
        if isinstance(spec, str):
            text = spec.strip()
            if base is not None and text.endswith(".json") and not text.startswith("{") \
                    and not Path(text).is_absolute():
                spec = str(Path(base) / text)
            recipe = get_recipe(spec)
            if not isinstance(recipe, AttentionRecipe):
                raise RecipeError("a plan cannot hold another plan")
            return recipe
        if not isinstance(spec, Mapping):
            raise RecipeError(f"expected a recipe object or string, got {type(spec).__name__}")
        return full_recipe(dict(spec))
    except RecipeError as exc:
        raise RecipeError(f"{where}: recipes[{label!r}]: {exc}") from None


def _entry_cost(v) -> float | None:
    """A plan entry's cost: a finite number, or None (absent, null, or NaN as older plans
    wrote it)."""
    if v is None:
        return None
    c = float(v)
    return c if math.isfinite(c) else None


def _entry_index(entry: Mapping[str, Any], key: str) -> int:
    """A plan entry's step or layer: a non-negative integer (not a bool, not 7.9)."""
    v = entry[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{key} must be a non-negative integer, got {v!r}")
    return v


def entry_recipe(spec: Any, step: int | None, layer: int | None) -> tuple[AttentionRecipe, str]:
    """(the recipe that `spec` runs at one (step, layer), a note for the user or ""): a plan's
    recipe planned there (its default where it has no entry, or when step / layer is None), a
    recipe itself. The recipe's own numerics: its dense policy is not applied (what the accuracy
    table and the report compare)."""
    from .recipe import get_recipe

    r = get_recipe(spec)
    if not isinstance(r, RecipePlan):
        return r, ""
    label = r.label_at(step, layer)
    where = ("(no step / layer: its default)" if step is None or layer is None else
             f"at step {step}, layer {layer}" + ("" if (step, layer) in r._by_entry
                                                   else " (no entry: its default)"))
    return r.recipes[label], f"plan {r.name!r} {where}: recipe {label!r}"


def single_recipe(spec: Any, name: str) -> AttentionRecipe:
    """``get_recipe(spec)`` for an argument that takes one recipe (not a plan), its errors naming
    the argument `name` (a CLI flag or a parameter)."""
    from .recipe import get_recipe

    try:
        r = get_recipe(spec)
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(f"{name} {spec!r}: {exc}") from None
    if isinstance(r, RecipePlan):
        raise ValueError(f"{name} {spec!r}: a plan (a recipe per step and layer); give one "
                         f"recipe, e.g. one of its own: {sorted(r.recipes)}")
    return r


def is_plan_dict(data: Any) -> bool:
    return isinstance(data, Mapping) and PLAN_MARKER in data


def read_plan_spec(spec: Any) -> RecipePlan | AttentionRecipe | None:
    """What ``get_recipe`` asks first: a plan (object, dict, JSON text or .json file), a recipe
    JSON file, or None when `spec` is neither (then it is parsed as a recipe spec)."""
    from pathlib import Path

    if isinstance(spec, RecipePlan):
        return spec
    if is_plan_dict(spec):
        return RecipePlan.from_dict(spec)
    if not isinstance(spec, str):
        return None
    text = spec.strip()
    where = "plan"
    if text.endswith(".json") and not text.startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise RecipeError(f"recipe: {text}: no such file (a plan or recipe JSON file)")
        where, text = text, path.read_text()
    elif not text.startswith("{") or PLAN_MARKER not in text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecipeError(f"{where}: invalid JSON ({exc})") from None
    if is_plan_dict(data):
        return RecipePlan.from_dict(data, where,
                                    base=str(Path(where).parent) if where != "plan" else None)
    if where != "plan":  # a .json file: a recipe object, nothing else
        if not isinstance(data, dict):
            raise RecipeError(f"{where}: not a plan or recipe (a JSON {type(data).__name__}, "
                              "expected an object)")
        try:
            return full_recipe(data)
        except RecipeError as exc:
            raise RecipeError(f"{where}: {exc}") from None
    return None
