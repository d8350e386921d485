#!/usr/bin/env bash
# Server mode on one machine: a vLLM server in one process, training in another, LoRA weights synced
# through a shared folder after every optimizer step. On a GPU machine, give the server its own GPU:
#   CUDA_VISIBLE_DEVICES=0 aitrain vllm-serve ...   and   CUDA_VISIBLE_DEVICES=1 aitrain grpo ...
set -euo pipefail
MODEL=${MODEL:-tiny}
PORT=${PORT:-8000}
export OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1

# Terminal 1 (here in the background): the server, with runtime LoRA loading on.
aitrain vllm-serve --model "$MODEL" --port "$PORT" --enable-lora --max-lora-rank 16 &
SERVER=$!
trap 'kill $SERVER' EXIT

# Terminal 2: training; it waits for the server (up to --vllm-server-timeout) and checks its model.
aitrain grpo --model "$MODEL" --rl-env-module envs.hotel --rl-env-class HotelEnv \
  --rl-env-config @examples/hotel_config.json --max-steps 10 --output-dir outputs/hotel-server --overwrite \
  --use-vllm --vllm-mode server --vllm-server-url "http://127.0.0.1:$PORT" --vllm-sync lora
