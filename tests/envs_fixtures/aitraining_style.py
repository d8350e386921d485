"""Environments written to AITraining's documented interface, as its users write them: no base class, no
import from aitrain_grpo. `build_dataset(tokenizer)` returns a `datasets.Dataset`, `score_episode(model,
tokenizer, completion, case_idx)` scores one completion, `get_tools()` returns OpenAI-style schemas.

Each records what it was called with in a JSON-lines file (`log_path`), so tests can see, across a
subprocess, what the trainer handed it."""

import json

import torch
from datasets import Dataset

QUESTIONS = ["Say hello.", "Greet the user.", "Write a short hello.", "Say hi to everyone."]


def _record(log_path, **fields):
    if log_path:
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(fields) + "\n")


def _text(completion):
    return completion if isinstance(completion, str) else completion[0]["content"]


class GreetingEnv:
    """Chat prompts with a `case_idx` column; the score uses the tokenizer and the model it is given,
    and one case (`fail_case`) raises, as a buggy scorer would."""

    def __init__(self, log_path: str = "", fail_case: int = -1):
        self.log_path = log_path
        self.fail_case = fail_case

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({
            "prompt": [[{"role": "user", "content": q}] for q in QUESTIONS],
            "case_idx": [10, 11, 12, 13],
        })

    def score_episode(self, model, tokenizer, completion, case_idx):
        if case_idx == self.fail_case:
            raise ValueError(f"no reference answer for case {case_idx}")
        text = _text(completion)
        ids = tokenizer(text or " ", return_tensors="pt")["input_ids"]
        logits = model(input_ids=ids).logits  # a live model that runs here, as a judge or a next turn would
        score = min(1.0, len(ids[0]) / 40.0)
        _record(self.log_path, case_idx=case_idx, completion=completion, score=score,
                model=type(model).__name__, training=model.training, grad=torch.is_grad_enabled(),
                logits_grad=logits.requires_grad)
        return score


class PlainPromptEnv:
    """String prompts and no `case_idx` column: the completion is a string, case_idx the row index."""

    def __init__(self, log_path: str = ""):
        self.log_path = log_path

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["Count to three.", "Name a colour.", "Say yes."]})

    def score_episode(self, model, tokenizer, completion, case_idx):
        _record(self.log_path, case_idx=case_idx, completion=completion)
        return 1.0 if "3" in completion else 0.0


class OrderToolsEnv:
    """Offers tools (one OpenAI-style, one bare function dict); AITraining never runs them, and neither
    may we: `lookup_order` raises if anything calls it."""

    def __init__(self, log_path: str = ""):
        self.log_path = log_path

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({
            "prompt": [[{"role": "system", "content": "You are a support agent."},
                        {"role": "user", "content": "Where is order A17?"}]] * 2,
            "case_idx": [0, 1],
        })

    def get_tools(self):
        return [
            {"type": "function", "function": {
                "name": "lookup_order", "description": "Find an order by its id.",
                "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                               "required": ["order_id"]}}},
            {"name": "cancel_order", "description": "Cancel an order.",
             "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}},
        ]

    def lookup_order(self, order_id):
        raise AssertionError("a tool was executed; AITraining environments' tools are never run")

    def score_episode(self, model, tokenizer, completion, case_idx):
        _record(self.log_path, case_idx=case_idx, completion=completion)
        return 1.0 if "lookup_order" in _text(completion) else 0.0


class DefaultsEnv:
    """AITraining's signature with defaults and keyword-only parameters is still AITraining's."""

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["x"]})

    def score_episode(self, model=None, tokenizer=None, *, completion="", case_idx=0):
        return 0.5


class AsyncScoreEnv:
    """An `async def score_episode` with AITraining's parameters (AITraining itself would not await it)."""

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["x"]})

    async def score_episode(self, model, tokenizer, completion, case_idx):
        return 0.25 if torch.is_grad_enabled() is False else 0.0


class TwoArgumentEnv:
    """A score_episode that fits neither interface."""

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["x"]})

    def score_episode(self, completion, answer):
        return 0.0


class BadToolsEnv:
    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": ["x"]})

    def get_tools(self):
        return [{"type": "function", "function": {"description": "no name"}}]

    def score_episode(self, model, tokenizer, completion, case_idx):
        return 0.0
