"""H3 packing, the embedded configs, checkpoint save / reload, local diffusers folders, sampling."""

import json
import time

import torch

from workbench.models import (
    AUDIO_TAG,
    TEXT_TAG,
    VIDEO_TAG,
    build_packed_layout,
    load_model,
    pack_h3_sequence,
    patchify_video,
    save_checkpoint,
    unpatchify_video,
)


def test_packing_matches_diffusers_modular_pipeline():
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
    )

    n_text, frames, lh, lw, n_audio, ch = 7, 6, 12, 20, 5, 2
    ref = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(n_text, dtype=torch.long), frames, lh, lw, n_audio, (1, 2, 2), ch,
        AUDIO_TAG, VIDEO_TAG,
    )
    lay = build_packed_layout(num_text=n_text, num_audio_latents=n_audio, audio_channels=ch,
                              video_grid=(frames, lh // 2, lw // 2))
    assert torch.equal(lay.position_ids, ref[0])
    assert torch.equal(lay.token_tags, ref[1])
    assert torch.equal(lay.video_indices, ref[2])
    assert torch.equal(lay.audio_indices, ref[3])
    assert torch.equal(lay.text_indices, ref[4])
    seg = lay.segments
    assert (seg.text, seg.audio, seg.video) == (7, 10, 6 * 6 * 10)
    assert lay.token_tags[0] == TEXT_TAG and lay.token_tags[7] == AUDIO_TAG


def test_patchify_matches_diffusers_and_round_trips():
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    x = torch.randn(2, 3, 4, 8, 12)
    rows = patchify_video(x, (2, 4, 4))
    assert torch.equal(rows.reshape(-1, rows.shape[-1]), patchify_video_latents(x, (2, 4, 4)))
    assert torch.equal(unpatchify_video(rows, (2, 4, 4), (3, 4, 8, 12)), x)


def test_h3_tiny_builds_fast_with_h3_attention_geometry():
    load_model("h3-tiny")  # import diffusers once
    t0 = time.perf_counter()
    h = load_model("h3-tiny")
    assert time.perf_counter() - t0 < 1.0
    cfg = h.model.config
    assert cfg.attention_head_dim == 128 and 2 * 3 * cfg.rope_freq_dim == 96
    attn = h.model.transformer_blocks[0].attn
    assert attn.norm_q.normalized_shape == (128,) and attn.norm_k.normalized_shape == (128,)
    # Seeded: two builds are identical; the packed forward gives finite velocities.
    h2 = load_model("h3-tiny")
    for (n, p), (_, q) in zip(h.model.named_parameters(), h2.model.named_parameters()):
        assert torch.equal(p, q), n
    seg = h.layout.segments
    kw, seg2 = pack_h3_sequence(torch.randn(1, seg.video, 96), torch.randn(1, seg.audio, 256),
                                h.encode_prompt("red"), h.layout, video_t=0.3, audio_t=0.6)
    assert seg2 == seg and kw["timestep"].tolist() == [0.30000001192092896, 0.6000000238418579]
    with torch.no_grad():
        v, a = h.model(**kw, return_dict=False)
    assert v.shape == (1, seg.video, 96) and a.shape == (1, seg.audio, 256)
    assert torch.isfinite(v).all() and torch.isfinite(a).all()


def test_sampling_is_deterministic_and_seed_dependent():
    h = load_model("h3-tiny")
    seen = []
    s1 = h.sample("green", seed=3, steps=4, callback=lambda i, t: seen.append((i, t)))
    s2 = h.sample("green", seed=3, steps=4)
    s3 = h.sample("green", seed=4, steps=4)
    assert [i for i, _ in seen] == [0, 1, 2]  # 4 grid points = 3 model calls
    assert seen[0][1] == 0.0 and 0 < seen[1][1] < seen[2][1] < 1  # t = 1 - sigma rises
    assert torch.equal(s1.video, s2.video) and torch.equal(s1.audio, s2.audio)
    assert not torch.equal(s1.video, s3.video)
    assert s1.video.shape == (16, 3, 16, 16) and s1.audio.shape == (8192,)


def test_local_diffusers_folder_and_safetensors_round_trip(tmp_path):
    h = load_model("h3-tiny")
    folder = tmp_path / "h3_small"
    h.model.save_pretrained(folder)
    (folder / "workbench.json").write_text(json.dumps(h.config.to_dict()))
    h2 = load_model(str(folder))  # from_pretrained(local_files_only=True)
    a = h.sample("blue", seed=1, steps=3)
    b = h2.sample("blue", seed=1, steps=3)
    assert torch.equal(a.video, b.video) and torch.equal(a.audio, b.audio)

    path = save_checkpoint(h, tmp_path / "tiny.safetensors")
    h3 = load_model(str(path))
    c = h3.sample("blue", seed=1, steps=3)
    assert torch.equal(a.video, c.video)


def test_bad_names_are_clear(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="not a registered name"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="knows the classes"):
        load_model("h3-tiny").encode_prompt("a purple cube")
