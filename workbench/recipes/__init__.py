"""Attention recipes: frozen dataclass + named presets + string/JSON forms, and per-(step, layer)
plans (``RecipePlan``) accepted wherever a recipe is."""

from .plan import PlanEntry, RecipePlan
from .recipe import (
    DEFAULT_RECIPE,
    PRESETS,
    AttentionRecipe,
    RecipeError,
    get_recipe,
    split_recipe_list,
)

__all__ = ["AttentionRecipe", "PRESETS", "DEFAULT_RECIPE", "PlanEntry", "RecipeError",
           "RecipePlan", "get_recipe", "split_recipe_list"]
