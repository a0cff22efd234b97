# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The `trl` console script: `trl grpo [flags] [--config file.yaml]`."""

import sys


COMMANDS = ("grpo",)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        if argv and not asked:
            print(f"trl: unknown command {argv[0]!r}", file=sys.stderr)
        usage = "usage: trl {grpo} [--config FILE.yaml] [--flag value ...]\n\n  grpo    train with (iterative) GRPO; `trl grpo --help` lists every flag"
        print(usage, file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    from .scripts.grpo import main as grpo_main

    grpo_main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
