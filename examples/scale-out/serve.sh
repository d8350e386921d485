#!/usr/bin/env bash
# A generation machine: SERVERS vLLM servers (`aitrain vllm-serve`), one per GPU where there are GPUs, on
# ports BASE_PORT, BASE_PORT+1, ...; runs until stopped (the job's end, or Ctrl-C). The trainers wait for
# them (up to --vllm-server-timeout), so start order does not matter.
#   MODEL=Qwen/Qwen2.5-0.5B-Instruct SERVERS=8 examples/scale-out/serve.sh
# Settings (environment): MODEL (required), SERVERS (1), BASE_PORT (8000), HOST (0.0.0.0: reachable by the
# trainers; anyone who can reach it can replace the weights, see docs/operations.md#security), LORA_RANK
# (16: at least the trainers' --lora-r), SERVE_ARGS (more `aitrain vllm-serve` flags, e.g. --enforce-eager).
set -euo pipefail
: "${MODEL:?set MODEL to the model the trainers train (the same --model)}"
SERVERS=${SERVERS:-1}
BASE_PORT=${BASE_PORT:-8000}
HOST=${HOST:-0.0.0.0}
GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then GPUS=$(nvidia-smi -L | wc -l); fi
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM
for ((i = 0; i < SERVERS; i++)); do
    if ((GPUS > 0)); then export CUDA_VISIBLE_DEVICES=$((i % GPUS)); fi
    # shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
    aitrain vllm-serve --model "$MODEL" --host "$HOST" --port $((BASE_PORT + i)) --enable-lora \
        --max-lora-rank "${LORA_RANK:-16}" ${SERVE_ARGS:-} &
    pids+=($!)
done
wait -n "${pids[@]}"  # one server ending ends the machine's job: the trainers fail over to the rest
