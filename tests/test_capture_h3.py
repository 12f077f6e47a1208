"""Capture on diffusers' MiniMaxH3Transformer3DModel: exact capture point, bit-identical output,
replacement through the same interceptor, replay API, CLI round trip."""

from __future__ import annotations


import pytest
import torch

from workbench.capture import AttentionInterceptor, capture, open_capture
from workbench.models import load_model
from workbench.models.h3 import pack_h3_sequence


@pytest.fixture(scope="module")
def h3_f32():
    return load_model("h3-tiny", dtype=torch.float32)


@pytest.fixture(scope="module")
def h3_bf16():
    return load_model("h3-tiny", dtype=torch.bfloat16)


def _packed(h3, seed: int, t: float = 0.7):
    """(forward kwargs, segment layout, position ids) of one step on random packed rows."""
    g = torch.Generator().manual_seed(seed)
    seg = h3.layout.segments
    cfg = h3.model.config
    patch = int(torch.tensor(cfg.patch_size).prod())
    video = torch.randn(1, seg.video, cfg.in_channels * patch, generator=g).to(h3.dtype)
    audio = torch.randn(1, seg.audio, cfg.audio_in_channels, generator=g).to(h3.dtype)
    text = torch.randn(1, seg.text, cfg.text_dim, generator=g).to(h3.dtype)
    kw, seg = pack_h3_sequence(video, audio, text, h3.layout, video_t=t)
    return kw, seg, h3.layout.position_ids


def _independent_qkv(attn, x, position_ids, theta=10000.0, freq_dim=16):
    """q, k, v [B, S, H, D] from the module's weights with a hand-written RMSNorm and RoPE."""
    H, D = attn.heads, attn.head_dim
    q = (x @ attn.to_q.weight.T).unflatten(-1, (H, D))
    k = (x @ attn.to_k.weight.T).unflatten(-1, (H, D))
    v = (x @ attn.to_v.weight.T).unflatten(-1, (H, D))

    def rms(t, w, eps):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w

    q = rms(q, attn.norm_q.weight, attn.norm_q.eps)
    k = rms(k, attn.norm_k.weight, attn.norm_k.eps)
    inv = 1.0 / theta ** (torch.arange(0, 2 * freq_dim, 2, dtype=torch.float64) / (2 * freq_dim))
    ang = torch.cat([position_ids[:, a, None].double() * inv for a in range(3)], dim=-1)
    ang = torch.cat([ang, ang], dim=-1)  # [S, 96]
    cos, sin = ang.cos().float()[None, :, None], ang.sin().float()[None, :, None]
    rot = ang.shape[-1]

    def rope(t):
        r, p = t[..., :rot], t[..., rot:]
        x1, x2 = r[..., : rot // 2], r[..., rot // 2:]
        return torch.cat([r * cos + torch.cat([-x2, x1], -1) * sin, p], -1)

    return rope(q), rope(k), v


def test_stored_qkv_equal_independent_recompute(h3_f32, tmp_path):
    model_f32 = h3_f32.model
    kw, layout, position_ids = _packed(h3_f32, seed=1)
    attn_inputs = {}
    hooks = [blk.attn.register_forward_pre_hook(
        lambda m, a, i=i: attn_inputs.__setitem__(i, a[0].detach().clone()))
        for i, blk in enumerate(model_f32.transformer_blocks)]
    try:
        with capture(model_f32, tmp_path / "s.zarr", layers=[0, 1], steps=[0], progress=False,
                     layout=layout) as cap:
            cap.step(0)
            with torch.no_grad():
                model_f32(**kw)
    finally:
        for h in hooks:
            h.remove()
    r = open_capture(tmp_path / "s.zarr")
    assert [(e.step, e.layer, e.complete) for e in r.entries()] == [(0, 0, True), (0, 1, True)]
    for layer in (0, 1):
        q, k, v = r.qkv(0, layer)
        assert q.dtype == torch.float32 and q.shape == (1, layout.total, 2, 128)
        attn = model_f32.transformer_blocks[layer].attn
        with torch.no_grad():
            q2, k2, v2 = _independent_qkv(attn, attn_inputs[layer], position_ids)
        torch.testing.assert_close(q, q2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k, k2, rtol=1e-5, atol=1e-5)
        assert torch.equal(v, v2) or torch.allclose(v, v2, rtol=1e-6, atol=1e-6)
        # The check has teeth: without RoPE the rotated channels disagree, the rest agree.
        with torch.no_grad():
            qn = _independent_qkv(attn, attn_inputs[layer], torch.zeros_like(position_ids))[0]
        assert (q[..., :96] - qn[..., :96]).abs().max() > 1e-2
        torch.testing.assert_close(q[..., 96:], qn[..., 96:], rtol=1e-5, atol=1e-5)


def test_capture_is_bit_identical_and_restores_processors(h3_bf16, tmp_path):
    model_bf16 = h3_bf16.model
    layout = h3_bf16.layout.segments
    procs = [b.attn.processor for b in model_bf16.transformer_blocks]
    ref = h3_bf16.sample("a red ball", seed=2, steps=4)  # 4 grid points: 3 model calls, steps 0-2
    with capture(model_bf16, tmp_path / "c.zarr", layers=[0, 1], steps=[0, 2], progress=False,
                 layout=layout, seed=2, prompt="a red ball", recipe="fp8_sol_kv_corrected") as cap:
        out = h3_bf16.sample("a red ball", seed=2, steps=4, callback=cap.step)
    assert torch.equal(ref.video_rows, out.video_rows)
    assert torch.equal(ref.audio_rows, out.audio_rows)
    assert [b.attn.processor for b in model_bf16.transformer_blocks] == procs
    r = open_capture(tmp_path / "c.zarr")
    assert sorted((e.step, e.layer) for e in r.entries()) == [(0, 0), (0, 1), (2, 0), (2, 1)]
    assert r.attrs["rotated_channels"] == 96 and r.attrs["seed"] == 2
    assert r.attrs["schema_version"] == 1 and '"name": "fp8_sol_kv_corrected"' in r.attrs["recipe"]
    assert r.attrs["model_config"]["num_attention_heads"] == 2
    assert "torch" in r.attrs["library_versions"] and r.layout == layout
    q, k, v = r.qkv(2, 1, heads=[1])
    assert q.dtype == torch.bfloat16 and q.shape == (1, layout.total, 1, 128)
    # Timesteps recorded as coordinates; the lazy xarray view matches qkv bit for bit.
    ds = r.to_xarray()
    assert ds.k.data.__class__.__name__ == "Array"  # dask: nothing read yet
    # H3's convention: the timestep grows from 0 (noise) towards 1 (clean)
    assert float(ds.timestep.sel(step=0)) == 0.0 and 0.0 < float(ds.timestep.sel(step=2)) < 1.0
    kk = torch.from_numpy(ds.k.sel(step=2, layer=1).values.view("int16")).view(torch.bfloat16)
    assert torch.equal(kk, r.qkv(2, 1)[1])
    dec = open_capture(tmp_path / "c.zarr").to_xarray(decode=True)
    assert torch.equal(torch.from_numpy(dec.v.sel(step=0, layer=0).values),
                       r.qkv(0, 0)[2].float())


def test_replacement_through_the_same_interceptor(h3_f32):
    model_f32 = h3_f32.model
    kw, _, _ = _packed(h3_f32, seed=5, t=0.5)
    with torch.no_grad():
        ref = model_f32(**kw).sample
        seen = []

        def sdpa_handler(call):
            seen.append((call.name, call.layer))
            o = torch.nn.functional.scaled_dot_product_attention(
                call.q.transpose(1, 2), call.k.transpose(1, 2), call.v.transpose(1, 2))
            return o.transpose(1, 2).contiguous()

        with AttentionInterceptor(model_f32, sdpa_handler):
            same = model_f32(**kw).sample
        torch.testing.assert_close(same, ref, rtol=1e-5, atol=1e-5)
        assert seen == [("transformer_blocks.0", 0), ("transformer_blocks.1", 1)]  # no refiner
        with AttentionInterceptor(model_f32, lambda c: torch.zeros_like(c.q), layers=[1]):
            changed = model_f32(**kw).sample
        assert (changed - ref).abs().max() > 1e-3
        seen.clear()
        with AttentionInterceptor(model_f32, lambda c: seen.append(c.name), include_refiner=True):
            model_f32(**kw)
        assert seen == ["token_refiner.refiner_blocks.0", "transformer_blocks.0",
                        "transformer_blocks.1"]
        with pytest.raises(ValueError, match="replacement must be"):
            with AttentionInterceptor(model_f32, lambda c: c.q[:, :3]):
                model_f32(**kw)
        with pytest.raises(ValueError, match="out of range"):
            with AttentionInterceptor(model_f32, lambda c: None, layers=[7]):
                pass
    # Processors are back after an exception inside the context.
    assert type(model_f32.transformer_blocks[0].attn.processor).__name__ == \
        "MiniMaxH3AttnProcessor"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
                                   torch.float16])
def test_bit_exact_round_trip_of_views(tmp_path, dtype):
    g = torch.Generator().manual_seed(0)
    nbits = 8 if dtype.itemsize == 1 else 16
    # Every bit pattern (NaN and Inf codes included) must come back unchanged.
    codes = torch.arange(2**nbits, dtype=torch.int32)
    codes = codes[torch.randperm(len(codes), generator=g)][: 2 * 8 * 2 * 16 * (nbits // 8)]
    raw = codes.to(torch.uint8 if nbits == 8 else torch.int16)
    x = raw.view(dtype).reshape(2, -1, 2, 16)
    with capture(None, tmp_path / "v.zarr", progress=False) as cap:
        cap.record("custom.attn", x, x.flip(1), x.flip(0), step=3, layer=0)
    q, k, v = open_capture(tmp_path / "v.zarr").qkv(3, 0)
    assert q.dtype == dtype
    for got, want in ((q, x), (k, x.flip(1)), (v, x.flip(0))):
        assert torch.equal(got.view(raw.dtype), want.contiguous().view(raw.dtype))


def test_cli_capture_inspect_table(tmp_path, capsys):
    from workbench.cli import main

    store = str(tmp_path / "X.zarr")
    assert main(["capture", "--model", "h3-tiny", "--out", store, "--layers", "0,1",
                 "--steps", "0,1", "--quiet"]) == 0
    assert main(["inspect", store, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "4 complete, 0 incomplete" in out and "K rot" in out
    assert "pass-through channels 96-127" in out
    assert "all chunks pass crc32c" in out
    assert main(["table", "--store", store, "--step", "0", "--layer", "1"]) == 0
    assert "quanted K" in capsys.readouterr().out
    # A second capture to the same path refuses; --resume keeps every complete entry.
    assert main(["capture", "--model", "h3-tiny", "--out", store, "--quiet"]) == 2
    assert main(["capture", "--model", "h3-tiny", "--out", store, "--layers", "0,1",
                 "--steps", "0,1", "--resume", "--quiet"]) == 0
    assert "4 already complete" in capsys.readouterr().out
    assert main(["archive", store, str(tmp_path / "A.zarr")]) == 0
    a, b = open_capture(store), open_capture(tmp_path / "A.zarr")
    for x, y in zip(a.qkv(1, 0), b.qkv(1, 0)):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    assert b.attrs["archive_compressor"] == "zstd:3"
