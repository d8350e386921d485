"""Generation from a vLLM server over HTTP (started by `aitrain vllm-serve`, or any vLLM OpenAI server
with dev mode on), plus the few control calls weight synchronisation needs.

Prompts go out as token ids through `/v1/completions` (one request per turn carrying every running
episode's prompt; the server batches them) and come back as token ids (`return_tokens_as_token_ids`)
with each sampled token's log-probability. Transient failures (connection refused, 5xx) are retried a
bounded number of times with backoff; then `GenerationServerError` names the server and what failed,
so a run stops with a message instead of hanging.

Only the standard library is used for HTTP, so the client works in a trainer without vLLM installed.

Left out: streaming, `n > 1` sampling (each episode is its own request row), multimodal prompts.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from aitrain_grpo.engine.backends.base import GenerationBackendError, Sample, SamplingParams


class GenerationServerError(GenerationBackendError):
    """The generation server cannot be reached or answered with an error. One line, names the server."""


class VLLMServerClient:
    def __init__(self, base_url: str, *, request_timeout: float = 600.0, retries: int = 3, backoff: float = 1.0):
        self.base_url = base_url.rstrip("/")
        self.request_timeout = request_timeout
        self.retries = retries
        self.backoff = backoff

    # ------------------------------------------------------------------------------ HTTP

    def _request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None, retry: bool = True) -> Any:
        url = f"{self.base_url}{path}"
        data = None if body is None else json.dumps(body).encode()
        attempts = self.retries + 1 if retry else 1
        last_error = ""
        for attempt in range(attempts):
            request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=timeout or self.request_timeout) as response:
                    text = response.read().decode() or "null"
                    try:
                        return json.loads(text)
                    except json.JSONDecodeError:
                        return text
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:300]
                last_error = f"HTTP {exc.code} from {path}: {' '.join(detail.split())}"
                if exc.code < 500:  # the request is wrong; asking again will not help
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last_error = f"{path} failed: {reason}"
            if attempt + 1 < attempts:
                time.sleep(self.backoff * 2**attempt)
        raise GenerationServerError(f"vLLM server at {self.base_url}: {last_error}")

    # ------------------------------------------------------------------------------ state

    def is_healthy(self) -> bool:
        try:
            self._request("GET", "/health", timeout=5, retry=False)
            return True
        except GenerationServerError:
            return False

    def wait_until_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.is_healthy():
            if time.monotonic() > deadline:
                raise GenerationServerError(
                    f"vLLM server at {self.base_url} is not answering after {timeout:g}s; start it with "
                    "`aitrain vllm-serve --model ...` or fix --vllm-server-url"
                )
            time.sleep(1.0)

    def served_models(self) -> list[str]:
        """Names of the base models served (LoRA adapters loaded at run time are left out)."""
        data = self._request("GET", "/v1/models", timeout=30)
        return [entry["id"] for entry in data.get("data", []) if not entry.get("parent")]

    # ------------------------------------------------------------------------------ weights

    def load_lora_adapter(self, name: str, path: str) -> None:
        # In place: a rerun into the same output folder reuses the same adapter names.
        self._request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": True})

    def unload_lora_adapter(self, name: str) -> None:
        self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name}, retry=False)

    def reload_weights(self, path: str | None = None) -> None:
        """Load full weights from a folder (or hub id) the server can read; without a path, from the
        folder it last loaded (dev-mode endpoint)."""
        body: dict[str, Any] = {"method": "reload_weights"}
        if path is not None:
            body["kwargs"] = {"weights_path": path}
        self._request("POST", "/collective_rpc", body)
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        # Cached prefixes were computed with the old weights.
        self._request("POST", "/reset_prefix_cache", {})

    # ------------------------------------------------------------------------------ sampling

    def complete(self, model: str, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams, stop_ids: list[int]) -> list[Sample]:
        greedy = sampling.temperature <= 0
        body = {
            "model": model,
            "prompt": prompts,
            "max_tokens": max_tokens,
            "temperature": 0.0 if greedy else sampling.temperature,
            "top_k": 0 if greedy or not sampling.top_k else sampling.top_k,
            "top_p": 1.0 if greedy else sampling.top_p,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": stop_ids,
        }
        choices = sorted(self._request("POST", "/v1/completions", body)["choices"], key=lambda c: c["index"])
        return [sample_from_choice(choice, stop_ids) for choice in choices]


def sample_from_choice(choice: dict[str, Any], stop_ids: list[int]) -> Sample:
    """An OpenAI-style completion choice (tokens as `token_id:N`) as a `Sample`."""
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens") or []
    token_ids = [int(t.split(":", 1)[1]) for t in tokens]
    values = [v if isinstance(v, (int, float)) and v == v and abs(v) != float("inf") else 0.0 for v in logprobs.get("token_logprobs") or []]
    stopped = bool(token_ids) and token_ids[-1] in stop_ids
    return Sample(token_ids=token_ids, logprobs=values[: len(token_ids)], finish_reason="stop" if stopped else "length")


class VLLMServerBackend:
    """`GenerationBackend` over a `VLLMServerClient`. `model` is the served name to sample from: the
    base model, or the newest LoRA adapter once weight sync has loaded one."""

    def __init__(self, client: VLLMServerClient, model: str, stop_ids: list[int]):
        self.client = client
        self.model = model
        self.stop_ids = stop_ids

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams) -> list[Sample]:
        if not prompts:
            return []
        return self.client.complete(self.model, prompts, max_tokens, sampling, self.stop_ids)
