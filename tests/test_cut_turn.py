"""`--rl-cut-turn`: what happens to an episode when a model turn hits --rl-max-new-tokens, on the real
tiny model. `end`: the episode stops there (stop reason `turn_tokens`) and the environment never sees the
cut turn. `continue`: the environment answers the cut turn as it stands, the episode goes on, and
`episode.truncated_turns` counts the cut turns."""

from __future__ import annotations

import json

import torch

from aitrain_grpo import Environment
from aitrain_grpo.engine.backends.base import SamplingParams
from aitrain_grpo.engine.backends.hf import HFBackend
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from helpers import run_cli

TURNS = 3
NEW_TOKENS = 3  # the tiny model rarely stops within three tokens: most turns are cut


class SeenTurnsEnv(Environment):
    """Asks for more until the model has spoken three times; remembers every turn `step` was shown."""

    max_turns = TURNS

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "user", "content": "Say something long."}]}]

    def step(self, episode, completion):
        episode.state.setdefault("seen", []).append(completion)
        return "Go on." if episode.turns < TURNS else None

    def score_episode(self, episode):
        return 0.0


def play(model_and_tokenizer, cut_turn: str):
    model, tokenizer = model_and_tokenizer
    torch.manual_seed(0)
    engine = RolloutEngine(SeenTurnsEnv(), tokenizer, HFBackend.for_model(model, tokenizer),
                           EpisodeSettings(max_new_tokens=NEW_TOKENS, sampling=SamplingParams(1.0, 0, 1.0), cut_turn=cut_turn))
    with engine:
        return engine.run(SeenTurnsEnv().build_dataset(tokenizer) * 8)


def cut_turns(trace, stop_ids) -> int:
    """Model turns in the trace that ended without a stop token (runs of mask-1 tokens)."""
    turns, current = [], []
    for token, mask in zip(trace.completion_ids, trace.env_mask):
        if mask:
            current.append(token)
        elif current:
            turns, current = turns + [current], []
    turns += [current] if current else []
    return sum(1 for turn in turns if turn[-1] not in stop_ids)


def test_end_stops_the_episode_at_the_cut_turn(tiny_model_and_tokenizer):
    batch = play(tiny_model_and_tokenizer, "end")
    stop_ids = {tiny_model_and_tokenizer[1].eos_token_id}
    cut = [(ep, trace) for ep, trace in zip(batch.episodes, batch.traces) if cut_turns(trace, stop_ids)]
    assert cut, "no turn was cut off; the test needs a shorter --rl-max-new-tokens"
    for episode, trace in cut:
        assert (episode.stop_reason, episode.truncated, episode.truncated_turns) == ("turn_tokens", True, 0)
        assert cut_turns(trace, stop_ids) == 1  # the episode's last turn, where it stopped
        # The environment was shown every turn but the last (the cut one).
        assert len(episode.state.get("seen", [])) == episode.turns - 1


def test_continue_shows_the_cut_turn_and_goes_on(tiny_model_and_tokenizer):
    batch = play(tiny_model_and_tokenizer, "continue")
    stop_ids = {tiny_model_and_tokenizer[1].eos_token_id}
    assert sum(ep.truncated_turns for ep in batch.episodes) > 0
    for episode, trace in zip(batch.episodes, batch.traces):
        assert episode.turns == TURNS, "a cut turn ended the episode"
        assert episode.stop_reason == "env"
        assert episode.state["seen"] == [m["content"] for m in episode.messages if m["role"] == "assistant"]
        assert episode.truncated_turns == cut_turns(trace, stop_ids)


def test_cli_flag_reaches_the_engine(tiny_model_dir, tmp_path):
    """`aitrain grpo --rl-cut-turn continue` logs the cut turns that the episodes went on after."""
    out = tmp_path / "run"
    result = run_cli(
        "grpo", "--model", tiny_model_dir, "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
        "--rl-max-new-tokens", str(NEW_TOKENS), "--rl-cut-turn", "continue", "--max-steps", "1",
        "--batch-size", "4", "--rl-num-generations", "4", "--output-dir", str(out),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert step["env/truncated_turns_mean"] > 0
    assert step["env/turns_mean"] == 3  # LetterEnv's three turns, every one played
