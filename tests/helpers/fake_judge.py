"""`FakeJudge`: an OpenAI-compatible /v1/chat/completions served in the test's own process, for the judge
reward's tests (no provider is reachable here). Conversation i of a group scores i / count (so order
shows), an episode scores 0.75; `reply` overrides the text (`reply_for`, a function of the ask, too),
`status` the code, `delay` holds each reply back that many seconds (a slow judge), `serve_at_once(n)`
lets only n calls be served at a time (a judge whose calls queue), and each request's arrival time
(`time.perf_counter()`) is kept."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeJudge:
    def __init__(self):
        self.requests: list[dict] = []
        self.reply: str | None = None
        self.reply_for = None
        self.status = 200
        self.delay = 0.0
        self.gate: threading.Semaphore | None = None
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                started = time.perf_counter()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body,
                                       "started": started})
                ask = body["messages"][-1]["content"]
                count = re.match(r"(\d+) conversations follow", ask)
                text = judge.reply_for(ask) if judge.reply_for else judge.reply if judge.reply is not None else (
                    json.dumps([i / int(count.group(1)) for i in range(int(count.group(1)))]) if count
                    else '{"score": 0.75}')
                if judge.gate is not None:
                    with judge.gate:
                        time.sleep(judge.delay)
                else:
                    time.sleep(judge.delay)
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
                self.send_response(judge.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # the judge's pool opens up to 16 connections at once
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve_at_once(self, calls: int | None) -> None:
        self.gate = threading.Semaphore(calls) if calls else None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def one_judged_step(model_dir: str, out, **judge_options) -> dict:
    """Train one step of envs.letters (one turn, 4 episodes) with the judge options given (RunConfig field
    names, rubric included); the step's metrics record."""
    import os

    from aitrain_grpo import RunConfig, train
    from helpers import REPO

    config = RunConfig(model=model_dir, rl_env_module="envs.letters", rl_env_class="LetterEnv",
                       rl_env_config={"turns": 1, "num_tasks": 8}, output_dir=str(out), max_steps=1,
                       batch_size=4, rl_max_new_tokens=16, rl_judge_rubric="Many letters a.", **judge_options)
    cwd = os.getcwd()
    os.chdir(REPO)  # envs.letters resolves from the current directory
    try:
        train(config.validate())
    finally:
        os.chdir(cwd)
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
