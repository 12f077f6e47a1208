"""Timing harness: CUDA-event medians with warm-up, rotating input sets, peak memory, ceilings.

Every time here is ``triton.testing.do_bench(..., return_mode="median")`` (CUDA events around each
call, warm-up first, L2 flushed between calls by do_bench). Callers rotate several input sets
through
``Rotating`` so no variant is timed on a buffer the L2 already holds.
"""

from __future__ import annotations

import datetime
import platform
import shutil
import statistics
import subprocess
import time

import torch


class Rotating:
    """Cycle through input sets: ``fn(*rot.next())`` uses a different set on every call."""

    def __init__(self, sets):
        self.sets = list(sets)
        self.i = 0

    def next(self):
        s = self.sets[self.i % len(self.sets)]
        self.i += 1
        return s


def _smi_id(props=None) -> str:
    """nvidia-smi's --id for torch's current CUDA device: its PCI address (domain:bus:device.0),
    which names the same board under CUDA_VISIBLE_DEVICES; "0" without CUDA or PCI fields."""
    try:
        if props is None:
            if not torch.cuda.is_available():
                return "0"
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return (f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:"
                f"{props.pci_device_id:02X}.0")
    except (AttributeError, RuntimeError):
        return "0"


class BoardSampler:
    """SM clock (MHz) and board power (W) of a GPU (default: torch's current device, by its PCI
    address) sampled every `period_ms` by ``nvidia-smi`` while the ``with`` block runs;
    ``result()`` -> {"sm_mhz", "power_w"} medians of the samples after the first `skip` (the
    tool starts while the GPU may still idle), or {} where nvidia-smi is absent or gave nothing.
    The instantaneous power field where the driver has it (the plain one is a one-second
    average, which smears idle time into short runs)."""

    def __init__(self, period_ms: int = 100, skip: int = 5, gpu: str | None = None):
        self.period_ms = period_ms
        self.skip = skip
        self.gpu = gpu if gpu is not None else _smi_id()
        self.proc = None
        self.text = ""

    def _power_field(self, tool: str) -> str:
        try:
            p = subprocess.run([tool, f"--id={self.gpu}", "--query-gpu=power.draw.instant",
                                "--format=csv,noheader,nounits"], capture_output=True,
                               text=True, timeout=10)
            return "power.draw.instant" if p.returncode == 0 and "N/A" not in p.stdout \
                else "power.draw"
        except (OSError, subprocess.SubprocessError):
            return "power.draw"

    def __enter__(self):
        tool = shutil.which("nvidia-smi")
        if tool:
            self.proc = subprocess.Popen(
                [tool, f"--id={self.gpu}", f"--query-gpu=clocks.sm,{self._power_field(tool)}",
                 "--format=csv,noheader,nounits", f"-lms={self.period_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.text = self.proc.communicate(timeout=10)[0]
            except subprocess.TimeoutExpired:  # a hung tool costs the samples, not the run
                self.proc.kill()
                self.text = ""
                self.proc.communicate()
        return False

    def result(self) -> dict:
        rows = []
        for line in self.text.splitlines():
            try:
                mhz, watts = (float(x) for x in line.split(","))
            except ValueError:  # "[N/A]" or a partial last line
                continue
            rows.append((mhz, watts))
        rows = rows[self.skip:] if len(rows) > 2 * self.skip else rows[len(rows) // 2:]
        if not rows:
            return {}
        return {"sm_mhz": statistics.median(r[0] for r in rows),
                "power_w": statistics.median(r[1] for r in rows)}


def board_under_load(fn, seconds: float = 2.0) -> dict:
    """{"sm_mhz", "power_w"} while fn runs back to back for `seconds` (``BoardSampler``), or {}
    without nvidia-smi. Why: an H200 running a dense FP8 attention kernel sits at its 700 W
    board limit with the SM clock below its maximum (1800 vs 1980 MHz, measured 2026-12-01), so
    a row's time depends on the power it draws, which this shows beside it."""
    with BoardSampler() as board:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            fn()
            torch.cuda.synchronize()
    return board.result()


def median_ms(fn, *, warmup_ms: int = 100, rep_ms: int = 500) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def interleaved_ms(fns: dict, *, rounds: int, rep_ms: int = 150) -> dict[str, list[float]]:
    """{label: [``median_ms`` of each round]}: every fn timed once per round, the fns in turn,
    `rounds` rounds. Options compared this way share the GPU's drifts (clocks, temperature,
    neighbours); timed one after the other, whole-call medians moved by up to 0.5 ms between runs
    of unchanged code at the H3 shape (H200, 2026-12-01), more than the options differed."""
    times = {label: [] for label in fns}
    labels = list(fns)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:  # rotated: no slot bias
            times[label].append(median_ms(fns[label], rep_ms=rep_ms))
    return times


def kernel_profile(fn, n: int = 3) -> list[dict]:
    """Where one call's GPU time goes: [{kernel, ms_per_call}] over n calls (torch profiler,
    CUDA activity), longest first, then the calls' span per call (kernels + gaps + work on other
    streams overlapping them)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    rows, t0, t1 = {}, None, None
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        rows[e.name] = rows.get(e.name, 0.0) + e.device_time_total / 1e3 / n
        t0 = e.time_range.start if t0 is None else min(t0, e.time_range.start)
        t1 = e.time_range.end if t1 is None else max(t1, e.time_range.end)
    out = [{"kernel": name[:90], "ms_per_call": v} for name, v in
           sorted(rows.items(), key=lambda kv: -kv[1])]
    if t0 is not None:
        out.append({"kernel": "(span of the calls / n, incl. gaps)",
                    "ms_per_call": (t1 - t0) / 1e3 / n})
    return out


def kernel_timeline(fn, n: int = 3) -> list[dict]:
    """The GPU work of the last of n profiled calls in launch order: [{kernel, start_us, us,
    gap_us}] (start relative to that call's first kernel; gap = idle time since the previous
    kernel ended, negative where they overlap on two streams). Why beside ``kernel_profile``:
    a call's span exceeded the sum of its longest kernels by 0.4-0.5 ms, and only the whole
    sequence shows whether that is many small launches or idle time between them."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            if i == n - 1:
                torch.cuda.synchronize()  # the last call starts on an idle GPU
                torch.cuda._sleep(20_000_000)  # and its launches queue behind a sleep
            fn()
        torch.cuda.synchronize()
    ev = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type.name == "CUDA"), key=lambda t: t[0])
    # the last call: everything after the sleep kernel
    last = max((i for i, t in enumerate(ev) if "spin_kernel" in t[2] or "sleep" in t[2].lower()),
               default=-1)
    ev = ev[last + 1:]
    if not ev:
        return []
    t0, prev_end, out = ev[0][0], ev[0][0], []
    for start, end, name in ev:
        out.append({"kernel": name[:90], "start_us": start - t0, "us": end - start,
                    "gap_us": start - prev_end})
        prev_end = max(prev_end, end)
    return out


def graph_median_ms(fn, *, warmup_ms: int = 100, rep_ms: int = 500) -> float | None:
    """GPU time of fn without the host's launch time: fn captured once in a CUDA graph (after two
    eager calls that compile and warm it), then ``median_ms`` of the graph's replays. None when
    fn cannot be captured (it synchronizes, or allocates in a way capture refuses). For passes
    made of many small launches, whose eager time is the host's, not the GPU's."""
    for _ in range(2):  # outside the try: a failing fn is an error, not "not capturable"
        fn()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - capture refused: the caller reports no graph time
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return None
    return median_ms(graph.replay, warmup_ms=warmup_ms, rep_ms=rep_ms)


def peak_extra_gib(fn) -> float:
    """Peak device memory allocated during one call, beyond what was allocated before it (GiB)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def env_info() -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version())
    try:
        import cudnn

        info["cudnn_frontend"] = getattr(cudnn, "__version__", "?")
    except Exception:  # noqa: BLE001 - optional package, any import failure means absent
        pass
    return info


def copy_bandwidth_tbs(n_bytes: int = 2 << 30) -> float:
    """Device-to-device copy rate, bytes read + written per second (TB/s)."""
    x = torch.randn(n_bytes // 4, device="cuda")
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x))
    return 2 * n_bytes / (ms * 1e-3) / 1e12


def matmul_tflops(dtype: str = "bf16", n: int = 8192) -> float:
    """Dense n^3 matmul rate on random data (bf16 torch.mm, or fp8 torch._scaled_mm)."""
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    if dtype == "bf16":
        a, b = a.bfloat16(), b.bfloat16()
        fn = lambda: a @ b  # noqa: E731
    else:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t()  # column-major second operand, as _scaled_mm needs
        one = torch.ones((), device="cuda")
        fn = lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)  # noqa: E731
    ms = median_ms(fn)
    return 2 * n**3 / (ms * 1e-3) / 1e12
