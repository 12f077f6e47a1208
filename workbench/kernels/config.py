"""Kernel configurations: frozen dataclasses passed explicitly, with named presets.

Every kernel entry point takes ``config=`` (``kv_stats(..., config=StatsConfig)``,
``quantize_qkv(..., config=QuantConfig)``, ``fp8_attention_fwd(..., config=AttentionConfig)``,
``routing.block_sums(..., config=RoutingConfig)``,
``dispatch.fp8_recipe_attention(..., config=KernelConfig)``); the default is ``DEFAULT``, the
values measured fastest on an H200 (BENCHMARKS.md). Nothing reads module globals for tuning, and
every config computes the same values (only the attention config's ``flush`` changes how the FP8
products reach FP32, never the precision contract), so a sweep can pass any of them.

Measured H200 values (torch 2.11, triton 3.6, shape (1, 32626, 56, 128)), 2026-11-30:
- attention: 64 query rows x 128 keys per tile, 4 warps, 2 pipeline stages, a 168-register cap
  (3 programs per SM), host-built TMA descriptors, the per-tile FP32 flush written as an FMA
  (``flush="fma"``: ptxas keeps the wgmmas asynchronous), 37.2 ms for the kernel alone; since
  2026-12-01 the dense kernel runs warp-specialized (3 consumer warpgroups of 64 rows and a TMA
  producer warp per CTA, 2 slots): 33.44 ms, the same values;
- statistics: 16-token sub-tiles, 64 per program as 4 loop steps of 16 unrolled, 4 warps, heads
  first: 0.263 ms = 84% of the copy bandwidth;
- quantizer: one 64-token V tile per program transposed as the 16-bit tile, 4 warps; Q/K blocks
  4 warps; heads-first grid; correction tiles of 4 channels x 512 tokens: 0.73 ms.

Options that benchmarks measured slower were removed; the code is in the history (commit 032b533
has all of them): lazy rescaling (``lazy_tau``, +10%), triton's automatic warp specialization
(spills, +15%), descriptors built in the kernel (``use_tma="device"``, +3-12%) and its scratch
allocator, the unfolded K scales (``sk_fold=False``, 609 vs 563 SASS per key tile, +4%), explicit
P rounding on the GPU (``round_p``, 22% slower, identical values: the hardware cast rounds the same
way; the interpreter still rounds explicitly), explicit E4M3 rounding in the GPU quantizer
(``HW_ROUND=False``, 1.87 vs 1.26 ms, same values), the V transpose store modes 0 and 1 and
several sub-tiles per V program (``V_TRANS_STORE``, ``V_SUB``: slower in every measured config).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace

FLUSHES = ("fma", "triton")
SCHEDULES_DENSE = ("programs", "warp_specialized")


@dataclass(frozen=True)
class AttentionConfig:
    """Tiling and launch of ``attention_fp8.fp8_attention_fwd``.

    flush: how each tile's FP8 product chains reach the FP32 accumulator, both after at most
    ``max_imprecise`` terms. "fma": Q K^T as one head-dim-long chain from zero and P @ V into a
    fresh accumulator added with ``acc * alpha + pv`` (production); "triton": triton's
    ``max_num_imprecise_acc`` on both dots, which makes ptxas serialize every wgmma (C7514, 2-4%
    slower) and is kept as the accuracy reference: with ``max_imprecise=0`` it accumulates in full
    FP32 after every 32-wide MMA step (4.4x slower, the same rel-L2 on the H200).
    """

    block_m: int = 64  # query rows per program (one warpgroup)
    block_n: int = 128  # keys per tile: 64 (one K scale per tile) or 128 (two, folded)
    num_warps: int = 4
    num_stages: int = 2
    maxnreg: int | None = 168  # register cap: 3 programs per SM on Hopper
    use_tma: bool = True  # host-built TMA descriptors (False: pointer loads)
    flush: str = "fma"
    max_imprecise: int = 128
    # "programs": independent 64-row programs, 3 per SM (the Triton kernel, attention_fp8);
    # "warp_specialized": CTAs of three 64-row consumer warpgroups sharing each K / V tile, loaded
    # by one producer warp into num_stages slots (the Gluon kernel, attention_fp8_ws; the same
    # values bit for bit, 33.44 vs 37.47 ms at the H3 shape on the H200). It applies to dense
    # E4M3 attention with head dim 128 on the GPU; routing lists (block-sparse), head dim 64,
    # BF16 operands, Triton's interpreter and tilings other than the one it implements (64-row
    # consumers, 128-key tiles, TMA, flush "fma") run the programs kernel (``dense_schedule``).
    schedule: str = "warp_specialized"
    # the BF16 dense-prefix rows (recipes with dense_prefix: SDPA on the first rows) on a side
    # CUDA stream, concurrent with the statistics, routing, quantizer and FP8 attention passes
    # (False: after them, on the caller's stream); the same values either way. H200, Sol at
    # density 0.149 (2026-12-01): 11.36 vs 11.70 ms
    prefix_stream: bool = True

    @property
    def dense_schedule(self) -> str:
        """The schedule a dense E4M3 launch with head dim 128 on the GPU gets."""
        ws_tiling = (self.block_m, self.block_n, self.use_tma, self.flush) == (64, 128, True, "fma")
        return "warp_specialized" if self.schedule == "warp_specialized" and ws_tiling else \
            "programs"

    def __post_init__(self) -> None:
        _check_ints(self, pow2=("num_warps",), positive=("num_stages",))
        if isinstance(self.max_imprecise, bool) \
                or not isinstance(self.max_imprecise, numbers.Integral) \
                or self.max_imprecise < 0:  # 0: full FP32 accumulation (flush "triton")
            raise ValueError(f"AttentionConfig.max_imprecise: {self.max_imprecise!r}; an int >= 0")
        if self.schedule not in SCHEDULES_DENSE:
            raise ValueError(f"AttentionConfig.schedule: {self.schedule!r}; choose one of "
                             f"{SCHEDULES_DENSE}")
        if self.flush not in FLUSHES:
            raise ValueError(f"AttentionConfig.flush: {self.flush!r}; choose one of {FLUSHES}")
        if self.block_n not in (64, 128):
            raise ValueError(f"AttentionConfig.block_n: {self.block_n!r}; choose 64 or 128 "
                             "(one or two 64-token K scales per key tile)")
        if self.block_m not in (64, 128):
            raise ValueError(f"AttentionConfig.block_m: {self.block_m!r}; choose 64 or 128")
        if self.flush == "fma" and self.block_n > self.max_imprecise:
            raise ValueError(f"AttentionConfig: flush='fma' flushes after block_n={self.block_n} "
                             f"FP8 terms, more than max_imprecise={self.max_imprecise}; use "
                             "flush='triton'")


@dataclass(frozen=True)
class QuantConfig:
    """Programs of ``quantize.quantize_qkv`` (Q/K block pass, V transpose pass, V correction)."""

    # Q / K block pass: H200, H3 shape, Q then centred K (2026-12-01, medians of 7 interleaved
    # rounds, the same codes): 0.624 / 0.434 / 0.427 / 0.556 ms at 2 / 4 / 8 / 16 warps, with
    # div_rn; with div_exact (2026-12-02) 0.191 (Q) + 0.205 (K) ms at 8, others not re-measured
    qk_warps: int = 8
    # Q's codes with its 64-token block sums in one read (a sparse call): warps per program.
    # H200, H3 shape, 2026-12-03 (do_bench medians): 0.222 / 0.255 / 0.408 / 0.716 ms at 2 / 4 /
    # 8 / 16 warps (the column sums' reduction across warps costs registers and barriers);
    # Q's codes alone at 8 warps 0.192, the block sums of Q, K and V 0.353
    q_sums_warps: int = 2
    v_rows: int = 64  # tokens per V program (one tile, transposed as the 16-bit tile)
    v_warps: int = 4
    corr_rows: int = 4  # channels of V^T summed per correction program
    corr_block_t: int = 512  # tokens per step (or its gcd with the padded length)
    # Grid order: True = consecutive programs take the heads of one token block, so the programs
    # in flight together read whole [H * D] token rows (0.730 vs 0.744 ms for the quantizer).
    heads_first: bool = True
    # V^T's tokens in the order of P's wgmma registers within each 32-token group: the attention
    # kernel feeds P to P @ V without a layout conversion (512 vs 563 SASS per key tile). False
    # stores token order (the reference the CPU test compares against).
    v_perm: bool = True

    def __post_init__(self) -> None:
        _check_ints(self, pow2=("qk_warps", "q_sums_warps", "v_warps", "corr_rows",
                                "corr_block_t"))
        if self.v_rows not in (32, 64, 128, 256):
            raise ValueError(f"QuantConfig.v_rows: {self.v_rows}; a power of two 32..256 "
                             "(a divisor of the 256-token padding)")


@dataclass(frozen=True)
class StatsConfig:
    """Programs of ``kv_stats.kv_stats``: each sums ``rows * sub`` tokens of one head."""

    rows: int = 16  # tokens per sub-tile
    sub: int = 64  # sub-tiles per program
    warps: int = 4
    unroll: int = 16  # sub-tiles unrolled per loop step (gcd with sub)
    stages: int = 1  # software pipelining of the loop over groups (1 = none)
    heads_first: bool = True  # grid order, as QuantConfig.heads_first
    final_chunks: int = 8  # partial rows added per finalize step

    def __post_init__(self) -> None:
        _check_ints(self, pow2=("rows", "sub", "warps", "final_chunks"),
                    positive=("unroll", "stages"))


def _check_ints(obj, *, pow2=(), positive=()) -> None:
    """Launch sizes: ints >= 1, powers of two where Triton's tiles need them (a bad one is named
    here instead of failing as a division by zero or a compiler error at launch)."""
    for name in (*pow2, *positive):
        n = getattr(obj, name)
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 or (
                name in pow2 and n & (n - 1)):
            kind = "a power of two" if name in pow2 else "an int >= 1"
            raise ValueError(f"{type(obj).__name__}.{name}: {n!r}; {kind}")


SCHEDULES = ("rows", "heavy_first", "warp_specialized")
WS_GROUPINGS = ("consecutive", "by_length")
SUMMARY_PRECISIONS = ("bf16", "tf32", "ieee")
SUMMARY_KERNELS = ("gluon", "triton", "fp8_tiles")


@dataclass(frozen=True)
class SparseConfig:
    """Block-sparse attention on routing lists (``attention_fp8.fp8_attention_fwd(routing=...)``;
    the exact tiles use ``AttentionConfig`` as the dense loop does, with 64-row programs).

    schedule: the order in which programs take query blocks: "rows" = the dense grid order;
    "heavy_first" = a work list sorted by exact-list length, longest first (the long lists start
    early and the short ones fill the tail); "warp_specialized" (default) = the exact tiles in
    the Gluon kernel (``attention_fp8_ws_lists``): CTAs of three consecutive query blocks of one
    head, a TMA producer warp feeding each consumer warpgroup's ring from its list (one KV part,
    E4M3 operands, head dim 128, TMA boxes, compiled; otherwise the "rows" programs). The same
    output bits as "rows"; on the H200 (2026-12-01) the exact-tile pass 6.37 vs 6.59 ms at Sol
    density 0.149 and whole calls 4-5% faster at densities 0.35-1.
    kv_splits: 1, 2 or 4 programs per query block, each a contiguous part of its exact list,
    plus a combine pass; None = the rule: 1 when the grid fills at least ``split_below_waves``
    waves of ``programs_per_sm`` programs per SM, else 2, or 4 below a quarter of that.
    summary_chunk: not-exact key blocks per step of Sol's summary route.
    summary_precision: the operands of the summary route's two products q . kc and w @ vc, both
    accumulated in FP32: "bf16" (tensor cores, 8-bit mantissas; Q's E4M3 codes are exact), "tf32"
    (tensor cores, 10-bit mantissas) or "ieee" (FP32 FMAs, the twin's arithmetic).
    Where the warp-specialized list kernel does not take it (``summary_kernel``), Sol's summary
    route runs as its own launch that hands its softmax state (acc, m, l) to the exact-tile
    launch, which then keeps the dense loop's register budget. Run after the exact
    tiles in the same program (commit 116e606 has it), its operands next to the accumulator need
    more than 168 registers: with the cap ptxas spills and serializes every wgmma, without it
    two programs fit an SM instead of three (H200, density 0.149: 17.09 vs 16.06 ms). Inside
    the warp-specialized kernel (commit 1e33a5d: after a consumer's exact tiles, its ring
    holding Q in BF16 and kc / vc chunks gathered by cp.async) it also lost: the list kernel
    7.49 ms against 5.62 + 1.58 for the exact tiles and the pass (H200, 2026-12-01).
    tma: the exact tiles' K and V as one TMA box per 64-key block, each box feeding its own
    Q K^T and P @ V from shared memory (True), or gathered pointer loads (False). With BF16
    summary operands kc and vc / s_v are rounded to BF16 once on the host (the values the kernel
    rounded to before).
    maxnreg: the register cap of the exact-tile launch (None: none); the summary pass takes its
    kernel's own (Gluon: 128; Triton: none).
    summary_kernel: the summary pass as a Gluon kernel ("gluon": Q's BF16 codes and the kc /
    vc chunks in shared memory, products added into the accumulator: 125 registers, four
    programs per SM; ``summary_gluon``; compiled, E4M3 operands, head dim 128, BF16 summary
    operands in chunks of 16 or 32) or the Triton kernel's specialization ("triton": 168
    registers, three per SM; also every case the Gluon one does not take). H200, H3 anchor
    (2026-12-01): the pass 1.49-1.50 ms against 1.55-1.58, the same output bits; whole calls
    within the interleaved rounds' spread (10.48 vs 10.62 and 10.70 vs 10.47 ms, 7 rounds each).
    Sharing each chunk among a CTA's three query blocks was slower (commit c2419c8).
    "fp8_tiles" (default): no pass; the warp-specialized exact-tile kernel runs the route as
    E4M3 tiles after each consumer's exact tiles, every key block in 128-block tiles, a
    consumer's exact blocks masked by a score bias (``attention_fp8_ws_lists.summary_tiles``:
    kc / skc with one scale per head, vc / (256 s_v), P = 2^(s - m + 8); with a scaled P the
    first summary tile divides the state by its factor; where that kernel does not run,
    "gluon"). No summary state goes through memory (the pass's FP32 state is 0.94 GB at the H3
    shape, written once and read once). H200, H3 shape, same runs (2026-12-01): whole calls
    at Sol tau 1 (density 0.149) 10.026 / 9.967 ms against 10.206 /
    10.356 for the Gluon pass (medians of 7 / 11 interleaved rounds), at tau 1.247 (density
    0.10) 8.009 vs 8.519, at tau 0.36 (density 0.35) 17.807 vs 17.621; rel-L2 vs float64 at
    tau 1 6.499e-3 against 6.493e-3 (the twin's FP32 route: 6.501e-3).
    ws_grouping: which three query blocks of a head share a CTA of the warp-specialized exact
    tiles: "consecutive" (sequence order) or "by_length" (sorted by exact-list length, longest
    first: the CTA's time is its longest list, and at Sol tau 1 on synthetic H3 inputs the three
    consecutive lists keep its consumers busy 95% of that time, 100% when sorted). Measured on
    the H200 at the H3 shape, Sol tau 1, medians of interleaved rounds (scripts/gpu_sparse_ab.py,
    2026-12-01): 10.75 / 10.83 ms against 10.88 / 10.87 in two runs (0.3-1.1%, within the
    rounds' spread of about 0.5 ms; the same output bits).
    Measured on the H200 at the H3 shape, Sol tau 1 (density 0.149), full calls (BENCHMARKS.md,
    2026-12-01): the defaults 11.7 ms; heavy-first 12.7, kv_splits 2 11.9, no register cap 11.9,
    gathered loads 12.6, summary chunk 16 / 64 11.8 / 11.7 (chunk 64 within noise, kept 32);
    with the warp-specialized exact tiles, CTAs by list length and 2-warp block sums (commit
    ba10f55) 11.03-11.09 ms, NVIDIA's CuTe sol_attn 11.09 in the same run (single timings; the
    interleaved medians of the options are in BENCHMARKS.md).
    Offline sm_90 compiles (scripts/sass_stats.py), SASS instructions of the main loop per 128
    exact keys: dense 512 (168 registers); sparse with two TMA boxes 600 (168 registers, a few
    spills in the loop; 591 without the cap, which measured slower), gathered loads 1321; TF32
    summary operands make ptxas serialize the wgmmas (BF16 operands do not).
    """

    schedule: str = "warp_specialized"
    kv_splits: int | None = None
    split_below_waves: float = 2.0
    programs_per_sm: int = 3  # AttentionConfig.maxnreg = 168: three 64-row programs per SM
    summary_chunk: int = 32
    summary_precision: str = "bf16"
    tma: bool = True
    maxnreg: int | None = 168
    ws_grouping: str = "by_length"
    summary_kernel: str = "fp8_tiles"
    # query blocks routed to every key block (``prefix_blocks_exact``), three per CTA: True =
    # the warp-specialized dense kernel computes them on a side stream beside the list kernel
    # (one K / V tile shared by a CTA's three consumers); False = the list kernel, their CTAs
    # first (each consumer loads its own copy of every tile)
    dense_rows_kernel: bool = True

    def __post_init__(self) -> None:
        _check_ints(self, positive=("programs_per_sm",))
        w = self.split_below_waves
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not (
                math.isfinite(w) and w > 0):
            raise ValueError(f"SparseConfig.split_below_waves: {self.split_below_waves!r}; a "
                             "positive number of waves")
        if self.ws_grouping not in WS_GROUPINGS:
            raise ValueError(f"SparseConfig.ws_grouping: {self.ws_grouping!r}; choose one of "
                             f"{WS_GROUPINGS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"SparseConfig.schedule: {self.schedule!r}; choose one of "
                             f"{SCHEDULES}")
        if self.kv_splits not in (None, 1, 2, 4):
            raise ValueError(f"SparseConfig.kv_splits: {self.kv_splits!r}; choose 1, 2, 4 or None")
        if self.summary_precision not in SUMMARY_PRECISIONS:
            raise ValueError(f"SparseConfig.summary_precision: {self.summary_precision!r}; "
                             f"choose one of {SUMMARY_PRECISIONS}")
        if self.summary_kernel not in SUMMARY_KERNELS:
            raise ValueError(f"SparseConfig.summary_kernel: {self.summary_kernel!r}; choose one "
                             f"of {SUMMARY_KERNELS}")
        if self.summary_chunk not in (16, 32, 64, 128):
            raise ValueError(f"SparseConfig.summary_chunk: {self.summary_chunk}; choose 16, 32, "
                             "64 or 128")

    def splits_for(self, n_programs: int, n_sms: int) -> int:
        """kv_splits, or the rule's choice for a grid of n_programs (list rows) on n_sms SMs."""
        if self.kv_splits is not None:
            return self.kv_splits
        waves = n_programs / (n_sms * self.programs_per_sm)
        if waves >= self.split_below_waves:
            return 1
        return 2 if waves >= self.split_below_waves / 4 else 4


@dataclass(frozen=True)
class RoutingConfig:
    """Launch shapes of the routing passes (``routing.block_sums`` and the list pass of
    ``routing.sol_lists`` / ``vsa_lists`` / ``mask_lists``).

    block_rows / block_warps / group_heads: the block-sum pass's programs, one per (64-token
    block, group of group_heads heads) of one of Q, K and V, summing block_rows x (group_heads x
    head dim) sub-tiles laid out with whole channels in a thread, so the sums and V's extremes
    need no reduction across threads (sm_90 SASS: no SHFL, 128-bit loads). Measured on the H200
    at the H3 shape (2026-12-01): block sums + V extremes 0.363 ms (3.86 TB/s read) with 2 rows x
    4 warps x 8 heads, 0.391 with 4 rows, 0.482 with 4 rows x 2 warps, 2.63 with 4 heads (and
    5.15 with 2 rows x 8 warps, 2026-12-02); whole Sol calls at tau 1 10.26 / 10.29 ms with 2 /
    4 rows (medians of 7 interleaved rounds). A
    program per head and block, reducing across its threads, took 0.478-0.505 ms at its best
    shapes (32 / 16 rows x 2 warps, two runs; calls 10.54 ms; code at b82b463).
    list_rows: list rows (b, h, i) per program of the list pass (each padded to a power of two
    of key blocks); list_warps per program.
    sol_front: how a sparse Sol call gets mu_K, mu_V, V's absmax, kc, vc, the query block means
    and theta from the block sums: "torch" (about thirty small launches, the twin's own ops) or
    "triton" (``routing.sol_routing_fused``: its own launches (one then, two since the
    statistics were taken once per head, not by every program of it), the exact
    threshold taken by the list pass from the scores' rows as their mean + tau x their standard
    deviation, which it equals; the same values up to FP32 rounding). H200, H3 shape, 2026-12-01
    (medians of interleaved rounds, whole Sol calls): 9.479 vs 9.849 ms at tau 1, 7.551 vs
    8.227 at 1.247, 17.323 vs 17.591 at 0.36, level with the diagonal threshold (10.434 vs
    10.376); the routing's small launches 0.469 vs 0.620 ms of GPU time; the same decisions as
    the torch front at the H3 shape (0 of 14.6 M pairs differ) and the same accuracy.
    front_parts / front_rows: the front's row launch's programs per K/V head (each a share of
    the block rows) and rows per step, for both launches (H200, H3 shape, when the front was one
    launch whose every program also read the statistics: 0.122 / 0.098 / 0.093 / 0.116 / 0.231
    ms at 1 / 2 / 4 / 8 / 16 parts of 32 rows, the same bits). front_channels: channels per
    program of the front's statistics launch (a program per K/V head and channel group, over
    all block rows). Both launches with the summary tiles, H200, H3 shape, 2026-12-03, do_bench
    medians (L2 flushed: the block sums come from HBM; in a call they are partly in L2, 0.083
    ms there): 0.093 ms at 16 channels x 64 rows x 4 parts, 0.097 at 8 x 64, 0.150 at 16 x 16,
    0.183 / 0.223 / 0.245 / 0.237 at 8 / 16 / 32 / 64 channels x 32 rows, 0.154 / 0.152 at 2
    / 8 parts of 16 x 32 (the one launch plus the summary operands' launch it replaced: 0.091 +
    0.067 ms in a call).
    """

    block_rows: int = 2
    block_warps: int = 4
    group_heads: int = 8
    list_rows: int = 4
    list_warps: int = 4
    sol_front: str = "triton"
    front_parts: int = 4
    front_rows: int = 64
    front_channels: int = 16

    def __post_init__(self) -> None:
        for name in ("block_rows", "block_warps", "group_heads", "list_rows", "front_rows",
                     "front_channels"):
            n = getattr(self, name)
            if n < 1 or n & (n - 1):
                raise ValueError(f"RoutingConfig.{name}: {n} is not a power of two")
        if self.front_parts < 1:
            raise ValueError(f"RoutingConfig.front_parts: {self.front_parts} is not >= 1")
        if self.sol_front not in ("torch", "triton"):
            raise ValueError(f"RoutingConfig.sol_front: {self.sol_front!r} is not 'torch' or "
                             "'triton'")


@dataclass(frozen=True)
class KernelConfig:
    """The configs of one full recipe call (``dispatch.fp8_recipe_attention``)."""

    attention: AttentionConfig = field(default_factory=AttentionConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    sparse: SparseConfig = field(default_factory=SparseConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)

    @classmethod
    def h200(cls) -> KernelConfig:
        """The values measured fastest on one H200 (see the module docstring)."""
        return cls()

    def with_attention(self, **overrides) -> KernelConfig:
        return replace(self, attention=replace(self.attention, **overrides))

    def with_quant(self, **overrides) -> KernelConfig:
        return replace(self, quant=replace(self.quant, **overrides))

    def with_stats(self, **overrides) -> KernelConfig:
        return replace(self, stats=replace(self.stats, **overrides))

    def with_sparse(self, **overrides) -> KernelConfig:
        return replace(self, sparse=replace(self.sparse, **overrides))

    def with_routing(self, **overrides) -> KernelConfig:
        return replace(self, routing=replace(self.routing, **overrides))

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)

    @classmethod
    def from_overrides(cls, overrides: dict, base: KernelConfig | None = None) -> KernelConfig:
        """``{"attention": {...}, "quant": {...}, "stats": {...}, "sparse": {...},
        "routing": {...}}`` applied to `base` (default DEFAULT); an unknown section or field
        raises ValueError naming it."""
        cfg = base or DEFAULT
        for section, values in overrides.items():
            if section not in ("attention", "quant", "stats", "sparse", "routing"):
                raise ValueError(f"kernel config: unknown section {section!r} "
                                 "(attention, quant, stats, sparse, routing)")
            sub = getattr(cfg, section)
            try:
                cfg = replace(cfg, **{section: replace(sub, **values)})
            except TypeError as exc:
                raise ValueError(f"kernel config section {section!r}: {exc}") from None
        return cfg


DEFAULT = KernelConfig.h200()
