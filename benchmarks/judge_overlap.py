"""Rollout + judge wall time of one batch: judge calls made after the rollout (as before issue 37's
overlap) against calls started as each group (episode) is scored (training/rewards/judge.py, the engine's
`on_episode_done`). The judge is the tests' fake OpenAI-compatible server (tests/helpers/fake_judge.py)
holding each reply back `--delays` seconds, `--judge-slots` calls at a time (0: all at once); the policy
the tiny model on hf (continuous schedule, sampled at temperature 1 so episodes differ); the environment
tests/helpers/rollouts.py's StaggeredEnv (1-4 turns). Prints one line per (mode, delay, way): the
median over `--repeats` batches. Results: JUDGE.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from aitrain_grpo.engine.backends.base import SamplingParams  # noqa: E402
from aitrain_grpo.engine.rollout import RolloutEngine  # noqa: E402
from aitrain_grpo.engine.settings import EpisodeSettings  # noqa: E402
from aitrain_grpo.models.tiny import tiny_model_path  # noqa: E402
from aitrain_grpo.training.rewards.judge import HttpJudge, Judge  # noqa: E402
from helpers.fake_judge import FakeJudge  # noqa: E402
from helpers.rollouts import StaggeredEnv, TurnEndingHF  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--slots", type=int, default=8, help="episodes in play at once")
    parser.add_argument("--delays", default="0.5,2", help="seconds the fake judge takes per call")
    parser.add_argument("--judge-slots", type=int, default=0, help="calls the judge serves at once (0: all)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = str(tiny_model_path())
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    rows = [{"prompt": [{"role": "user", "content": f"Task {task}: tell me about room {task * 7}."}], "task": task}
            for task in range(args.groups) for _ in range(args.group_size)]
    settings = EpisodeSettings(max_new_tokens=16, sampling=SamplingParams(temperature=1.0), schedule="continuous",
                               max_concurrent_episodes=args.slots)
    fake = FakeJudge()
    fake.serve_at_once(args.judge_slots)
    engine = RolloutEngine(StaggeredEnv(), tokenizer, TurnEndingHF.for_model(model, tokenizer), settings)
    engine.run(rows)  # warm up
    print(f"{len(rows)} episodes ({args.groups} groups of {args.group_size}), {args.slots} in play at once, the "
          f"judge serving {args.judge_slots or 'all'} calls at once")
    for mode in ("group", "episode"):
        for delay in [float(d) for d in args.delays.split(",")]:
            fake.delay = delay
            for way in ("after", "overlapped"):
                rollout_s, total_s = [], []
                for repeat in range(args.repeats):
                    torch.manual_seed(repeat)
                    judge = Judge("Reward helpful replies.", mode, 0.0, args.group_size,
                                  HttpJudge(fake.url + "/v1", "fake", None))
                    engine.on_episode_done = judge.on_episode_done if way == "overlapped" else None
                    started = time.perf_counter()
                    batch = engine.run(rows)
                    rollout_s.append(time.perf_counter() - started)
                    judge.score(batch.episodes)
                    total_s.append(time.perf_counter() - started)
                    judge.close()
                print(f"{mode:8} delay {delay:4.1f}s  {way:10}  rollout {statistics.median(rollout_s):5.2f}s  "
                      f"rollout+judge {statistics.median(total_s):5.2f}s", flush=True)
    engine.close()
    fake.close()


if __name__ == "__main__":
    main()
