"""Would an in-process judge (`LocalJudge`) overlapping with the rollout slow the rollout down? The tiny
model's rollout (hf, `lockstep` or `continuous` as the argument says) of 32 StaggeredEnv episodes, alone
and with a second tiny model generating judge replies in a thread beside it, as an overlapped in-process
judge would (median of 3). Results and the decision it led to: JUDGE.md."""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from aitrain_grpo.engine.backends.base import SamplingParams  # noqa: E402
from aitrain_grpo.engine.rollout import RolloutEngine  # noqa: E402
from aitrain_grpo.engine.settings import EpisodeSettings  # noqa: E402
from aitrain_grpo.models.tiny import tiny_model_path  # noqa: E402
from aitrain_grpo.training.rewards.judge import LocalJudge  # noqa: E402
from helpers.rollouts import StaggeredEnv, TurnEndingHF  # noqa: E402


def main() -> None:
    schedule = sys.argv[1] if len(sys.argv) > 1 else "lockstep"
    path = str(tiny_model_path())
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    rows = [{"prompt": [{"role": "user", "content": f"Task {t}: tell me about room {t * 7}."}], "task": t}
            for t in range(8) for _ in range(4)]
    settings = EpisodeSettings(max_new_tokens=16, sampling=SamplingParams(1.0), schedule=schedule,
                               max_concurrent_episodes=8)
    engine = RolloutEngine(StaggeredEnv(), tokenizer, TurnEndingHF.for_model(model, tokenizer), settings)
    judge = LocalJudge(path)
    ask = [[{"role": "user", "content": "Score this conversation: hello there " * 5}]]
    engine.run(rows)  # warm up
    for way in ("alone", "beside a judge"):
        seconds = []
        for _ in range(3):
            stop = threading.Event()

            def judging() -> None:
                while not stop.is_set():
                    judge.complete(ask, reply_tokens=64)

            thread = threading.Thread(target=judging) if way != "alone" else None
            if thread is not None:
                thread.start()
            started = time.perf_counter()
            engine.run(rows)
            seconds.append(time.perf_counter() - started)
            stop.set()
            if thread is not None:
                thread.join()
        print(f"{schedule} rollout {way}: {statistics.median(seconds):.2f}s", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
