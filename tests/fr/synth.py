"""Build small synthetic dumps (the shape PyTorch writes) for analysis unit tests."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

T0 = 1_700_000_000_000_000_000


def entry(
    pg: str,
    seq: int,
    op: str = "all_reduce",
    *,
    desc: str = "",
    size: int = 64,
    out: list[list[int]] | None = None,
    dtype: str = "Float",
    done: bool = True,
    t_ms: float = 0.0,
    record: int = 0,
) -> dict[str, Any]:
    return {
        "record_id": record,
        "pg_id": int(pg) if pg.isdigit() else 0,
        "process_group": (pg, desc),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": T0 + int(t_ms * 1e6),
        "input_sizes": [[size]],
        "input_dtypes": [dtype],
        "output_sizes": out if out is not None else [[size]],
        "output_dtypes": [dtype],
        "state": "completed" if done else "started",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": done,
        "timeout_ms": 600000,
        "is_p2p": False,
    }


def write(
    folder: Path, rank: int, entries: list[dict[str, Any]], *, as_json: bool = False, version: str = "2.4"
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, e in enumerate(entries):
        e["record_id"] = i
    dump = {"version": version, "pg_config": {}, "pg_status": {}, "entries": entries}
    if as_json:
        path = folder / f"nccl_trace_rank_{rank}.json"
        path.write_text(json.dumps(dump))
    else:
        path = folder / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(dump, protocol=2))
    return path
