"""A classified line's reason travels on the wire as a :data:`~sentinel.components.vocab.ReasonCode`.

The aggregator decodes a batch in one pass and refuses it whole when a field does not fit its type, so a
classifier reason that is not a short snake_case code would cost the host its batch, not just the line.
"""

from __future__ import annotations

import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.components.vocab import ReasonCode
from sentinel.signals import classify_text
from tests.signals.test_eval import EVAL, THIRD
from tests.support import CORPUS


def _texts() -> list[str]:
    lines = (CORPUS / "logs" / "real_lines.jsonl").read_text(encoding="utf-8").splitlines()
    lines += EVAL.read_text(encoding="utf-8").splitlines()
    lines += THIRD.read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()]


def test_every_reason_on_the_real_lines_is_a_wire_reason_code() -> None:
    reasons = {r for r in (classify_text(t).reason for t in _texts()) if r is not None}
    assert len(reasons) > 20  # the corpus exercises many rules, not one
    for reason in reasons:
        assert msgspec.convert(reason, ReasonCode) == reason


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.sampled_from(_texts()).map(lambda t: t.upper()))
def test_any_line_gives_no_reason_or_a_reason_code(text: str) -> None:
    reason = classify_text(text).reason
    if reason is not None:
        assert msgspec.convert(reason, ReasonCode) == reason
