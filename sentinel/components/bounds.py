"""Hard bounds the decoder enforces while it validates a frame, shared by ``sentinel.wire`` and the
components' records (which ``wire`` imports, so they cannot import ``wire``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

MAX_LIST = 256  # throttle reasons, NVLinks, pids of one GPU, an event's fields
MAX_SHORT_CHARS = 512  # a name, code, path or reason; the agent cuts what it sends to this
Short = Annotated[str, msgspec.Meta(max_length=MAX_SHORT_CHARS)]
