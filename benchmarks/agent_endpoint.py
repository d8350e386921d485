"""What the agent endpoint costs: the same episodes as agent code on an OpenAI client vs as an `Environment`.

Both variants play the same conversation with the tiny model and the hf backend under the continuous
schedule: a user prompt, then `--turns` model turns, each answered by a fixed user message ("Go on
(k)."). The environment variant answers in `step`; the agent variant is plain openai-SDK code that sends
the whole history back to the run's endpoint each turn, so every turn costs an HTTP request, JSON
encoding, the OpenAI client, message comparison and the template suffix. Sampling is greedy and the
conversations render to the same tokens, so both variants generate the same tokens and the difference
in wall time is the endpoint's. Variants alternate, `--repeats` times each; medians are reported.

    OMP_NUM_THREADS=1 python benchmarks/agent_endpoint.py                 # appends to AGENT_ENDPOINT.md
    python benchmarks/agent_endpoint.py --repeats 1 --results -           # smoke run, prints

Figures: overhead per request (ms) = (agent wall - environment wall) / requests; overhead share = that
difference / the agent variant's time inside generate (the issue's target: <= 5 % at 16 concurrent
episodes).

Left out: vLLM backends (the endpoint's cost does not depend on the backend; the backend's own time is
measured in rollout.py) and SmolLM2 (a larger model only makes the share smaller).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from aitrain_grpo import AgentEnvironment, Environment  # noqa: E402
from aitrain_grpo.engine.backends.base import SamplingParams  # noqa: E402
from aitrain_grpo.engine.backends.hf import HFBackend  # noqa: E402
from aitrain_grpo.engine.rollout import RolloutEngine  # noqa: E402

from results_table import machine as describe_machine  # noqa: E402


def rows(episodes: int) -> list[dict]:
    return [{"prompt": f"Tell me about hotels, please ({i}).", "id": i} for i in range(episodes)]


class ChatEnv(Environment):
    def __init__(self, turns: int):
        self.turns = turns
        self.max_turns = turns + 1

    def build_dataset(self, tokenizer):
        return []

    def step(self, episode, completion):
        return None if episode.turns >= self.turns else f"Go on ({episode.turns - 1})."

    def score_episode(self, episode):
        return 1.0


class ChatAgent(AgentEnvironment):
    def __init__(self, turns: int, max_tokens: int):
        self.turns, self.max_tokens = turns, max_tokens
        self.max_turns = turns + 1

    def build_dataset(self, tokenizer):
        return []

    async def rollout(self, client, row):
        messages = [{"role": "user", "content": row["prompt"]}]
        for turn in range(self.turns):
            reply = await client.chat.completions.create(model=client.model, messages=messages, max_tokens=self.max_tokens)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            if turn + 1 < self.turns:
                messages.append({"role": "user", "content": f"Go on ({turn})."})
        return 1.0


def play(env, model, tokenizer, args) -> dict:
    engine = RolloutEngine(env, tokenizer, HFBackend.for_model(model, tokenizer), max_new_tokens=args.tokens,
                           max_completion_length=4096, sampling=SamplingParams(temperature=0.0),
                           schedule="continuous", model_name="tiny")
    try:
        started = time.perf_counter()
        batch = engine.run(rows(args.episodes))
        wall = time.perf_counter() - started
    finally:
        engine.close()
    tokens = [t.completion_ids for t in batch.traces]
    return {"wall": wall, "generate": batch.generate_seconds, "requests": batch.agent_counts.get("requests", 0),
            "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--results", default=str(Path(__file__).with_name("AGENT_ENDPOINT.md")),
                        help="file to append the table to, or - to print only")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aitrain_grpo.models.tiny import tiny_model_path

    torch.set_num_threads(1)
    path = str(tiny_model_path())
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    env, agent = ChatEnv(args.turns), ChatAgent(args.turns, args.tokens)
    play(env, model, tokenizer, args)  # warm-up: first calls pay for lazy imports and allocations
    runs = {"environment": [], "agent": []}
    for _ in range(args.repeats):
        runs["environment"].append(play(env, model, tokenizer, args))
        runs["agent"].append(play(agent, model, tokenizer, args))
    same = all(a["tokens"] == e["tokens"] for a, e in zip(runs["agent"], runs["environment"]))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("wall", "generate")} for name, rs in runs.items()}
    requests = runs["agent"][0]["requests"]
    extra = med["agent"]["wall"] - med["environment"]["wall"]
    lines = [
        f"\n## {time.strftime('%Y-%m-%d %H:%M')} ({describe_machine()})\n",
        f"`python benchmarks/agent_endpoint.py --episodes {args.episodes} --turns {args.turns} --tokens {args.tokens} "
        f"--repeats {args.repeats}`; tiny model, hf backend, continuous schedule, greedy; medians of {args.repeats}.\n",
        "| variant | wall s | inside generate s | requests |",
        "| --- | --- | --- | --- |",
        f"| environment (`step`) | {med['environment']['wall']:.2f} | {med['environment']['generate']:.2f} | - |",
        f"| agent (openai SDK through the endpoint) | {med['agent']['wall']:.2f} | {med['agent']['generate']:.2f} | {requests} |",
        "",
        f"Same tokens generated by both variants: {'yes' if same else 'NO'}. Endpoint overhead: "
        f"{1000 * extra / max(requests, 1):.1f} ms per request; {100 * extra / med['agent']['generate']:.1f} % of the "
        f"time inside generate (target <= 5 %); agent / environment wall {med['agent']['wall'] / med['environment']['wall']:.3f}x.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results != "-":
        with open(args.results, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
