"""TRL's own loop for the head-to-head: `GRPOTrainer(environment_factory=StationsTRL)`, run as TRL's docs
run it, one process per run (benchmarks/head_to_head.py starts it; `python benchmarks/head_to_head_trl.py
--start DIR --output-dir DIR --seed N` runs one by hand).

What TRL is given, so that it trains on the tokens aitrain trains on:
- The chat template aitrain uses for the model (`trl_chat_template`). SmolLM2's own template drops the
  `tools` argument, and aitrain then describes the tools in the system message (engine/chat.py,
  `describe_tools`); TRL would show the model no tools at all. So TRL gets a ChatML template that writes
  that same system message (tests/test_head_to_head.py checks the prompt tokens are identical, and that
  TRL's tool-reply tokens equal aitrain's). A model whose template shows the tools itself (the tiny
  model) keeps its own template. The saved checkpoints carry the model's original template, so `aitrain
  eval` renders every model the same way.
- A response template for parsing `<tool_call>` JSON (`RESPONSE_TEMPLATE`: TRL knows none for SmolLM2).
- The recipe's numbers (`RECIPE`, shared with the aitrain command): 16 episodes a step in groups of 4,
  lr, KL, temperature, top-k/top-p off, 48 new tokens a turn (`generation_kwargs={"max_new_tokens": 48}`,
  since TRL otherwise lets one turn use the whole episode budget), 256 tokens an episode, 4 model turns
  (`max_tool_calling_iterations=3`), LoRA r16/alpha32/dropout 0 (aitrain's default) on all linear layers, and aitrain's
  pass size of 2 episodes (`per_device_train_batch_size=2`, 8 accumulation steps: TRL's documented way
  to bound memory; one generation batch of 16 per optimizer step).
- TRL's fastest options here: Hugging Face generation (its vLLM colocate mode cannot keep the engine's
  weights current on a CPU, and its transformers continuous batching ran out of memory: HEAD_TO_HEAD.md),
  no activation checkpointing and float32 (slower or unsupported on a CPU), `use_cpu=True`, no
  completion logging.

The budget: SIGTERM (benchmarks/head_to_head.py sends it when the run's minutes are up) sets a flag;
the step in flight finishes, a checkpoint is saved and training stops. aitrain's `SignalStop` does the
same on the same signal, so both trainers stop by one rule.

In-training evaluation (`--eval-every N`) and evaluating a checkpoint in TRL's loop (`--evaluate
CHECKPOINT --output FILE`, no training): head_to_head_trl_eval.py.

Left out: vLLM, DeepSpeed, several processes, and TRL's `rollout_func` path (TRL runs this task natively).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "benchmarks") not in sys.path:
    sys.path.append(str(REPO / "benchmarks"))  # appended: a test helper of the same name wins

# One recipe for both trainers (head_to_head.py turns it into aitrain flags). beyond_sft's `kl` recipe,
# with a constant learning rate: max_steps is far beyond any budget, so the linear decay barely moves.
RECIPE = dict(batch_size=16, num_generations=4, lr=5e-4, kl_coef=0.1, temperature=1.0, top_k=0, top_p=1.0,
              max_new_tokens=48, max_completion_length=256, max_turns=4, max_steps=1000, micro_batch=2,
              lora_r=16, lora_alpha=32, lora_dropout=0.0)

RESPONSE_TEMPLATE = {  # TRL's qwen3_template without the <think> field: `<tool_call>` JSON blocks, then text
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def described_tools_template(default_system: str = SMOLLM2_SYSTEM) -> str:
    """A ChatML template that writes the tools as aitrain's ChatRenderer does for a template that drops
    them: `describe_tools`'s text in the system message (after the caller's system text, or alone), tool
    results as `tool` messages, calls as Hermes `<tool_call>` JSON."""
    from aitrain_grpo.engine.chat import describe_tools

    head, tail = describe_tools([{"x": 1}], results_as_user=False).split('{"x": 1}')
    q = json.dumps  # a JSON string is a valid Jinja string literal
    return (
        "{%- set ns = namespace(tools_text='') -%}"
        "{%- if tools -%}{%- set ns.tools_text = " + q(head) + " + (tools | map('tojson') | join('\\n')) + "
        + q(tail) + " -%}{%- endif -%}"
        "{%- for message in messages -%}"
        "{%- if loop.first and messages[0]['role'] != 'system' -%}"
        "{{- '<|im_start|>system\\n' + (ns.tools_text if tools else " + q(default_system) + ") + '<|im_end|>\\n' -}}"
        "{%- endif -%}"
        "{%- set m = namespace(content=(message['content'] if message['content'] is string else '')) -%}"
        "{%- if loop.first and message['role'] == 'system' and tools -%}"
        "{%- set m.content = m.content + '\\n\\n' + ns.tools_text -%}{%- endif -%}"
        "{%- if message['role'] == 'assistant' and message.tool_calls -%}{%- for call in message.tool_calls -%}"
        "{%- set fn = call.function if call.function is defined else call -%}"
        "{%- set m.content = m.content + '<tool_call>\\n' + ({'name': fn.name, 'arguments': fn.arguments} | tojson)"
        " + '\\n</tool_call>' -%}{%- endfor -%}{%- endif -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + m.content + '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )


def trl_chat_template(tokenizer, tools: list[dict]) -> str:
    """The template to give TRL so it renders what aitrain renders for this tokenizer and these tools."""
    from aitrain_grpo.engine.chat import ChatRenderer

    renderer = ChatRenderer(tokenizer, tools)
    if renderer.tools_route.startswith("tools reach the model through its chat template"):
        return tokenizer.chat_template
    chatml = "<|im_start|>" in tokenizer.chat_template
    if not chatml or "tool results are sent as tool messages" not in renderer.tools_route:
        raise SystemExit(f"no TRL template for this model: aitrain's route is {renderer.tools_route!r}; only ChatML "
                         f"templates that render tool messages are written here")
    return described_tools_template()


def grpo_args(output_dir: Path, seed: int, save_steps: int, max_steps: int | None = None, recipe: dict = RECIPE):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir), seed=seed, learning_rate=recipe["lr"], max_steps=max_steps or recipe["max_steps"],
        per_device_train_batch_size=recipe["micro_batch"],
        gradient_accumulation_steps=recipe["batch_size"] // recipe["micro_batch"],
        num_generations=recipe["num_generations"], max_completion_length=recipe["max_completion_length"],
        generation_kwargs={"max_new_tokens": recipe["max_new_tokens"]},
        max_tool_calling_iterations=recipe["max_turns"] - 1,
        temperature=recipe["temperature"], top_k=recipe["top_k"], top_p=recipe["top_p"], beta=recipe["kl_coef"],
        save_strategy="steps", save_steps=save_steps, logging_steps=1, report_to=[], disable_tqdm=True,
        use_cpu=True, bf16=False, gradient_checkpointing=False, log_completions=False,
    )


class StopOnSignal:
    """SIGTERM -> finish the step, save a checkpoint, stop (the budget; see the module docstring). A
    second SIGTERM stops at once, as with aitrain's SignalStop."""

    def __init__(self):
        self.received = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        if self.received:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
        self.received = True

    def callback(self):
        from transformers import TrainerCallback

        stopper = self

        class Stop(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):  # the line aitrain prints too
                print(f"training: {state.max_steps} steps, output in {args.output_dir}", flush=True)

            def on_step_end(self, args, state, control, **kwargs):
                if stopper.received:
                    control.should_save = True
                    control.should_training_stop = True
                return control

        return Stop()


def original_tokenizer_in_checkpoints(tokenizer_dir: str):
    """A callback that saves the model's own tokenizer (its original chat template) into each checkpoint,
    then writes the save into the evaluation ledger (the point a resumed run counts on from)."""
    from transformers import AutoTokenizer, TrainerCallback

    from head_to_head_ledger import Ledger

    original, ledger = AutoTokenizer.from_pretrained(tokenizer_dir), Ledger()

    class Keep(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            original.save_pretrained(str(Path(args.output_dir) / f"checkpoint-{state.global_step}"))
            ledger.save(state.global_step)

    return Keep()


def tokenizer_for(start: str):
    """The start's tokenizer with the template and response template TRL is given (module docstring)."""
    from transformers import AutoTokenizer

    from envs.stations import StationEnv

    tokenizer = AutoTokenizer.from_pretrained(start)
    tokenizer.chat_template = trl_chat_template(tokenizer, StationEnv().tools)
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def build_trainer(start: str, output_dir: Path, seed: int, save_steps: int, max_steps: int | None = None,
                  recipe: dict = RECIPE, eval_every: int = 0, eval_tasks: int = 16, eval_samples: int = 2,
                  resumed: bool = False):
    """GRPOTrainer(environment_factory=StationsTRL) on the start model, as TRL's docs build one. With
    `eval_every`, TRL's own in-training evaluation: `eval_dataset` = the first `eval_tasks` held-back rows,
    `eval_strategy="steps"`, `eval_steps`, `eval_on_start` (step 0, as aitrain's `--eval-every`; not when
    `resumed`: the checkpoint's step was evaluated by the process that saved it, as aitrain does),
    `num_generations_eval` = `eval_samples`, at the training temperature (TRL has no evaluation temperature);
    each evaluation goes into the ledger (head_to_head_trl_eval.py)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from envs.stations_trl import StationsTRL, rows
    from head_to_head_ledger import Ledger
    from head_to_head_trl_eval import EvalRecorder, ledger_evaluations

    model = AutoModelForCausalLM.from_pretrained(start, dtype="float32")
    lora = LoraConfig(r=recipe["lora_r"], lora_alpha=recipe["lora_alpha"], lora_dropout=recipe["lora_dropout"],
                      target_modules="all-linear", task_type="CAUSAL_LM")
    args = grpo_args(output_dir, seed, save_steps, max_steps, recipe)
    held_back = None
    if eval_every:
        args.eval_strategy, args.eval_steps, args.eval_on_start = "steps", eval_every, not resumed
        args.num_generations_eval = eval_samples
        args.per_device_eval_batch_size = 16 if 16 % eval_samples == 0 else eval_samples
        held_back = Dataset.from_list(rows("held_out")[:eval_tasks])
    recorder = EvalRecorder()
    trainer = GRPOTrainer(model=model, args=args, processing_class=tokenizer_for(start),
                          train_dataset=Dataset.from_list(rows("train")), eval_dataset=held_back,
                          environment_factory=StationsTRL, reward_funcs=[recorder.reward_func()], peft_config=lora,
                          callbacks=[original_tokenizer_in_checkpoints(start)])
    recorder.trainer = trainer
    if eval_every:
        ledger_evaluations(trainer, recorder, Ledger())
    return trainer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start", required=True, help="the shared start: a plain model folder")
    parser.add_argument("--output-dir", type=Path, help="training: the trainer's output folder")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save-steps", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=RECIPE["max_steps"])
    parser.add_argument("--eval-every", type=int, default=0, help="TRL's in-training evaluation every N steps (0: none)")
    parser.add_argument("--eval-tasks", type=int, default=16, help="held-back rows each evaluation plays")
    parser.add_argument("--eval-samples", type=int, default=2, help="episodes a row (num_generations_eval)")
    parser.add_argument("--evaluate", default=None, metavar="CHECKPOINT",
                        help="no training: evaluate this checkpoint (either trainer's, or the start) in TRL's loop")
    parser.add_argument("--output", type=Path, help="--evaluate: the episodes' JSON lines")
    parser.add_argument("--eval-temperature", type=float, default=0.7)
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--resume", default=None, metavar="CHECKPOINT", help="training: go on from this checkpoint")
    args = parser.parse_args(argv)
    if args.evaluate:
        from head_to_head_trl_eval import evaluate_checkpoint

        evaluate_checkpoint(args.evaluate, args.start, args.output, args.eval_tasks, args.eval_samples,
                            args.eval_temperature, args.eval_seed)
        return
    stop = StopOnSignal()  # first: a budget that ends during loading still stops after one step
    import torch

    torch.set_num_threads(1)
    trainer = build_trainer(args.start, args.output_dir, args.seed, args.save_steps, args.max_steps,
                            eval_every=args.eval_every, eval_tasks=args.eval_tasks, eval_samples=args.eval_samples,
                            resumed=args.resume is not None)
    trainer.add_callback(stop.callback())
    trainer.train(resume_from_checkpoint=args.resume)
    print(f"trl: stopped after step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
