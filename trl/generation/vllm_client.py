# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The trainer's side of server mode: `VLLMServerClient` talks to a server started by `trl vllm-serve` over HTTP
(generation, health, prefix cache) and pushes weights over a gloo (CPU) or NCCL (CUDA) group.

It implements the generator protocol shared with the in-process engine: `generate(prompt_ids, sampling, seeds)`,
`load_weights(weights)`, `close()`.

Weight transfer: the trainer is rank 0 of a group with every vLLM worker (`world_size = 1 + tensor_parallel_size`),
whose TCPStore the first worker serves at the server's host on `group_port`. For each tensor the trainer broadcasts
a header (its JSON `[name, shape, dtype]`, as a byte length then the bytes) and the tensor; a zero length ends the
push. The worker extension (`trl.generation.vllm_worker_ext.WeightReceiver`) turns that stream into the iterator
of one `reload_weights` call, so a lazy `weights` iterator (gathering one layer at a time) is never held whole.
"""

import json
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import urlparse

import requests
import torch


RESTART_HINT = "the server's weights may be broken: restart it (`trl vllm-serve --model <path>`)"
# The sampling keys that are not request fields of vLLM's /v1/completions, or that the client sets itself.
# Groups left by failed pushes (see `VLLMServerClient._drop_group`).
_ABANDONED = []
_NOT_SENT = {"n", "seed", "structured_outputs_regex", "prompt", "return_token_ids"}


def server_base_url(base_url: str | None = None, host: str = "0.0.0.0", port: int = 8000) -> str:
    """The URL the trainer connects to: `base_url` (trailing `/` dropped) when given, else `http://host:port`, where
    a host that means "every interface" (`0.0.0.0`, `::`, empty: the server's default bind address) is reached at
    `127.0.0.1`, i.e. a server on this machine."""
    if base_url:
        return base_url.rstrip("/")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


class VLLMServerClient:
    """
    Generation and weight pushes through a vLLM server started by `trl vllm-serve`.

    Args:
        base_url (`str`, *optional*):
            The server's URL (`http://host:port`); when given, `host` and `port` are ignored.
        host (`str`, defaults to `"0.0.0.0"`), port (`int`, defaults to `8000`):
            Where the server runs (`0.0.0.0` means this machine).
        group_port (`int`, defaults to `51216`):
            Port of the weight-transfer group's TCPStore, served by vLLM's first worker on the server's host.
        timeout (`float`, defaults to `240.0`):
            Seconds `wait_until_healthy` waits for the server, and the weight group's timeout.
    """

    def __init__(
        self,
        base_url: str | None = None,
        host: str = "0.0.0.0",
        port: int = 8000,
        group_port: int = 51216,
        timeout: float = 240.0,
    ):
        self.base_url = server_base_url(base_url, host, port)
        self.group_host = urlparse(self.base_url).hostname or "127.0.0.1"
        self.group_port = group_port
        self.timeout = timeout
        self.num_pushes = 0
        self._group = self._store = self._peer_error = None
        self._group_device = torch.device("cpu")
        self._world_size = 0

    # -- HTTP ---------------------------------------------------------------------------------------------------

    def _post(self, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """POST `body` as JSON; returns the JSON answer ({} when empty). Raises RuntimeError naming the URL and the
        server's message on an HTTP error, or on a lost connection."""
        url = f"{self.base_url}{path}"
        try:
            response = requests.post(url, json=body, timeout=timeout)
        except requests.RequestException as error:
            raise RuntimeError(f"vLLM server request {url} failed: {error}") from error
        if response.status_code != 200:
            raise RuntimeError(f"vLLM server request {url} failed with HTTP {response.status_code}: {response.text}")
        return response.json() if response.content else {}

    def _rpc(self, method: str, **kwargs) -> list:
        """Call `method` of the worker extension on every vLLM worker (`/collective_rpc`, string kwargs); returns
        one result per worker. A 404 means the server lacks the dev-mode endpoints: not started by `trl vllm-serve`."""
        body = {"method": method, "kwargs": {key: str(value) for key, value in kwargs.items()}}
        try:
            return self._post("/collective_rpc", body).get("results", [])
        except RuntimeError as error:
            if "HTTP 404" in str(error):
                raise RuntimeError(
                    f"the vLLM server at {self.base_url} has no /collective_rpc endpoint: it must be started by "
                    "`trl vllm-serve` (VLLM_SERVER_DEV_MODE=1 and the weight-transfer worker extension)"
                ) from error
            raise

    def wait_until_healthy(self) -> None:
        """Poll `GET /health` until it answers 200, for up to `timeout` seconds. Raises ConnectionError naming the
        URL, the timeout and how to start the server."""
        deadline = time.monotonic() + self.timeout
        last = "no answer"
        while True:
            try:
                response = requests.get(f"{self.base_url}/health", timeout=max(0.1, min(5.0, self.timeout)))
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except requests.RequestException as error:
                last = type(error).__name__
            if time.monotonic() >= deadline:
                host, _, port = self.base_url.rpartition("//")[2].partition(":")
                raise ConnectionError(
                    f"the vLLM server at {self.base_url} was not reachable within vllm_server_timeout="
                    f"{self.timeout:g} s (last: {last}); start it with `trl vllm-serve --model <path> --host {host} "
                    f"--port {port or 80}` (add `--dtype float32` for a float32 policy on the CPU: vLLM's `auto` "
                    "serves it in bfloat16 there), or point vllm_server_base_url (or vllm_server_host/"
                    "vllm_server_port) at it"
                )
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))

    # -- generation -----------------------------------------------------------------------------------------------

    @staticmethod
    def request_body(prompt_ids: list[int], sampling: dict, seed: int) -> dict:
        """The /v1/completions body for one row: token-id prompt, one completion sampled with `sampling` (vLLM
        `SamplingParams` keywords; None values left out, `structured_outputs_regex` sent as `structured_outputs`)
        and `seed`, the sampled token ids and their log-probs (`logprobs` 0 unless `sampling` says otherwise)."""
        body = {key: value for key, value in sampling.items() if key not in _NOT_SENT and value is not None}
        body.setdefault("logprobs", 0)
        body.update(prompt=list(prompt_ids), n=1, seed=int(seed), return_token_ids=True)
        if sampling.get("structured_outputs_regex") is not None:
            body["structured_outputs"] = {"regex": sampling["structured_outputs_regex"]}
        return body

    def generate(
        self, prompt_ids: list[list[int]], sampling: dict, seeds: list[int]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """One completion per row of `prompt_ids`, row i sampled with `sampling` and `seeds[i]` (one request per row,
        sent together so that the server batches them). Returns (completion token ids per row, including the stop
        token when generation stopped on one; the processed log-prob of each of those tokens), in the rows' order.
        Raises ValueError when `seeds` and `prompt_ids` differ in length, RuntimeError on a failed request."""
        if len(seeds) != len(prompt_ids):
            raise ValueError(f"{len(seeds)} seeds for {len(prompt_ids)} prompts")
        if not prompt_ids:
            return [], []
        bodies = [self.request_body(ids, sampling, seed) for ids, seed in zip(prompt_ids, seeds)]
        with ThreadPoolExecutor(max_workers=min(len(bodies), 64)) as pool:
            answers = list(pool.map(lambda body: self._post("/v1/completions", body), bodies))
        completions, logps = [], []
        for answer in answers:
            choice = answer["choices"][0]
            ids = list(choice["token_ids"])
            token_logps = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
            if len(token_logps) != len(ids):
                raise RuntimeError(
                    f"the vLLM server at {self.base_url} returned {len(ids)} tokens but {len(token_logps)} log-probs"
                )
            completions.append(ids)
            logps.append(token_logps)
        return completions, logps

    # -- weights --------------------------------------------------------------------------------------------------

    def reset_prefix_cache(self) -> None:
        """`POST /reset_prefix_cache`, retried for up to 10 s while the server reports blocks still in use."""
        deadline = time.monotonic() + 10.0
        while not self._post("/reset_prefix_cache").get("success", True):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the vLLM server at {self.base_url} could not reset its prefix cache")
            time.sleep(0.1)

    def _open_group(self) -> None:
        import torch.distributed as dist

        self._rpc("close_weight_group")  # a group left by a failed push must free the port before a new one
        backends = self._rpc("weight_transfer_backend")
        if not backends or len(set(backends)) != 1:
            raise RuntimeError(f"unexpected worker backends {backends!r}")
        backend, world = backends[0], 1 + len(backends)
        answer = {}

        def join_workers():
            try:
                answer["ok"] = self._rpc(
                    "init_weight_group",
                    host=self.group_host,
                    port=self.group_port,
                    world_size=world,
                    timeout=self.timeout,
                )
            except Exception as error:  # re-raised below, in the caller's thread
                answer["error"] = error

        thread = threading.Thread(target=join_workers, daemon=True)
        thread.start()
        wait = timedelta(seconds=self.timeout)
        try:
            store = dist.TCPStore(self.group_host, self.group_port, world, is_master=False, timeout=wait)
            if backend == "nccl":  # untested here (no GPU): the trainer's current CUDA device sends
                self._group = dist.ProcessGroupNCCL(store, 0, world, dist.ProcessGroupNCCL.Options())
                self._group_device = torch.device("cuda", torch.cuda.current_device())
            else:
                self._group = dist.ProcessGroupGloo(store, 0, world, wait)
                self._group_device = torch.device("cpu")
        finally:
            thread.join(self.timeout)
        if "error" in answer:
            self._group = None
            raise answer["error"]
        self._store, self._world_size = store, world

    def _broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` from rank 0. On gloo, waits while polling `self._peer_error` (set when the workers'
        /collective_rpc call failed), so that a failed reload is reported at once instead of after the timeout."""
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        work = self._group.broadcast([tensor], options)
        if self._group_device.type == "cpu":
            pause = 1e-4
            while not work.is_completed():
                if self._peer_error is not None:
                    raise RuntimeError(f"the workers stopped receiving: {self._peer_error}")
                time.sleep(pause)
                pause = min(2 * pause, 0.01)
        work.wait()

    def _send_header(self, header: bytes | None) -> None:
        """A header frame: its byte length as one int64 (0 ends the push, -1 aborts it), then the bytes."""
        length = -1 if header is None else len(header)
        self._broadcast(torch.tensor([length], dtype=torch.int64, device=self._group_device))
        if length > 0:
            data = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self._group_device)
            self._broadcast(data)

    def _drop_group(self, failed: bool = False) -> None:
        """Forget the group. After a failed push it is kept alive in `_ABANDONED` instead: destroying (or
        aborting) a gloo group whose broadcast no worker will receive waits out the whole timeout."""
        if failed and self._group is not None:
            _ABANDONED.append((self._group, self._store))
        self._group = self._store = None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Replace the served model's weights by `weights` (HF checkpoint names, full tensors, iterated once and
        lazily) in one `reload_weights` call on every worker, then reset the prefix cache. Opens the transfer group
        on first use. Returns the number of tensors sent. Raises RuntimeError naming the URL on any failure (the
        server may then hold broken weights: restart it)."""
        try:
            if self._group is None:
                self._open_group()
            answer = {}
            self._peer_error = None

            def receive():
                try:
                    answer["ok"] = self._rpc("receive_weights")
                except Exception as error:
                    answer["error"] = self._peer_error = error

            thread = threading.Thread(target=receive, daemon=True)
            thread.start()
            sent = 0
            try:
                for name, tensor in weights:
                    tensor = tensor.detach().to(self._group_device).contiguous()
                    header = json.dumps([name, list(tensor.shape), str(tensor.dtype).removeprefix("torch.")])
                    self._send_header(header.encode())
                    self._broadcast(tensor)
                    sent += 1
            except BaseException:
                if "error" not in answer:
                    self._send_header(None)  # the workers stop (their reload fails) instead of waiting
                thread.join(self.timeout)
                raise
            self._send_header(b"")
            thread.join(self.timeout)
            if thread.is_alive():
                raise RuntimeError(f"no answer to receive_weights within {self.timeout:g} s")
            if "error" in answer:
                raise answer["error"]
            self.reset_prefix_cache()
        except Exception as error:
            self._drop_group(failed=True)  # out of step with the workers: a next push opens a new group
            raise RuntimeError(
                f"weight push to the vLLM server at {self.base_url} failed ({error}); {RESTART_HINT}"
            ) from error
        self.num_pushes += 1
        return sent

    def close(self) -> None:
        """Close the weight-transfer group on both sides (the server keeps running). Never raises."""
        if self._world_size:  # a group was opened (maybe dropped since by a failed push)
            try:
                self._rpc("close_weight_group")
            except Exception:
                pass
        self._drop_group()
        self._world_size = 0
