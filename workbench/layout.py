"""Segment layout of a packed attention sequence: which rows are text, conditioning, audio, video.

A spec every stage shares (capture records it, the recipes' dense prefix and Sol's sink read it,
figures shade it), so it sits below the stages.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class SegmentLayout:
    """Row ranges of a packed sequence ``[text | conditioning | audio | video]``.

    The prefix is everything before the generated video rows; FP8 Sol treats the prefix key blocks
    as a sink and recomputes the prefix query rows in BF16 (dense-prefix replacement).
    """

    text: int = 0
    conditioning: int = 0
    audio: int = 0
    video: int = 0

    @property
    def prefix_len(self) -> int:
        return self.text + self.conditioning + self.audio

    @property
    def total(self) -> int:
        return self.prefix_len + self.video

    def bands(self) -> list[tuple[str, int, int]]:
        """[(name, start, stop)] for the non-empty segments, in sequence order."""
        out, start = [], 0
        for name in ("text", "conditioning", "audio", "video"):
            n = getattr(self, name)
            if n:
                out.append((name, start, start + n))
            start += n
        return out

    def segment_of(self, rows: torch.Tensor) -> list[str]:
        bands = self.bands()
        return [next((n for n, a, b in bands if a <= int(r) < b), "?") for r in rows]

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SegmentLayout:
        return cls(**{k: int(d.get(k, 0)) for k in ("text", "conditioning", "audio", "video")})

    @classmethod
    def all_video(cls, seq_len: int) -> SegmentLayout:
        return cls(video=seq_len)


# MiniMax-H3 at 1344x768, 107 frames: 14 text rows, 356 audio rows, 32 x 1008 video rows.
H3_LIVE_LAYOUT = SegmentLayout(text=14, conditioning=0, audio=356, video=32256)
