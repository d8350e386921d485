"""The cities of envs.weather and envs.stations, and their split into training and held-back cities.

`split_cities("train")` is 16 of CITIES; `split_cities("held_out")` is the other 4 (every fifth) and the
12 MORE_HELD_OUT cities, which only evaluation sees. The held-back split was the 4 alone at first; in
both environments one of them (Athens) no model solved, because SmolLM2 copies the prompt's example city
(Tokyo) there, so one city decided a quarter of every held-back number. An environment that draws a
value per city draws CITIES' first and MORE_HELD_OUT's after them, so adding the 12 changed no training
row and no value of the first 20: models trained before stay valid.
"""

from __future__ import annotations

CITIES = (
    "Lisbon", "Paris", "Berlin", "Madrid", "Rome", "Vienna", "Oslo", "Dublin", "Prague", "Athens",
    "Warsaw", "Zurich", "Brussels", "Stockholm", "Helsinki", "Budapest", "Porto", "Milan", "Munich", "Lyon",
)
MORE_HELD_OUT = ("Copenhagen", "Amsterdam", "Barcelona", "Edinburgh", "Krakow", "Seville", "Geneva", "Venice",
                 "Florence", "Tallinn", "Riga", "Vilnius")
HELD_OUT_EVERY = 5  # every fifth of CITIES is held back from training


def split_cities(split: str) -> list[str]:
    """The cities of `split` ("train" or "held_out"), in a fixed order."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
    held_out = split == "held_out"
    chosen = [c for i, c in enumerate(CITIES) if (i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1) == held_out]
    return chosen + list(MORE_HELD_OUT) if held_out else chosen
