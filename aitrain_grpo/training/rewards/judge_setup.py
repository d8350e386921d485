"""The run's judge from its options (`build_judge`), checked before step 1 and before any model loads.

Why: a judge that could not work was found out only at run time, after the model loaded: an unreachable
`--rl-judge-url` scored every episode `--rl-judge-fallback` and the run trained on that constant to its
end; a rubric too long for the judge's context failed every call; a missing `--rl-judge-model` was
reported as `--model ... could not be loaded`. Each is now one `error:` line naming the option (exit 2),
raised from `build_trainer` before the run's model loads and before run_config.json is written:

- a judge behind `--rl-judge-url` gets one call, the run's own (the rubric, the mode, a group of
  `--rl-num-generations` copies of a two-message conversation): a refused connection, a timeout or an
  HTTP error (a server that finds the prompt past its context, a model name it does not serve) is
  refused, naming the URL, the error and, for a long rubric, its size. A reply without readable scores
  only warns: a real judge may answer a made-up conversation oddly, and failing calls at run time stop
  the run anyway (failing.py);
- an in-process judge (`--rl-judge-model self`: the run's `--model`; or a model path or id) has its
  config and tokenizer read, not its weights: a model that is not there is named with its own flag, and
  the judge's instructions with the rubric, plus its reply (LOCAL_REPLY_TOKENS), must fit its context
  (`max_position_embeddings`), counted with its tokenizer and chat template.

Left out: the context of a judge behind a URL (servers do not report it alike; the test call carries the
rubric, so a server that refuses it is named), and how long a hub id takes to be found missing without a
network (transformers' own retries).
"""

from __future__ import annotations

import sys
from typing import Any

from aitrain_grpo.errors import ConfigError, describe_exception, one_line
from aitrain_grpo.training.rewards.judge import (
    LOCAL_REPLY_TOKENS, SYSTEM, HttpJudge, Judge, LocalJudge, episode_prompt, failure_text, group_prompt,
    parse_scores, read_rubric,
)

SAMPLE = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
LONG_RUBRIC = 10_000  # characters past which a failed test call names the rubric's size
CHARS_PER_TOKEN = 32  # more than any tokenizer's token holds of text: the head counted before the whole


def build_judge(config) -> Judge | None:
    """The run's judge from its options (None without --rl-judge-rubric), checked (see the module
    docstring); an in-process one is loaded now."""
    if not config.rl_judge_rubric:
        return None
    rubric = read_rubric(config.rl_judge_rubric)
    if config.rl_judge_url:
        backend = HttpJudge(config.rl_judge_url, config.rl_judge_model, config.rl_judge_api_key_env)
        judge = Judge(rubric, config.rl_judge_mode, config.rl_judge_fallback, config.rl_num_generations, backend,
                      f" at {backend.url}")
        try:
            check_url_judge(judge)
        except ConfigError:
            judge.close()
            raise
        return judge
    self_judge = config.rl_judge_model == "self"
    model = config.model if self_judge else config.rl_judge_model
    check_local_judge(rubric, model, "--model" if self_judge else "--rl-judge-model", config.rl_judge_mode,
                      config.rl_num_generations)
    return Judge(rubric, config.rl_judge_mode, config.rl_judge_fallback, config.rl_num_generations,
                 LocalJudge(model), f" ({model}, in-process)")


def check_url_judge(judge: Judge) -> None:
    """One call to the judge behind a URL, as the run will make them; a failed call is refused."""
    count = judge.unit_size
    reply = judge.backend.complete([judge._prompt([SAMPLE] * count)])[0]
    if isinstance(reply, Exception):
        size = len(judge.rubric)
        long = (f"; the rubric is {size:,} characters: shorten it if it overfills the judge's context"
                if size > LONG_RUBRIC else "")
        raise ConfigError(
            f"--rl-judge-url {judge.backend.url}: the judge's test call before step 1 failed "
            f"({describe_exception(reply, 200)}){long}; start the judge server or fix the URL (and "
            f"--rl-judge-model, the name it serves), or judge in-process without --rl-judge-url")
    if parse_scores(reply, count, judge.mode) is None:
        print(f"warning: the judge{judge.name} {failure_text(reply, count)} to its test call before step 1; "
              f"a failed call scores --rl-judge-fallback, and the run stops after 3 batches of only failed calls",
              file=sys.stderr)


def _prompt_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    """The tokens of a judge prompt as LocalJudge renders it (its chat template, else the contents joined)."""
    if tokenizer.chat_template:
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"])
    return len(tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"])


def check_local_judge(rubric: str, model: str, flag: str, mode: str, group_size: int) -> None:
    """The in-process judge's model must be there, and its instructions with the rubric must leave room in
    its context for a conversation and the reply; read from its config and tokenizer, not its weights."""
    from transformers import AutoConfig

    from aitrain_grpo.models.loading import load_tokenizer, resolve_source

    try:
        source = resolve_source(model)
        tokenizer = load_tokenizer(source)
    except ConfigError as exc:
        raise ConfigError(f"{flag} {model} (the judge): {exc}") from None
    try:
        context = getattr(AutoConfig.from_pretrained(source.weights), "max_position_embeddings", None)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{flag} {model} (the judge) could not be loaded: {one_line(exc, 200)}; pass a causal LM "
                          f"folder or model id") from None
    if not context:
        return
    unit = [SAMPLE] * (group_size if mode == "group" else 1)
    ask = group_prompt(unit) if mode == "group" else episode_prompt(unit[0])
    tokenizer.model_max_length = 10**12  # counted here, never fed to the model: no "longer than" warning

    def tokens_with(text: str) -> int:
        return _prompt_tokens(tokenizer, [{"role": "system", "content": SYSTEM.format(rubric=text)},
                                          {"role": "user", "content": ask}])

    head = rubric[:(context + 1) * CHARS_PER_TOKEN]  # a 5 MB rubric that overflows is found from its head
    tokens = tokens_with(head)
    if tokens + LOCAL_REPLY_TOKENS <= context and len(head) < len(rubric):
        tokens = tokens_with(rubric)
    if tokens + LOCAL_REPLY_TOKENS > context:
        raise ConfigError(
            f"--rl-judge-rubric: the judge's prompt with this rubric ({len(rubric):,} characters) and the "
            f"shortest conversation is {'over ' if len(head) < len(rubric) else ''}{tokens:,} tokens, which with its reply ({LOCAL_REPLY_TOKENS} tokens) "
            f"exceeds the judge's context ({flag} {model}: {context:,} tokens), so every call would fail; "
            f"shorten the rubric, or judge with a model of a longer context")
