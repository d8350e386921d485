"""Evaluation as a library: play an environment's episodes with a model, without training, and measure it.

Each task (dataset row) is played `samples` times through the same `RolloutEngine` as training, which
gives pass@k. `EvalResult` reports mean score, success rate (episodes scoring 1.0), pass@k (tasks with
at least one success among their k episodes), mean turns, environment errors, truncations, and
generated tokens per second. `open_backend` loads a model for generation: merged LoRA with Hugging Face
generate, or an in-process vLLM engine applying the adapter per request (the backend itself comes from
`engine/backends/choice.py`, as training's does). `SharedVLLMEngine` serves several models on the same
base weights from one vLLM engine (a run's start and LoRA checkpoints), each adapter per request.

Left out: the command (`aitrain eval`: options, the training run's settings, the table), in
commands/evaluation.py; the difference between two models with its interval (paired.py) and a run's
checkpoints side by side (sweep.py).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aitrain_grpo.engine.backends.base import GenerationBackend
from aitrain_grpo.engine.backends.choice import build_backend, require_vllm
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.engine.stats import SUCCESS, episode_scores, episode_stats
from aitrain_grpo.env.base import Environment, Episode
from aitrain_grpo.errors import ConfigError, EnvFailedError, one_line
from aitrain_grpo.models.loading import ModelSource, load_causal_lm, load_for_generation, load_tokenizer, stop_token_ids
from aitrain_grpo.runlog.records import episode_record, write_jsonl


# The settings of TRL's colocated engine (trl/generation/vllm_generation.py, `LLM(...)`) that change what
# it generates: compiled graphs (no enforce_eager; on an AVX2 CPU eager kernels round differently enough to
# change greedy tokens), its batch token limit and processed log-probabilities.
TRL_ENGINE_SETTINGS = {"max_num_batched_tokens": 4096, "logprobs_mode": "processed_logprobs"}


def _adapter_config(source: ModelSource) -> dict:
    return json.loads((Path(source.adapter) / "adapter_config.json").read_text()) if source.adapter else {}


def _needs_merge(adapter: dict) -> bool:
    """vLLM applies neither a DoRA adapter nor a module saved in full: such an adapter is merged first."""
    return bool(adapter.get("use_dora") or adapter.get("modules_to_save"))


def _start_llm(weights: str, tokenizer_path: str, spec: str, lora_rank: int | None):
    """The engine, built as TRL builds a training run's colocated one (TRL_ENGINE_SETTINGS); with
    `lora_rank`, adapters up to that rank are applied per request."""
    from vllm import LLM

    lora_kwargs = {"enable_lora": True, "max_lora_rank": max(8, lora_rank)} if lora_rank else {}
    try:
        return LLM(model=weights, tokenizer=tokenizer_path, gpu_memory_utilization=0.5, **TRL_ENGINE_SETTINGS,
                   **lora_kwargs)
    except Exception as exc:  # vLLM reports unsupported models and memory problems this way
        raise ConfigError(f"vLLM could not load {spec}: {' '.join(str(exc).split())[:300]}") from None


def _stop_ids(weights: str, tokenizer) -> list[int]:
    from transformers import AutoConfig, GenerationConfig

    generation_config = GenerationConfig.from_model_config(AutoConfig.from_pretrained(weights))
    return stop_token_ids(SimpleNamespace(generation_config=generation_config), tokenizer)


def open_vllm_engine(source: ModelSource) -> tuple[Any, Any, list[int], Any]:
    """An in-process vLLM engine on the base weights, with the LoRA adapter (if any) applied per
    request rather than merged (vLLM serves adapters natively), except a DoRA adapter or one with modules
    saved in full, which vLLM cannot apply and gets merged: (llm, lora_request, stop_ids, tokenizer).
    Built as TRL builds a training run's colocated engine (TRL_ENGINE_SETTINGS), so that `aitrain eval`
    plays the kernels a run's held-back evaluation played."""
    # vLLM is optional and, like torch, takes seconds to import: only when --use-vllm asks for it.
    from vllm.lora.request import LoRARequest

    tokenizer = load_tokenizer(source)
    lora_request = None
    adapter = _adapter_config(source)
    with tempfile.TemporaryDirectory(prefix="aitrain-merged-") as merged:
        weights, tokenizer_path = source.weights, source.tokenizer
        if _needs_merge(adapter):
            # merged as a training run's vLLM gets them (--vllm-sync auto), read once and removed
            load_causal_lm(source.adapter).save_pretrained(merged)
            tokenizer.save_pretrained(merged)
            weights = tokenizer_path = merged
        elif source.adapter:
            lora_request = LoRARequest("eval-adapter", 1, source.adapter)
        llm = _start_llm(weights, tokenizer_path, source.spec, int(adapter.get("r", 16)) if lora_request else None)
    return llm, lora_request, _stop_ids(source.weights, tokenizer), tokenizer


class SharedVLLMEngine:
    """One in-process vLLM engine for several models on the same base weights (a run's start and its
    LoRA checkpoints, a model and its base as `--baseline`): each adapter applied per request. One engine
    start instead of one a model (20-50 s each), and no second engine asking for GPU memory that the
    first one, deleted, may not have given back. `for_sources` gives None when the models do not share
    their base, or one needs merging (DoRA, modules saved in full): each then gets its own engine."""

    def __init__(self, sources: list[ModelSource]):
        ranks = [int(_adapter_config(s).get("r", 16)) for s in sources if s.adapter]
        self.llm = _start_llm(sources[0].weights, sources[0].tokenizer, sources[0].spec, max(ranks) if ranks else None)
        self.adapters: dict[str, Any] = {}

    @classmethod
    def for_sources(cls, sources: list[ModelSource]) -> "SharedVLLMEngine | None":
        if len(sources) < 2 or len({s.weights for s in sources}) != 1:
            return None
        if any(_needs_merge(_adapter_config(s)) for s in sources):
            return None
        require_vllm("--use-vllm")
        return cls(sources)

    def open(self, source: ModelSource) -> tuple[GenerationBackend, Any, None]:
        """The backend, tokenizer (the model's own) and no model object, as `open_backend` gives them."""
        from vllm.lora.request import LoRARequest

        lora_request = None
        if source.adapter:
            if source.adapter not in self.adapters:
                n = len(self.adapters) + 1
                self.adapters[source.adapter] = LoRARequest(f"eval-adapter-{n}", n, source.adapter)
            lora_request = self.adapters[source.adapter]
        tokenizer = load_tokenizer(source)
        stop_ids = _stop_ids(source.weights, tokenizer)
        return build_backend("vllm_colocate", stop_ids, llm=self.llm, lora_request=lora_request), tokenizer, None


def open_backend(source: ModelSource, *, use_vllm: bool = False) -> tuple[GenerationBackend, Any, Any]:
    """The generation backend, tokenizer and model (hf only; None with vLLM) evaluation uses: Hugging
    Face generate on the (merged) model, or an in-process vLLM engine; built by the same `build_backend`
    as training's. With vLLM it also takes one turn at a time, so the continuous schedule can run."""
    if use_vllm:
        require_vllm("--use-vllm")
        llm, lora_request, stop_ids, tokenizer = open_vllm_engine(source)
        return build_backend("vllm_colocate", stop_ids, llm=llm, lora_request=lora_request), tokenizer, None
    model, tokenizer = load_for_generation(source)
    return build_backend("hf", model=model, tokenizer=tokenizer), tokenizer, model


# ------------------------------------------------------------------------------------------- results


@dataclass
class EvalResult:
    """The episodes one model played, `samples` per task in task order, and what generating cost."""

    label: str
    episodes: list[Episode]
    tasks: list[int]          # the dataset row index of each episode
    samples: int
    schedule: str = "lockstep"  # how the episodes were played (engine/rollout.py)
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def scores(self) -> list[float]:
        return episode_scores(self.episodes)

    def pass_at_k(self) -> float:
        solved: dict[int, bool] = {}
        for task, score in zip(self.tasks, self.scores):
            solved[task] = solved.get(task, False) or score >= SUCCESS
        return sum(solved.values()) / max(len(solved), 1)

    def summary(self) -> dict[str, float]:
        stats = episode_stats(self.episodes)
        return {
            "episodes": stats.episodes,
            "tasks": len(set(self.tasks)),
            "mean_score": stats.score_mean,
            "success_rate": stats.success_rate,
            f"pass@{self.samples}": self.pass_at_k(),
            "mean_turns": stats.turns_mean,
            "errors": stats.errors,
            "truncated": stats.truncated,
            "tool_errors": stats.tool_errors,
            "tokens_per_second": self.generated_tokens / self.generate_seconds if self.generate_seconds else 0.0,
        }

    def records(self) -> list[dict[str, Any]]:
        seen: dict[int, int] = {}
        out = []
        for episode, task in zip(self.episodes, self.tasks):
            sample = seen[task] = seen.get(task, -1) + 1
            out.append(episode_record(episode, model=self.label, task=task, sample=sample))
        return out


def evaluate(
    env: Environment,
    backend: GenerationBackend,
    tokenizer,
    rows: list[dict[str, Any]],
    *,
    label: str,
    settings: EpisodeSettings = EpisodeSettings(),
    samples: int = 1,
    batch_size: int = 32,
    seed: int = 0,
) -> EvalResult:
    """Play every row `samples` times with the backend's model, `batch_size` episodes at a time, as
    `settings` say (the schedule too: as in training, continuous with vLLM and lockstep with hf unless
    the run said otherwise). `label` is also the model name an agent environment's requests use."""
    from transformers import set_seed  # imports torch (seconds): only once episodes are played

    set_seed(seed)  # same seed, same sampling noise: two models compared on equal terms
    engine = RolloutEngine(env, tokenizer, backend, replace(settings, model_name=label))
    tasks = [index for index in range(len(rows)) for _ in range(samples)]
    result = EvalResult(label=label, episodes=[], tasks=tasks, samples=samples, schedule=engine.schedule)
    started = time.perf_counter()
    with engine:
        for start in range(0, len(tasks), batch_size):
            chunk = tasks[start:start + batch_size]
            batch = engine.run([dict(rows[i]) for i in chunk])
            result.episodes.extend(batch.episodes)
            result.generated_tokens += sum(sum(trace.env_mask) for trace in [*batch.traces, *sum(batch.earlier, [])])
            result.generate_seconds += batch.generate_seconds
    result.wall_seconds = time.perf_counter() - started
    return result


def environment_errors(result: EvalResult) -> tuple[int, str]:
    """How many of `result`'s episodes ended in an environment error, and the most common (with its count)."""
    counts = Counter(one_line(episode.error, 300) for episode in result.episodes if episode.error)
    common = "; ".join(f"({n}x) {message}" for message, n in counts.most_common(2))
    return sum(counts.values()), common


def check_not_all_failed(result: EvalResult, what: str, fix: str, *, fatal: bool = True) -> str | None:
    """A note when some of `result`'s episodes ended in an environment error, None when none did. When every
    one did, its scores are those errors' zeros, not the model's: `EnvFailedError` (or, not `fatal`, a note
    saying so). `what` names the episodes ("episodes of MODEL", "held-back episodes")."""
    errors, common = environment_errors(result)
    if not errors:
        return None
    if errors == len(result.episodes):
        said = (f"all {errors} {what} ended in an environment error, so their scores say nothing of the model; "
                f"most common: {common}; {fix}")
        if fatal:
            raise EnvFailedError(said)
        return f"note: {said}"
    return (f"note: {errors} of {len(result.episodes)} {what} ended in an environment error (scored 0); "
            f"most common: {common}")


def write_records(path: str | Path, results: list[EvalResult]) -> Path:
    """One JSON line per episode, every model's in turn (`model` says whose)."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True)
    write_jsonl(path, [record for result in results for record in result.records()])
    return path
