"""A scripted TextArena opponent: the lowest-numbered move the game lists (tests/test_adapter_textarena.py)."""

import re


def lowest_move(observation: str) -> str:
    listed = [line for line in observation.splitlines() if "Available Moves" in line]
    return min(re.findall(r"'(\[\d+\])'", listed[-1]), key=lambda move: int(move[1:-1]))
