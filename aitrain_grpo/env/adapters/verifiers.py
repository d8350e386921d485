"""verifiers environments (the classic API, `verifiers.legacy` of verifiers 0.3.1), trained unchanged
through the run's endpoint: `--rl-env verifiers:ENV_ID` or `--rl-env verifiers:my_module:make_env`.

Why the classic API: its `Environment.run_rollout(input, client, model, sampling_args)` plays one rollout
(single-turn, multi-turn `env_response` loops, `ToolEnv` tool calls) against any `openai.AsyncOpenAI`
(wrapped in its `OpenAIChatCompletionsClient`, non-streaming) and scores it with the env's `Rubric`, so
an episode is exactly an `AgentEnvironment.rollout(client, row)`. verifiers 0.4.0 keeps only the v1 stack
(`verifiers.v1`): there a rollout is a harness *program* launched in a runtime (provisioned with uv) whose
model calls go through verifiers' interception server, and its built-in chat programs stream, which the
endpoint refuses; 0.4.0 is refused here with a one-line error.

How verifiers' notions map onto ours:
- Environment: `load_environment(env_id, **env_args)` (an installed verifiers environment package), or
  `env="module:function"`: your function called with `env_args`, returning a verifiers `Environment`.
- Rows: the env's dataset (`split="train"`, or `"eval"` for its eval dataset, which verifiers falls back
  to the train one without), `size` rows at most; each row keeps `prompt` (chat messages, the env's
  system prompt and few-shot included), `answer`, `info`, `task` and `example_id`.
- Episode: `run_rollout` with the episode's client and `client.model`; every model turn (and so the token
  budgets, `--rl-max-turns` included) is the endpoint's. Sampling stays the run's.
- Score: the rubric's reward (its reward functions weighted), clipped to [0, 1]; a reward outside it
  is clipped and counted in `env/reward_clipped` (GRPO compares rewards within a group, but the engine's
  score is a [0, 1] number). Metrics: the rubric's individual reward functions and metrics, as verifiers
  names them (`env/<name>`). An empty reply (verifiers' EmptyModelResponseError ends the rollout) is the
  model's doing: scored by the rubric, counted in `env/empty_reply`. Any other error verifiers records
  is raised, so the episode scores 0 with the error named.

Left out: `EnvGroup` weighting beyond what verifiers does itself, the v1 stack, verifiers' own group
scoring (`score_group`: rubrics that compare the rollouts of a group score each rollout alone here), and
an oracle (`solve`): verifiers environments have none.
"""

from __future__ import annotations

import json
import math
from typing import Any

from aitrain_grpo.env.adapters.common import import_object
from aitrain_grpo.env.agent import AgentEnvironment, AgentResult
from aitrain_grpo.errors import EnvLoadError, one_line

INSTALL = "pip install 'aitrain-grpo[verifiers]'"
SPLITS = ("train", "eval")
ROW_KEYS = ("prompt", "answer", "info", "task", "example_id")
# Errors verifiers records for what the model did (not faults of the environment): scored by the rubric.
MODEL_ERRORS = ("EmptyModelResponseError",)


def _verifiers():
    """`verifiers.legacy` (the classic API), or a one-line error naming the fix."""
    try:
        import verifiers
    except ImportError:
        raise EnvLoadError(f"verifiers environments need the verifiers package; install it with {INSTALL}") from None
    try:
        import verifiers.legacy as vf
    except ImportError:
        version = getattr(verifiers, "__version__", "?")
        raise EnvLoadError(f"verifiers {version} has no classic API (verifiers.legacy; 0.4.0 keeps only the v1 stack, "
                           f"whose rollouts cannot play through this endpoint); install it with {INSTALL}") from None
    return vf


def _plain(value: Any) -> Any:
    """A dataset value as plain JSON-like data (pydantic messages as dicts)."""
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(exclude_none=True))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class VerifiersEnv(AgentEnvironment):
    """A verifiers environment played through the endpoint (see the module docstring)."""

    interface = "verifiers environment"

    def __init__(self, env: str, env_args: dict[str, Any] | None = None, split: str = "train", size: int | None = None,
                 max_turns: int = 10):
        vf = _verifiers()
        if not isinstance(env, str) or not env.strip():
            raise EnvLoadError("verifiers: env must name an environment: an env id (e.g. 'gsm8k') or 'module:function'")
        if split not in SPLITS:
            raise EnvLoadError(f"verifiers: split must be one of {', '.join(SPLITS)}, got {split!r}")
        if env_args is not None and not isinstance(env_args, dict):
            raise EnvLoadError(f"verifiers: env_args must be a JSON object of keyword arguments, got {type(env_args).__name__}")
        self.env_name, self.env_args, self.split, self.size = env.strip(), dict(env_args or {}), split, size
        self.max_turns = max_turns
        self.vf_env = self._load(vf)

    def _load(self, vf) -> Any:
        name, args = self.env_name, self.env_args
        if ":" in name:
            make = import_object(name, "verifiers env")
            if not callable(make):
                raise EnvLoadError(f"verifiers: {name!r} is a {type(make).__name__}, not a function returning an environment")
            where = f"{name}(**{one_line(json.dumps(args, default=str), 120)})"
            try:
                built = make(**args)
            except TypeError as exc:
                raise EnvLoadError(f"verifiers: {where} failed: {exc}; check env_args") from None
        else:
            where = f"load_environment({name!r})"
            try:
                built = vf.load_environment(name, **args)
            except (ImportError, AttributeError, ValueError) as exc:
                raise EnvLoadError(f"verifiers: {where} failed: {one_line(str(exc), 200)}; install the environment "
                                   f"package (e.g. `vf-install {name}`) or name it as 'module:function'") from None
        if not isinstance(built, vf.Environment):
            raise EnvLoadError(f"verifiers: {where} returned {type(built).__name__}, not a verifiers Environment "
                               "(verifiers.legacy.Environment: SingleTurnEnv, MultiTurnEnv, ToolEnv, ...)")
        return built

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        try:
            data = self.vf_env.get_dataset() if self.split == "train" else self.vf_env.get_eval_dataset()
        except ValueError as exc:
            raise EnvLoadError(f"verifiers: {self.env_name!r} has no {self.split} dataset ({exc})") from None
        if self.size is not None:
            data = data.select(range(min(int(self.size), len(data))))
        rows = []
        for item in data:
            row = {key: _plain(item[key]) for key in ROW_KEYS if key in item and item[key] is not None}
            if isinstance(row.get("info"), str):  # verifiers stores info as JSON text in some datasets
                try:
                    row["info"] = json.loads(row["info"])
                except json.JSONDecodeError:
                    pass
            rows.append(row)
        return rows

    def _input(self, row: dict[str, Any]) -> dict[str, Any]:
        item = {key: row[key] for key in ROW_KEYS if key in row}
        item.setdefault("example_id", 0)
        return item

    async def rollout(self, client, row) -> AgentResult:
        vf = _verifiers()
        output = await self.vf_env.run_rollout(self._input(row), vf.OpenAIChatCompletionsClient(client), client.model,
                                               {})
        error = output.get("error") or {}
        error = error if isinstance(error, dict) else {"error": str(error)}
        if error and error.get("error") not in MODEL_ERRORS:
            detail = ": ".join(str(error[k]) for k in ("error", "message") if error.get(k))
            raise RuntimeError(f"verifiers rollout failed: {one_line(detail, 300)}")
        reward = output.get("reward")
        reward = float(reward) if reward is not None else 0.0
        if math.isnan(reward):
            raise ValueError("the verifiers rubric returned a NaN reward")
        metrics = {str(k): float(v) for k, v in (output.get("metrics") or {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        score = min(1.0, max(0.0, reward))
        metrics["reward_clipped"] = float(score != reward)
        metrics["empty_reply"] = float(error.get("error") == "EmptyModelResponseError")
        return AgentResult(score=score, metrics=metrics)


__all__ = ["VerifiersEnv"]
