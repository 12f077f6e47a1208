"""H3 packing, the embedded configs, checkpoint save / reload, local diffusers folders, sampling."""

import json
import time

import pytest
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


@pytest.mark.parametrize("frames, lh, lw, patch", [(32, 48, 84, (1, 2, 2)),  # the live grid
                                                    (2, 16, 24, (1, 2, 4))])  # a non-square patch
def test_packing_positions_are_diffusers_bit_for_bit(frames, lh, lw, patch):
    """The live grid differed by 1.4e-14 (torch's arange against numpy's linspace) and a non-square
    patch by 5.7 (the area of the patched grid against the latent's; a review's findings)."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
    )

    ref = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(14, dtype=torch.long), frames, lh, lw, 3, patch, 2, AUDIO_TAG, VIDEO_TAG)
    lay = build_packed_layout(num_text=14, num_audio_latents=3, audio_channels=2,
                              video_grid=(frames, lh // patch[1], lw // patch[2]),
                              patch_hw=patch[1:])
    assert torch.equal(lay.position_ids, ref[0])


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


def test_model_inputs_are_named_and_kept(tmp_path):
    """A review's findings: the first class named in the text wins (was the first class in the
    list), punctuation separates words, a shift of 0 is passed on (was the default, silently), a
    dtype given as a string or an int dtype is named, a bare diffusers folder says why it cannot
    sample (was an AttributeError), a bool is not a class index."""
    h = load_model("h3-tiny")
    assert h.class_of("a blue ball, then a red one") == 2
    assert h.class_of("Red.") == 0 and h.class_of("a red. ball") == 0
    with pytest.raises(ValueError, match="a text or a class index"):
        h.class_of(True)
    with pytest.raises(ValueError, match="shift"):
        h.sample("red", seed=0, steps=2, video_shift=0.0)
    for dt in ("bfloat16", torch.int64):
        with pytest.raises(ValueError, match="^dtype: "):
            load_model("h3-tiny", dtype=dt)
    folder = tmp_path / "bare"
    h.model.save_pretrained(folder)  # no workbench.json: no clip geometry
    with pytest.raises(ValueError, match="no clip geometry"):
        load_model(str(folder)).sample("red", steps=2)


def test_generate_records_the_checkpoint_that_was_loaded(tmp_path):
    """A fine-tuned h3-nano keeps the name "h3-nano" in its config: the clip and a capture named
    the embedded checkpoint's hash (a review's finding); now the loaded file's."""
    from workbench.capture.identity import checkpoint_id, file_sha256
    from workbench.generate import generate

    h = load_model("h3-nano")
    with torch.no_grad():
        h.model.proj_out.bias.add_(0.5)
    path = save_checkpoint(h, tmp_path / "my_ft.safetensors")
    ft = load_model(str(path))
    assert ft.name == "h3-nano" and ft.source == str(path)
    clip = generate(ft, "red", seed=0, steps=2, recipe=None, progress=False,
                    capture=tmp_path / "ft.zarr", capture_layers=[0], capture_steps=[0])
    assert clip.config["checkpoint_sha256"] == file_sha256(path)
    root = json.loads((tmp_path / "ft.zarr" / "zarr.json").read_text())
    assert root["attributes"]["checkpoint_id"] == checkpoint_id(path) != checkpoint_id("h3-nano")
