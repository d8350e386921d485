"""`--rl-reward-model`: a sequence-classification model's score as one more reward (TRL's reward_funcs
given as a model). What a user sees: the logged reward is the model's own score of each episode's whole
conversation, rendered with its chat template and cut to its context from the front; the total weighs it
last; a model that cannot be a reward model is refused before the policy loads."""

from __future__ import annotations

import json

import pytest
import torch

from aitrain_grpo.config import RunConfig
from aitrain_grpo.training.trainer import train
from helpers import REPO
from helpers.cli import refused

PROBES = "envs_fixtures.reward_probes"
LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]
CONTEXT = 48  # shorter than the letters game's three-turn conversations, longer than some one-turn ones


def build_reward_model(folder, *, labels: int = 1):
    """A small random Llama sequence classifier on the tiny model's tokenizer (its ChatML template)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from aitrain_grpo.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=len(tokenizer), max_position_embeddings=CONTEXT,
                         num_labels=labels, pad_token_id=tokenizer.pad_token_id, initializer_range=0.5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        LlamaForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def own_scores(folder, conversations):
    """Each conversation scored by the model alone, one at a time, its last CONTEXT tokens."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    scores = []
    for messages in conversations:
        ids = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            scores.append(model(torch.tensor([ids[-CONTEXT:]])).logits[0, 0].item())
    return scores


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reward-model")
    model = build_reward_model(folder / "rm")
    probe = folder / "probe.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AITRAIN_REWARD_PROBE", str(probe))
        patch.chdir(REPO / "tests")  # the probe module resolves from the current folder
        train(RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", output_dir=str(folder / "out"),
                        max_steps=2, rl_max_new_tokens=16, use_vllm=False, rl_reward_model=model,
                        rl_reward_funcs=f"{PROBES}:conversations", rl_reward_weights="0.5,0,2"))
    records = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]
    calls = [json.loads(line) for line in probe.read_text().splitlines()]
    return model, records, calls


def test_the_reward_is_the_models_score_of_each_whole_conversation(run):
    model, records, calls = run
    assert len(calls) == len(records) == 2  # one batch a step
    for record, conversations in zip(records, calls):
        scores = own_scores(model, conversations)
        assert record["rewards/reward_model/mean"] == pytest.approx(sum(scores) / len(scores), abs=1e-4)
        assert record["reward"] == pytest.approx(0.5 * record["rewards/episode_score/mean"]
                                                 + 2 * record["rewards/reward_model/mean"], abs=1e-4)


def test_conversations_past_its_context_keep_their_end_and_are_counted(run):
    _, records, calls = run
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run[0])
    for record, conversations in zip(records, calls):
        lengths = [len(tokenizer.apply_chat_template(c, tokenize=False)) for c in conversations]
        cut = [len(tokenizer(tokenizer.apply_chat_template(c, tokenize=False), add_special_tokens=False)["input_ids"])
               > CONTEXT for c in conversations]
        assert record["rewards/reward_model/truncated_frac"] == pytest.approx(sum(cut) / len(cut)), lengths
    assert any(r["rewards/reward_model/truncated_frac"] > 0 for r in records)


def test_a_model_that_cannot_be_a_reward_model_is_refused_before_the_policy_loads(tmp_path, tiny_model_dir,
                                                                                   monkeypatch):
    monkeypatch.chdir(REPO)
    two = build_reward_model(tmp_path / "two", labels=2)
    base = ["grpo", *LETTERS, "--output-dir", str(tmp_path / "run"), "--no-use-vllm"]
    refused([*base, "--rl-reward-model", str(tmp_path / "missing")], tmp_path,
            f"--rl-reward-model {tmp_path / 'missing'} could not be loaded")
    refused([*base, "--rl-reward-model", tiny_model_dir], tmp_path,
            "is LlamaForCausalLM, not a reward model", "--rl-judge-rubric")
    refused([*base, "--rl-reward-model", two], tmp_path, "has 2 labels")
    refused([*base, "--rl-reward-model", two, "--rl-reward-weights", "1"], tmp_path,
            "1 weight(s) for 2 reward(s) (the environment's score, then 0 from --rl-reward-funcs, then the reward model's)")
