"""Train on the hotel environment from Python instead of the CLI.

    OMP_NUM_THREADS=1 python examples/train_hotel.py            # tiny local model, a few steps
    python examples/train_hotel.py --model Qwen/Qwen2.5-0.5B-Instruct --steps 200
"""

import argparse

from aitrain_grpo import RunConfig, load_environment, train

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="tiny")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--output-dir", default="outputs/hotel-python")
args = parser.parse_args()

env = load_environment("envs.hotel", "HotelEnv", "@examples/hotel_config.json")
config = RunConfig(
    model=args.model,
    output_dir=args.output_dir,
    rl_env_module="envs.hotel",
    rl_env_class="HotelEnv",
    rl_env_config="@examples/hotel_config.json",
    max_steps=args.steps,
    rl_max_new_tokens=96,
    overwrite=True,
)
summary = train(config, env=env)
print(summary)
