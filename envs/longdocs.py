"""A long-horizon environment: collect codes from a document store whose pages are too long to keep.

Each task names `documents` documents (10 by default) of a store of 26. `read_document(name)` returns the
document's page: `page_words` words of routine notes with, somewhere in the middle, one line "The code of
document NAME is NUMBER." The episode ends with the first turn without a tool call, which should list
`NAME = NUMBER` for every document; the score is the share of codes right.

The whole history does not fit a small context: ten pages of about 300 words are several thousand tokens.
Under `--rl-context keep` an episode in a 2,048-token window stops with `context` before it has read them
all. It is solvable only by keeping what matters: under `--rl-context drop-tool-results` (older pages
become a stub) an agent that writes each code into its own turn (`NOTE NAME = NUMBER`, which stays in its
context) answers from its notes. That is what `solve` does, reading nothing but the conversation, so it
plays the same whether a page is still there or already dropped (`next_message` works on any text of
the conversation: the messages joined, or the rendered prompt). Cutting pages to their head and tail
(`--rl-max-tool-result-tokens`) loses the code, which sits in the middle.

    aitrain env check --rl-env-module envs.longdocs --rl-env-class LongDocsEnv
    aitrain grpo --model smollm2 --rl-env-module envs.longdocs --rl-env-class LongDocsEnv \\
        --rl-context drop-tool-results --rl-context-keep-last 1 --rl-context-window 2048 \\
        --rl-max-completion-length 1536 --rl-max-new-tokens 96

Left out: a search tool (the task names the documents), and distractor codes.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from aitrain_grpo import Episode, ToolEnvironment, tool

NAMES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett", "kilo", "lima",
         "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
         "xray", "yankee", "zulu")
FILLER = (
    "The archive entry continues with routine notes about shipments and storage.",
    "Staff recorded the weather, the number of visitors and the state of the reading room.",
    "A later hand added remarks on repairs to the shelves and the lighting.",
    "Several pages list supplies ordered for the winter and their prices.",
    "The clerk copied an earlier inventory, with corrections in the margin.",
    "Letters from the regional office are summarised without comment.",
    "Minutes of a meeting follow, mostly about opening hours and cleaning.",
    "There is a long description of the old catalogue and why it was replaced.",
)
SYSTEM_PROMPT = (
    "You collect codes from a document store. Read each listed document with read_document. Every page is "
    "long and holds one line 'The code of document NAME is NUMBER.' Older pages are removed from your context "
    "as you go, so whenever you find a code, write it at the start of your next message as NOTE NAME = NUMBER, "
    "then make your next call. When you have every code, answer without a tool call, one line per document: "
    "NAME = NUMBER."
)
TASK = "Find the codes of these documents: {names}."
_TASK = re.compile(r"codes of these documents: ([a-z, ]+)\.")
_PAGE_CODE = re.compile(r"The code of document ([a-z]+) is (\d+)\.")
_NOTE = re.compile(r"NOTE ([a-z]+) = (\d+)")
_ANSWER = re.compile(r"\b([a-z]+)\s*=\s*(\d+)")
_NOTE_LINE = re.compile(r"^\s*NOTE [a-z]+ = \d+\s*$", re.MULTILINE)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class LongDocsEnv(ToolEnvironment):
    """Read `documents` long pages and report the code each holds (see the module docstring)."""

    def __init__(self, num_tasks: int = 64, seed: int = 0, documents: int = 10, page_words: int = 300):
        for name, value, low, high in (("num_tasks", num_tasks, 1, 100_000), ("documents", documents, 1, len(NAMES)),
                                       ("page_words", page_words, 20, 20_000)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer from {low} to {high}, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.num_tasks, self.documents = num_tasks, documents
        self.max_turns = documents + 2  # a read per document, the answer, and one turn to spare
        rng = random.Random(seed)
        self.codes = {name: rng.randrange(1000, 10000) for name in NAMES}
        self.pages = {name: self._page(rng, name, page_words) for name in NAMES}
        self.tasks = [rng.sample(NAMES, documents) for _ in range(num_tasks)]

    def _page(self, rng: random.Random, name: str, words: int) -> str:
        sentences: list[str] = []
        while sum(len(s.split()) for s in sentences) < words:
            sentences.append(rng.choice(FILLER))
        middle = len(sentences) // 2 + rng.randrange(-1, 2)
        sentences.insert(max(middle, 1), f"The code of document {name} is {self.codes[name]}.")
        return f"Document {name}.\n" + " ".join(sentences)

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        return [{"prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": TASK.format(names=", ".join(names))}],
                 "task_id": i, "documents": ", ".join(names)} for i, names in enumerate(self.tasks)]

    def reset(self, episode: Episode) -> None:
        episode.state["read"] = []

    @tool
    def read_document(self, episode: Episode, name: str) -> str:
        """Read one document of the store: its whole page.

        Args:
            name: The document's name, e.g. "alpha".
        """
        page = self.pages.get(name.strip().lower())
        if page is None:
            raise ValueError(f"no document {name!r}; the names are NATO letters, e.g. alpha")
        episode.state["read"].append(name.strip().lower())
        return page

    def score_episode(self, episode: Episode) -> float:
        wanted = episode.row["documents"].split(", ")
        # The answer is the lines of the last turn that are not notes: a turn cut by a budget before its
        # call was written, holding only `NOTE name = code`, answers nothing.
        text = _NOTE_LINE.sub("", episode.last_completion)
        answer = dict(_ANSWER.findall(text)) if not episode.tool_calls else {}
        right = sum(answer.get(name) == str(self.codes[name]) for name in wanted)
        episode.metrics.update(documents_read=len(set(episode.state.get("read", [])) & set(wanted)),
                               codes_right=right)
        return right / len(wanted)

    def solve(self, episode: Episode) -> str:
        """An expert's next message, from the conversation alone (see `next_message`); asked for a summary
        (`--rl-context summarize`), the codes found so far as notes and what is left to read."""
        text = "\n".join(str(m.get("content") or "") for m in episode.messages)
        if episode.log.summarizing:
            return self.summary(text)
        return self.next_message(text)

    @staticmethod
    def summary(text: str) -> str:
        """A summary of the conversation's text: one note per code found (a page in view counts), then the
        documents still to read; `next_message` goes on from it."""
        wanted = _TASK.search(text).group(1).split(", ")
        noted = {**dict(_PAGE_CODE.findall(text)), **dict(_NOTE.findall(text))}
        lines = [f"NOTE {name} = {noted[name]}" for name in wanted if name in noted]
        unread = [name for name in wanted if name not in noted]
        return "\n".join(lines + [f"Still to read: {', '.join(unread)}." if unread else "Every code is noted."])

    @staticmethod
    def next_message(text: str) -> str:
        """The expert's next message given the conversation's text: note the code of the latest page, then
        read the next document not yet noted, or answer from the notes once every code is noted."""
        wanted = _TASK.search(text).group(1).split(", ")
        noted = dict(_NOTE.findall(text))
        pages = _PAGE_CODE.findall(text)
        note = ""
        if pages and pages[-1][0] not in noted:
            name, code = pages[-1]
            noted[name], note = code, f"NOTE {name} = {code}\n"
        unread = [name for name in wanted if name not in noted]
        if unread:
            return note + tool_call_text("read_document", {"name": unread[0]})
        return note + "\n".join(f"{name} = {noted[name]}" for name in wanted)
