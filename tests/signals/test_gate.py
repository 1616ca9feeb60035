"""The gate's two engines agree, the gate loses no event, and the scanner is classify_line on every line.

The scanner only classifies lines the gate lets through, and classify_line starts with the same gate test,
so the scanner's output is classify_line's whichever engine runs. What must hold for that to be true, and
for raw mode to agree with --records mode, is checked here on the whole public corpus and the evaluation
set: both engines find the same lines, and no line that classifies as more than noise lacks a gate
literal.
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.signals import classify_line, classify_text, is_noise, scan_bytes
from sentinel.signals.gate import GATE_LITERALS, Gate, PythonGate, load_gate
from tests.support import corpus_path

EVAL = Path(__file__).resolve().parent.parent / "data" / "logs_eval" / "eval_lines.jsonl"
EXTRA = EVAL.with_name("extra_real_lines.jsonl")
THIRD = EVAL.with_name("third_real_lines.jsonl")
UNSEEN = EVAL.with_name("unseen_lines.jsonl")


def _texts() -> list[str]:
    texts = []
    for path in (corpus_path("logs", "real_lines.jsonl"), EVAL, EXTRA, THIRD, UNSEEN):
        for raw in path.read_text(encoding="utf-8").splitlines():
            if raw.strip():
                texts.append(json.loads(raw)["text"])
    return texts


def _lines() -> list[str]:
    return [line for text in _texts() for line in text.splitlines() if line.strip()]


def _engines() -> list[Gate]:
    engines: list[Gate] = [PythonGate()]
    # Without hyperscan installed the fallback is still checked against itself.
    with contextlib.suppress(Exception):
        engines.append(load_gate("hyperscan"))
    return engines


def test_hyperscan_is_installed_where_ci_runs() -> None:
    """pyproject's dev extra installs it; without it the fast path is not what runs."""
    pytest.importorskip("hyperscan")
    assert load_gate("auto").name == "hyperscan"


def test_engines_find_the_same_lines_on_corpus_and_eval_set() -> None:
    rng = random.Random(7)
    lines = _lines() * 3
    rng.shuffle(lines)
    body = ("\n".join(lines) + "\n").encode()
    results = {gate.name: gate.line_starts(body, 0, len(body)) for gate in _engines()}
    assert len({tuple(starts) for starts in results.values()}) == 1, {k: len(v) for k, v in results.items()}
    assert next(iter(results.values())), "the corpus has lines the gate lets through"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([lit.decode() for lit in GATE_LITERALS] + ["NCCL INFO", "\n", " ", "X"]),
            st.text(alphabet=st.characters(max_codepoint=0x2FF), max_size=12),
        ),
        max_size=60,
    )
)
def test_engines_agree_on_arbitrary_text(parts: list[str]) -> None:
    data = "".join(parts).encode("utf-8", "surrogateescape") + b"\n"
    results = {tuple(gate.line_starts(data, 0, len(data))) for gate in _engines()}
    assert len(results) == 1
    lines = data.split(b"\n")[:-1]
    for gate in _engines():
        assert [gate.has_match(line) for line in lines] == [PythonGate().has_match(line) for line in lines]


def test_no_line_with_a_signal_lacks_a_gate_literal() -> None:
    """Raw mode (gated) and --records mode (not gated) agree on every corpus and eval line."""
    missing = []
    for line in _lines():
        full = classify_text(line)
        if is_noise(full):
            continue
        gated = classify_line(line)
        if gated is None or (gated.kind, gated.severity) != (full.kind, full.severity):
            missing.append(f"{full.kind}/{full.severity}: {line[:100]}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("engine", ["python", "hyperscan"])
def test_scanner_with_each_engine_is_classify_line_on_every_line(engine: str) -> None:
    if engine == "hyperscan":
        pytest.importorskip("hyperscan")
    gate = load_gate(engine)
    rng = random.Random(3)
    singles = [line for line in _lines() if "|" not in line[:1]]
    chatter = ["node1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via P2P/IPC", "step 10 loss 1.23"]
    lines = [rng.choice(singles) if rng.random() < 0.3 else rng.choice(chatter) for _ in range(4000)]
    data = ("\n".join(lines) + "\n").encode()
    got = [(e.line, e.kind, e.severity, e.xid) for e in scan_bytes(data, gate=gate)]
    python = [(e.line, e.kind, e.severity, e.xid) for e in scan_bytes(data, gate=PythonGate())]
    assert got == python
    assert got, "the mixed log has events"
