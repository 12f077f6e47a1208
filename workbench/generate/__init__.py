"""Generation with any attention recipe, and frame- / audio-level comparison of clips."""

from .compare import compare_dirs, compare_recipes
from .run import Clip, generate, read_clip, resolve_recipe, write_clip

__all__ = ["Clip", "compare_dirs", "compare_recipes", "generate", "read_clip", "resolve_recipe",
           "write_clip"]
