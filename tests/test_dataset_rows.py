"""Dataset rows as `build_dataset` returns them: plain dicts out, and a one-line message naming the row
and the problem for each mistake (split from test_loading.py)."""

from __future__ import annotations

import datasets
import pytest

from aitrain_grpo.env.base import Environment
from aitrain_grpo.env.dataset import build_rows, validate_dataset
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.errors import EnvLoadError
from helpers import FIXTURES_DIR, one_line

pytestmark = pytest.mark.usefixtures("isolated_imports")


def test_dataset_and_lists_become_plain_dicts():
    ds = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}], "x": 1}])
    assert validate_dataset(ds) == [{"prompt": [{"role": "user", "content": "hi"}], "x": 1}]
    rows = [{"prompt": "a"}]
    out = validate_dataset(rows)
    out[0]["extra"] = 1
    assert rows == [{"prompt": "a"}]  # the environment's own rows are untouched
    assert validate_dataset(r for r in rows) == [{"prompt": "a"}]


def test_assistant_tool_call_message_may_have_no_content():
    call = {"name": "f", "arguments": "{}"}
    prompt = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "content": "r"}]
    assert validate_dataset([{"prompt": prompt}])[0]["prompt"] == prompt


@pytest.mark.parametrize("rows, expected", [
    (None, "build_dataset returned NoneType; return a list of dicts or a datasets.Dataset (is a `return`"),
    (42, "build_dataset returned int;"),
    ("prompt", "build_dataset returned str;"),
    ({"prompt": ["a", "b"]}, "build_dataset returned dict, a mapping, not a list of rows"),
    ([], "build_dataset returned no rows"),
    ([{"prompt": "a"}, "b"], "row 1 from build_dataset is a str, not a dict"),
    ([{"prompt": "a"}, {"question": "q", "answer": 1}], 
     "row 1 from build_dataset has no 'prompt' (columns: question, answer)"),
    ([{"prompt": " "}], "row 0 from build_dataset has an empty 'prompt' string"),
    ([{"prompt": []}], "row 0 from build_dataset has an empty 'prompt' list"),
    ([{"prompt": 5}], "row 0 from build_dataset has a 'prompt' of type int"),
    ([{"prompt": ["hi"]}], "row 0 from build_dataset: prompt message 0 is a str, not a dict"),
    ([{"prompt": [{"content": "hi"}]}], 
     "prompt message 0 has no 'role'; roles must be one of system, user, assistant, tool"),
    ([{"prompt": [{"role": "bot", "content": "hi"}]}], "prompt message 0 has role 'bot'; roles must be one of"),
    ([{"prompt": [{"role": "user", "content": 3}]}], "prompt message 0 (user) has 'content' of type int"),
    ([{"prompt": "a"}, {"prompt": [{"role": "user"}]}], 
     "row 1 from build_dataset: prompt message 0 (user) has no 'content'"),
    ([{"prompt": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "The answer is"}]}],
     "row 0 from build_dataset: the prompt ends with an assistant message, which would be sent as a finished turn"),
])
def test_bad_rows_name_the_row_and_the_problem(rows, expected):
    with pytest.raises(EnvLoadError) as info:
        validate_dataset(rows)
    assert expected in one_line(info)


def test_dataset_without_prompt_column_lists_columns():
    ds = datasets.Dataset.from_list([{"question": "q"}])
    with pytest.raises(EnvLoadError, match=r"without a 'prompt' column \(columns: question\)"):
        validate_dataset(ds)


def test_dataset_dict_asks_for_one_split():
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a"}])})
    with pytest.raises(EnvLoadError, match=r"pick one split, e.g. ds\['train'\]"):
        validate_dataset(dd)


def test_build_rows_returns_validated_rows():
    env = load_environment("envs_fixtures.good", "GoodEnv", '{"num_tasks": 2}')
    rows = build_rows(env, tokenizer=None)
    assert [r["answer"] for r in rows] == [0, 1] and rows[0]["prompt"][0]["content"] == "Task 0"


def test_a_build_dataset_without_the_tokenizer_is_called_without_it():
    class NoTokenizer(Environment):
        def build_dataset(self):
            return [{"prompt": "Say hi."}]

    class KeywordTokenizer(Environment):
        def build_dataset(self, *, tokenizer=None):
            return [{"prompt": f"tokenizer given: {tokenizer}"}]

    assert build_rows(NoTokenizer(), tokenizer="tok")[0]["prompt"] == "Say hi."
    assert build_rows(KeywordTokenizer(), tokenizer="tok")[0]["prompt"] == "tokenizer given: None"


def test_build_rows_reports_exception_in_build_dataset():
    env = load_environment("envs_fixtures.ctor_raises", "CtorRaisesEnv")
    with pytest.raises(EnvLoadError) as info:
        build_rows(env, tokenizer=None)
    message = one_line(info)
    assert message.startswith("build_dataset of CtorRaisesEnv raised KeyError: 'missing_column'")
    assert f"{FIXTURES_DIR / 'ctor_raises.py'}:13" in message


def test_build_rows_names_the_class_when_rows_are_wrong():
    class NoReturnEnv(Environment):
        def build_dataset(self, tokenizer):
            [{"prompt": "forgot to return"}]

    with pytest.raises(EnvLoadError, match=r"NoReturnEnv.build_dataset returned NoneType"):
        build_rows(NoReturnEnv(), tokenizer=None)
