"""A recorded ``nvidia-smi -q -x`` document read into a small element tree, refusing hostile XML.

The file is outside input: it is parsed by expat with every declaration refused (a DOCTYPE may name its
external DTD, as nvidia-smi's does, but may not carry an internal subset; no ENTITY, ELEMENT or ATTLIST is
accepted and no external entity is ever loaded), so entity expansion (billion laughs) and external entities
cannot happen. Size, nesting depth, element count and text per element are bounded; every refusal is a
:class:`RecordingError` whose message is one line naming the file and the problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from xml.parsers import expat

#: bytes of XML at most (an 8-GPU host's output is a few hundred KiB)
MAX_BYTES: Final = 16 * 1024 * 1024
#: element nesting at most (nvidia-smi nests about 6 deep)
MAX_DEPTH: Final = 32
#: elements at most (an 8-GPU host prints under 10,000 with its supported clocks; each costs a few hundred
#: bytes in the tree)
MAX_ELEMENTS: Final = 50_000
#: characters of text in one element at most
MAX_TEXT: Final = 64 * 1024
#: ``<gpu>`` elements at most
MAX_GPUS: Final = 64
_CHUNK: Final = 64 * 1024
ROOT_TAG: Final = "nvidia_smi_log"


class RecordingError(Exception):
    """The recording cannot be used; the message is one line: ``FILE: problem``."""


@dataclass(slots=True)
class Node:
    """One element: its tag, attributes, stripped text and children in document order."""

    tag: str
    attrs: dict[str, str] = field(default_factory=dict)
    children: list[Node] = field(default_factory=list)
    text: str = ""

    def find(self, path: str) -> Node | None:
        """The first element at ``a/b/c`` below this one, or None."""
        node: Node | None = self
        for part in path.split("/"):
            if node is None:
                return None
            node = next((c for c in node.children if c.tag == part), None)
        return node

    def findall(self, tag: str) -> list[Node]:
        return [c for c in self.children if c.tag == tag]


class _Builder:
    def __init__(self) -> None:
        self.stack: list[Node] = []
        self.texts: list[list[str]] = []
        self.sizes: list[int] = []
        self.root: Node | None = None
        self.elements = 0

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        self.elements += 1
        if self.elements > MAX_ELEMENTS:
            raise RecordingError(f"more than {MAX_ELEMENTS} elements")
        if len(self.stack) >= MAX_DEPTH:
            raise RecordingError(f"elements nested deeper than {MAX_DEPTH}")
        node = Node(tag, dict(attrs))
        if self.stack:
            self.stack[-1].children.append(node)
        elif self.root is None:
            self.root = node
        self.stack.append(node)
        self.texts.append([])
        self.sizes.append(0)

    def end(self, tag: str) -> None:
        node = self.stack.pop()
        node.text = "".join(self.texts.pop()).strip()
        self.sizes.pop()

    def data(self, text: str) -> None:
        if not self.texts:
            return
        self.texts[-1].append(text)
        self.sizes[-1] += len(text)
        if self.sizes[-1] > MAX_TEXT:
            raise RecordingError(f"an element <{self.stack[-1].tag}> holds more than {MAX_TEXT} characters")


def _refuse(what: str) -> RecordingError:
    return RecordingError(f"{what} refused (a recording carries no declarations)")


def parse(data: bytes) -> Node:
    """The document's root element; :class:`RecordingError` (without the file name) when refused."""
    if len(data) > MAX_BYTES:
        raise RecordingError(f"larger than {MAX_BYTES} bytes")
    builder = _Builder()
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)

    def doctype(name: str, sysid: str | None, pubid: str | None, has_internal_subset: int) -> None:
        if has_internal_subset:
            raise _refuse("a DOCTYPE with an internal subset")

    def entity(name: str, *_: object) -> None:
        raise _refuse(f"an ENTITY declaration ({name})")

    def declaration(name: str, *_: object) -> None:
        raise _refuse(f"a declaration ({name})")

    def external(*_: object) -> int:
        raise _refuse("an external entity")

    def skipped(name: str, is_parameter: int) -> None:
        raise RecordingError(f"undefined entity &{name};")

    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = entity
    parser.UnparsedEntityDeclHandler = entity
    parser.NotationDeclHandler = declaration
    parser.ElementDeclHandler = declaration
    parser.AttlistDeclHandler = declaration
    parser.ExternalEntityRefHandler = external
    parser.SkippedEntityHandler = skipped
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        for offset in range(0, len(data), _CHUNK):
            parser.Parse(data[offset : offset + _CHUNK], False)
        parser.Parse(b"", True)
    except expat.ExpatError as exc:
        raise RecordingError(
            f"not well-formed XML: {expat.ErrorString(exc.code)} at line {exc.lineno}"
        ) from None
    root = builder.root
    if root is None:
        raise RecordingError("no XML document")
    if root.tag != ROOT_TAG:
        raise RecordingError(
            f"the root element is <{root.tag[:40]}>, not <{ROOT_TAG}> (not nvidia-smi -q -x)"
        )
    if len(root.findall("gpu")) > MAX_GPUS:
        raise RecordingError(f"more than {MAX_GPUS} <gpu> elements")
    return root


def load(path: str | os.PathLike[str]) -> Node:
    """Read and parse ``path``; :class:`RecordingError` ``"FILE: problem"`` when it cannot be used."""
    where = str(path)
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise RecordingError(f"{where}: cannot read: {exc.strerror or exc}") from None
    try:
        return parse(data)
    except RecordingError as exc:
        raise RecordingError(f"{where}: {_one_line(str(exc))}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
