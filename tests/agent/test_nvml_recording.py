"""The recording reader against hostile XML, and the replay against any nvidia-smi-shaped document
(hypothesis: generated trees of the mapping's elements with odd values), through the agent's own source."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from xml.sax.saxutils import escape

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.agent.nvml import NvmlSource
from sentinel.agent.nvml.recording import MAX_BYTES, RecordingError, load, parse
from sentinel.agent.nvml.replay import ERROR_TEXTS, MAPPING, ReplayLibrary
from sentinel.cli import main
from sentinel.components.nvml_read import GpuLostError, GpuSourceDown

LAUGHS = (
    b'<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [\n <!ENTITY a "ha">\n'
    + b"".join(f' <!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">\n'.encode() for i in range(9))
    + b"]>\n<nvidia_smi_log><driver_version>&j;</driver_version></nvidia_smi_log>\n"
)
EXTERNAL = (
    b'<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [ <!ENTITY x SYSTEM "file:///etc/passwd"> ]>\n'
    b"<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>\n"
)
PARAMETER = (
    b'<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [ <!ENTITY % p SYSTEM "http://example.invalid/x.dtd"> %p; ]>\n'
    b"<nvidia_smi_log/>\n"
)
UNDECLARED = (
    b'<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log SYSTEM "x.dtd">\n<nvidia_smi_log>&x;</nvidia_smi_log>'
)
DEEP = b"<nvidia_smi_log>" + b"<a>" * 1_000_000 + b"</a>" * 1_000_000 + b"</nvidia_smi_log>"
WIDE = b"<nvidia_smi_log>" + b"<gpu/>" * 300_000 + b"</nvidia_smi_log>"
LONG_TEXT = b"<nvidia_smi_log><driver_version>" + b"9" * 100_000 + b"</driver_version></nvidia_smi_log>"

HOSTILE: dict[str, tuple[bytes, str]] = {
    "billion-laughs": (LAUGHS, "internal subset refused"),
    "external-entity": (EXTERNAL, "internal subset refused"),
    "parameter-entity": (PARAMETER, "internal subset refused"),
    "undeclared-entity": (UNDECLARED, "entity"),
    "deep-nesting": (DEEP, "nested deeper than 32"),
    "many-elements": (WIDE, "more than 50000 elements"),
    "long-text": (LONG_TEXT, "more than 65536 characters"),
    "not-xml": (b"\x00\xff garbage", "not well-formed"),
    "empty": (b"", "not well-formed"),
    "other-root": (b"<html><body/></html>", "not <nvidia_smi_log>"),
    "too-many-gpus": (b"<nvidia_smi_log>" + b"<gpu/>" * 65 + b"</nvidia_smi_log>", "more than 64 <gpu>"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_xml_is_refused_in_bounded_time_and_memory(name: str) -> None:
    data, problem = HOSTILE[name]
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(RecordingError, match=problem):
            parse(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 20  # linear in the input, stopped at the first bound
    assert peak < 16 * 2**20 + 2 * len(data)  # never the expansion; the tree stops at its bounds


@pytest.mark.parametrize("name", ["billion-laughs", "external-entity", "deep-nesting", "not-xml"])
def test_the_command_refuses_with_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"{name}.xml"
    path.write_bytes(HOSTILE[name][0])
    assert main(["agent", "once", "--json", "--sysfs-root", str(tmp_path), "--nvml-replay", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: --nvml-replay: {path}: ")


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.xml"
    with path.open("wb") as handle:
        handle.write(b"<nvidia_smi_log>")
        handle.seek(MAX_BYTES + 10)  # sparse: the size is there, the bytes are never read past the bound
        handle.write(b"</nvidia_smi_log>")
    with pytest.raises(RecordingError, match=f"^{path}: larger than {MAX_BYTES} bytes$"):
        load(path)
    with pytest.raises(RecordingError, match="cannot read"):
        load(tmp_path / "missing.xml")


def test_nvidia_smis_own_doctype_is_accepted() -> None:
    root = parse(
        b'<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
        b'<nvidia_smi_log><driver_version>550.90.07</driver_version><gpu id="00000000:18:00.0">'
        b"<uuid>GPU-1</uuid></gpu></nvidia_smi_log>"
    )
    assert root.find("driver_version") is not None
    gpu = root.findall("gpu")[0]
    assert gpu.attrs == {"id": "00000000:18:00.0"}
    assert gpu.find("uuid") is not None and gpu.find("uuid").text == "GPU-1"  # type: ignore[union-attr]


@given(st.binary(max_size=2000))
def test_any_bytes_are_a_tree_or_one_line_refusal(data: bytes) -> None:
    try:
        parse(data)
    except RecordingError as exc:
        assert "\n" not in str(exc)


# -- structure-aware fuzz: nvidia-smi-shaped documents with odd values ------------------------------------

_LEAVES = sorted(
    {
        alternative
        for source in MAPPING
        for path in source.paths
        for alternative in path.split("+")
        if not path.startswith(("@", "gpu ", "processes/"))
        and source.function != "nvmlSystemGetDriverVersion"
    }
)
_VALUES = st.one_of(
    st.sampled_from(["N/A", "[N/A]", "", "Yes", "No", "Active", "Not Active", "P0", "P15", "Unknown", "16x"]),
    st.sampled_from(sorted(text.title() for text in ERROR_TEXTS)),
    st.integers(-(2**70), 2**70).map(str),
    st.tuples(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(["", " W", " MiB", " MHz", " C", " %", " us", " KB/s", " bank(s)"]),
    ).map(lambda t: f"{t[0]}{t[1]}"),
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40),
    st.sampled_from(
        ["Completed", "In Progress", "Not Started", "Success", "Full", "Degraded", "True", "False"]
    ),
    st.uuids().map(str),
)
_GPU = st.dictionaries(st.sampled_from(_LEAVES), _VALUES, max_size=40)
#: processes/process_info entries: (pid, type, used_memory)
_PROCESSES = st.lists(
    st.tuples(
        st.one_of(st.integers(-5, 2**40).map(str), _VALUES),
        st.sampled_from(["C", "G", "C+G", "", "N/A"]),
        _VALUES,
    ),
    max_size=3,
)


def _document(
    gpus: list[dict[str, str]], section_values: dict[str, str], processes: list[tuple[str, str, str]]
) -> bytes:
    out = ['<?xml version="1.0" ?>\n<nvidia_smi_log>\n<driver_version>550.90.07</driver_version>\n']
    for index, leaves in enumerate(gpus):
        tree: dict[str, object] = {}
        for path, text in leaves.items():
            node = tree
            parts = path.split("/")
            for part in parts[:-1]:
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    break
                node = child
            else:
                node.setdefault(parts[-1], text)
        for section, text in section_values.items():  # a section printed as one value
            tree[section] = text
        table = "".join(
            f"<process_info><pid>{escape(pid)}</pid><type>{escape(kind)}</type>"
            f"<used_memory>{escape(used)}</used_memory></process_info>"
            for pid, kind, used in processes
        )
        out.append(
            f'<gpu id="00000000:{0x18 + index:02X}:00.0">{_render(tree)}<processes>{table}</processes></gpu>\n'
        )
    out.append("</nvidia_smi_log>\n")
    return "".join(out).encode()


def _render(tree: dict[str, object]) -> str:
    return "".join(
        f"<{tag}>{_render(value) if isinstance(value, dict) else escape(str(value))}</{tag}>"
        for tag, value in tree.items()
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_GPU, max_size=3),
    st.dictionaries(
        st.sampled_from(["remapped_rows", "ecc_errors", "fabric", "retired_pages", "clocks"]),
        _VALUES,
        max_size=2,
    ),
    _PROCESSES,
)
def test_any_nvidia_smi_shaped_recording_is_read_by_the_agent(
    gpus: list[dict[str, str]], sections: dict[str, str], processes: list[tuple[str, str, str]]
) -> None:
    """Whatever the recording says, the agent's source opens it and reads every GPU: a value is read or
    the field is NOT_SUPPORTED / an NVML error; a recorded "GPU is lost" marks the GPU lost and only a
    recorded UNINITIALIZED or DRIVER_NOT_LOADED takes NVML as a whole down, as on a real host."""
    library = ReplayLibrary(parse(_document(gpus, sections, processes)))
    errors: list[tuple[str, str]] = []
    with library.installed():
        source = NvmlSource(on_error=lambda fn, err: errors.append((fn, err)))
        try:
            try:
                inventory = source.open()
            except GpuSourceDown as exc:  # a recorded identity field saying NVML itself is down
                assert "uninitialized" in str(exc).lower() or "driver not loaded" in str(exc).lower()
                return
            assert len(inventory) == len(gpus)
            for info in inventory:
                try:
                    sample = source.read_slow(info.index, 0.0)
                except GpuSourceDown as exc:
                    assert "uninitialized" in str(exc).lower() or "driver not loaded" in str(exc).lower()
                    continue
                except GpuLostError as exc:
                    assert "GPU is lost" in str(exc)
                    continue
                assert sample.gpu == info.index
                assert all(0 < pid < 2**32 for pid in sample.pids or [])
                if sample.pcie_link is not None and sample.pcie_link.width is not None:
                    assert 0 <= sample.pcie_link.width < 2**32
        finally:
            source.close()
    assert all(err != "exception" for _, err in errors)
