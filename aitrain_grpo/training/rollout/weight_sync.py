"""Getting the trainer's new weights into the vLLM engine that samples the episodes.

Colocated engine (in the trainer's process, built by TRL):
- on CUDA, TRL pushes each parameter into vLLM's model itself (`load_weights`), which works there;
- elsewhere (CPU), vLLM repacks linear weights into kernel-specific form after loading (oneDNN,
  AMX and zentorch kernels replace `layer.weight` with an empty tensor), so TRL's per-parameter push
  fails or misses the copy that generates. `ColocateWeightSync` hands all weights of a sync (LoRA
  merged in) to vLLM's layerwise `reload_weights`, which re-runs that post-load processing. A vLLM
  without it is refused at start (`colocate_reload_problem`).

Server, chosen by `--vllm-sync`:
- `nccl`: TRL's own weight transfer (GPU only). TRL does it; this module only chooses it.
- `lora`: the LoRA adapter is saved to the sync folder under a new name each step and loaded into the
  server by that name; generation then asks for that adapter. Old versions are unloaded and deleted.
- `disk`: the full weights (LoRA merged in, if any) are saved to the sync folder as safetensors and the
  server reloads them from there.
The folder must be readable by the server at the same path (same machine, or a shared file system).
Each version is written to a hidden temporary folder and renamed, so the server never reads half a file.
With several servers (`--vllm-server-url A,B`) each version is loaded into every server of the
`ServerPool` (engine/backends/server_pool.py), which also gives it to a server that returns after a
fault before that server's first request; the previous version is deleted once no server serves it.

Only the main process writes and calls the server; every process switches to the new adapter name,
which is derived from the step number so all agree without talking. Processes wait for each other
after a sync so nobody samples from stale weights.

Left out: NCCL itself (TRL's client), sharded (FSDP/ZeRO-3) gathers for the colocated reload (CPU
training does not shard), and weight transfer across machines without a shared folder.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

import torch

from aitrain_grpo.engine.backends.server_pool import ServerPool, Weights
from aitrain_grpo.engine.backends.vllm_server import GenerationServerError
from aitrain_grpo.errors import ConfigError, one_line
from aitrain_grpo.outputs import written_atomically


def choose_sync_method(requested: str, *, peft: bool, cuda: bool, adapter_for_vllm: bool = True) -> str:
    """Resolve `--vllm-sync auto`: LoRA with --peft when vLLM can apply the adapter (`adapter_for_vllm`:
    not DoRA, no modules saved in full), otherwise merged weights: NCCL on CUDA, disk elsewhere."""
    if requested != "auto":
        return requested
    if peft and adapter_for_vllm:
        return "lora"
    return "nccl" if cuda else "disk"


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's weights under the base model's names, with LoRA (if any) merged in, on the CPU."""
    is_peft = hasattr(model, "merge_adapter") and hasattr(model, "peft_config")
    if is_peft:
        model.merge_adapter()
    try:
        state = {}
        for name, tensor in model.state_dict().items():
            if is_peft:
                if "lora_" in name or "original_module" in name:
                    continue
                name = name.removeprefix("base_model.model.").replace(".base_layer", "").replace("modules_to_save.default.", "")
            state[name] = tensor.detach().to("cpu").contiguous().clone()
        return state
    finally:
        if is_peft:
            model.unmerge_adapter()


class FolderWeightSync:
    """`lora` and `disk` synchronisation through a shared folder, to every server of the run's pool."""

    def __init__(self, method: str, pool: ServerPool, sync_dir: Path, base_model: str):
        if method not in ("lora", "disk"):
            raise ValueError(f"unknown folder sync method {method!r}")
        self.method = method
        self.base_model = base_model
        self.pool = pool
        self.sync_dir = Path(sync_dir).resolve()
        self.last_step: int | None = None
        self.current: Path | None = None
        # Adapter names are global on the server: tie them to this run's folder so two runs sharing a
        # server do not swap each other's adapters.
        self.prefix = "aitrain-" + hashlib.sha1(str(self.sync_dir).encode()).hexdigest()[:8]

    def _probe_adapter(self, model) -> None:
        """Load the untrained adapter once into each server and unload it, before step 1: a server that
        cannot take adapters, or not of this rank, is named now rather than after a step has trained
        (`_first_adapter_refused`). Sampling stays on the base model until the first real sync."""
        probe = self.sync_dir / f"{self.prefix}-probe"
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        with written_atomically(probe, folder=True) as folder:
            model.save_pretrained(str(folder))
        try:
            for server in self.pool.each_live():
                try:
                    server.client.load_lora_adapter(probe.name, str(probe))
                    server.client.unload_lora_adapter(probe.name)
                except GenerationServerError as exc:
                    raise _first_adapter_refused(exc, model, server.url) from None
        finally:
            shutil.rmtree(probe, ignore_errors=True)

    def _remove_left_behind(self) -> None:
        """Delete the versions an earlier process of this run left in the folder. A sync writes the new
        version, loads it into the servers, then deletes the one before; a process killed with SIGKILL during
        that load left the older one, and its resume, which rewrites only the versions of the steps it syncs
        again (names are by step), never deleted it: an adapter, or with `disk` a whole copy of the weights,
        per such kill (tests/test_async_rollout.py). A `.partial` a kill cut off goes too. The first sync of a
        process owns the folder: the run lock keeps a second live run out of the output folder that holds it
        by default (two live runs given one --vllm-sync-dir already share version names, and clash anyway)."""
        for left in [*self.sync_dir.glob(f"{self.prefix}-step-*"), *self.sync_dir.glob(f".{self.prefix}-step-*.partial")]:
            shutil.rmtree(left, ignore_errors=True)

    def maybe_sync(self, trainer) -> float | None:
        """Sync if the optimizer has stepped since the last sync; returns the seconds spent, or None."""
        step = trainer.state.global_step
        if step == self.last_step:
            return None
        started = time.perf_counter()
        accelerator = trainer.accelerator
        main = accelerator.is_main_process
        if self.last_step is None:
            if main:
                self._remove_left_behind()
            # A server outlives runs, and a `disk` run leaves its weights in it: start from the base
            # model's checkpoint, which is what the trainer starts from too (or, when resuming, what
            # the resumed adapter applies to). The path is explicit because a reload from a folder
            # makes that folder the server's default for later reloads.
            self.pool.publish(Weights(self.base_model), load=main, fresh=True)
            self.last_step = 0
            if self.method == "lora" and main:
                self._probe_adapter(accelerator.unwrap_model(trainer.model))
            if step == 0:
                accelerator.wait_for_everyone()
                return time.perf_counter() - started
        version = self.sync_dir / f"{self.prefix}-step-{step}"
        if self.method == "disk" or main:
            model = accelerator.unwrap_model(trainer.model)
        if self.method == "disk":
            # Merging is done on every process (it is cheap and keeps any sharded gathers collective).
            state = merged_state_dict(model)
        if main:
            self.sync_dir.mkdir(parents=True, exist_ok=True)
            with written_atomically(version, folder=True) as folder:
                if self.method == "lora":
                    model.save_pretrained(str(folder))
                else:
                    from safetensors.torch import save_file

                    save_file(state, str(folder / "model.safetensors"))
        # Every server gets the version (a server out of rotation, when it answers again); then the
        # previous one is no longer served anywhere and is deleted.
        if self.method == "lora":
            weights = Weights(self.base_model, adapter=(version.name, str(version)))
        else:
            weights = Weights(self.base_model, folder=str(version))
        self.pool.publish(weights, load=main)
        if main and self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = version
        self.last_step = step
        accelerator.wait_for_everyone()
        return time.perf_counter() - started


def _first_adapter_refused(exc: GenerationServerError, model, url: str) -> ConfigError:
    """The one-line error for a server that refused the run's first LoRA adapter: LoRA off, or a rank
    above its --max-lora-rank (vLLM's message names the rank)."""
    rank = max((getattr(config, "r", 0) for config in getattr(model, "peft_config", {}).values()), default=0)
    detail = one_line(str(exc), 200)
    if "rank" in str(exc).lower():
        return ConfigError(f"the vLLM server at {url} refused a LoRA adapter of rank {rank} ({detail}); restart it "
                           f"with --enable-lora --max-lora-rank {rank} or more, or train with a smaller --lora-r")
    return ConfigError(f"the vLLM server at {url} does not take LoRA adapters ({detail}); restart it with "
                       f"`aitrain vllm-serve ... --enable-lora --max-lora-rank {rank or 16}`, or use --vllm-sync disk")


def colocate_reload_problem() -> str | None:
    """Why the installed vLLM cannot take the trainer's weights in process on this platform, or None.
    Checked before anything loads, so a run never fails at its first sync."""
    import inspect

    from vllm.platforms import current_platform

    platform = current_platform.device_name or current_platform.device_type
    try:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload  # noqa: F401
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        GPUModelRunner = None
    reload = getattr(GPUModelRunner, "reload_weights", None)
    if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
        return None
    import vllm

    return (
        f"colocated vLLM on {platform} needs vLLM's layerwise reload_weights(weights_iterator=...), which vLLM "
        f"{vllm.__version__} lacks; use --vllm-mode server (aitrain vllm-serve) or vLLM 0.31"
    )


class ColocateWeightSync:
    """Trainer weights -> the colocated engine through vLLM's layerwise reload, once per optimizer step.

    All weights go in one `reload_weights` call: vLLM buffers each layer's tensors until the layer is
    complete, then loads and re-processes (repacks) it, and finally copies the result into the tensors
    the engine already holds, so nothing the engine captured goes stale."""

    def __init__(self, llm):
        self.llm = llm
        self.last_step: int | None = None

    def maybe_sync(self, trainer) -> float | None:
        """Sync if the optimizer has stepped since the last sync (or never synced: a resumed run starts
        from its checkpoint, not from what the engine loaded); returns the seconds spent, or None."""
        step = trainer.state.global_step
        if step == self.last_step:
            return None
        started = time.perf_counter()
        # Copies, not views: vLLM may hold a tensor until its layer completes, after the adapter is unmerged.
        state = merged_state_dict(trainer.accelerator.unwrap_model(trainer.model))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items()), "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()  # cached prefixes hold keys and values of the old weights
        self.last_step = step
        return time.perf_counter() - started


class TRLWeightPush:
    """Trainer weights -> vLLM through TRL's own engine (`vllm_generation.sync_weights`: colocated on
    CUDA, or a server over NCCL), once per optimizer step, at the step's start (step/flow.py's rollout)."""

    def __init__(self):
        self.last_step: int | None = None

    def maybe_sync(self, trainer) -> float | None:
        from aitrain_grpo.training.trl.access import push_weights_through_trl

        step = trainer.state.global_step
        if step == self.last_step:
            return None
        started = time.perf_counter()
        push_weights_through_trl(trainer)
        self.last_step = step
        return time.perf_counter() - started
