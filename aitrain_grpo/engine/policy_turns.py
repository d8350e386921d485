"""Turns of the policy being played, asked for by an environment's own code (`episode.policy_turn`).

Some environments need the policy inside `reset` or `step`: a two-player game whose other seat is
played by the model being trained (self-play, env/adapters/textarena.py). Whoever plays an episode sets
`episode.policy_turn` before `reset` (env/base.py): an async function from a conversation (chat
messages) to the policy's reply text. An environment awaits it in an `async def` method; a sync method
runs in a worker thread and must not block on it (the backend's batched calls need those threads).

- Token level (`RolloutEngine`: training, eval, env check's model policy): the conversation is rendered
  with the run's chat template and the episode's tools, drawn by the run's backend with the run's
  sampling and `--rl-max-new-tokens` through the same draw the engine's own turns use (`open_sampler`:
  `generate_one` on a vLLM backend; on hf a `TurnBatcher`, which batches it with the other turns in
  flight, under either schedule), and decoded. Counted in the batch's `generate_calls`.
- Text level (`runner.play_text`: env check's oracle and empty policies, sft): the text policy being
  played answers, handed an `Episode` whose messages are that conversation (same row, fresh state).

Either way these turns stay out of the episode's token sequence: nothing trains them, and only the
per-turn token cap applies to them (not the completion budget).

Left out: their token ids and log-probabilities (not kept: nothing trains them), and reading tool calls
from them (the environment gets the text).
"""

from __future__ import annotations

from typing import Awaitable, Callable

from aitrain_grpo.engine.backends.base import GenerationBackend, RequestBackend, Sample, SamplingParams
from aitrain_grpo.engine.turn_batcher import TurnBatcher
from aitrain_grpo.env.base import Episode, Message, PolicyTurn

Draw = Callable[[int, list[int], int], Awaitable[Sample]]  # (episode's order, prompt ids, max tokens)


def open_sampler(backend: GenerationBackend, sampling: SamplingParams) -> tuple[Draw, TurnBatcher | None]:
    """How one rollout draws single turns: the backend's own `generate_one` where it takes one request at
    a time, else a `TurnBatcher` (to be closed on the engine's loop when the rollout ends)."""
    if isinstance(backend, RequestBackend):
        if getattr(backend, "episode_affinity", False):  # several servers: an episode keeps to one (server_pool.py)
            async def draw(order: int, prompt: list[int], max_tokens: int) -> Sample:
                return await backend.generate_one(prompt, max_tokens, sampling, episode=order)
        else:
            async def draw(order: int, prompt: list[int], max_tokens: int) -> Sample:
                return await backend.generate_one(prompt, max_tokens, sampling)

        return draw, None
    batcher = TurnBatcher(backend, sampling)
    return batcher.submit, batcher


def give_policy_turns(episodes: list[Episode], draw: Draw, renderer_for, tokenizer, batch, *, max_new_tokens: int,
                      stop_ids) -> None:
    """Set each episode's `policy_turn` for the token-level engine; each turn counts in `batch.generate_calls`."""
    for order, episode in enumerate(episodes):
        episode.policy_turn = sampled_policy_turn(draw, order, renderer_for(episode), tokenizer, batch,
                                                  max_new_tokens=max_new_tokens, stop_ids=stop_ids)


def sampled_policy_turn(draw: Draw, order: int, renderer, tokenizer, batch, *, max_new_tokens: int,
                        stop_ids) -> PolicyTurn:
    """One episode's `policy_turn`: render the conversation, draw a turn, decode it (without its stop token)."""
    async def turn(messages: list[Message]) -> str:
        drawn = await draw(order, renderer.prompt_ids(list(messages)), max_new_tokens)
        batch.generate_calls += 1
        ids = drawn.token_ids[:-1] if drawn.token_ids and drawn.token_ids[-1] in stop_ids else drawn.token_ids
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    return turn


def text_policy_turn(policy: Callable[[Episode], str], episode: Episode) -> PolicyTurn:
    """`episode.policy_turn` for text-level play: `policy` answers the conversation as an episode of its own."""
    async def turn(messages: list[Message]) -> str:
        text = policy(Episode(row=episode.row, messages=[dict(m) for m in messages], max_turns=episode.max_turns))
        if not isinstance(text, str):
            raise TypeError(f"the policy returned {type(text).__name__}, not the text of the next message")
        return text

    return turn
