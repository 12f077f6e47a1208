"""Frame- and audio-level metrics of a test clip against a reference clip (the same-seed BF16 run).

Frames: video tensors [T, 3, H, W] float in [0, 1] (data range 1; other ranges, non-finite values
and frames under 6 px are refused). Audio: waveforms [N] float of one length (clips with audio
of other lengths are refused, not cut; LSD is None below 129 samples).

- frame cosine: cosine similarity of the flattened clips (and per frame).
- PSNR: 10 log10(1 / MSE) over the whole clip (per frame for the curves); inf when identical.
- SSIM mean / min: torchmetrics SSIM (Gaussian 11 x 11, sigma 1.5, C1 = 0.01^2, C2 = 0.03^2,
  channels averaged; every pixel scored, the frame padded by reflection, so on 16 px frames it
  differs from the windows-inside-the-frame convention: 0.9958 vs 0.9951 on an h3-nano pair)
  per frame, mean and worst frame (NaN when a frame's is).
- MS-SSIM: torchmetrics' 5-scale MS-SSIM per frame, averaged. The standard 5 scales need frames of
  at least 161 px, so smaller frames are first enlarged by nearest-neighbour repetition with an
  integer factor (what a viewer sees in the enlarged mp4; no new content is invented).
- audio cosine: cosine similarity of the waveforms.
- SI-SDR: scale-invariant signal-to-distortion ratio in dB, reference = clip A (``si_sdr``: inf
  when identical up to gain, -inf for a silent test clip). Invariant to gain; a delay is not
  compensated (a pure delay lowers it).
- log-spectral distance (LSD, dB): for every STFT frame (Hann window ``n_fft``, hop n_fft / 4), the
  RMS over frequency bins of the difference of the log power spectra
  10 log10(|X_a|^2 + eps) - 10 log10(|X_b|^2 + eps), averaged over STFT frames. 0 when identical.
"""

from __future__ import annotations

import math

import torch

MS_SSIM_MIN_SIDE = 176  # > (11 - 1) * 2^4 = 160, the 5-scale MS-SSIM constraint
MIN_SIDE = 6  # torchmetrics' SSIM pads each side by 5 px (reflection needs a larger frame)
LSD_N_FFT = 256


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
    """Scale-invariant SDR (dB) of `estimate` against `reference`, both made zero-mean:
    10 log10(|a r|^2 / |e - a r|^2) with a = <e, r> / <r, r>. inf when the estimate is the
    reference up to gain, -inf when it has no component along it (a silent estimate), NaN for a
    silent reference (undefined). No epsilon: torchmetrics' gave a silent estimate 0 dB (better
    than a poor one) and identical clips a finite 184 dB."""
    r = reference.detach().double().reshape(-1)
    e = estimate.detach().double().reshape(-1)
    r, e = r - r.mean(), e - e.mean()
    rr = float(r @ r)
    if rr == 0:
        return math.nan
    target = (float(e @ r) / rr) * r
    noise = e - target
    tn, nn = float(target @ target), float(noise @ noise)
    if tn == 0:  # nothing of the reference in it (a silent estimate has no noise either)
        return -math.inf
    if nn == 0:
        return math.inf
    return 10.0 * math.log10(tn / nn)


def log_spectral_distance(a: torch.Tensor, b: torch.Tensor, n_fft: int = LSD_N_FFT,
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
        for which, v in (("reference", ref_video), ("test", test_video)):
            _check_frames(which, v)
        s = per_frame_ssim(ref_video, test_video)
        out.update(
            frame_cosine=cosine(ref_video, test_video),
            psnr_db=psnr(ref_video, test_video),
            ssim_mean=float(sum(s) / len(s)),
            ssim_min=math.nan if any(math.isnan(x) for x in s) else float(min(s)),
            ms_ssim=ms_ssim(ref_video, test_video),
            curves={
                "psnr_db": per_frame_psnr(ref_video, test_video),
                "ssim": s,
                "cosine": per_frame_cosine(ref_video, test_video),
            },
        )
    ra = None if ref_audio is None or ref_audio.numel() == 0 else ref_audio.reshape(-1)
    ta = None if test_audio is None or test_audio.numel() == 0 else test_audio.reshape(-1)
    if (ra is None) != (ta is None):
        which = "reference" if ra is None else "test"
        raise ValueError(f"the {which} clip has no audio and the other has: compare clips with "
                         "audio on both sides or none")
    if ra is not None:
        if ra.numel() != ta.numel():  # was cut to the shorter, silently
            raise ValueError(f"audio lengths differ: {ra.numel()} samples (reference) vs "
                             f"{ta.numel()} (test)")
        short = ra.numel() <= LSD_N_FFT // 2  # the STFT's centred frames need more samples
        out.update(
            audio_cosine=cosine(ra, ta),
            si_sdr_db=si_sdr(ra, ta),
            lsd_db=None if short else log_spectral_distance(ra, ta),
        )
    return out


def _check_frames(which: str, v: torch.Tensor) -> None:
    """Frames [T, C, H, W] in [0, 1], finite, at least SSIM's window margin in size."""
    if v.dim() != 4 or v.shape[0] == 0:
        raise ValueError(f"{which} video: {tuple(v.shape)}; expected frames [T, C, H, W]")
    if min(v.shape[-2:]) < MIN_SIDE:
        raise ValueError(f"{which} video: frames of {v.shape[-2]} x {v.shape[-1]} px; SSIM's "
                         f"11 x 11 window needs at least {MIN_SIDE} x {MIN_SIDE}")
    bad = ~torch.isfinite(v)
    if bool(bad.any()):
        t = int(bad.nonzero()[0, 0])
        raise ValueError(f"{which} video: non-finite values (first in frame {t})")
    lo, hi = float(v.min()), float(v.max())
    if lo < -1e-6 or hi > 1 + 1e-6:  # PSNR's peak and SSIM's constants assume [0, 1]
        raise ValueError(f"{which} video: values in [{lo:.3g}, {hi:.3g}]; frames must be in "
                         "[0, 1] (decoded H3 frames in [-1, 1]: (x + 1) / 2)")


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
        return "inf" if v > 0 else "-inf"  # a silent test clip's SI-SDR is -inf, the worst
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
