"""Generation with the vLLM engine TRL runs inside the trainer (`use_vllm=True, vllm_mode="colocate"`).

TRL builds the engine; training hands over the engine and its tensor-parallel group (training/trl/access.py,
`generation_handles`: this module never sees the trainer). The trainer's weights reach it before each
rollout from TRL (CUDA) or from `training/rollout/weight_sync.py`'s layerwise reload (CPU, where vLLM repacks
weights). This backend only samples from it, from token ids, one `generate` call per turn for every
running episode. The log-probabilities are vLLM's processed ones (after temperature), which is what
TRL's importance-sampling correction compares against the trainer's own.

With tensor parallelism, the processes of one tensor-parallel group must pass vLLM the same prompts:
each process gathers its group's prompts, every process generates the whole group's batch (vLLM
shards the work), and keeps its own slice, as TRL does for its single-turn path.

`VLLMColocateRequests` (one process, no tensor parallelism) also takes one episode turn at a time
(`generate_one`, the engine's continuous schedule): requests go into the engine's own queue
(`LLMEngine.add_request`) and one driver task on the engine's event loop runs `LLMEngine.step()` while
any request is unfinished, yielding to the event loop between steps so that episodes whose turn just
finished can submit their next one; vLLM's scheduler batches whatever is in flight.

Left out: sleep mode (TRL's `vllm_enable_sleep_mode`), multimodal prompts, and the continuous
schedule with tensor parallelism (every rank would have to add the same requests in the same step
order; those runs keep the batched, lockstep path).
"""

from __future__ import annotations

import asyncio
import itertools
import math

from aitrain_grpo.engine.backends.base import GenerationBackend, Sample, SamplingParams


class VLLMColocateBackend(GenerationBackend):
    """Samples from an in-process `vllm.LLM`: TRL's (handed over by training) or one built by the caller
    (evaluation, benchmarks), optionally through a LoRA adapter (`lora_request`)."""

    def __init__(self, llm, stop_ids: list[int], *, tp_group=None, tp_size: int = 1, lora_request=None):
        self.llm = llm
        self.stop_ids = stop_ids
        self.tp_group = tp_group
        self.tp_size = tp_size
        self.lora_request = lora_request

    @staticmethod
    def for_llm(llm, stop_ids: list[int], *, tp_group=None, tp_size: int = 1, lora_request=None) -> "VLLMColocateBackend":
        """The backend for an engine: one that also takes single turns (`VLLMColocateRequests`) unless the
        engine is sharded over a tensor-parallel group."""
        backend_class = VLLMColocateRequests if tp_size == 1 else VLLMColocateBackend
        return backend_class(llm, stop_ids, tp_group=tp_group, tp_size=tp_size, lora_request=lora_request)

    def _sampling_params(self, max_tokens: int, sampling: SamplingParams):
        from vllm import SamplingParams as VLLMSampling

        greedy = sampling.temperature <= 0
        return VLLMSampling(
            max_tokens=max_tokens,
            temperature=0.0 if greedy else sampling.temperature,
            top_k=0 if greedy or not sampling.top_k else sampling.top_k,
            top_p=1.0 if greedy else sampling.top_p,
            min_p=0.0 if greedy else sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            logprobs=0,  # the sampled token's own log-probability
            stop_token_ids=self.stop_ids,
            skip_special_tokens=False,
            detokenize=False,
        )

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams) -> list[Sample]:
        import torch.distributed as dist

        local = prompts
        if self.tp_size > 1:
            gathered: list = [None] * self.tp_size
            dist.all_gather_object(gathered, prompts, group=self.tp_group)
            offsets = [0]
            for part in gathered:
                offsets.append(offsets[-1] + len(part))
            prompts = [p for part in gathered for p in part]
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in prompts],
            sampling_params=self._sampling_params(max_tokens, sampling),
            use_tqdm=False,
            lora_request=self.lora_request,
        )
        samples = [sample_from_vllm_output(out.outputs[0], self.stop_ids) for out in outputs]
        if self.tp_size > 1:
            rank = dist.get_rank(group=self.tp_group)
            samples = samples[offsets[rank]:offsets[rank + 1]]
            assert len(samples) == len(local)
        return samples


class VLLMColocateRequests(VLLMColocateBackend):
    """The colocated engine, also taking one episode turn at a time (`RequestBackend`); one process only."""

    def __init__(self, llm, stop_ids: list[int], **kwargs):
        super().__init__(llm, stop_ids, **kwargs)
        if self.tp_size > 1:
            raise ValueError("one turn at a time needs tensor_parallel_size 1; use VLLMColocateBackend")
        self._waiting: dict[str, asyncio.Future] = {}
        self._request_ids = itertools.count()
        self._driver: asyncio.Task | None = None

    async def generate_one(self, prompt: list[int], max_tokens: int, sampling: SamplingParams) -> Sample:
        from vllm.sampling_params import RequestOutputKind

        params = self._sampling_params(max_tokens, sampling)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it finishes
        request_id = f"aitrain-{next(self._request_ids)}"
        finished = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = finished
        try:
            self.llm.llm_engine.add_request(request_id, {"prompt_token_ids": prompt}, params, lora_request=self.lora_request)
        except BaseException:
            del self._waiting[request_id]
            raise
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        try:
            output = await finished
        except asyncio.CancelledError:  # the rollout was given up: free the engine of this request
            if self._waiting.pop(request_id, None) is not None:
                self.llm.llm_engine.abort_request([request_id])
            raise
        return sample_from_vllm_output(output.outputs[0], self.stop_ids)

    async def _drive(self) -> None:
        """Step the engine while requests are waiting; a failed step fails every waiting request."""
        engine = self.llm.llm_engine
        while self._waiting:
            try:
                outputs = engine.step()
            except Exception as exc:
                waiting, self._waiting = self._waiting, {}
                for future in waiting.values():
                    if not future.done():
                        future.set_exception(exc)
                return
            for output in outputs:
                if output.finished:
                    future = self._waiting.pop(output.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(output)
            await asyncio.sleep(0)  # let episodes whose turn finished submit their next turn


def sample_from_vllm_output(completion, stop_ids: list[int]) -> Sample:
    """A vLLM `CompletionOutput` as a `Sample` (NaN log-probs, which vLLM reports as None, become 0)."""
    token_ids = list(completion.token_ids)
    logprobs = []
    for token, entry in zip(token_ids, completion.logprobs or []):
        value = entry[token].logprob if entry is not None and token in entry else 0.0
        logprobs.append(value if value is not None and math.isfinite(value) else 0.0)
    logprobs += [0.0] * (len(token_ids) - len(logprobs))
    stopped = bool(token_ids) and token_ids[-1] in stop_ids
    return Sample(token_ids=token_ids, logprobs=logprobs, finish_reason="stop" if stopped else "length")
