# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The `--smoke` flag every script in this folder takes: the script's own code path end to end on the smallest
settings (fewest steps, smallest model or preset, one seed), in seconds to about a minute, printing its usual table.
tests/slow/test_benchmarks_smoke.py runs every script so and checks the table.

Standard library only: the upstream-TRL workers of the compare_upstream_* scripts import this file too.
"""

import argparse
import os


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE_HELP = "a quick end-to-end run on the smallest settings (flags given explicitly still win)"


def parse_args_with_smoke(parser: argparse.ArgumentParser, smoke: dict, argv=None) -> argparse.Namespace:
    """`parser.parse_args(argv)` with a `--smoke` flag added: with it, `smoke` replaces the parser's defaults, so
    that flags given on the command line still win.

    Raises:
        ValueError: if `smoke` names a field that is not one of the parser's arguments.
    """
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    unknown = set(smoke) - {action.dest for action in parser._actions}
    if unknown:
        raise ValueError(f"smoke settings for unknown arguments: {sorted(unknown)}")
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**smoke)
        args = parser.parse_args(argv)
    return args


def upstream_trl_python() -> str:
    """The python of the TRL 1.16.0 venv that the tests use (tests/upstream_venv.py builds it on first use, ~10 s)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("upstream_venv", os.path.join(ROOT, "tests", "upstream_venv.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.upstream_trl_python()
