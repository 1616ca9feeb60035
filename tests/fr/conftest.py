"""Shared fixtures: the real corpus folders and their ground truth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support import corpus_path

SCENARIO_VERDICT = {
    "healthy": "healthy",
    "hang": "hang",
    "hang_cascade": "hang",
    "op_mismatch": "mismatch",
    "size_mismatch_crash": "crash",
    "straggler": "straggler",
}


def corpus_folders() -> list[Path]:
    root = corpus_path("flight_recorder")
    return sorted(p for p in root.iterdir() if (p / "ground_truth.json").exists())


def ground_truth(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "ground_truth.json").read_text())
    return data
