"""Secrets stay out of the files a run writes: the values of secret environment variables
(`HF_TOKEN`, `WANDB_API_KEY`, ...), config values under secret-sounding keys, and URL credentials are
neither in `run_config.json` nor in the transcripts, checkpoints or logs."""

from __future__ import annotations

import json

from helpers import REPO, run_cli

from aitrain_grpo.runlog.redaction import REDACTED, redact, secret_values

HF_TOKEN = "hf_QzT8secretTOKENvalue123"
WANDB_API_KEY = "wandb-0123456789abcdef-secret"
API_KEY = "sk-live-abcdef0123456789"
URL_PASSWORD = "pw-in-the-url-4242"


def test_no_written_file_holds_a_secret(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_API_KEY)
    out = tmp_path / "run"
    env_config = {"api_key": API_KEY, "hub_auth": HF_TOKEN, "turns": 2, "num_tasks": 8}
    result = run_cli(
        "grpo", "--rl-env-module", "fault_envs", "--rl-env-class", "SecretLetters",
        "--rl-env-config", json.dumps(env_config), "--model", tiny_model_dir, "--output-dir", str(out),
        "--max-steps", "2", "--save-steps", "1", "--batch-size", "8", "--rl-max-new-tokens", "16",
        # Written to run_config.json, never reached: Hugging Face generates.
        "--vllm-server-url", f"http://trainer:{URL_PASSWORD}@127.0.0.1:8000", "--no-use-vllm", cwd=REPO / "tests" / "faults",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "episodes.jsonl" for p in written) and any(p.parent.name == "checkpoint-1" for p in written)
    for path in written:
        data = path.read_bytes()
        for secret in (HF_TOKEN, WANDB_API_KEY, API_KEY, URL_PASSWORD):
            assert secret.encode() not in data, f"{secret} written to {path.relative_to(out)}"
    config = json.loads((out / "run_config.json").read_text())
    assert json.loads(config["rl_env_config"]) == {"api_key": REDACTED, "hub_auth": REDACTED, "turns": 2, "num_tasks": 8}
    assert config["vllm_server_url"] == f"http://{REDACTED}@127.0.0.1:8000"
    # The transcripts keep their text, with the token blanked where the environment wrote it.
    transcripts = (out / "episodes.jsonl").read_text()
    assert f"Bearer {REDACTED}" in transcripts and f"(checked with {REDACTED})" in transcripts


def test_only_secret_names_count():
    environ = {"HF_TOKEN": HF_TOKEN, "TOKENIZERS_PARALLELISM": "false-ish-long", "HOME": "/root/home/dir",
               "AWS_SECRET_ACCESS_KEY": "aws-secret-0000", "SHORT_TOKEN": "abc"}
    assert secret_values(environ) == [HF_TOKEN, "aws-secret-0000"]
    options = {"rl_max_new_tokens": 128, "token_budget": 100, "answer_key": "b", "password": "hunter2-long",
               "note": f"uses {HF_TOKEN} here"}
    assert redact(options, [HF_TOKEN]) == {"rl_max_new_tokens": 128, "token_budget": 100, "answer_key": "b",
                                           "password": REDACTED, "note": f"uses {REDACTED} here"}
