"""`--chat-template-kwargs` (TRL's chat_template_kwargs): the chat template's own variables, such as
Qwen3's `enable_thinking`, reach every rendering a command makes: training's prompts, sft's
demonstrations, env check's and eval's. What a user sees: a model whose template reads the variable gets
the prompts it asks for (here an empty thinking block, as Qwen3 writes with `enable_thinking` false); a
variable the template does not read gets a note; a value that is not a JSON object is refused."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from aitrain_grpo.commands.cli import app
from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.demos import Demonstration
from aitrain_grpo.models.loading import load_tokenizer, resolve_source
from aitrain_grpo.sft.trainer import demo_dataset
from aitrain_grpo.training.trainer import build_trainer
from helpers import REPO
from helpers.cli import refused

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]
NO_THINKING = '{"enable_thinking": false}'
EMPTY_THOUGHT = "<think>\n\n</think>"
# Qwen3's rule, on the tiny model's ChatML: with enable_thinking false the generation prompt closes an
# empty thought, so the model answers without one.
THINKING_SWITCH = ("{%- if add_generation_prompt and enable_thinking is defined and enable_thinking is false -%}"
                   "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}")


@pytest.fixture(scope="module")
def thinking_model(tiny_model_dir, tmp_path_factory):
    """The tiny model with a template that reads `enable_thinking`."""
    folder = tmp_path_factory.mktemp("thinking") / "model"
    shutil.copytree(tiny_model_dir, folder)
    template = folder / "chat_template.jinja"
    template.write_text(template.read_text() + THINKING_SWITCH)
    return str(folder)


def test_training_prompts_are_rendered_with_the_variables(thinking_model, tmp_path):
    def first_prompt(**options):
        trainer = build_trainer(RunConfig(model=thinking_model, rl_env_module="envs.letters", rl_env_class="LetterEnv",
                                          output_dir=str(tmp_path / str(len(options))), max_steps=1,
                                          rl_max_new_tokens=4, use_vllm=False, **options))
        try:
            trainer.train()
            return trainer.processing_class.decode(trainer.rollout.last_batch.traces[0].prompt_ids)
        finally:
            trainer.rollout_parts.close()

    assert first_prompt(chat_template_kwargs=NO_THINKING).endswith(EMPTY_THOUGHT + "\n\n")
    assert EMPTY_THOUGHT not in first_prompt()


def test_sft_demonstrations_are_rendered_with_the_variables(thinking_model):
    tokenizer = load_tokenizer(resolve_source(thinking_model))
    demo = Demonstration(messages=[{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}],
                         prompt_length=1, score=1.0, row=0)
    [ids] = demo_dataset(tokenizer, [demo], {"enable_thinking": False})["input_ids"]
    assert EMPTY_THOUGHT in tokenizer.decode(ids)
    [plain] = demo_dataset(tokenizer, [demo])["input_ids"]
    assert EMPTY_THOUGHT not in tokenizer.decode(plain)


def test_env_check_shows_the_prompt_with_the_variables_and_notes_those_no_template_reads(thinking_model,
                                                                                        tiny_model_dir, monkeypatch):
    monkeypatch.chdir(REPO)

    def check(model):
        result = CliRunner().invoke(app, ["env", "check", *LETTERS, "--model", model, "--policies", "empty",
                                          "--episodes", "1", "--chat-template-kwargs", NO_THINKING])
        assert result.exit_code == 0, result.output
        return result.output

    assert EMPTY_THOUGHT in check(thinking_model)
    plain = check(tiny_model_dir)
    assert "note: --chat-template-kwargs enable_thinking changes nothing in" in plain
    assert "check the name against the template" in plain


@pytest.mark.parametrize("value, said", [
    ("not json", "--chat-template-kwargs is not valid JSON: Expecting value at line 1, column 1"),
    ("[1, 2]", "--chat-template-kwargs must be a JSON object of the template's variables, got list"),
])
def test_a_value_that_is_not_a_json_object_is_refused(tmp_path, monkeypatch, value, said):
    monkeypatch.chdir(tmp_path)
    refused(["grpo", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--output-dir", "run",
             "--chat-template-kwargs", value], tmp_path, said)
    assert json.loads(json.dumps(value)) == value  # the value is echoed nowhere else: nothing was written
