"""Segment layout of a packed attention sequence (named row ranges in sequence order), and the
channel groups of a head (RoPE-rotated vs pass-through channels).

Specs every stage shares (capture records them and inspect prints them, the recipes' dense prefix
and Sol's sink read the layout, figures shade it, tables split the error by both), so they sit
below the stages.

MiniMax-H3 packs ``[text | conditioning | audio | video]``; ``SegmentLayout(text=14, audio=356,
video=32256)`` builds that. Any other model names its own segments
(``SegmentLayout.of([("prompt", 20), ("answer", 108)])``); a sequence nothing is known about is
one segment called ``tokens`` (``SegmentLayout.tokens(S)``), never ``video``.

The *prefix* is every row before the generated rows: the rows FP8 Sol treats as a key sink and
the dense-prefix policy recomputes in BF16. For H3 it is text + conditioning + audio; for a
layout given by name it is every segment before the last (``prefix_segments`` overrides).
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass

import torch

H3_SEGMENTS = ("text", "conditioning", "audio", "video")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


class LayoutError(ValueError):
    """A layout that cannot describe a sequence: the message names the segment or the field."""


@dataclass(frozen=True, init=False, repr=False)
class SegmentLayout:
    """Ordered named segments ``((name, rows), ...)`` of a packed sequence.

    ``SegmentLayout(text=.., conditioning=.., audio=.., video=..)`` is H3's layout (its four
    fields stay readable as attributes on any layout: 0 when the segment is absent).
    ``segments`` keeps empty segments (H3's conditioning is usually 0); ``bands()`` drops them.
    """

    segments: tuple[tuple[str, int], ...]
    prefix_segments: int  # how many leading segments form the prefix

    def __init__(self, text: int = 0, conditioning: int = 0, audio: int = 0, video: int = 0, *,
                 segments=None, prefix_segments: int | None = None):
        if segments is None:
            segments = tuple(zip(H3_SEGMENTS, (text, conditioning, audio, video)))
            prefix_segments = 3 if prefix_segments is None else prefix_segments
        elif any((text, conditioning, audio, video)):
            raise LayoutError("layout: give either H3's keyword rows or named segments, not both")
        segs = tuple(_check_segment(s) for s in segments)
        names = [n for n, _ in segs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise LayoutError(f"layout: segment name(s) {dup} appear more than once")
        if prefix_segments is None:
            prefix_segments = max(len(segs) - 1, 0)
        if not (isinstance(prefix_segments, int) and 0 <= prefix_segments <= len(segs)):
            raise LayoutError(f"layout: prefix_segments must be in 0..{len(segs)}, "
                              f"got {prefix_segments!r}")
        object.__setattr__(self, "segments", segs)
        object.__setattr__(self, "prefix_segments", prefix_segments)

    def __repr__(self) -> str:
        if self.is_h3:
            return "SegmentLayout(" + ", ".join(f"{n}={r}" for n, r in self.segments) + ")"
        return f"SegmentLayout.of({list(self.segments)}, prefix_segments={self.prefix_segments})"

    # -- constructors -----------------------------------------------------------------------------
    @classmethod
    def of(cls, segments, prefix_segments: int | None = None) -> SegmentLayout:
        """Named segments [(name, rows), ...] in sequence order (or a {name: rows} dict).
        Default prefix: every segment before the last."""
        if isinstance(segments, dict):
            segments = list(segments.items())
        return cls(segments=tuple(segments), prefix_segments=prefix_segments)

    @classmethod
    def tokens(cls, seq_len: int) -> SegmentLayout:
        """One segment ``tokens`` of `seq_len` rows, no prefix: what nothing else is known about."""
        return cls.of([("tokens", seq_len)], prefix_segments=0)

    @classmethod
    def all_video(cls, seq_len: int) -> SegmentLayout:
        """An H3 sequence of video rows only (use ``tokens`` when the rows are not video)."""
        return cls(video=seq_len)

    @classmethod
    def parse(cls, text: str) -> SegmentLayout:
        """``"text:14,audio:356,video:32256"`` -> named segments (prefix: all but the last).

        A list of exactly H3's names in H3's order gives H3's layout."""
        segs = []
        for item in (p.strip() for p in str(text).split(",")):
            name, colon, rows = item.partition(":")
            if not colon:
                raise LayoutError(f"layout {text!r}: segment {item!r} is not NAME:ROWS")
            try:
                n = int(rows)
            except ValueError:
                raise LayoutError(f"layout {text!r}: rows of segment {name.strip()!r} are not an "
                                  f"integer: {rows.strip()!r}") from None
            segs.append((name.strip(), n))
        names = [n for n, _ in segs]
        if names and names == [n for n in H3_SEGMENTS if n in names] and names[-1] == "video":
            return cls(**dict(segs))
        return cls.of(segs)

    # -- reading ----------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.segments)

    def rows(self, name: str) -> int:
        """Rows of segment `name` (0 when the layout has no such segment)."""
        return next((r for n, r in self.segments if n == name), 0)

    @property
    def text(self) -> int:
        return self.rows("text")

    @property
    def conditioning(self) -> int:
        return self.rows("conditioning")

    @property
    def audio(self) -> int:
        return self.rows("audio")

    @property
    def video(self) -> int:
        return self.rows("video")

    @property
    def is_h3(self) -> bool:
        """H3's four segments in H3's order, prefix before video (stored in H3's old form)."""
        return self.names == H3_SEGMENTS and self.prefix_segments == 3

    @property
    def prefix_len(self) -> int:
        """Rows before the generated rows (Sol's sink, the dense-prefix rows)."""
        return sum(r for _, r in self.segments[: self.prefix_segments])

    @property
    def generated(self) -> str | None:
        """Name of the first non-empty segment after the prefix (None when there is none)."""
        return next((n for n, r in self.segments[self.prefix_segments:] if r), None)

    @property
    def total(self) -> int:
        return sum(r for _, r in self.segments)

    def bands(self) -> list[tuple[str, int, int]]:
        """[(name, start, stop)] for the non-empty segments, in sequence order."""
        out, start = [], 0
        for name, n in self.segments:
            if n:
                out.append((name, start, start + n))
            start += n
        return out

    def segment_of(self, rows: torch.Tensor) -> list[str]:
        bands = self.bands()
        return [next((n for n, a, b in bands if a <= int(r) < b), "?") for r in rows]

    def describe(self) -> str:
        """``text 14 | audio 356 | video 32,256 (prefix 370 rows)``."""
        s = " | ".join(f"{n} {b - a:,}" for n, a, b in self.bands())
        return s + (f" (prefix {self.prefix_len:,} rows)" if self.prefix_len else "")

    # -- storage ----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """H3 layouts: ``{"text", "conditioning", "audio", "video"}`` row counts (the form every
        store has held since the first schema); others: ``{"segments": [[name, rows], ...],
        "prefix_segments": n}``."""
        if self.is_h3:
            return {n: r for n, r in self.segments}
        return {"segments": [[n, r] for n, r in self.segments],
                "prefix_segments": self.prefix_segments}

    @classmethod
    def from_dict(cls, d: dict) -> SegmentLayout:
        if not isinstance(d, dict):
            raise LayoutError(f"layout: expected a dict, got {type(d).__name__}")
        if "segments" in d:
            segs = d["segments"]
            if not isinstance(segs, list) or not all(isinstance(s, (list, tuple)) and len(s) == 2
                                                     for s in segs):
                raise LayoutError(f"layout: 'segments' must be [[name, rows], ...], got {segs!r}")
            return cls.of([tuple(s) for s in segs], d.get("prefix_segments"))
        unknown = sorted(set(d) - set(H3_SEGMENTS))
        if unknown:
            raise LayoutError(f"layout: unknown field(s) {unknown}; expected {list(H3_SEGMENTS)} "
                              "or 'segments'")
        return cls(**{k: d.get(k, 0) for k in H3_SEGMENTS})  # row counts checked as given


def _check_segment(seg) -> tuple[str, int]:
    try:
        name, rows = seg
    except (TypeError, ValueError):
        raise LayoutError(f"layout: segment {seg!r} is not (name, rows)") from None
    if not isinstance(name, str) or not _NAME.match(name):
        raise LayoutError(f"layout: segment name {name!r} must start with a letter and hold "
                          "letters, digits, '_', '.' or '-'")
    if isinstance(rows, bool) or not isinstance(rows, numbers.Integral) or rows < 0:
        raise LayoutError(f"layout: segment {name!r} needs a non-negative integer row count, "
                          f"got {rows!r}")
    return name, int(rows)


def channel_span(start: int, stop: int) -> str:
    """Channels start..stop-1 as a label: "96-127", "5" (one channel)."""
    return f"{start}-{stop - 1}" if stop - start > 1 else f"{start}"


def channel_groups(rotated: int | None, head_dim: int, tensor: str = "K"
                   ) -> list[tuple[str, str, int, int]]:
    """[(key, label, start, stop)] of the non-empty channel groups of a head: the RoPE-rotated
    channels 0..rotated-1 (key "rot") and the pass-through channels rotated..D-1 (key "pass").
    tensor "V": the same spans, labelled as K's (RoPE rotates Q and K only; V's channels are
    grouped like K's so that the two drifts line up).

    A model without RoPE (rotated 0) has only pass-through channels; one that rotates every
    channel (rotated == D) only rotated ones: the empty group is left out, not printed as nan.
    rotated None (not recorded): one group "all" of every channel.
    """
    if rotated is None:
        return [("all", f"channels {channel_span(0, head_dim)} (RoPE split unknown)", 0,
                 head_dim)]
    check_rotated(rotated, head_dim)
    out = []
    rot, rest = channel_span(0, rotated), channel_span(rotated, head_dim)
    if tensor == "V":
        labels = (f"channels {rot} (K's rotated span)", f"channels {rest} (K's pass-through span)")
    else:
        labels = (f"rotated channels {rot}", f"pass-through channels {rest}")
    if rotated > 0:
        out.append(("rot", labels[0], 0, rotated))
    if rotated < head_dim:
        out.append(("pass", labels[1], rotated, head_dim))
    return out


def channel_group_part(key: str, tensor: str = "K") -> str:
    """The short name of a ``channel_groups`` group for legends: "rotated" / "pass-through"
    ("K's rotated span" / "K's pass-through span" for V), "all channels" for key "all"."""
    part = {"rot": "rotated", "pass": "pass-through"}.get(key)
    if part is None:
        return "all channels"
    return f"K's {part} span" if tensor == "V" else part


def check_rotated(rotated: int, head_dim: int) -> None:
    """rotated must be a channel count the head holds: 0 (no RoPE) to D (every channel)."""
    if isinstance(rotated, bool) or not isinstance(rotated, int) or not 0 <= rotated <= head_dim:
        raise ValueError(f"rotated: the RoPE channel count must be an integer in 0..{head_dim} "
                         f"(the head dim), got {rotated!r}")


# MiniMax-H3 at 1344x768, 107 frames: 14 text rows, 356 audio rows, 32 x 1008 video rows.
H3_LIVE_LAYOUT = SegmentLayout(text=14, conditioning=0, audio=356, video=32256)
