"""``workbench recipes``: the named presets and their numerics."""

from __future__ import annotations

import json

from .recipe import PRESETS, get_recipe


def cmd_recipes(args) -> int:
    if args.show is not None:
        print(json.dumps(get_recipe(args.show).to_dict(), indent=2))
        return 0
    width = max(len(n) for n in PRESETS)
    for name, r in PRESETS.items():
        print(f"{name:<{width}}  {r.describe()}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("recipes", help="list the named recipe presets (or --show one as JSON)")
    p.add_argument("--show", default=None, help="print one recipe spec as JSON")
    p.set_defaults(func=cmd_recipes)

