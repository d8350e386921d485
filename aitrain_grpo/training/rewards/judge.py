"""The judge reward (`--rl-judge-rubric`): a language model scores episodes by a rubric the user writes.

Why: many tasks have no programmatic score (is this reply helpful, is this summary faithful), and a cold
model may never reach the environment's score at all. A judge gives GRPO a graded signal from a rubric.
It is one more reward function, named `judge` (so TRL logs `rewards/judge/mean`), after those of
`--rl-reward-funcs` and weighted last in `--rl-reward-weights`; the environment's score still counts
(give it weight 0 to train on the judge alone).

The judge sees the rubric and the transcripts (every message, roles labelled), never the environment's
score. Two modes:
- `group` (RULER-style): one call shows a group's episodes side by side (their shared prompt once) and
  asks for a JSON list of one score in [0, 1] per episode: relative judgments are what GRPO uses;
- `episode`: one call per episode, asking for `{"score": x}` (a bare number is read too).

Where it runs: behind an OpenAI-compatible URL (`--rl-judge-url`, `--rl-judge-model` the served name,
the key read from the variable `--rl-judge-api-key-env` names, held in memory only, in one request
header), or in-process (`--rl-judge-model self`: a frozen copy of the run's base model, not the policy
being trained; or a model path), generating greedily with Hugging Face.

A reply is read as JSON (never evaluated); a call that fails (HTTP error, timeout, a prompt longer than
an in-process judge's context) or whose reply has no readable scores in [0, 1] scores each of its
episodes `--rl-judge-fallback`, and is counted in `judge/failures` (failed calls per batch, averaged over
a logging step); the first one prints a one-line warning, and every call of 3 batches in a row failing
stops the run (failing.py). The judge is built, and checked before step 1, in judge_setup.py.
Replies are cached by rubric, mode and transcript(s) (`judge/cache_hits`), so a replayed group or a
repeated episode costs no second call; failures are not cached, so a later batch tries again.

Judge calls over HTTP overlap with the rollout: the engine calls `on_episode_done` as each episode is
scored (engine/rollout.py), and once every episode of a group is (group mode; groups are consecutive runs
of --rl-num-generations in the batch, TRL's layout) or the episode is (episode mode), its call is
submitted to a pool of PARALLEL_CALLS threads while the other episodes still play. Calls are kept by
their cache key (rubric, mode, transcripts; alike transcripts share one call), so results meet their
batch whatever order batches are played in (--rl-async-steps plays them ahead, --rl-zero-std-groups
refill replaces groups); the reward function then collects them, counting failures, caching and falling
back exactly as a call made then; `judge/early_calls` counts the batch's groups (episodes) whose call
had started during the rollout.
Calls never collected (a refilled-away group, a rollout played again) are dropped oldest first.

Left out: overlapping an in-process judge (`LocalJudge` generates with torch on the device and cores the
rollout generates on; on CPU, a judge generating in a thread beside it made the tiny model's rollout
twice as long, benchmarks/JUDGE.md: its calls run after the batch's episodes, one at a time), retries,
judging from the score or the environment's state, and reasoning before the scores (the reply must be the
JSON; a judge that writes prose around it still works when the JSON is the first list/object in it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlparse

from aitrain_grpo.errors import ConfigError, describe_exception
from aitrain_grpo.training.rewards.functions import RewardFunc, episode_reward
from aitrain_grpo.training.rewards.failing import FailureBound

REPLY_TOKENS = 512  # the longest reply asked of a judge behind a URL
LOCAL_REPLY_TOKENS = 256  # and of one in-process (it stops at its end-of-text token)
HTTP_TIMEOUT = 120.0  # seconds one judge call may take
CONNECT_TIMEOUT = 10.0  # of which seconds to connect (a host that drops packets is named in that time)
PARALLEL_CALLS = 16  # judge calls in flight at once over HTTP
CACHE_SIZE = 100_000  # replies kept (oldest dropped first)
PENDING_SIZE = 4096  # early calls kept until their batch collects them (oldest dropped first)

SYSTEM = ("You are a strict, fair judge. You score transcripts of an AI assistant's conversations by the rubric "
          "below, from 0 (fails it entirely) to 1 (meets it fully). Reply with JSON only.\n\nRubric:\n{rubric}")
GROUP_ASK = ("{count} conversations follow, attempts at the same task.\n\n{body}\n\nScore each conversation by the "
             "rubric, comparing them with one another. Reply with a JSON list of {count} numbers from 0 to 1, in "
             "order, and nothing else (for three conversations, e.g. [0.2, 0.9, 0.5]).")
EPISODE_ASK = ("The conversation:\n\n{body}\n\nScore it by the rubric. Reply with a JSON object and nothing else: "
               "{{\"score\": <a number from 0 to 1>}}.")


def read_rubric(value: str) -> str:
    """`--rl-judge-rubric` as text: the value itself, or the file it names after '@'."""
    if not value.startswith("@"):
        return value.strip()
    path = Path(value[1:]).expanduser()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--rl-judge-rubric {value}: cannot read it ({describe_exception(exc, 120)}); pass a "
                          f"UTF-8 text file") from None
    if not text:
        raise ConfigError(f"--rl-judge-rubric {value}: the file is empty; write the rubric in it")
    return text


def render(messages: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"[{m.get('role', '?')}] {m.get('content') or ''}".rstrip() for m in messages)


def group_prompt(transcripts: Sequence[Sequence[dict[str, Any]]]) -> str:
    """The user message of a group call: the messages every episode starts with once, then each episode's own."""
    shared = 0
    while transcripts and all(len(t) > shared and t[shared] == transcripts[0][shared] for t in transcripts):
        shared += 1
    shared = min(shared, min(len(t) for t in transcripts) - 1) if shared else 0  # each keeps one of its own
    parts = [f"=== The task (shared by all) ===\n{render(transcripts[0][:shared])}"] if shared else []
    parts += [f"=== Conversation {i} ===\n{render(t[shared:])}" for i, t in enumerate(transcripts, 1)]
    return GROUP_ASK.format(count=len(transcripts), body="\n\n".join(parts))


def episode_prompt(transcript: Sequence[dict[str, Any]]) -> str:
    return EPISODE_ASK.format(body=render(transcript))


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def _json_values(text: str, limit: int = 20) -> list[Any]:
    """Candidate JSON values in a reply, in order: the whole text, a fenced block, then each list or object
    that starts somewhere in it (prose around the JSON is skipped)."""
    values = []
    for candidate in [text.strip(), *(m.group(1).strip() for m in _FENCE.finditer(text))]:
        try:
            values.append(json.loads(candidate))
        except ValueError:
            continue
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        if len(values) >= limit:
            break
        try:
            values.append(decoder.raw_decode(text, match.start())[0])
        except ValueError:
            continue
    return values


def _score(value: Any) -> float | None:
    if isinstance(value, dict):
        value = value.get("score")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0.0 <= value <= 1.0 else None


def parse_scores(text: str, count: int, mode: str) -> list[float] | None:
    """The scores in a judge's reply: `count` numbers in [0, 1] (group: a list, or {"scores": [...]}, whose
    items may be {"score": x}; episode: {"score": x} or a number), else None."""
    for value in _json_values(text):
        if mode == "group":
            if isinstance(value, dict):
                value = value.get("scores")
            if isinstance(value, list) and len(value) == count:
                scores = [_score(v) for v in value]
                if all(s is not None for s in scores):
                    return scores  # type: ignore[return-value]
        else:
            score = _score(value)
            if score is not None:
                return [score]
    return None


class HttpJudge:
    """A chat model behind an OpenAI-compatible URL; `complete` returns one reply per prompt, or the
    exception its call raised. A URL without a path gets /v1; /chat/completions is appended."""

    def __init__(self, url: str, model: str, key_env: str | None):
        url = url.rstrip("/")
        if not url.endswith("/chat/completions"):
            url += ("" if urlparse(url).path not in ("", "/") else "/v1") + "/chat/completions"
        self.url, self.model = url, model
        key = os.environ.get(key_env, "") if key_env else ""
        self._key = key
        import httpx

        self._client = httpx.Client(timeout=httpx.Timeout(HTTP_TIMEOUT, connect=CONNECT_TIMEOUT), headers={"Authorization": f"Bearer {key}"} if key else {})
        self._pool: ThreadPoolExecutor | None = None  # started with the first call

    def _call(self, messages: list[dict[str, str]]) -> str:
        response = self._client.post(self.url, json={"model": self.model, "messages": messages, "temperature": 0.0,
                                                     "max_tokens": REPLY_TOKENS})
        if response.status_code != 200:  # a server may echo the key in its error: it is masked
            text = response.text.replace(self._key, "<redacted>") if self._key else response.text
            raise RuntimeError(f"HTTP {response.status_code} from {self.url}: {text[:200]}")
        return str(response.json()["choices"][0]["message"]["content"] or "")

    def _guarded(self, messages: list[dict[str, str]]) -> str | Exception:
        try:
            return self._call(messages)
        except Exception as exc:
            return exc

    def submit(self, messages: list[dict[str, str]]) -> Future:
        """One call in the background (at most PARALLEL_CALLS at once); its result is the reply or the exception."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=PARALLEL_CALLS, thread_name_prefix="judge")
        return self._pool.submit(self._guarded, messages)

    def complete(self, conversations: list[list[dict[str, str]]]) -> list[str | Exception]:
        return [future.result() for future in [self.submit(messages) for messages in conversations]]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class LocalJudge:
    """A causal LM in this process (frozen, greedy, batched). Its memory comes on top of the run's."""

    def __init__(self, model_name: str):
        import torch

        from aitrain_grpo.models.loading import load_model_and_tokenizer

        self.model, self.tokenizer = load_model_and_tokenizer(model_name)
        self.model.to("cuda" if torch.cuda.is_available() else "cpu").eval().requires_grad_(False)
        self.context = getattr(self.model.config, "max_position_embeddings", None) or 10**9

    def _ids(self, messages: list[dict[str, str]]) -> list[int]:
        if self.tokenizer.chat_template:
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                           return_dict=True)["input_ids"])
        return self.tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"]

    def complete(self, conversations: list[list[dict[str, str]]],
                 reply_tokens: int = LOCAL_REPLY_TOKENS) -> list[str | Exception]:
        import torch

        out: list[str | Exception] = []
        for messages in conversations:  # one at a time: judge prompts differ a lot in length
            try:
                ids = self._ids(messages)
                if len(ids) + reply_tokens > self.context:
                    raise ValueError(f"the judge prompt has {len(ids)} tokens; with the reply it exceeds the "
                                     f"judge's context of {self.context}")
                inputs = torch.tensor([ids], device=self.model.device)
                with torch.no_grad():
                    generated = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False,
                                                    max_new_tokens=reply_tokens,
                                                    pad_token_id=self.tokenizer.pad_token_id)
                out.append(self.tokenizer.decode(generated[0, len(ids):], skip_special_tokens=True))
            except Exception as exc:
                out.append(exc)
        return out


class Judge:
    """Scores a batch's episodes (`score`), with the cache and the failure count; `backend` is an
    `HttpJudge`, a `LocalJudge`, or anything with their `complete`."""

    def __init__(self, rubric: str, mode: str, fallback: float, group_size: int, backend: Any, name: str = ""):
        self.rubric, self.mode, self.fallback, self.group_size = rubric, mode, fallback, group_size
        self.backend, self.name = backend, name
        self.cache: OrderedDict[str, list[float]] = OrderedDict()
        self.pending: OrderedDict[str, Future] = OrderedDict()  # early calls by cache key, not yet collected
        self._lock = threading.Lock()  # the engine's thread submits while the trainer's collects
        self.warned = False
        self.failing = FailureBound(f"the judge{name}", f"train on --rl-judge-fallback {fallback:g}",  # failing.py
                                    "fix the judge (is it up? does its model write the JSON scores?)")
        self.watching = False  # a rollout's episodes start early calls: `judge/early_calls` is logged

    def _key(self, transcripts: list[list[dict[str, Any]]]) -> str:
        text = json.dumps([self.rubric, self.mode, transcripts], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def unit_size(self) -> int:
        return self.group_size if self.mode == "group" else 1

    def _prompt(self, unit: list[list[dict[str, Any]]]) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM.format(rubric=self.rubric)},
                {"role": "user", "content": group_prompt(unit) if self.mode == "group" else episode_prompt(unit[0])}]

    @property
    def overlaps(self) -> bool:
        """Whether calls start during the rollout (a backend with `submit`: HTTP; see the module docstring)."""
        return callable(getattr(self.backend, "submit", None))

    def on_episode_done(self, batch: Any, index: int) -> None:
        """The engine's hook: submit the call of `index`'s group (or episode) once all its episodes are scored."""
        start = index - index % self.unit_size
        unit = batch.episodes[start:start + self.unit_size]
        if len(unit) == self.unit_size and all(ep.score is not None for ep in unit):
            self.submit_early(unit)

    def submit_early(self, episodes: Sequence[Any]) -> None:
        """Start the call for one group (or episode) now; `score` collects it."""
        unit = episode_transcripts(episodes)
        key = self._key(unit)
        with self._lock:
            if key in self.cache or key in self.pending:
                return
            self.pending[key] = self.backend.submit(self._prompt(unit))
            while len(self.pending) > PENDING_SIZE:
                self.pending.popitem(last=False)

    def score(self, episodes: Sequence[Any], log_metric: Callable[[str, float], None] | None = None) -> list[float]:
        """One score per episode, in order: groups are consecutive runs of `group_size` (TRL's layout)."""
        transcripts = episode_transcripts(episodes)
        step = self.unit_size
        units = [transcripts[i:i + step] for i in range(0, len(transcripts), step)]
        keys = [self._key(unit) for unit in units]
        results: list[list[float] | None] = [None] * len(units)
        asks: list[int] = []
        early: dict[int, Future] = {}
        with self._lock:
            for i, key in enumerate(keys):
                if key in self.cache:
                    self.cache.move_to_end(key)
                    results[i] = self.cache[key]
                elif key in self.pending:
                    early[i] = self.pending[key]
                else:
                    asks.append(i)
        hits = len(units) - len(asks) - len(early)
        replies = dict(zip(asks, self.backend.complete([self._prompt(units[i]) for i in asks]) if asks else []))
        replies.update({i: future.result() for i, future in early.items()})
        with self._lock:
            for i in early:
                self.pending.pop(keys[i], None)
        failures, last_failure = 0, ""
        for i, reply in sorted(replies.items()):
            scores = None if isinstance(reply, Exception) else parse_scores(reply, len(units[i]), self.mode)
            if scores is None:
                failures += 1
                last_failure = failure_text(reply, len(units[i]))
                self._warn(reply, len(units[i]))
                results[i] = [self.fallback] * len(units[i])
                continue
            results[i] = scores
            with self._lock:
                self.cache[keys[i]] = scores
                if len(self.cache) > CACHE_SIZE:
                    self.cache.popitem(last=False)
        if log_metric is not None:
            log_metric("judge/failures", float(failures))
            log_metric("judge/cache_hits", float(hits))
            if self.watching:
                log_metric("judge/early_calls", float(len(early)))
        self.failing.record(len(replies), failures, last_failure)  # failing.py: raises past the bound
        return [score for unit_scores in results for score in unit_scores]  # type: ignore[union-attr]

    def close(self) -> None:
        getattr(self.backend, "close", lambda: None)()

    def _warn(self, reply: str | Exception, count: int) -> None:
        if self.warned:
            return
        self.warned = True
        print(f"warning: the judge{self.name} {failure_text(reply, count)}; its episodes score {self.fallback} (--rl-judge-fallback), "
              f"this and later failures counted in judge/failures", file=sys.stderr)


def failure_text(reply: str | Exception, count: int) -> str:
    """What went wrong with one call, for a message: its exception, or the reply without readable scores."""
    if isinstance(reply, Exception):
        return f"failed: {describe_exception(reply, 200)}"
    return f"answered no {count} score(s) in [0, 1] as JSON: {reply.strip()[:160]!r}"


def episode_transcripts(episodes: Sequence[Any]) -> list[list[dict[str, Any]]]:
    """Each episode's messages as role and content: what the judge and a reward model (reward_model.py) read."""
    return [[{"role": m.get("role"), "content": m.get("content")} for m in ep.messages] for ep in episodes]


def judge_rewards(judge: Judge | None, rollout) -> list[Callable[..., Any]]:
    """The judge as TRL reward functions (none or one), given each batch's episodes as --rl-reward-funcs are;
    a judge over HTTP also watches `rollout`'s episodes, to start its calls as they finish."""
    if judge is None:
        return []
    if judge.overlaps:
        rollout.watch_episodes(judge.on_episode_done, on_close=judge.close)
        judge.watching = True

    def judge_reward(episodes, log_metric=None, **kwargs):
        return judge.score(episodes, log_metric)

    return [episode_reward(RewardFunc("judge", "judge", judge_reward), rollout)]
