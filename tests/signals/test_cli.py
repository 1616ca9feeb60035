"""``sentinel logs classify`` as a user runs it: files, stdin, gzip, --all, --records, bad input."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.cli import main

XID = "[ 5107.644336] NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus."
CHATTER = "node08:6561:6561 [0] NCCL INFO Connected all trees"
WARN = "node08:6561:6562 [0] include/socket.h:403 NCCL WARN Net : Connection closed by remote peer 10.0.0.9<33411>"


def _run(args: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "logs", "classify", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def _objects(stdout: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.decode().splitlines()]


def test_raw_file_and_gzip_by_magic(tmp_path: Path) -> None:
    text = "\n".join([CHATTER, XID, CHATTER, WARN, CHATTER]) + "\n"
    plain = tmp_path / "kern.log"
    plain.write_text(text)
    packed = tmp_path / "no-gz-suffix.log"
    packed.write_bytes(gzip.compress(text.encode()))
    result = _run([str(plain), str(packed)])
    assert result.returncode == 0, result.stderr
    objects = _objects(result.stdout)
    assert [(o["kind"], o["line"]) for o in objects] == [("xid", 2), ("nccl_warn_net", 4)] * 2
    for obj in objects:
        assert {"kind", "severity", "xid", "pci_bus", "rank", "seq", "op", "timeout_ms"} <= obj.keys()


def test_stdin_dash_all_and_invalid_utf8() -> None:
    data = (CHATTER + "\n\xff\xfe garbage \x80\n" + XID + "\n").encode("latin-1")
    quiet = _run(["-"], stdin=data)
    assert quiet.returncode == 0
    assert [o["kind"] for o in _objects(quiet.stdout)] == ["xid"]
    loud = _run(["--all"], stdin=data)
    assert loud.returncode == 0
    assert [o["kind"] for o in _objects(loud.stdout)] == ["nccl_info", "other", "xid"]


def test_records_one_object_per_record_in_order(tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    lines = [{"text": XID}, {"text": CHATTER, "source": "x"}, {"text": "hello"}, {"text": WARN}]
    records.write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    result = _run(["--records", str(records)])
    assert result.returncode == 0, result.stderr
    assert [o["kind"] for o in _objects(result.stdout)] == ["xid", "nccl_info", "other", "nccl_warn_net"]


@pytest.mark.parametrize(
    ("args", "stdin", "needle"),
    [
        (["/nonexistent/file.log"], b"", "cannot open"),
        (["--records", "-"], b"not json\n", "not a JSON object"),
        (["--records", "-"], b'{"txt": "x"}\n', "bad record"),
        (["--records", "-"], b'{"text": 5}\n', "bad record"),
        (["-"], b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage", "cannot read"),
        (["--records", "x.jsonl", "also.log"], b"", "not both"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], stdin: bytes, needle: str) -> None:
    result = _run(args, stdin=stdin)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_directory_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", "classify", str(tmp_path)]) == 2
    assert "cannot open" in capsys.readouterr().err
