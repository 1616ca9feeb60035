"""Hard bounds the decoder enforces while it validates a frame, shared by ``sentinel.wire`` and the
components' records (which ``wire`` imports, so they cannot import ``wire``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

MAX_LIST = 256  # throttle reasons, NVLinks, pids of one GPU, an event's fields
Short = Annotated[str, msgspec.Meta(max_length=512)]
