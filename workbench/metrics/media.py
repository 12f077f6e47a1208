"""Frame- and audio-level metrics of a test clip against a reference clip (the same-seed BF16 run).

Frames: video tensors [T, 3, H, W] float in [0, 1] (data range 1). Audio: waveforms [N] float.

- frame cosine: cosine similarity of the flattened clips (and per frame).
- PSNR: 10 log10(1 / MSE) over the whole clip (per frame for the curves); inf when identical.
- SSIM mean / min: torchmetrics SSIM (Gaussian 11 x 11, sigma 1.5) per frame, mean and worst frame.
- MS-SSIM: torchmetrics' 5-scale MS-SSIM per frame, averaged. The standard 5 scales need frames of
  at least 161 px, so smaller frames are first enlarged by nearest-neighbour repetition with an
  integer factor (what a viewer sees in the enlarged mp4; no new content is invented).
- audio cosine: cosine similarity of the waveforms.
- SI-SDR: scale-invariant signal-to-distortion ratio in dB (torchmetrics), reference = clip A.
  Invariant to gain; a delay is not compensated (a pure delay lowers it).
- log-spectral distance (LSD, dB): for every STFT frame (Hann window ``n_fft``, hop n_fft / 4), the
  RMS over frequency bins of the difference of the log power spectra
  10 log10(|X_a|^2 + eps) - 10 log10(|X_b|^2 + eps), averaged over STFT frames. 0 when identical.
"""

from __future__ import annotations

import math

import torch

MS_SSIM_MIN_SIDE = 176  # > (11 - 1) * 2^4 = 160, the 5-scale MS-SSIM constraint


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.detach().double().reshape(-1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors, flattened (1.0 when both are zero)."""
    a, b = _flat(a), _flat(b)
    na, nb = a.norm(), b.norm()
    if na == 0 and nb == 0:
        return 1.0
    return float((a @ b) / (na * nb).clamp_min(1e-300))


def psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> float:
    """PSNR in dB over all elements; inf for identical inputs."""
    mse = float(torch.mean((a.double() - b.double()) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(data_range**2 / mse)


def per_frame_psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> list[float]:
    return [psnr(a[i], b[i], data_range) for i in range(a.shape[0])]


def per_frame_cosine(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    return [cosine(a[i], b[i]) for i in range(a.shape[0])]


def per_frame_ssim(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """SSIM of every frame pair; a, b [T, C, H, W] in [0, 1]."""
    from torchmetrics.functional.image import structural_similarity_index_measure as ssim

    vals = ssim(b.float(), a.float(), data_range=1.0, reduction="none")
    return [float(v) for v in vals]


def _enlarge(x: torch.Tensor, min_side: int = MS_SSIM_MIN_SIDE) -> torch.Tensor:
    side = min(x.shape[-2:])
    f = max(1, math.ceil(min_side / side))
    if f == 1:
        return x
    return x.repeat_interleave(f, dim=-2).repeat_interleave(f, dim=-1)


def ms_ssim(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean 5-scale MS-SSIM over frames (frames enlarged by an integer factor when small)."""
    from torchmetrics.functional.image import multiscale_structural_similarity_index_measure

    # float32: 5x faster than float64 on CPU; MS-SSIM differences of 1e-6 do not matter here.
    a2, b2 = _enlarge(a.float()), _enlarge(b.float())
    vals = multiscale_structural_similarity_index_measure(
        b2, a2, data_range=1.0, reduction="none", normalize="relu"
    )
    return float(vals.mean())


def si_sdr(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    """Scale-invariant SDR (dB) of `estimate` against `reference` (zero-mean per torchmetrics)."""
    from torchmetrics.functional.audio import scale_invariant_signal_distortion_ratio

    return float(
        scale_invariant_signal_distortion_ratio(
            estimate.double(), reference.double(), zero_mean=True
        )
    )


def log_spectral_distance(a: torch.Tensor, b: torch.Tensor, n_fft: int = 256,
                          eps: float = 1e-10) -> float:
    """LSD in dB: per STFT frame, RMS over bins of the log-power difference; mean over frames."""
    win = torch.hann_window(n_fft, dtype=torch.float64)

    def logpow(x):
        X = torch.stft(x.double().reshape(-1), n_fft, hop_length=n_fft // 4, window=win,
                       return_complex=True, center=True)
        return 10.0 * torch.log10(X.abs() ** 2 + eps)  # [bins, frames]

    d = logpow(a) - logpow(b)
    return float(torch.sqrt(torch.mean(d**2, dim=0)).mean())


def compare_media(
    ref_video: torch.Tensor | None,
    test_video: torch.Tensor | None,
    ref_audio: torch.Tensor | None = None,
    test_audio: torch.Tensor | None = None,
) -> dict:
    """All frame and audio metrics of test against ref, plus per-frame curves."""
    out: dict = {}
    if ref_video is not None and test_video is not None:
        if ref_video.shape != test_video.shape:
            raise ValueError(
                f"video shapes differ: {tuple(ref_video.shape)} vs {tuple(test_video.shape)}"
            )
        s = per_frame_ssim(ref_video, test_video)
        out.update(
            frame_cosine=cosine(ref_video, test_video),
            psnr_db=psnr(ref_video, test_video),
            ssim_mean=float(sum(s) / len(s)),
            ssim_min=float(min(s)),
            ms_ssim=ms_ssim(ref_video, test_video),
            curves={
                "psnr_db": per_frame_psnr(ref_video, test_video),
                "ssim": s,
                "cosine": per_frame_cosine(ref_video, test_video),
            },
        )
    if ref_audio is not None and test_audio is not None:
        n = min(ref_audio.numel(), test_audio.numel())
        ra, ta = ref_audio.reshape(-1)[:n], test_audio.reshape(-1)[:n]
        out.update(
            audio_cosine=cosine(ra, ta),
            si_sdr_db=si_sdr(ra, ta),
            lsd_db=log_spectral_distance(ra, ta),
        )
    return out


TABLE_COLUMNS = [
    ("frame_cosine", "Frame cosine", "{:.6f}"),
    ("psnr_db", "PSNR (dB)", "{:.2f}"),
    ("ssim_mean", "SSIM mean", "{:.4f}"),
    ("ssim_min", "SSIM min", "{:.4f}"),
    ("ms_ssim", "MS-SSIM", "{:.4f}"),
    ("audio_cosine", "Audio cosine", "{:.6f}"),
    ("si_sdr_db", "SI-SDR (dB)", "{:.2f}"),
    ("lsd_db", "LSD (dB)", "{:.3f}"),
]


def _cell(v, fmt: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return fmt.format(v)


def media_table(rows: dict[str, dict], reference: str) -> str:
    """Markdown table, one row per variant, every metric against `reference` (the seed's layout)."""
    head = "| Variant (vs " + reference + ") | " + " | ".join(c[1] for c in TABLE_COLUMNS) + " |"
    sep = "|---|" + "|".join("---:" for _ in TABLE_COLUMNS) + "|"
    lines = [head, sep]
    for name, m in rows.items():
        lines.append(
            f"| {name} | " + " | ".join(_cell(m.get(k), f) for k, _, f in TABLE_COLUMNS) + " |"
        )
    return "\n".join(lines)
