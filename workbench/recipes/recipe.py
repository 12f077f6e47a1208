"""AttentionRecipe: one frozen description of an attention variant, with named presets.

A recipe fully states the numerics of a variant: operand formats and scale granularity, smoothing,
V-bias correction, Hadamard rotation, accumulation, sparsity and the dense policy. It round-trips to
JSON (stored in capture attributes) and to a compact CLI string::

    fp8_sol_kv_corrected                     # a preset
    fp8_sol_kv_corrected:sol_tau=0.5         # a preset with overrides
    {"qk_format": "fp8_e4m3", ...}           # full JSON
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import operator
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

# "exact": operands kept at compute precision (FP32, or FP64 for float64 inputs): identities and
# ceilings, not a deployable format.
QK_FORMATS = ("bf16", "fp8_e4m3", "int8", "exact")
QK_GRANULARITIES = ("block", "token", "tensor")
V_FORMATS = ("bf16", "fp8_e4m3", "exact")
V_GRANULARITIES = ("channel", "tensor")
P_FORMATS = ("bf16", "fp8_e4m3", "exact")
OUT_FORMATS = ("bf16", "exact")
# How P = 2^(s - m) (m = the row max, so P in [0, 1]) is scaled before its cast to E4M3; the row
# sum and P @ V take the same scaled P, so the scale cancels in the output:
# "unit": no scaling (FP8 Sol). P < 2^-6 falls into E4M3's subnormal range (spacing 2^-9) and
#   P < 2^-10 rounds to zero, so many small probabilities lose most of their mass.
# "exp2_offset8": P * 2^8 = 2^(s - m + 8), the constant folded into the exponent (FlashAttention-3
#   style): P in [0, 256], subnormal only below 2^-14; exact to undo (a power of two).
# "rowmax448": P * 448, so the row max lands on E4M3's largest value (448 = 1.75 * 2^8).
P_SCALINGS = ("unit", "exp2_offset8", "rowmax448")
# How P's E4M3 code is produced from the score s (log2 units) and the row max m:
# "exp2": P = 2^(s - m + c) in FP32 (the special-function unit's exp2), rounded to nearest E4M3.
# "log_linear": no exponential. The E4M3 code is linear in log2 P, code = round(8 (s - m' + c))
#   + 56 (56: the code of 1.0; code <= 0: P = 0), with m' = ceil(8 m) / 8 (the row max on the
#   1/8 grid, so one FMA per element gives the code exactly); between powers of two the value is
#   linear in the exponent's fraction (up to 6% above 2^x before its 3-bit rounding; the standard
#   deviation of log(P / 2^x) is 0.0315 against 0.0265 for rounding 2^x; its rms, 0.0502, holds
#   the mean bias, divided out below), and m' shifts every P of a row by the
#   same factor, which the row sum cancels. Needs p_scaling "exp2_offset8" (under "unit" the codes
#   1-7 are E4M3 subnormals, not the log-linear values) and row_sum "p_operand" (the row sum must
#   take the same P). The kernels then compute P with FP32 adds and byte moves only. The codes are
#   LL_MEAN_RATIO times 2^x on average (the interpolation lies above 2^x), so the state of the
#   exact tiles is divided by it: the row sum and P @ V of the dense output cancel it anyway, but
#   Sol's summary route (FP32 weights), KV parts and the LSE would weigh the exact tiles 4% high.
#   (The warp-specialized list kernel's Sol summary tiles write codes as well, so there both
#   routes carry the bias and only the LSE takes it out.)
P_EXPS = ("exp2", "log_linear")
# The mean of (log-linear code's value) / 2^x over x uniform, per 1/8 step: the code of
# k/8 holds 2^floor(k/8) (1 + (k mod 8) / 8) for x in [k/8 - 1/16, k/8 + 1/16), so the mean is
# (1/8) sum_j (1 + j/8) 2^(-j/8) * (2^(1/16) - 2^(-1/16)) / (ln 2 / 8) = 1.04036 (4M random x
# with random grid offsets: 1.04034, the same for every offset).
LL_MEAN_RATIO = (sum((1 + j / 8) * 2 ** (-j / 8) for j in range(8)) / 8
                 * (2 ** (1 / 16) - 2 ** (-1 / 16)) * 8 / 0.6931471805599453)
# The softmax denominator l (row sum of P):
# "p_fp32": the FP32 P before its rounding to p_format (the numerator takes the rounded P);
# "p_operand": the rounded P that P @ V takes, summed with P @ V's accumulation: numerator and
#   denominator see the same weights, so the output is a weighted mean of the V rows (better with
#   an unsmoothed V bias; with smoothed V it needs a scaled P, or the P values that round to zero
#   lose their mass). FP8 kernels: P @ ones on the tensor cores (warp-specialized, dense and
#   sparse exact tiles), FP32 adds of the rounded P (programs kernel); Sol's summary route keeps
#   its FP32 sum of the block weights (but for the list kernel's summary tiles with p_exp
#   "log_linear", whose codes are summed as P @ ones too).
ROW_SUMS = ("p_fp32", "p_operand")
SMOOTHINGS = ("none", "k", "kv")
ACCUMULATIONS = ("fp32", "reduced")
# How a "reduced" accumulator drops bits at each 32-key MMA step (docs/numerics.md):
# "truncate": the accumulator and the step's 32 products are aligned to the leading bit of the
#   largest of them and cut toward zero to accum_mantissa_bits bits below it, added, and the sum
#   cut the same way below its own leading bit: Hopper's FP8 wgmma as measured on the H200 (every
#   probe sum bit for bit, docs/numerics.md);
# "nearest": the exact step sum added to the accumulator and rounded to nearest even (an unbiased
#   model: it misses the truncation's downward drift, ~100x too small an error for FlashAttention-3
#   FP8 at 32k keys).
ACCUM_ROUNDINGS = ("truncate", "nearest")
SPARSITIES = ("dense", "sol", "vsa")
SOL_THRESHOLDS = ("exact", "diag")
VSA_PREFIX_MODES = ("exempt", "compete")


class RecipeError(ValueError):
    """An invalid recipe: the message names the field and the reason."""


@dataclass(frozen=True)
class AttentionRecipe:
    """The numerics of one attention variant.

    Shapes are not part of a recipe: the same recipe applies to any [B, S, H, D] input.
    """

    name: str = "custom"
    # Q and K operands of QK^T.
    qk_format: str = "fp8_e4m3"
    qk_granularity: str = "block"  # one scale per (batch, qk_block tokens, head)
    qk_block: int = 64
    # V operand of PV.
    v_format: str = "fp8_e4m3"
    v_granularity: str = "channel"  # one scale per (batch, head, channel)
    # P operand of PV.
    p_format: str = "fp8_e4m3"
    p_scaling: str = "unit"
    p_exp: str = "exp2"  # P_EXPS
    row_sum: str = "p_fp32"  # ROW_SUMS
    # Output written by the epilogue (kernels write BF16).
    out_format: str = "bf16"
    # Smoothing: subtract the FP32 token mean before quantizing K ("k") or K and V ("kv").
    smoothing: str = "kv"
    v_bias_correction: bool = True
    # FA3-style incoherent processing: orthonormal Hadamard on the head dim of Q and K.
    hadamard: bool = False
    # "reduced" emulates a tensor-core accumulator with accum_mantissa_bits bits of mantissa,
    # flushed into an FP32 buffer every accum_flush_keys keys (PV product only), dropping bits
    # as accum_rounding says (ACCUM_ROUNDINGS).
    accumulation: str = "fp32"
    accum_mantissa_bits: int = 13
    accum_flush_keys: int = 128
    accum_rounding: str = "truncate"
    # Sparsity.
    sparsity: str = "dense"
    sol_tau: float = 1.0
    sol_threshold: str = "exact"
    sol_block: int = 64
    sol_band: int = 1  # |i - j| <= band is always exact
    vsa_tile: int = 64
    vsa_keep: float = 0.25
    vsa_prefix: str = "exempt"
    # Dense policy: steps < dense_steps or layers < dense_layers run BF16 dense attention, and the
    # prefix query rows (everything before the generated video rows) are recomputed in BF16.
    dense_steps: int = 0
    dense_layers: int = 0
    dense_prefix: bool = False
    # Sparse recipes: the query blocks holding prefix rows attend every key block exactly, with
    # the recipe's own operands (FP8 for the FP8 recipes), instead of being routed: the cheaper
    # alternative to the BF16 replacement (``dense_prefix``), which it excludes.
    prefix_blocks_exact: bool = False
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _check_types(self)
        validate(self)

    # -- derived properties -------------------------------------------------------------------
    @property
    def quantizes_qk(self) -> bool:
        return self.qk_format in ("fp8_e4m3", "int8")

    @property
    def quantizes_v(self) -> bool:
        return self.v_format == "fp8_e4m3"

    @property
    def smooth_k(self) -> bool:
        return self.smoothing in ("k", "kv")

    @property
    def smooth_v(self) -> bool:
        return self.smoothing == "kv"

    def is_dense_at(self, step: int | None, layer: int | None) -> bool:
        """True when the dense policy says this (step, layer) runs BF16 dense attention. step and
        layer are indices (ints >= 0) or None (not known: that side of the policy is off)."""
        step, layer = entry_index("step", step), entry_index("layer", layer)
        return (step is not None and step < self.dense_steps) or (
            layer is not None and layer < self.dense_layers
        )

    def at(self, step: int | None = None, layer: int | None = None) -> AttentionRecipe:
        """The recipe that actually runs at (step, layer): BF16 dense where the policy says so."""
        if self.is_dense_at(step, layer):
            return replace(PRESETS["bf16"], name=f"{self.name}@dense_policy")
        return self

    def with_(self, **overrides: Any) -> AttentionRecipe:
        return replace(self, **overrides)

    def numerics_key(self) -> str:
        """The recipe's JSON without its name and notes: equal for two recipes that compute
        the same (a recipe given twice under two names, a plan's twin of a scanned one)."""
        return self.with_(name="x", notes="").to_json()

    # -- serialization ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttentionRecipe:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise RecipeError(f"recipe: unknown field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**{k: _coerce(known[k], v) for k, v in data.items()})

    @classmethod
    def from_json(cls, text: str) -> AttentionRecipe:
        return cls.from_dict(json.loads(text))

    def to_string(self) -> str:
        """Compact form: the preset name plus the fields that differ from it."""
        base = PRESETS.get(self.name)
        if base is None:
            return self.to_json()
        diffs = [
            f"{f.name}={_fmt(getattr(self, f.name))}"
            for f in fields(self)
            if f.compare and f.name != "name" and getattr(self, f.name) != getattr(base, f.name)
        ]
        return self.name if not diffs else f"{self.name}:{','.join(diffs)}"

    def label(self) -> str:
        """How tables, figures and widgets name the recipe: the preset with every override
        (``to_string``); a recipe that is no preset shows its name (its JSON is too long for a
        column header; ``to_string`` gives it)."""
        return self.to_string() if self.name in PRESETS else f"{self.name} (custom recipe)"

    def describe(self) -> str:
        """Every numeric choice in words: formats, scale granularity, P scaling, output format,
        accumulation, smoothing, correction, rotation, sparsity and the dense policy."""
        if self.quantizes_qk:
            gran = f"block{self.qk_block}" if self.qk_granularity == "block" else \
                self.qk_granularity
            qk = f"{self.qk_format}/{gran}"
        else:
            qk = self.qk_format
        v = self.v_format if not self.quantizes_v else f"{self.v_format}/{self.v_granularity}"
        p = self.p_format + (f" scaling {self.p_scaling}" if self.p_format == "fp8_e4m3" else "")
        if self.p_exp != "exp2":
            p += f" {self.p_exp}"
        parts = [f"QK {qk}", f"V {v}", f"P {p}", f"out {self.out_format}"]
        if self.row_sum != "p_fp32":
            parts.append(f"row sum {self.row_sum}")
        if self.accumulation == "reduced":
            parts.append(f"accum reduced {self.accum_mantissa_bits}b {self.accum_rounding} "
                         f"flush {self.accum_flush_keys} keys")
        parts.append(f"smooth {self.smoothing}")
        if self.v_bias_correction:
            parts.append("V-bias corr")
        if self.hadamard:
            parts.append("hadamard")
        if self.sparsity == "sol":
            parts.append(f"sol tau={self.sol_tau} {self.sol_threshold} block={self.sol_block} "
                         f"band={self.sol_band}")
        elif self.sparsity == "vsa":
            parts.append(f"vsa tile={self.vsa_tile} keep={self.vsa_keep} {self.vsa_prefix}")
        if self.dense_prefix:
            parts.append("bf16 prefix rows")
        if self.prefix_blocks_exact:
            parts.append("prefix blocks exact")
        if self.dense_steps or self.dense_layers:
            parts.append(f"dense steps<{self.dense_steps} layers<{self.dense_layers}")
        return ", ".join(parts)


def _fmt(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Turn CLI strings into the field's type; reject what does not fit, naming the field."""
    typ = f.type if isinstance(f.type, str) else f.type.__name__
    if not isinstance(value, str) or typ == "str":
        if typ == "bool" and not isinstance(value, bool):
            raise RecipeError(f"recipe field {f.name!r}: expected a bool, got {value!r}")
        if typ == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise RecipeError(f"recipe field {f.name!r}: expected an int, got {value!r}")
        if typ == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RecipeError(f"recipe field {f.name!r}: expected a number, got {value!r}")
        if typ == "float":
            try:
                return float(value)
            except OverflowError:  # an int past float's range (JSON has no limit)
                raise RecipeError(f"recipe field {f.name!r}: {str(value)[:20]}... is past the "
                                  "float range") from None
        if typ == "str" and not isinstance(value, str):
            raise RecipeError(f"recipe field {f.name!r}: expected a string, got {value!r}")
        return value
    try:
        if typ == "bool":
            low = value.strip().lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError(value)
        if typ == "int":
            return int(value)
        if typ == "float":
            return float(value)
    except ValueError:
        raise RecipeError(f"recipe field {f.name!r}: cannot read {value!r} as {typ}") from None
    return value


def entry_index(name: str, x) -> int | None:
    """A step or layer argument as an int index (None stays None); RecipeError naming it when
    it is not one (negative, fractional, a bool)."""
    if x is None:
        return None
    i = _index(x)
    if i is None:
        raise RecipeError(f"{name}: {x!r}; an index >= 0 (or None)")
    return i


def _index(x) -> int | None:
    """x as an index >= 0 (an int, a numpy or torch integer, or a whole float such as 3.0), else
    None (negative, fractional, bool, or not a number)."""
    if isinstance(x, bool):
        return None
    try:
        i = operator.index(x)
    except TypeError:
        if isinstance(x, numbers.Real) and float(x).is_integer():
            i = int(x)
        else:
            return None
    return i if i >= 0 else None


def _choice(recipe: AttentionRecipe, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(recipe, name)
    if value not in allowed:
        raise RecipeError(
            f"recipe field {name!r}: unknown value {value!r}; choose one of {allowed}"
        )


def _check_types(r: AttentionRecipe) -> None:
    """Each field of its declared type, naming the field (a string "false" in a bool field is
    true, 64.5 tokens per block a crash far from here). Numpy scalars and an int in a float field
    become the plain Python value (one JSON form, so equal recipes compare equal)."""
    for f in dataclasses.fields(r):
        value, typ = getattr(r, f.name), str(f.type)
        is_bool = isinstance(value, (bool, np.bool_))
        if typ == "bool":
            ok, cast = is_bool, bool
        elif typ == "int":
            ok, cast = isinstance(value, numbers.Integral) and not is_bool, int
        elif typ == "float":
            ok, cast = isinstance(value, numbers.Real) and not is_bool, float
        elif typ == "str":
            ok, cast = isinstance(value, str), str
        else:
            continue
        if not ok:
            raise RecipeError(f"recipe field {f.name!r}: {value!r} is a {type(value).__name__}, "
                              f"not a {typ}")
        if type(value) is not cast:
            object.__setattr__(r, f.name, cast(value))


def validate(r: AttentionRecipe) -> None:
    """Raise RecipeError naming the field and why, for unknown values and invalid combinations."""
    _choice(r, "qk_format", QK_FORMATS)
    _choice(r, "qk_granularity", QK_GRANULARITIES)
    _choice(r, "v_format", V_FORMATS)
    _choice(r, "v_granularity", V_GRANULARITIES)
    _choice(r, "p_format", P_FORMATS)
    _choice(r, "p_scaling", P_SCALINGS)
    _choice(r, "p_exp", P_EXPS)
    _choice(r, "row_sum", ROW_SUMS)
    _choice(r, "out_format", OUT_FORMATS)
    _choice(r, "smoothing", SMOOTHINGS)
    _choice(r, "accumulation", ACCUMULATIONS)
    _choice(r, "accum_rounding", ACCUM_ROUNDINGS)
    _choice(r, "sparsity", SPARSITIES)
    _choice(r, "sol_threshold", SOL_THRESHOLDS)
    _choice(r, "vsa_prefix", VSA_PREFIX_MODES)
    if r.v_bias_correction and r.smoothing != "kv":
        raise RecipeError(
            "recipe field 'v_bias_correction': the correction restores the mean of the smoothed V, "
            f"so it needs smoothing='kv' (got smoothing={r.smoothing!r})"
        )
    if r.v_bias_correction and not r.quantizes_v:
        raise RecipeError(
            f"recipe field 'v_bias_correction': V is not quantized (v_format={r.v_format!r}), "
            "there is no quantization bias to correct"
        )
    if r.p_scaling != "unit" and r.p_format != "fp8_e4m3":
        raise RecipeError(
            f"recipe field 'p_scaling': {r.p_scaling!r} only applies to p_format='fp8_e4m3'"
        )
    if r.p_exp == "log_linear":
        need = [f"{k}={v!r} (got {getattr(r, k)!r})" for k, v in
                (("p_format", "fp8_e4m3"), ("p_scaling", "exp2_offset8"), ("row_sum", "p_operand"))
                if getattr(r, k) != v]
        if need:
            raise RecipeError("recipe field 'p_exp': 'log_linear' writes E4M3 codes of the "
                              "scaled P that the row sum must take too; it needs "
                              + ", ".join(need))
    for name, lo in (("qk_block", 1), ("sol_block", 1), ("vsa_tile", 1), ("accum_flush_keys", 1)):
        if getattr(r, name) < lo:
            raise RecipeError(f"recipe field {name!r}: must be >= {lo}, got {getattr(r, name)}")
    if not 1 <= r.accum_mantissa_bits <= 23:
        raise RecipeError(
            f"recipe field 'accum_mantissa_bits': must be in 1..23, got {r.accum_mantissa_bits}"
        )
    if r.sol_band < 0:
        raise RecipeError(f"recipe field 'sol_band': must be >= 0, got {r.sol_band}")
    if not 0.0 < r.vsa_keep <= 1.0:
        raise RecipeError(f"recipe field 'vsa_keep': must be in (0, 1], got {r.vsa_keep}")
    if r.dense_steps < 0 or r.dense_layers < 0:
        raise RecipeError("recipe fields 'dense_steps'/'dense_layers': must be >= 0")
    if r.prefix_blocks_exact and r.sparsity == "dense":
        raise RecipeError("recipe field 'prefix_blocks_exact': a dense recipe computes every "
                          "block exactly already (it applies to sparsity='sol' or 'vsa')")
    if r.prefix_blocks_exact and r.dense_prefix:
        raise RecipeError("recipe field 'prefix_blocks_exact': the BF16 dense-prefix rows "
                          "(dense_prefix=true) would replace the prefix rows it computes; set "
                          "dense_prefix=false")
    if r.sol_tau != r.sol_tau:  # NaN
        raise RecipeError("recipe field 'sol_tau': NaN is not a threshold")


_BF16 = dict(
    qk_format="bf16", v_format="bf16", p_format="bf16", smoothing="none", v_bias_correction=False
)
_FP8_SOL = dict(sparsity="sol", dense_prefix=True, dense_steps=10, dense_layers=2)
# the fast forms' P: scaled by 2^8, summed as P @ V's operand, its E4M3 codes without exp2
_LOG_LINEAR_P = dict(p_scaling="exp2_offset8", row_sum="p_operand", p_exp="log_linear")

PRESETS: dict[str, AttentionRecipe] = {
    r.name: r
    for r in [
        AttentionRecipe(name="bf16", **_BF16, notes="BF16 dense attention, the baseline."),
        AttentionRecipe(
            name="exact",
            qk_format="exact", v_format="exact", p_format="exact", out_format="exact",
            smoothing="none", v_bias_correction=False,
            notes="No rounding anywhere (FP32 / FP64 math): for identities and ceilings.",
        ),
        AttentionRecipe(
            name="fp8_dense",
            smoothing="none",
            v_bias_correction=False,
            notes="FP8 E4M3 QK (64-token block scales) and PV (V channel scales), no smoothing.",
        ),
        AttentionRecipe(
            name="fp8_dense_k",
            smoothing="k",
            v_bias_correction=False,
            notes="fp8_dense with K smoothing (quantize K - mu_K).",
        ),
        AttentionRecipe(
            name="fp8_dense_kv_corrected",
            notes="fp8_dense with K and V smoothing and the V-bias correction.",
        ),
        AttentionRecipe(
            name="fp8_sol_unsmoothed",
            smoothing="none",
            v_bias_correction=False,
            **_FP8_SOL,
            notes="FP8 Sol attention as first shipped: no smoothing, BF16 prefix rows.",
        ),
        AttentionRecipe(
            name="fp8_sol_k", smoothing="k", v_bias_correction=False, **_FP8_SOL,
            notes="FP8 Sol attention with K smoothing.",
        ),
        AttentionRecipe(
            name="fp8_sol_kv_corrected",
            **_FP8_SOL,
            notes="The seed PR: FP8 Sol with K/V smoothing, V-bias correction, BF16 prefix rows.",
        ),
        AttentionRecipe(
            name="fp8_dense_kv_loglinear",
            **_LOG_LINEAR_P,
            notes="fp8_dense_kv_corrected with P = 2^(s - m + 8), the row sum of the E4M3 P and "
                  "P's codes written without an exponential: the fastest dense form at the "
                  "preset's accuracy (BENCHMARKS.md).",
        ),
        AttentionRecipe(
            name="fp8_sol_kv_loglinear",
            **{**_FP8_SOL, "dense_prefix": False},
            prefix_blocks_exact=True,
            **_LOG_LINEAR_P,
            notes="fp8_sol_kv_corrected with the prefix query blocks exact in FP8 instead of "
                  "BF16 rows and P's codes as in fp8_dense_kv_loglinear: the fastest Sol form "
                  "at least as accurate as NVIDIA's Sol kernel (BENCHMARKS.md).",
        ),
        AttentionRecipe(
            name="int8_qk_fp8_pv",
            qk_format="int8",
            smoothing="k",
            v_bias_correction=False,
            notes="SageAttention2-style peer: INT8 QK with K smoothing, FP8 PV.",
        ),
        AttentionRecipe(
            name="fp8_hadamard",
            smoothing="none",
            v_bias_correction=False,
            hadamard=True,
            notes="FlashAttention-3-style incoherent processing: Hadamard on Q and K, then FP8.",
        ),
        AttentionRecipe(
            name="vsa_bf16",
            **_BF16,
            sparsity="vsa",
            vsa_tile=64,
            vsa_keep=0.25,
            vsa_prefix="exempt",
            notes="VSA block-sparse attention in BF16: keep 25% of video tiles, prefix exempt.",
        ),
    ]
}

DEFAULT_RECIPE = "fp8_sol_kv_corrected"


# fields every recipe object has had since the first version: an object without them would take
# the dataclass defaults (smoothing "kv" and the V-bias correction for {"name": "fp8_dense"}),
# not the preset its name suggests
CORE_FIELDS = ("qk_format", "v_format", "p_format", "smoothing", "sparsity")


def full_recipe(data: dict[str, Any]) -> AttentionRecipe:
    """A recipe object given whole (``workbench recipes --show NAME`` prints one): its values
    checked, and refused when it lacks a core field rather than filled with defaults."""
    r = AttentionRecipe.from_dict(data)
    missing = [f for f in CORE_FIELDS if f not in data]
    if missing:
        raise RecipeError(f"recipe: a recipe object lists every field (`workbench recipes --show "
                          f"NAME` prints one); this one lacks {missing}. For a preset with "
                          "changes write 'NAME:field=value,...'")
    return r


def get_recipe(spec: str | AttentionRecipe | dict | None = None) -> AttentionRecipe:
    """Parse a recipe from a preset name, 'preset:field=value,...', JSON text, or a dict.

    A per-(step, layer) plan (``workbench.recipes.plan``: JSON text, dict or a ``.json`` file
    path) comes back as a ``RecipePlan``, which callers use through ``.at(step, layer)``.
    """
    if spec is None:
        return PRESETS[DEFAULT_RECIPE]
    if isinstance(spec, AttentionRecipe):
        return spec
    from .plan import read_plan_spec

    plan = read_plan_spec(spec)
    if plan is not None:
        return plan
    if isinstance(spec, dict):
        return full_recipe(spec)
    if not isinstance(spec, str):
        raise RecipeError(f"recipe: expected a name, string or dict, got {type(spec).__name__}")
    text = spec.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RecipeError(f"recipe: invalid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise RecipeError(f"recipe: JSON {type(data).__name__}, expected an object")
        return full_recipe(data)
    name, _, rest = text.partition(":")
    name = name.strip()
    if name not in PRESETS:
        raise RecipeError(f"recipe: unknown preset {name!r}; presets: {sorted(PRESETS)}")
    base = PRESETS[name]
    if not rest:
        return base
    known = {f.name: f for f in fields(AttentionRecipe)}
    overrides: dict[str, Any] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise RecipeError(f"recipe {text!r}: override {item!r} is not of the form field=value")
        if key not in known or key == "name":
            raise RecipeError(f"recipe {text!r}: unknown field {key!r}")
        overrides[key] = _coerce(known[key], value.strip())
    return replace(base, **overrides)


def split_recipe_list(text: str) -> list[str]:
    """'a,b:x=1,y=2,{"json": 1, ...},plan.json' -> specs. A comma starts a new recipe unless it
    is inside JSON braces or what follows is another field=value override of the previous one."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out: list[str] = []
    for p in (x.strip() for x in parts):
        if not p:
            continue
        is_override = "=" in p and ":" not in p and not p.startswith("{")
        if is_override and out and ":" in out[-1] and not out[-1].startswith("{"):
            out[-1] += "," + p
        else:
            out.append(p)
    return out
