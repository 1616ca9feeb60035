"""The command tree: every command documents its options; unimplemented ones refuse to run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.cli import COMMANDS, _load_registrar, build_parser, main
from sentinel.cli.cmd_fr import parse_fast


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sentinel", *args], capture_output=True, text=True, timeout=60
    )


def test_top_level_help_lists_every_command() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for command, _ in COMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("command", [name for name, _ in COMMANDS])
def test_each_command_has_help(command: str) -> None:
    result = _run(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: sentinel" in result.stdout


def test_every_option_has_help_text() -> None:
    import argparse

    def walk(parser: argparse.ArgumentParser, where: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{where} {name}")
            elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
                assert action.help, f"option {action.dest} of '{where}' has no help text"

    walk(build_parser(), "sentinel")


def test_unimplemented_commands_refuse_to_run(capsys: pytest.CaptureFixture[str]) -> None:
    missing = [name for name, _ in COMMANDS if _load_registrar(name) is None]
    for name in missing:
        assert main([name]) == 2
        assert "not available" in capsys.readouterr().err


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: sentinel" in capsys.readouterr().out


def test_help_texts_have_no_rest_markup_and_name_only_documents_in_the_repository() -> None:
    import argparse
    import re

    from tests.support import REPO

    texts: list[tuple[str, str]] = []

    def walk(parser: argparse.ArgumentParser, where: str) -> None:
        texts.append((where, parser.format_help()))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{where} {name}")

    walk(build_parser(), "sentinel")
    assert len(texts) > 20
    for where, text in texts:
        assert "``" not in text and not re.search(r":(class|func|meth|mod):`", text), (
            f"'{where} --help': reST markup"
        )
        assert "contract" not in text.lower(), f"'{where} --help' points at the contracts document"
        for document in re.findall(
            r"\b(?:docs|examples|rules|systemd)/[\w./-]+\.(?:md|toml|yml|service)", text
        ):
            assert (REPO / document).is_file(), f"'{where} --help' names {document}, not in the repository"


_FR_TOKENS = st.sampled_from(
    ["d", "a/b/", "./x//", "", " ", "-", "--", "-x", " -x", "--json", "--json=1", "--js", "--all-entries",
     "--all", "--workers", "--workers=2", "--workers=", "--workers=-1", "2", "-1", "0", "x", "1.5", "٣",
     "--progress-after", "--progress-after=0.5", "0.25", "nan", "-h", "--help", "analyze"]
)  # fmt: skip


@given(st.lists(_FR_TOKENS, max_size=7))
def test_fr_analyze_reads_its_plain_arguments_as_argparse_does(tokens: list[str]) -> None:
    """``parse_fast`` answers only what argparse answers the same way (the same values), else None."""
    fast = parse_fast(["analyze", *tokens])
    if fast is None:
        return
    args = build_parser(only="fr").parse_args(["fr", "analyze", *tokens])
    assert vars(fast) == vars(args)


def test_fr_analyze_plain_arguments_are_read_without_argparse() -> None:
    fast = parse_fast(["analyze", "--workers", "3", "d//", "--json", "--progress-after=2"])
    assert fast is not None
    assert (fast.dir, fast.workers, fast.json, fast.all_entries, fast.progress_after) == (
        "d",
        3,
        True,
        False,
        2.0,
    )
    for other in (
        ["analyze"],
        ["analyze", "d", "e"],
        ["analyze", "d", "--js"],
        ["analyze", "d", "-h"],
        ["x", "d"],
    ):
        assert parse_fast(other) is None


@pytest.mark.parametrize("spelling", [["--workers", "-1"], ["--workers=-1"], ["--workers", "x"]])
def test_fr_analyze_refuses_a_negative_worker_count(spelling: list[str], tmp_path: object) -> None:
    """``--workers`` is 0 (decode in this process) or more; -1 used to run with one worker unasked."""
    proc = _run("fr", "analyze", str(tmp_path), *spelling)
    assert proc.returncode == 2
    assert "argument --workers: invalid" in proc.stderr
    assert parse_fast(["analyze", str(tmp_path), *spelling]) is None
