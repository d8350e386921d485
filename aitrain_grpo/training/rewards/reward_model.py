"""A reward model's score as one more reward (`--rl-reward-model`): a sequence-classification model scores
each finished episode's conversation, as TRL takes a model id among its `reward_funcs`.

Why: a preference-trained reward model is how RLHF scores open-ended replies that no program can check,
and it is cheaper and steadier than a generating judge (rewards/judge.py): one forward per episode, no
reply to parse, a graded score that two equal conversations always share.

- What it reads: the episode's whole conversation (every message, the environment's included), rendered
  with the reward model's own chat template, the form it was trained on, or without one as role-labelled
  lines (the judge's `render`), and tokenized with its own tokenizer. A conversation longer than the
  model's context keeps its end, where the final answer is; the share cut is logged as
  `rewards/reward_model/truncated_frac`.
- The score: the logit of the model's one label (TRL's rule, `logits[:, 0]`), unbounded, logged as
  `rewards/reward_model/mean` and weighted last in `--rl-reward-weights` (after the judge's). Group
  advantages make its offset irrelevant; its scale counts against the other rewards' through the weights.
- Where: in this process, frozen, float32 on a CPU and bfloat16 on CUDA, SCORE_BATCH conversations a
  forward, padded on the right; under several processes each scores its own episodes.
- Checked before the policy model loads (`check_reward_model`): its config must read, name a
  `...ForSequenceClassification` architecture and have one label.

Left out: a reward model behind a URL (serve it and call it from a `--rl-reward-funcs` function), models of
several labels (refused: reward one label's logit from a `--rl-reward-funcs` function), and a chat template
that cannot render a message (a `tool` role some templates reject): that batch's call fails and abstains,
with the one-line warning every reward function gets (rewards/functions.py).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from aitrain_grpo.errors import ConfigError, one_line
from aitrain_grpo.training.rewards.functions import RewardFunc, episode_reward
from aitrain_grpo.training.rewards.judge import episode_transcripts, render

NAME = "reward_model"  # what TRL logs the reward under: rewards/reward_model/mean
FLAG = "--rl-reward-model"
SCORE_BATCH = 8  # conversations a forward


def check_reward_model(spec: str) -> None:
    """Refuse a `--rl-reward-model` that is not a one-label sequence classifier, reading its config only."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(spec)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{FLAG} {spec} could not be loaded: {one_line(exc, 200)}; pass the folder or model id "
                          f"of a sequence-classification reward model") from None
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        kind = ", ".join(architectures) or "a model that names no architecture"
        raise ConfigError(f"{FLAG} {spec} is {kind}, not a reward model (a ...ForSequenceClassification with one "
                          f"label); to have a language model grade episodes, use --rl-judge-rubric with "
                          f"--rl-judge-model")
    if config.num_labels != 1:
        raise ConfigError(f"{FLAG} {spec} has {config.num_labels} labels; a reward model's score is its one label's "
                          f"logit; to reward one of these labels, return its logit from a --rl-reward-funcs function")


class RewardModel:
    """The model and tokenizer of `--rl-reward-model`, loaded once; `score` gives one float an episode."""

    def __init__(self, spec: str):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        check_reward_model(spec)
        self.tokenizer = AutoTokenizer.from_pretrained(spec)
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        self.model = AutoModelForSequenceClassification.from_pretrained(spec, dtype=dtype)
        self.model.to("cuda" if torch.cuda.is_available() else "cpu").eval().requires_grad_(False)
        if self.tokenizer.pad_token_id is None:  # padding a batch needs one; the model pools past it
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        # the model's positions and the tokenizer's limit, whichever is smaller (a tokenizer without one says 1e30)
        limits = [n for n in (getattr(self.model.config, "max_position_embeddings", None),
                              self.tokenizer.model_max_length) if isinstance(n, int) and 0 < n < 10**7]
        self.context = min(limits) if limits else None

    def text(self, messages: Sequence[dict[str, Any]]) -> str:
        """One conversation as the reward model reads it (see the module docstring)."""
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False)
        return render(messages)

    def ids(self, messages: Sequence[dict[str, Any]]) -> tuple[list[int], bool]:
        """The conversation's token ids, its end kept within the context; and whether it was cut."""
        ids = self.tokenizer(self.text(messages), add_special_tokens=not self.tokenizer.chat_template)["input_ids"]
        if self.context is not None and len(ids) > self.context:
            return ids[-self.context:], True
        return ids, False

    def score(self, conversations: Sequence[Sequence[dict[str, Any]]]) -> tuple[list[float], float]:
        """Each conversation's score, and the share of them cut to fit the context."""
        import torch

        encoded = [self.ids(messages) for messages in conversations]
        scores: list[float] = []
        for start in range(0, len(encoded), SCORE_BATCH):
            chunk = [ids for ids, _ in encoded[start:start + SCORE_BATCH]]
            width = max(len(ids) for ids in chunk)
            pad = self.tokenizer.pad_token_id
            input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in chunk], device=self.model.device)
            attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in chunk],
                                     device=self.model.device)
            with torch.no_grad():
                logits = self.model(input_ids=input_ids, attention_mask=attention).logits
            scores.extend(logits[:, 0].float().tolist())
        return scores, sum(cut for _, cut in encoded) / max(len(encoded), 1)


def reward_model_rewards(model: RewardModel | None, rollout) -> list[Callable[..., Any]]:
    """The reward model as TRL reward functions (none or one), given each batch's episodes as
    `--rl-reward-funcs` are (rewards/functions.py: failures abstain and are counted)."""
    if model is None:
        return []

    def reward_model(episodes, log_metric=None, **kwargs):
        scores, truncated = model.score(episode_transcripts(episodes))
        if log_metric is not None:
            log_metric(f"rewards/{NAME}/truncated_frac", truncated)
        return scores

    return [episode_reward(RewardFunc(NAME, NAME, reward_model), rollout)]
