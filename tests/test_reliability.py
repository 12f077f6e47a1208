"""Short versions of the crash and corruption campaigns (scripts/kill_campaign.py; the full runs
and their counts are in docs/reliability.md): SIGKILLs mid-chunk-write then verify + resume +
bitwise comparison with an uninterrupted run, and chunk / JSON corruptions that verify must flag
(naming the file) unless every read stays bit-exact."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("kill_campaign", REPO / "scripts/kill_campaign.py")
campaign = importlib.util.module_from_spec(spec)
sys.modules["kill_campaign"] = campaign  # dataclasses look their module up there
spec.loader.exec_module(campaign)


def test_kills_mid_write_then_resume_equal_an_uninterrupted_run(tmp_path):
    res = campaign.kill_campaign(1, campaign.SHORT, seed=0, workdir=tmp_path)
    assert res.failures == []
    assert (res.trials, res.kills, res.resumes, res.missed) == (1, 2, 1, 0)
    assert res.kills_mid_entry >= 1  # a kill landed while an entry's chunks were being written


def test_corruptions_are_flagged_or_harmless(tmp_path):
    res = campaign.corruption_campaign(seed=0, workdir=tmp_path, max_chunk_files=1,
                                       max_edits=25, stores=("plain", "zstd"))
    assert res.failures == []
    for kind in ("chunk flip", "chunk truncate", "chunk delete"):
        assert res.by_kind[kind] == [2, 2]  # every chunk corruption flagged
    json_kinds = {k for k in res.by_kind if not k.startswith("chunk")}
    assert {"root field", "entry field", "array field"} <= json_kinds
    assert res.trials == 6 + 50 and res.flagged + res.harmless == res.trials
    assert res.flagged >= 30
