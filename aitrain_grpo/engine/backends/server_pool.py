"""Several vLLM servers behind one generation backend, and what a run does when one stops answering.

`--vllm-server-url URL1,URL2,...` names the servers (one is a pool of one); `VLLMServerClient`
(vllm_server.py) stays the HTTP client of one server. The pool adds:

- Dispatch: each episode goes to the live server with the fewest requests in flight when it makes its
  first request, and stays there for all its turns (its prefix is in that server's cache). The engine
  names the episode (`episode=`, its order in the rollout); the binding is forgotten when the rollout
  ends (`rollout_session`). A lockstep `generate` batch is split by episode the same way, one request
  per server, sent at once from a few threads.
- Weights: the weight sync (training/rollout/weight_sync.py) hands the pool what the servers must serve
  (`Weights`: the base model, a full-weights folder, a LoRA adapter) and the pool loads it into every
  live server (`publish`). Each server's load time is kept for `vllm/<host:port>/sync_seconds`.
- Faults: a request that fails in transport or with a 5xx takes its server out of rotation (one
  warning line) and raises `ReplayEpisode`: the engine plays that episode again from its start, and so
  does every other episode bound to that server when it next asks for a turn. A server is never retried
  in place: one that restarted within a retry window would otherwise answer with the base model's
  weights. A server out of rotation is put back after it answers /health, serves the same base model
  and has been given the current weights: tried at every weight sync, or at once when no server is
  left. With none left, requests wait (printing every few seconds what they wait for) up to
  `--vllm-server-timeout`, then fail with `GenerationServerError`, which stops the run with a
  checkpoint (training/run/stopping.py). The weights a returning server gets are those its peers serve, so
  every request of a step is sampled by one weight version.
- Metrics (`take_metrics`): per server and in total, requests and generated tokens since the last
  call, sync seconds, and whether it is live.

Left out: weighted or cache-aware routing beyond least-loaded (each training process counts only its
own requests), health checks of idle live servers (a dead server is found by its next request), moving
an episode between servers without a replay, and NCCL weight transfer (TRL's client talks to one
server; refused where the run is planned). With several training processes only the main one loads
weights, so another process puts a lost server back only once it has no server left (it then loads
the current weights itself): correct, but that process uses fewer servers meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import urlparse

from aitrain_grpo.engine.backends.base import GenerationBackend, ReplayEpisode, Sample, SamplingParams
from aitrain_grpo.engine.backends.vllm_server import SERVER_WAIT_REPORT_SECONDS, GenerationServerError, VLLMServerClient


@dataclass(frozen=True)
class Weights:
    """What every server must serve: `base` (the model it was started with) with the full weights in
    `folder` loaded over it (disk sync), or `adapter`, a LoRA adapter (name, folder) on top (lora sync)."""

    base: str
    folder: str | None = None
    adapter: tuple[str, str] | None = None

    @property
    def served(self) -> str:
        """The model name requests ask for."""
        return self.adapter[0] if self.adapter else self.base


class Server:
    """One server of the pool, its load and its counters since the last `take_metrics`."""

    def __init__(self, url: str, request_timeout: float):
        self.client = VLLMServerClient(url, request_timeout=request_timeout, retries=0)
        self.url = self.client.base_url
        self.name = urlparse(self.url).netloc or self.url
        self.live = True
        self.in_flight = 0
        self.requests = self.tokens = 0
        self.sync_seconds = 0.0
        self.returned_at: float | None = None  # when a returning server answered /health again
        self.return_to_first_request: float | None = None  # seconds from then to its first answered request


class ServerPool(GenerationBackend):
    """A `RequestBackend` over one or more vLLM servers; see the module docstring."""

    episode_affinity = True  # the engine names each request's episode (engine/policy_turns.py)

    def __init__(self, urls: list[str], base_model: str, stop_ids: list[int], *, wait_timeout: float = 240.0,
                 request_timeout: float = 600.0, stream=None):
        if not urls:
            raise ValueError("a server pool needs at least one URL")
        self.servers = [Server(url, request_timeout) for url in urls]
        self.stop_ids = stop_ids
        self.weights = Weights(base_model)
        self.wait_timeout = wait_timeout
        self.stream = stream or sys.stderr
        self._lock = threading.RLock()  # servers' state, the bindings and the weights
        self._waiting = threading.Lock()  # one wait for a returning server at a time
        self._bound: dict[Any, Server] = {}
        self._recovery: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None
        self._threads: ThreadPoolExecutor | None = None  # lockstep batches split across servers

    @property
    def model(self) -> str:
        return self.weights.served

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    # ------------------------------------------------------------------------------ dispatch

    def _pick(self, episode: Any) -> Server | None:
        """The server for `episode`'s next request (counted in flight), None when no server is live.
        Raises `ReplayEpisode` when the episode's server was taken out of rotation since its last turn."""
        with self._lock:
            server = self._bound.get(episode) if episode is not None else None
            if server is not None and not server.live:
                del self._bound[episode]
                raise ReplayEpisode(f"vLLM server {server.name} was taken out of rotation during this episode")
            if server is None:
                live = [s for s in self.servers if s.live]
                if not live:
                    return None
                server = min(live, key=lambda s: s.in_flight)
                if episode is not None:
                    self._bound[episode] = server
            server.in_flight += 1
            return server

    def _done(self, server: Server, samples: list[Sample] | None) -> None:
        with self._lock:
            server.in_flight -= 1
            if samples is not None:
                server.requests += len(samples)
                server.tokens += sum(len(s.token_ids) for s in samples)
                if server.returned_at is not None and server.return_to_first_request is None:
                    server.return_to_first_request = time.monotonic() - server.returned_at

    def _failed(self, server: Server, episode: Any, exc: GenerationServerError) -> None:
        """A request to `server` failed: a refusal is the run's error; anything else takes the server out
        and replays the episode (a request of no episode is sent again, elsewhere)."""
        if not exc.transient:
            raise exc
        self.lose(server, exc)
        if episode is not None:
            with self._lock:
                self._bound.pop(episode, None)
            raise ReplayEpisode(f"{exc}; the episode is played again from its start") from None

    def lose(self, server: Server, reason: Exception) -> None:
        """Take `server` out of rotation, with one warning line."""
        with self._lock:
            if not server.live:
                return
            server.live = False
            server.returned_at = None
            others = ", ".join(s.name for s in self.servers if s.live)
        where = f"on {others}" if others else "when a server returns"
        self._say(f"warning: vLLM server {server.name} taken out of rotation ({reason}); its episodes are "
                  f"replayed from their start {where}")

    async def generate_one(self, prompt: list[int], max_tokens: int, sampling: SamplingParams, episode: Any = None) -> Sample:
        while True:
            server = self._pick(episode)
            if server is None:
                await self._await_return()
                continue
            sample = None
            try:
                sample = await server.client.complete_one(self.model, prompt, max_tokens, sampling, self.stop_ids)
            except GenerationServerError as exc:
                self._failed(server, episode, exc)
                continue
            finally:
                self._done(server, None if sample is None else [sample])
            return sample

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams,
                 episodes: list[Any] | None = None) -> list[Sample]:
        """A batch, split across servers by episode; samples in prompt order."""
        if not prompts:
            return []
        keys = list(episodes) if episodes is not None else [None] * len(prompts)
        while True:
            picked: list[Server] = []
            try:
                for key in keys:
                    server = self._pick(key)
                    if server is None:
                        raise _NoneLive
                    picked.append(server)
            except _NoneLive:
                for server in picked:
                    self._done(server, None)
                self.wait_for_return()
                continue
            except ReplayEpisode:
                for server in picked:
                    self._done(server, None)
                raise
            groups: dict[Server, list[int]] = {}
            for i, server in enumerate(picked):
                groups.setdefault(server, []).append(i)
            results = self._send_groups(groups, prompts, max_tokens, sampling)
            failed = [(server, exc) for server, exc in results.items() if isinstance(exc, GenerationServerError)]
            for server, exc in failed:
                self._failed(server, None, exc)  # raises a refusal; else the server is out of rotation
            if failed and episodes is not None:
                raise ReplayEpisode(f"{failed[0][1]}; the rollout is played again from its start")
            if not failed:
                samples: list[Sample] = [None] * len(prompts)  # type: ignore[list-item]
                for server, indexes in groups.items():
                    for i, sample in zip(indexes, results[server]):
                        samples[i] = sample
                return samples

    def _send_groups(self, groups: dict[Server, list[int]], prompts, max_tokens, sampling) -> dict[Server, Any]:
        def send(server: Server, indexes: list[int]):
            samples = None
            try:
                samples = server.client.complete(self.model, [prompts[i] for i in indexes], max_tokens, sampling, self.stop_ids)
                return samples
            except GenerationServerError as exc:
                return exc
            finally:
                self._done(server, samples)
                for _ in indexes[1:]:
                    with self._lock:
                        server.in_flight -= 1

        if len(groups) == 1:
            ((server, indexes),) = groups.items()
            return {server: send(server, indexes)}
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=len(self.servers), thread_name_prefix="aitrain-vllm-pool")
        futures = {server: self._threads.submit(send, server, indexes) for server, indexes in groups.items()}
        return {server: future.result() for server, future in futures.items()}

    @contextlib.contextmanager
    def rollout_session(self) -> Iterator[None]:
        try:
            yield
        finally:
            with self._lock:
                self._bound.clear()
            for server in self.servers:
                server.client.close_session()

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None

    # ------------------------------------------------------------------------------ servers that return

    async def _await_return(self) -> None:
        """Wait on the event loop until a server is live again: one wait in a worker thread, shared by
        every request that finds none (a thread each would take the environment's workers)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._recovery is None or self._recovery[0] is not loop or self._recovery[1].done():
                self._recovery = (loop, loop.run_in_executor(None, self.wait_for_return))
            future = self._recovery[1]
        await asyncio.shield(future)

    def wait_for_return(self) -> None:
        """Block until a server is live, readmitting the first that answers again; past the timeout a
        one-line `GenerationServerError` (not transient: it stops the run)."""
        with self._waiting:
            started = time.monotonic()
            next_report = started + SERVER_WAIT_REPORT_SECONDS
            while not any(s.live for s in self.servers):
                if any(self.readmit(server) for server in self.servers):
                    return
                now = time.monotonic()
                urls = ", ".join(s.url for s in self.servers)
                if now - started > self.wait_timeout:
                    several = len(self.servers) > 1
                    raise GenerationServerError(
                        f"vLLM server{'s' if several else ''} at {urls} {'are' if several else 'is'} not answering after "
                        f"{self.wait_timeout:g}s (--vllm-server-timeout)")
                if now >= next_report:
                    self._say(f"waiting for a vLLM server to return: {urls} ({now - started:.0f}s of "
                              f"--vllm-server-timeout {self.wait_timeout:g}s)")
                    next_report = now + SERVER_WAIT_REPORT_SECONDS
                time.sleep(1.0)

    def readmit(self, server: Server) -> bool:
        """Put `server` back in rotation if it answers /health, serves the base model and takes the
        current weights. True when it is live now."""
        if server.live:
            return True
        if not server.client.is_healthy():
            return False
        answered = time.monotonic()
        with self._lock:
            weights = self.weights
        try:
            if weights.base not in server.client.served_models():
                self._say(f"warning: vLLM server {server.name} answers again but does not serve {weights.base}; kept out")
                return False
            seconds = self._load(server, weights, None)
        except GenerationServerError:
            return False
        with self._lock:
            if self.weights != weights:  # a sync came in meanwhile: try again with the new weights
                return False
            server.live = True
            server.returned_at, server.return_to_first_request = answered, None
            server.sync_seconds += seconds
        self._say(f"vLLM server {server.name} is back in rotation (given the current weights in {seconds:.1f}s)")
        return True

    # ------------------------------------------------------------------------------ weights

    def _load(self, server: Server, weights: Weights, previous: Weights | None) -> float:
        """Load `weights` into one server: from scratch when `previous` is None (a server that may have
        restarted), else as a change from `previous`. Returns the seconds it took."""
        started = time.perf_counter()
        client = server.client
        if previous is None or weights.adapter is None or previous.base != weights.base:
            client.reload_weights(weights.folder or weights.base)
        if weights.adapter is not None:
            client.load_lora_adapter(*weights.adapter)
            if previous is not None and previous.adapter is not None and previous.adapter != weights.adapter:
                with contextlib.suppress(GenerationServerError):  # cleanup only
                    client.unload_lora_adapter(previous.adapter[0])
        return time.perf_counter() - started

    def publish(self, weights: Weights, *, load: bool = True, fresh: bool = False) -> None:
        """Make `weights` what every server serves: loaded into each live server (from scratch with
        `fresh`), and into each one out of rotation that answers again (then back in rotation). With
        `load` False (a training process other than the main one) only the served name changes."""
        with self._lock:
            previous, self.weights = self.weights, weights
        if not load:
            return
        for server in self.servers:
            if not server.live:
                self.readmit(server)
                continue
            try:
                seconds = self._load(server, weights, None if fresh else previous)
            except GenerationServerError as exc:
                if not exc.transient:
                    raise
                self.lose(server, exc)
                continue
            with self._lock:
                server.sync_seconds += seconds
        if not any(s.live for s in self.servers):
            self.wait_for_return()

    def each_live(self) -> list[Server]:
        with self._lock:
            return [s for s in self.servers if s.live]

    # ------------------------------------------------------------------------------ metrics

    def take_metrics(self) -> dict[str, float]:
        """`vllm/*` since the last call: per server `vllm/<host:port>/requests`, `.../tokens`,
        `.../sync_seconds`, `.../live` (and `.../return_to_first_request_s` once after a return), totals."""
        metrics: dict[str, float] = {}
        with self._lock:
            for s in self.servers:
                prefix = f"vllm/{s.name}"
                metrics.update({f"{prefix}/requests": float(s.requests), f"{prefix}/tokens": float(s.tokens),
                                f"{prefix}/sync_seconds": s.sync_seconds, f"{prefix}/live": float(s.live)})
                if s.return_to_first_request is not None and s.returned_at is not None:
                    metrics[f"{prefix}/return_to_first_request_s"] = s.return_to_first_request
                    s.returned_at = None  # reported once
                s.requests = s.tokens = 0
                s.sync_seconds = 0.0
            metrics["vllm/requests"] = float(sum(metrics[f"vllm/{s.name}/requests"] for s in self.servers))
            metrics["vllm/tokens"] = float(sum(metrics[f"vllm/{s.name}/tokens"] for s in self.servers))
            metrics["vllm/servers_live"] = float(sum(s.live for s in self.servers))
        return metrics


class _NoneLive(Exception):
    """No server is live for a lockstep batch (internal)."""
