"""Frame and audio metrics on signals whose answer is known."""

import math

import pytest
import torch

from workbench.metrics.media import (
    compare_media,
    cosine,
    log_spectral_distance,
    media_table,
    ms_ssim,
    psnr,
    si_sdr,
)


def _clip(seed=0, T=4, H=16, W=16):
    g = torch.Generator().manual_seed(seed)
    # Smooth content in [0.2, 0.8] so added noise never clips.
    base = torch.rand(T, 3, H // 2, W // 2, generator=g)
    v = torch.nn.functional.interpolate(base, size=(H, W), mode="bilinear", align_corners=False)
    return 0.2 + 0.6 * v


def _audio(seed=0, n=8192):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64) * 0.2


def test_identical_clips():
    v, a = _clip(), _audio()
    m = compare_media(v, v.clone(), a, a.clone())
    assert m["psnr_db"] == math.inf
    assert m["ssim_mean"] == pytest.approx(1.0, abs=1e-6)
    assert m["ssim_min"] == pytest.approx(1.0, abs=1e-6)
    assert m["ms_ssim"] == pytest.approx(1.0, abs=1e-6)
    assert m["frame_cosine"] == pytest.approx(1.0, abs=1e-12)
    assert m["audio_cosine"] == pytest.approx(1.0, abs=1e-12)
    assert m["si_sdr_db"] == math.inf  # was a finite 184 dB beside PSNR's inf
    assert m["lsd_db"] == 0.0
    assert all(x == math.inf for x in m["curves"]["psnr_db"])


@pytest.mark.parametrize("sigma,expected", [(0.01, 40.0), (0.05, 26.02)])
def test_known_noise_gives_expected_psnr(sigma, expected):
    v = _clip()
    g = torch.Generator().manual_seed(1)
    n = torch.randn(v.shape, generator=g)
    noisy = v + sigma * n / n.pow(2).mean().sqrt()  # noise of RMS exactly sigma
    # PSNR = 20 log10(1 / sigma) for noise of RMS sigma (data range 1).
    assert psnr(v, noisy) == pytest.approx(expected, abs=0.01)
    m = compare_media(v, noisy)
    assert m["ssim_mean"] < 1.0 and m["ssim_min"] <= m["ssim_mean"]
    assert 0.0 < ms_ssim(v, noisy) < 1.0


def test_more_noise_lowers_ssim_and_ms_ssim():
    v = _clip()
    g = torch.Generator().manual_seed(2)
    n = torch.randn(v.shape, generator=g)
    s1, s2 = compare_media(v, v + 0.01 * n), compare_media(v, v + 0.05 * n)
    assert s2["ssim_mean"] < s1["ssim_mean"] < 1.0
    assert s2["ms_ssim"] < s1["ms_ssim"] < 1.0


def test_si_sdr_gain_invariant_delay_sensitive():
    a = _audio()
    assert si_sdr(a, 0.5 * a) > 100.0  # pure gain: scale-invariant
    assert si_sdr(a, 3.0 * a) > 100.0
    # A pure delay of white noise decorrelates it: SI-SDR far below 0 dB.
    assert si_sdr(a, torch.roll(a, 7)) < -10.0
    assert abs(cosine(a, torch.roll(a, 7))) < 0.1


def test_si_sdr_known_snr():
    a = _audio()
    g = torch.Generator().manual_seed(3)
    n = torch.randn(a.shape, generator=g, dtype=torch.float64)
    n = n - (n @ a) / (a @ a) * a  # orthogonal to a, so SI-SDR = SNR exactly
    n = n * (a.norm() / n.norm()) * 10 ** (-20 / 20)  # 20 dB
    assert si_sdr(a, a + n) == pytest.approx(20.0, abs=0.05)


def test_lsd_of_gain_is_its_db():
    a = _audio()
    # Every bin's power drops by 20 log10(2) = 6.02 dB: the per-frame RMS difference is that.
    assert log_spectral_distance(a, 0.5 * a) == pytest.approx(20 * math.log10(2), abs=1e-3)
    assert log_spectral_distance(a, a) == 0.0


def test_table_layout():
    v, a = _clip(), _audio()
    t = media_table({"bf16": compare_media(v, v, a, a)}, "bf16")
    head = t.splitlines()[0]
    for col in ("Frame cosine", "PSNR", "SSIM mean", "SSIM min", "MS-SSIM", "Audio cosine",
                "SI-SDR", "LSD"):
        assert col in head
    assert "| inf |" in t


def test_si_sdr_edges_are_infinite_not_epsilon_values():
    a = _audio()
    assert si_sdr(a, 0.5 * a) == math.inf
    assert si_sdr(a, torch.zeros_like(a)) == -math.inf  # a silent clip was 0 dB (above a poor one)
    assert math.isnan(si_sdr(torch.zeros_like(a), a))
    ref = 10 * math.log10(float(a.var()) / 0.1**2)  # independent noise of sigma 0.1
    g = torch.Generator().manual_seed(3)
    assert si_sdr(a, a + 0.1 * torch.randn(a.shape, generator=g, dtype=a.dtype)) == \
        pytest.approx(ref, abs=0.2)


@pytest.mark.parametrize("case, msg", [
    ("short_audio", "audio lengths differ: 8192 samples"),  # was cut to the shorter, silently
    ("no_audio", "test clip has no audio"),  # was a torch traceback
    ("range", r"values in \[-0.5"),  # [-1, 1] frames: PSNR / SSIM on the wrong scale
    ("nan", "non-finite values \\(first in frame 1\\)"),
    ("tiny", "frames of 4 x 4 px"),
])
def test_compare_media_refuses_mismatched_or_invalid_clips(case, msg):
    v, a = _clip(), _audio()
    tv, ta, rv = v.clone(), a.clone(), v
    if case == "short_audio":
        ta = a[:4096]
    elif case == "no_audio":
        ta = torch.zeros(0)
    elif case == "range":
        tv = v * 2 - 1
    elif case == "nan":
        tv[1, 0, 3, 3] = float("nan")
    else:
        rv, tv = _clip(H=4, W=4), _clip(H=4, W=4)
    with pytest.raises(ValueError, match=msg):
        compare_media(rv, tv, a, ta)


def test_short_audio_has_no_lsd():
    v, a = _clip(), _audio(n=100)
    m = compare_media(v, v.clone(), a, a.clone())
    assert m["lsd_db"] is None and m["audio_cosine"] == pytest.approx(1.0)  # was a traceback


def test_table_shows_minus_inf_for_a_silent_test_clip():
    v, a = _clip(), _audio()
    m = compare_media(v, v.clone(), a, torch.zeros_like(a))
    assert m["si_sdr_db"] == -math.inf
    row = next(ln for ln in media_table({"silent": m}, "ref").splitlines() if "silent" in ln)
    assert "| -inf |" in row  # was "inf", the best score
