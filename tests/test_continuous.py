"""Continuous rollouts give what lockstep rollouts give, and every episode says why it ended.

With greedy sampling and a deterministic environment the two schedules must produce the same
conversations, the same token ids and masks, and log-probabilities that differ only by the float
rounding that a different batch composition brings (the tolerance is stated per backend). The
episodes here play different numbers of turns, come in GRPO groups of two identical prompts, and get
fewer slots than there are episodes, so the continuous schedule really does refill slots and batch
differently. The vLLM server version of the comparison is in test_vllm.py.

The model is the real tiny one; its turns end with a forced EOS after `NEW_TOKENS` tokens (a
transformers generation option; helpers/rollouts.py), so episodes play all the turns the environment asks for.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from aitrain_grpo.engine.backends.hf import HFBackend
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from helpers.rollouts import GREEDY, NEW_TOKENS, StaggeredEnv, TurnEndingHF, assert_same_rollouts, play

# hf, fp32 on CPU: the same rows in other batches (other padding widths and batch sizes) move the
# log-probabilities by float rounding only; measured up to 3e-6 here.
HF_LOGPROB_TOLERANCE = 1e-4


def test_continuous_and_lockstep_rollouts_are_the_same_on_hf(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    lockstep = play(model, tokenizer, "lockstep")
    continuous = play(model, tokenizer, "continuous")
    assert sorted({ep.turns for ep in lockstep.episodes}) == [1, 2, 3, 4]  # the episodes really differ
    assert_same_rollouts(lockstep, continuous, HF_LOGPROB_TOLERANCE)
    # Lockstep: one call per turn of each wave of 5 slots; continuous batches whatever is ready, so its
    # calls differ (here more of them, smaller, as episodes finish at different times).
    assert continuous.generate_calls != lockstep.generate_calls


def test_the_engine_picks_continuous_only_for_backends_that_take_single_requests(tiny_model_and_tokenizer):
    from aitrain_grpo.engine.backends.vllm_server import VLLMServerBackend, VLLMServerClient

    model, tokenizer = tiny_model_and_tokenizer
    env = StaggeredEnv()
    hf = RolloutEngine(env, tokenizer, HFBackend.for_model(model, tokenizer))
    server = RolloutEngine(env, tokenizer, VLLMServerBackend(VLLMServerClient("http://127.0.0.1:9"), "tiny", [2]))
    assert (hf.schedule, server.schedule) == ("lockstep", "continuous")
    for engine in (hf, server):
        engine.close()


def test_a_group_prompt_is_prefilled_once_and_gives_the_same_samples(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    shared = TurnEndingHF.for_model(model, tokenizer)
    unshared = TurnEndingHF.for_model(model, tokenizer)
    unshared.share_group_prompts = False
    with_sharing = play(model, tokenizer, "lockstep", backend=shared, slots=64)
    without = play(model, tokenizer, "lockstep", backend=unshared, slots=64)
    assert shared.shared_prefills == 1 and unshared.shared_prefills == 0  # the first turn, once
    assert_same_rollouts(without, with_sharing, HF_LOGPROB_TOLERANCE)


@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_every_episode_says_why_it_ended(schedule, tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    by_env = play(model, tokenizer, schedule)
    assert {ep.stop_reason for ep in by_env.episodes} == {"env"}  # each ended when the environment said so

    capped = play(model, tokenizer, schedule, max_turns=2)
    assert [ep.stop_reason for ep in capped.episodes] == ["env" if 1 + ep.row["task"] % 4 <= 2 else "max_turns"
                                                          for ep in capped.episodes]

    # No forced EOS: the greedy tiny model never ends a turn by itself, so the per-turn limit cuts it.
    cut = play(model, tokenizer, schedule, backend=HFBackend.for_model(model, tokenizer), cut_turn="end")
    assert {ep.stop_reason for ep in cut.episodes} == {"turn_tokens"} and all(ep.turns == 1 for ep in cut.episodes)

    # Three 8-token turns and two ~20-token replies do not fit in 40: the budget stops those episodes.
    budget = play(model, tokenizer, schedule, max_completion_length=40)
    multi_turn = [ep for ep in budget.episodes if 1 + ep.row["task"] % 4 >= 3]
    assert multi_turn and {ep.stop_reason for ep in multi_turn} == {"completion_budget"}
    assert all(len(t.completion_ids) <= 40 for t in budget.traces)

    failing = play(model, tokenizer, schedule, env=StaggeredEnv(fail_task=3))
    reasons = {ep.row["task"]: ep.stop_reason for ep in failing.episodes}
    assert reasons[3] == "error" and {r for t, r in reasons.items() if t != 3} == {"env"}
    assert all(ep.error and "booking service is down" in ep.error for ep in failing.episodes if ep.row["task"] == 3)


def test_a_backend_failure_stops_a_continuous_rollout_and_the_engine_stays_usable(tiny_model_and_tokenizer):
    from aitrain_grpo.engine.backends.base import GenerationBackendError

    model, tokenizer = tiny_model_and_tokenizer

    class DiesOnThirdCall(TurnEndingHF):
        calls = 0

        def generate(self, prompts, max_tokens, sampling):
            self.calls += 1
            if self.calls == 3:
                raise GenerationBackendError("generation server at http://x: gone")
            return super().generate(prompts, max_tokens, sampling)

    env = StaggeredEnv()
    engine = RolloutEngine(env, tokenizer, DiesOnThirdCall.for_model(model, tokenizer), EpisodeSettings(
        schedule="continuous", max_new_tokens=NEW_TOKENS, sampling=GREEDY, max_concurrent_episodes=5))
    with engine:
        with pytest.raises(GenerationBackendError, match="gone"):
            engine.run(env.build_dataset(tokenizer))
        # No episode of the failed rollout is left to wake up during the next one.
        assert not asyncio.all_tasks(engine.runner.loop)
        again = engine.run(env.build_dataset(tokenizer))
        assert {ep.stop_reason for ep in again.episodes} == {"env"}


def test_lockstep_waves_respect_the_slot_bound(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    sizes: list[int] = []

    class Recording(TurnEndingHF):
        def generate(self, prompts, max_tokens, sampling):
            sizes.append(len(prompts))
            return super().generate(prompts, max_tokens, sampling)

    with contextlib.nullcontext():
        play(model, tokenizer, "lockstep", backend=Recording.for_model(model, tokenizer), slots=5)
    assert max(sizes) == 5


def test_a_continuous_rollout_against_a_dead_server_names_the_server_after_its_retries(tiny_model_and_tokenizer, refused_url):
    from aitrain_grpo.engine.backends.vllm_server import GenerationServerError, VLLMServerBackend, VLLMServerClient

    _, tokenizer = tiny_model_and_tokenizer
    url = refused_url  # held for the whole test: connection refused, and no other process can take it
    client = VLLMServerClient(url, retries=2, backoff=0.01)
    env = StaggeredEnv()
    engine = RolloutEngine(env, tokenizer, VLLMServerBackend(client, "tiny", [tokenizer.eos_token_id]),
                           EpisodeSettings(max_concurrent_episodes=1))
    with engine:
        with pytest.raises(GenerationServerError, match=f"vLLM server at {url}: /v1/completions failed"):
            engine.run(env.build_dataset(tokenizer)[:1])


def test_the_rollout_schedule_flag_reaches_the_engine_and_a_bad_value_is_one_line(tmp_path):
    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.training.trainer import build_trainer
    from helpers import run_cli
    from envs.letters import LetterEnv

    config = RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(tmp_path / "run"), max_steps=1,
                       rl_rollout_schedule="continuous")
    trainer = build_trainer(config, env=LetterEnv(num_tasks=8))
    engine = trainer.rollout.engine  # built with the trainer
    with engine:
        assert engine.schedule == "continuous"  # the hf backend alone would have been lockstep

    result = run_cli("grpo", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--rl-rollout-schedule", "sideways",
                     "--output-dir", str(tmp_path / "bad"))
    assert result.returncode == 2
    assert "--rl-rollout-schedule 'sideways' is not one of auto, continuous, lockstep" in result.stderr


def test_eval_takes_the_rollout_schedule_flag_and_names_the_schedule(tiny_model_dir, tmp_path):
    from helpers import run_cli

    letters = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--episodes", "2", "--rl-max-new-tokens", "8"]
    result = run_cli("eval", "--model", tiny_model_dir, *letters)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "lockstep rollouts" in " ".join(result.stdout.split())  # Hugging Face generate batches its turns
    result = run_cli("eval", "--model", tiny_model_dir, *letters, "--rl-rollout-schedule", "sideways")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --rl-rollout-schedule 'sideways' is not one of auto, continuous, lockstep"


def test_cpu_sampling_uses_native_grouped_query_attention_and_samples_the_same(tiny_model_and_tokenizer, monkeypatch):
    """The hf backend samples with torch's grouped-query kernel (no copied keys and values, engine/backends/
    attention.py) and gets what transformers' own `sdpa` gives: same greedy tokens, same log-probabilities."""
    import torch

    import aitrain_grpo.engine.backends.hf as hf_module

    model, tokenizer = tiny_model_and_tokenizer
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # the tiny model is grouped-query
    native_calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        native_calls.append(bool(kwargs.get("enable_gqa")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    native = play(model, tokenizer, "lockstep")
    assert native_calls and all(native_calls) and model.config._attn_implementation == "sdpa"
    native_calls.clear()
    monkeypatch.setattr(hf_module, "native_gqa", lambda model: contextlib.nullcontext())
    transformers_sdpa = play(model, tokenizer, "lockstep")
    assert False in native_calls  # transformers copies K/V for the masked (padded) calls
    assert_same_rollouts(transformers_sdpa, native, 1e-5)
