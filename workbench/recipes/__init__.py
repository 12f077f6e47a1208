"""Attention recipes: frozen dataclass + named presets + string/JSON forms."""

from .recipe import (
    DEFAULT_RECIPE,
    PRESETS,
    AttentionRecipe,
    RecipeError,
    get_recipe,
)

__all__ = ["AttentionRecipe", "PRESETS", "DEFAULT_RECIPE", "RecipeError", "get_recipe"]
