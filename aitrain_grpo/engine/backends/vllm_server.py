"""Generation from a vLLM server over HTTP (started by `aitrain vllm-serve`, or any vLLM OpenAI server
with dev mode on), plus the few control calls weight synchronisation needs.

Prompts go out as token ids through `/v1/completions` and come back as token ids
(`return_tokens_as_token_ids`) with each sampled token's log-probability. Two ways to ask:
`generate` sends one request carrying a whole batch (the engine's lockstep schedule; `httpx`, like the
control calls), `generate_one` sends one request per episode turn, many at once, and the server's
continuous batching does the rest (the continuous schedule). Both have a timeout per request and retry
transient failures (connection refused or reset, timeouts, 5xx) a bounded number of times with
exponential backoff; then `GenerationServerError` names the server and what failed, so a run stops
with a message instead of hanging. A 4xx answer is not retried: asking again would not help.
`wait_for_server` is the one wait for a server to answer /health (training's check before loading,
`aitrain vllm-serve` after starting one).

The per-turn requests go out on `aiohttp`, not `httpx.AsyncClient`: httpcore 1.0's connection pool
rescans every connection on each request event (O(connections x requests), encode/httpcore#1035),
which with 64 turns in flight cost the client 2-10 ms of CPU a request (0.15-0.7 s per 64 turns,
profiled: `_assign_requests_to_connections`), against about 0.4 ms with aiohttp; on a machine whose
cores the server shares, that CPU came out of generation. Its session lives for one rollout
(`rollout_session`), on the engine's event loop.

Left out: streaming, `n > 1` sampling (each episode is its own request row), multimodal prompts, and
the OpenAI client (its retry policy and types add nothing the token-id protocol needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any, Iterator

import httpx

from aitrain_grpo.engine.backends.base import GenerationBackend, GenerationBackendError, Sample, SamplingParams

# Enough connections for every request the engine keeps in flight; more would only queue in the server.
MAX_CONNECTIONS = 512


class GenerationServerError(GenerationBackendError):
    """The generation server cannot be reached or answered with an error. One line, names the server.
    `transient`: the server was unreachable, timed out or answered 5xx (it may come back), rather than
    refusing the request (4xx, asking again would not help)."""

    transient = False


class _Failed(Exception):
    """One attempt failed; `retry` says whether another attempt may help."""

    def __init__(self, message: str, retry: bool):
        super().__init__(message)
        self.retry = retry


def _answer(path: str, status: int, text: str) -> Any:
    """The decoded body of a response, or `_Failed` for an error status."""
    if status >= 400:
        detail = " ".join(text[:300].split())
        raise _Failed(f"HTTP {status} from {path}: {detail}", retry=status >= 500)
    text = text or "null"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _transport_failure(path: str, exc: Exception) -> _Failed:
    reason = str(exc) or type(exc).__name__
    return _Failed(f"{path} failed: {reason}", retry=True)


class VLLMServerClient:
    def __init__(self, base_url: str, *, request_timeout: float = 600.0, retries: int = 3, backoff: float = 1.0):
        self.base_url = base_url.rstrip("/")
        self.request_timeout = request_timeout
        self.retries = retries
        self.backoff = backoff
        self._client: httpx.Client | None = None
        # An aiohttp session belongs to the event loop it was made on: made on first use, closed after
        # each rollout (close_session), so none is left open when the engine's loop closes.
        self._session: tuple[asyncio.AbstractEventLoop, Any] | None = None

    # ------------------------------------------------------------------------------ HTTP

    def _timeout(self, timeout: float | None) -> httpx.Timeout:
        # No pool timeout: a request waiting for a free connection is queued work, not a failure.
        return httpx.Timeout(timeout or self.request_timeout, pool=None)

    def _error(self, failure: _Failed) -> GenerationServerError:
        error = GenerationServerError(f"vLLM server at {self.base_url}: {failure}")
        error.transient = failure.retry
        return error

    def _request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None, retry: bool = True) -> Any:
        if self._client is None:
            self._client = httpx.Client(limits=httpx.Limits(max_connections=MAX_CONNECTIONS))
        attempts = self.retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                try:
                    response = self._client.request(method, f"{self.base_url}{path}", json=body, timeout=self._timeout(timeout))
                except httpx.HTTPError as exc:
                    raise _transport_failure(path, exc) from exc
                return _answer(path, response.status_code, response.text)
            except _Failed as failure:
                if not failure.retry or attempt + 1 == attempts:
                    raise self._error(failure) from None
            time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")

    def _async_session(self):
        import aiohttp  # imported when the continuous schedule first runs

        loop = asyncio.get_running_loop()
        if self._session is None or self._session[0] is not loop:
            self.close_session()
            # No timeout on waiting for a free connection (queued work, not a failure); connecting and
            # reading the answer each get the request timeout.
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.request_timeout, sock_read=self.request_timeout)
            self._session = (loop, aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS), timeout=timeout))
        return self._session[1]

    def close_session(self) -> None:
        """Close the per-turn requests' session, if one is open, on its own event loop."""
        if self._session is None:
            return
        loop, session = self._session
        self._session = None
        if loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop.is_running():  # from a task on it, or from another thread
            if running is loop:
                loop.create_task(session.close())
            else:
                asyncio.run_coroutine_threadsafe(session.close(), loop)
        elif running is None:
            loop.run_until_complete(session.close())
        # else another loop runs in this thread while the session's is idle: it cannot be run from here

    async def _request_async(self, path: str, body: Any) -> Any:
        import aiohttp

        session = self._async_session()
        attempts = self.retries + 1
        for attempt in range(attempts):
            try:
                try:
                    async with session.post(f"{self.base_url}{path}", json=body) as response:
                        status, text = response.status, await response.text()
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    raise _transport_failure(path, exc) from exc
                return _answer(path, status, text)
            except _Failed as failure:
                if not failure.retry or attempt + 1 == attempts:
                    raise self._error(failure) from None
            await asyncio.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------------------ state

    def is_healthy(self) -> bool:
        try:
            self._request("GET", "/health", timeout=5, retry=False)
            return True
        except GenerationServerError:
            return False

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

    def completion_body(self, model: str, prompt: list[int] | list[list[int]], max_tokens: int, sampling: SamplingParams,
                        stop_ids: list[int]) -> dict[str, Any]:
        greedy = sampling.temperature <= 0
        return {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0 if greedy else sampling.temperature,
            "top_k": 0 if greedy or not sampling.top_k else sampling.top_k,
            "top_p": 1.0 if greedy else sampling.top_p,
            "min_p": 0.0 if greedy else sampling.min_p,
            "repetition_penalty": sampling.repetition_penalty,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": stop_ids,
        }

    def complete(self, model: str, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams, stop_ids: list[int]) -> list[Sample]:
        """One request for a batch of prompts; samples in prompt order."""
        body = self.completion_body(model, prompts, max_tokens, sampling, stop_ids)
        choices = sorted(self._request("POST", "/v1/completions", body)["choices"], key=lambda c: c["index"])
        return [sample_from_choice(choice, stop_ids) for choice in choices]

    async def complete_one(self, model: str, prompt: list[int], max_tokens: int, sampling: SamplingParams, stop_ids: list[int]) -> Sample:
        """One request for one prompt, on the running event loop."""
        body = self.completion_body(model, prompt, max_tokens, sampling, stop_ids)
        (choice,) = (await self._request_async("/v1/completions", body))["choices"]
        return sample_from_choice(choice, stop_ids)


SERVER_WAIT_REPORT_SECONDS = 5.0


def wait_for_server(client: VLLMServerClient, timeout: float, *, hint: str = "", process=None,
                    timeout_flag: str | None = None) -> None:
    """Wait until the server answers /health, or raise a one-line `GenerationServerError` at `timeout`
    seconds (`hint` says what to do then) or as soon as `process`, the server's own process if this
    side started it, has exited. With `timeout_flag` (the option that set `timeout`), a line on stderr
    every few seconds says what is awaited: a server still loading its model looks the same as none."""
    started = time.monotonic()
    next_report = started + SERVER_WAIT_REPORT_SECONDS
    while not client.is_healthy():
        if process is not None and process.poll() is not None:
            raise GenerationServerError(f"the vLLM server exited with code {process.returncode} before it was ready")
        now = time.monotonic()
        if now - started > timeout:
            raise GenerationServerError(f"vLLM server at {client.base_url} is not answering after {timeout:g}s{hint and '; '}{hint}")
        if timeout_flag and now >= next_report:
            print(
                f"waiting for the vLLM server at {client.base_url} to answer /health "
                f"({now - started:.0f}s of {timeout_flag} {timeout:g}s)",
                file=sys.stderr, flush=True,
            )
            next_report = now + SERVER_WAIT_REPORT_SECONDS
        time.sleep(1.0)


def sample_from_choice(choice: dict[str, Any], stop_ids: list[int]) -> Sample:
    """An OpenAI-style completion choice (tokens as `token_id:N`) as a `Sample`."""
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens") or []
    token_ids = [int(t.split(":", 1)[1]) for t in tokens]
    values = [v if isinstance(v, (int, float)) and v == v and abs(v) != float("inf") else 0.0 for v in logprobs.get("token_logprobs") or []]
    stopped = bool(token_ids) and token_ids[-1] in stop_ids
    return Sample(token_ids=token_ids, logprobs=values[: len(token_ids)], finish_reason="stop" if stopped else "length")


class VLLMServerBackend(GenerationBackend):
    """`RequestBackend` over a `VLLMServerClient`. `model` is the served name to sample from: the
    base model, or the newest LoRA adapter once weight sync has loaded one."""

    def __init__(self, client: VLLMServerClient, model: str, stop_ids: list[int]):
        self.client = client
        self.model = model
        self.stop_ids = stop_ids

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams) -> list[Sample]:
        if not prompts:
            return []
        return self.client.complete(self.model, prompts, max_tokens, sampling, self.stop_ids)

    @contextlib.contextmanager
    def rollout_session(self) -> Iterator[None]:
        try:
            yield
        finally:
            self.client.close_session()

    async def generate_one(self, prompt: list[int], max_tokens: int, sampling: SamplingParams) -> Sample:
        return await self.client.complete_one(self.model, prompt, max_tokens, sampling, self.stop_ids)
