"""Build (once) the warm-started tiny Qwen2.5-VL, the offline visual default policy, and print its report.

    python scripts/build_tiny_vl.py                 # into $VAGEN_CACHE or ~/.cache/vagen
    python scripts/build_tiny_vl.py --cache-dir /tmp/cache --steps 100

A finished build is reused: running it again prints the stored report at once.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields, replace

from vagen.models.warmstart import WarmStartRecipe, build_warm_tiny_vl, read_report


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=None, help="cache folder (default: $VAGEN_CACHE or ~/.cache/vagen)")
    for spec in fields(WarmStartRecipe):
        kind = type(spec.default)
        parser.add_argument(
            f"--{spec.name.replace('_', '-')}",
            type=(lambda text: text.lower() in {"1", "true", "yes"}) if kind is bool else kind,
            default=None,
            help=f"recipe field (default {spec.default!r})",
        )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    overrides = {
        spec.name: getattr(args, spec.name) for spec in fields(WarmStartRecipe) if getattr(args, spec.name) is not None
    }
    recipe = replace(WarmStartRecipe(), **overrides)
    started = time.perf_counter()

    folder = build_warm_tiny_vl(args.cache_dir, recipe)
    print(f"warm tiny_vl at {folder} ({time.perf_counter() - started:.0f} s)")
    print(json.dumps(read_report(folder), indent=2))


if __name__ == "__main__":
    main()
