"""Which agent instance a host's stream comes from: a new instance starts the host's dedup window over.

The aggregator drops a batch whose (host, seq) it has applied. An agent whose state directory was wiped
(a reinstall, configuration management, an ephemeral container) numbers its batches from 0 again; on a
new boot the boot id says so (:meth:`~sentinel.aggregator.state.HostView.restart_numbering`), on the same
boot only the agent instance id does (``Hello.instance_id``, made with the state directory). Without it the
new instance's batches were acked as duplicates of the old numbering and dropped, an Xid 79 among them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sentinel.log import get_logger
from sentinel.wire import Hello

if TYPE_CHECKING:
    from sentinel.aggregator.state import HostView


def log() -> Any:
    """The module's logger, bound at use so that the level set by ``setup_logging`` later applies."""
    return get_logger(module="aggregator.streams")


def adopt_instance(host: HostView, hello: Hello) -> bool:
    """Take ``hello``'s agent instance for ``host``; True when the dedup window changed (to be persisted).

    Another instance than the one the window's numbering belongs to: the window starts over just below
    ``hello.next_seq`` (the first seq the new instance sends), logged as ``agent_instance_changed``. A Hello
    without an instance id (an older agent) changes nothing.
    """
    new = hello.instance_id
    if not new or new == host.instance_id:
        return False
    if host.instance_id:
        log().warning(
            "agent_instance_changed",
            host=host.name,
            old=host.instance_id,
            new=new,
            seq_hw=host.seq_hw,
            next_seq=hello.next_seq,
            detail="the agent's state directory was replaced: its seqs start over, the dedup window too",
        )
        host.seq_hw = max(hello.next_seq, 0) - 1
        host.seq_above = set()
    host.instance_id = new
    return True
