"""Run options reach the code that uses them: TRL's GRPOConfig, the LoRA config, the rollout engine's
sampling; a flag overrides the same key in `--config`; the output folder defaults to outputs/<class>.

Each option is set to a value other than its default, so a flag that is parsed but never passed on
leaves TRL's default in place and fails here.
"""

from __future__ import annotations

import pytest

from aitrain_grpo.commands.cli import build_run_config
from aitrain_grpo.config import RunConfig
from envs.letters import LetterEnv
from helpers import REPO

LETTERS = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv", rl_max_new_tokens=8)
# option -> (value, where TRL or peft keeps it)
GRPO_OPTIONS = {
    "rl_kl_coef": (0.07, "beta"),
    "rl_clip_range": (0.3, "epsilon"),
    "rl_entropy_coef": (0.01, "entropy_coef"),
    "rl_loss_type": ("dr_grpo", "loss_type"),
    "rl_temperature": (0.7, "temperature"),
    "rl_top_k": (5, "top_k"),
    "rl_top_p": (0.9, "top_p"),
    "rl_max_completion_length": (200, "max_completion_length"),
    "rl_num_generations": (2, "num_generations"),
    # With the whole batch (8) in one pass, TRL accumulates exactly --gradient-accumulation-steps passes.
    "micro_batch_size": (8, "per_device_train_batch_size"),
    "gradient_accumulation_steps": (2, "gradient_accumulation_steps"),
    "logging_steps": (3, "logging_steps"),
    "epochs": (2.0, "num_train_epochs"),
    "lr": (2e-4, "learning_rate"),
    "rl_num_iterations": (3, "num_iterations"),  # 3: --logging-steps 3 stays a multiple of the updates a batch
    "rl_clip_range_high": (0.28, "epsilon_high"),
    "rl_importance_sampling": ("sequence", "importance_sampling_level"),
    "rl_scale_rewards": ("batch", "scale_rewards"),
    "lr_scheduler": ("cosine", "lr_scheduler_type"),
    "warmup_steps": (2.0, "warmup_steps"),
    "weight_decay": (0.01, "weight_decay"),
    "max_grad_norm": (0.5, "max_grad_norm"),
    "seed": (5, "seed"),
}
LORA_OPTIONS = {"lora_r": (4, "r"), "lora_alpha": (8, "lora_alpha"), "lora_dropout": (0.1, "lora_dropout")}


def test_the_defaults_differ_from_the_values_tested():
    defaults = RunConfig()
    for name, (value, _) in {**GRPO_OPTIONS, **LORA_OPTIONS}.items():
        assert getattr(defaults, name) != value, name


@pytest.fixture(scope="module")
def trained_one_step(tiny_model_dir, tmp_path_factory):
    """A trainer built from non-default options, after one optimizer step (so the engine exists)."""
    from aitrain_grpo.training.trainer import build_trainer

    options = {name: value for name, (value, _) in {**GRPO_OPTIONS, **LORA_OPTIONS}.items()}
    config = RunConfig(**LETTERS, **options, model=tiny_model_dir, target_modules="q_proj,v_proj", max_steps=1,
                       output_dir=str(tmp_path_factory.mktemp("options") / "run"))
    trainer = build_trainer(config, env=LetterEnv(turns=1, num_tasks=4))
    trainer.train()
    return trainer


@pytest.mark.parametrize("name", sorted(GRPO_OPTIONS))
def test_option_reaches_grpo_config(trained_one_step, name):
    value, trl_name = GRPO_OPTIONS[name]
    expected = pytest.approx(value) if isinstance(value, float) else value
    assert getattr(trained_one_step.args, trl_name) == expected


def test_the_optimizer_decays_the_adapter_weights(trained_one_step):
    groups = trained_one_step.optimizer.param_groups
    assert max(group["weight_decay"] for group in groups) == pytest.approx(0.01)


def test_the_learning_rate_follows_the_schedule_asked(tiny_model_dir, tmp_path):
    """What a user reads in metrics.jsonl: 2 warmup steps up to --lr, then held (constant_with_warmup) or
    decayed (linear, the default)."""
    import json

    from aitrain_grpo.training.trainer import train

    rates = {}
    for schedule in ("constant_with_warmup", "linear"):
        out = tmp_path / schedule
        train(RunConfig(**LETTERS, model=tiny_model_dir, max_steps=4, lr=1e-3, warmup_steps=2, lr_scheduler=schedule,
                        output_dir=str(out)), env=LetterEnv(turns=1, num_tasks=8))
        rates[schedule] = [json.loads(line)["learning_rate"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rates["constant_with_warmup"] == pytest.approx([0.0, 5e-4, 1e-3, 1e-3])
    assert rates["linear"] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4])


def test_lora_options_reach_the_adapter(trained_one_step):
    lora = trained_one_step.model.peft_config["default"]
    for name, (value, peft_name) in LORA_OPTIONS.items():
        assert getattr(lora, peft_name) == pytest.approx(value), name
    assert set(lora.target_modules) == {"q_proj", "v_proj"}
    adapted = {name.split(".lora_A")[0].rsplit(".", 1)[-1]
               for name, _ in trained_one_step.model.named_parameters() if ".lora_A" in name}
    assert adapted == {"q_proj", "v_proj"}  # and only those layers got an adapter


def test_sampling_options_reach_the_rollout_engine(trained_one_step):
    engine = trained_one_step.rollout.engine
    assert (engine.sampling.temperature, engine.sampling.top_k, engine.sampling.top_p) == pytest.approx((0.7, 5, 0.9))
    assert engine.max_new_tokens == 8 and engine.max_completion_length == 200


def test_a_flag_overrides_the_same_key_in_the_config_file(tmp_path, tiny_model_dir):
    from aitrain_grpo.training.run.plan import plan_run
    from aitrain_grpo.training.trainer import grpo_config

    path = tmp_path / "run.yaml"
    path.write_text("rl-env-module: envs.letters\nrl-env-class: LetterEnv\nlr: 1e-3\nrl-kl-coef: 0.2\nrl-top-k: 7\n")
    config = build_run_config(str(path), {"lr": 5e-4, "rl_top_k": None, "model": tiny_model_dir})
    config.output_dir = str(tmp_path / "out")
    plan = plan_run(config)
    args = grpo_config(plan.config, plan)
    assert args.learning_rate == pytest.approx(5e-4)  # the flag
    assert args.beta == pytest.approx(0.2) and args.top_k == 7  # the file, where no flag was given


def test_the_default_output_dir_is_outputs_slash_the_class_name(tmp_path, monkeypatch, tiny_model_dir):
    from aitrain_grpo.training.trainer import build_trainer

    monkeypatch.chdir(tmp_path)
    trainer = build_trainer(RunConfig(**LETTERS, model=tiny_model_dir, max_steps=1), env=LetterEnv(turns=1, num_tasks=4))
    assert trainer.args.output_dir == "outputs/letterenv"
    assert (tmp_path / "outputs" / "letterenv" / "run_config.json").is_file()


def test_the_options_reference_is_current():
    from aitrain_grpo.commands.options_doc import options_markdown

    written = (REPO / "docs" / "options.md").read_text()
    assert written == options_markdown(), (
        "docs/options.md is stale; regenerate it: python -m aitrain_grpo.commands.options_doc > docs/options.md")
    assert "| `--rl-advantage` | `outcome` |" in written and "## Logging and saving" in written


def test_validate_returns_the_typed_options_and_leaves_the_config_as_it_was():
    # A config file's YAML may give a float as a string and one --rl-env as a list: validate reads them as
    # their fields' types into a new RunConfig and changes nothing in the one it checked.
    import dataclasses

    from aitrain_grpo import RunConfig

    given = RunConfig(rl_env=["envs.letters:LetterEnv"], lr="1e-4")
    before = dataclasses.asdict(given)
    checked = given.validate()
    assert dataclasses.asdict(given) == before
    assert checked.lr == 1e-4 and checked.rl_env == "envs.letters:LetterEnv"
    assert checked.validate() == checked  # checking twice gives the same options


def test_sft_leaves_out_grpo_rules_and_keeps_the_others():
    """`aitrain sft` trains on demonstrations: a batch that is no multiple of the GRPO group is fine there
    (and stays as given), while the rules both commands share still hold."""
    from aitrain_grpo.commands.sft import sft_run_config
    from aitrain_grpo.errors import ConfigError

    options = dict(LETTERS, batch_size=3, rl_num_generations=4, output_dir="outputs/x")
    assert sft_run_config(dict(options)).batch_size == 3
    with pytest.raises(ConfigError, match="--batch-size 3 is not a multiple of --rl-num-generations 4"):
        RunConfig(**options).validate()
    with pytest.raises(ConfigError, match="--lr must be positive"):
        sft_run_config(dict(options, lr=0))
    with pytest.raises(ConfigError, match="--batch-size must be a positive integer"):
        sft_run_config(dict(options, batch_size=0))


def test_a_run_checks_its_options_once(tmp_path, tiny_model_dir, monkeypatch):
    """The command line's options are checked in one place (plan_run), not once by the CLI and again by
    the run: a rule added there holds for `aitrain grpo` and for `train(config)` alike."""
    from aitrain_grpo.training.run.plan import plan_run

    calls = []
    original = RunConfig.validate
    monkeypatch.setattr(RunConfig, "validate", lambda self, **kw: calls.append(1) or original(self, **kw))
    config = build_run_config(None, dict(LETTERS, model=tiny_model_dir, output_dir=str(tmp_path / "out")))
    plan_run(config)
    assert len(calls) == 1


def test_sft_takes_the_same_schedule_and_regularisation(tmp_path):
    from trl import SFTConfig

    from aitrain_grpo.training.step.micro_batches import BatchShape
    from aitrain_grpo.training.trl.hf_args import trainer_args

    config = RunConfig(lr_scheduler="cosine", warmup_steps=0.1, weight_decay=0.01, max_grad_norm=0.5)
    args = SFTConfig(**trainer_args(config, tmp_path, SFTConfig, BatchShape.of(config, whole_step=False)))
    assert (args.lr_scheduler_type, args.warmup_steps, args.weight_decay, args.max_grad_norm) == \
        ("cosine", 0.1, 0.01, 0.5)


def test_every_switch_can_be_turned_off_on_the_command_line(tmp_path):
    # A switch that is on by default (--shuffle-dataset, --rl-kl-bias-correction) or set on by --config
    # must have a --no- form, or the docs' `--no-shuffle-dataset` is "No such option" and only a file can
    # turn it off.
    import typer.main

    from aitrain_grpo.commands.cli import app
    from aitrain_grpo.commands.options import FIELDS, flag_name, flag_type

    command = typer.main.get_command(app).commands["grpo"]
    switches = [name for name in FIELDS if flag_type(name) is bool]
    assert {"shuffle_dataset", "rl_kl_bias_correction", "activation_checkpointing", "peft"} <= set(switches)
    config = tmp_path / "run.yaml"
    config.write_text("".join(f"{flag_name(name)[2:]}: true\n" for name in switches))
    args = ["--config", str(config)] + [f"--no-{flag_name(name)[2:]}" for name in switches]
    flags = command.make_context("grpo", args).params
    built = build_run_config(flags.pop("config"), flags)
    assert {name: getattr(built, name) for name in switches} == dict.fromkeys(switches, False)
