#!/usr/bin/env bash
# A training machine: `accelerate launch` of `aitrain grpo` as machine MACHINE_RANK of NUM_MACHINES, PROCS
# processes on it (one per GPU; 1 on a CPU machine). The arguments are `aitrain grpo`'s.
#   NUM_MACHINES=2 MACHINE_RANK=0 MAIN_IP=10.0.0.1 PROCS=8 examples/scale-out/train.sh --model ... \
#       --use-vllm --vllm-mode server --vllm-server-url http://gen1:8000,http://gen1:8001 --vllm-sync lora ...
# Settings (environment): NUM_MACHINES (1), MACHINE_RANK (0), MAIN_IP (127.0.0.1: machine 0's address, which
# every machine must reach), MAIN_PORT (29500), PROCS (the GPUs here, or 1), ACCELERATE_CONFIG (an
# examples/accelerate/*.yaml for DeepSpeed or FSDP; its machine and process counts are overridden here).
set -euo pipefail
NUM_MACHINES=${NUM_MACHINES:-1}
GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then GPUS=$(nvidia-smi -L | wc -l); fi
PROCS=${PROCS:-$((GPUS > 0 ? GPUS : 1))}
launch=(accelerate launch --num_machines "$NUM_MACHINES" --machine_rank "${MACHINE_RANK:-0}"
        --main_process_ip "${MAIN_IP:-127.0.0.1}" --main_process_port "${MAIN_PORT:-29500}"
        --num_processes $((NUM_MACHINES * PROCS)) --rdzv_backend static --same_network)
if [[ -n "${ACCELERATE_CONFIG:-}" ]]; then
    launch+=(--config_file "$ACCELERATE_CONFIG")
elif ((GPUS > 0)); then
    launch+=(--multi_gpu --mixed_precision bf16)
else
    launch+=(--multi_gpu --mixed_precision no)  # on a CPU: one process per machine over gloo
fi
exec "${launch[@]}" -m aitrain_grpo grpo "$@"
