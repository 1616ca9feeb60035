"""Configuration: good files load, every kind of bad file gets a precise one-line message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.config import DAEMONS, AgentConfig, AggregatorConfig, ConfigError, load_config
from sentinel.config.loader import env_name, iter_leaf_paths
from tests.support import REPO


def _write(tmp_path: Path, text: str, name: str = "agent.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _load_agent(path: Path, env: dict[str, str] | None = None) -> AgentConfig:
    return load_config(AgentConfig, path, env_prefix="SENTINEL_AGENT", env=env or {}, missing_ok=False)


def test_good_file_overrides_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, '[collect]\ntick_s = 0.5\n[agent]\nhost = "gpu-17"\n')
    config = _load_agent(path)
    assert config.collect.tick_s == 0.5
    assert config.agent.host == "gpu-17"
    assert config.stream == AgentConfig().stream  # untouched sections keep their defaults


def test_absent_default_file_means_defaults(tmp_path: Path) -> None:
    config = load_config(AgentConfig, tmp_path / "none.toml", env_prefix="SENTINEL_AGENT", env={})
    assert config == AgentConfig()


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"none\.toml: no such file"):
        _load_agent(tmp_path / "none.toml")


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[collect]\ntick_z = 1\n", "collect.tick_z", "unknown key"),
        ("bogus = 1\n", "bogus", "unknown key"),
        ('[collect]\ntick_s = "fast"\n', "collect.tick_s", "expected float, got str"),
        ("[collect]\ntick_s = 0\n", "collect.tick_s", "expected float >= 0.05"),
        ("[stream]\nspool_max_bytes = -1\n", "stream.spool_max_bytes", "expected int >= 0"),
        ('[log]\nlevel = "loud"\n', "log.level", "invalid enum value 'loud'"),
        ("collect = 3\n", "collect", "expected object, got int"),
    ],
)
def test_bad_values_name_file_key_and_problem(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        _load_agent(path)
    assert info.value.key == key
    assert problem in info.value.problem
    assert str(info.value).startswith(f"{path}: {key}: ")
    assert "\n" not in str(info.value)


def test_invalid_toml_names_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[collect\n")
    with pytest.raises(ConfigError, match=r"invalid TOML: .*line 1"):
        _load_agent(path)


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(b"x = '\xff'\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        _load_agent(path)


def test_environment_overrides_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "[collect]\ntick_s = 0.5\n")
    config = _load_agent(
        path, env={"SENTINEL_AGENT_COLLECT__TICK_S": "2", "SENTINEL_AGENT_AGENT__HOST": "h1"}
    )
    assert config.collect.tick_s == 2.0
    assert config.agent.host == "h1"


def test_bad_environment_value_is_reported(tmp_path: Path) -> None:
    path = _write(tmp_path, "")
    with pytest.raises(ConfigError, match=r"collect\.tick_s: expected float"):
        _load_agent(path, env={"SENTINEL_AGENT_COLLECT__TICK_S": "soon"})


@pytest.mark.parametrize("spec", list(DAEMONS.values()), ids=lambda s: s.name)
def test_every_key_has_a_default_and_an_env_name(spec: object) -> None:
    from sentinel.config import DaemonConfigSpec

    assert isinstance(spec, DaemonConfigSpec)
    default = msgspec.convert({}, spec.struct)  # every key has a default
    paths = [path for path, _ in iter_leaf_paths(spec.struct)]
    assert paths, "config has keys"
    names = {env_name(spec.env_prefix, path) for path in paths}
    assert len(names) == len(paths)  # env names are unambiguous
    assert default is not None


@pytest.mark.parametrize("name", ["agent.toml", "aggregator.toml"])
def test_examples_are_valid(name: str) -> None:
    example = REPO / "examples" / name
    if not example.exists():
        pytest.skip(f"examples/{name} not written yet")
    spec = DAEMONS[name.removesuffix(".toml")]
    config = load_config(spec.struct, example, env_prefix=spec.env_prefix, env={}, missing_ok=False)
    assert isinstance(config, AgentConfig | AggregatorConfig)


def test_configuration_doc_is_current() -> None:
    from sentinel.cli.cmd_config import render_docs

    doc = REPO / "docs" / "configuration.md"
    assert doc.read_text() == render_docs(), "docs/configuration.md is stale: run `sentinel config docs`"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_never_escape_as_anything_but_config_error(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "agent.toml"
    path.write_bytes(data)
    try:
        _load_agent(path)
    except ConfigError as exc:
        assert "\n" not in str(exc).strip() or "invalid TOML" in str(exc)


def test_cli_check_accepts_good_and_rejects_bad(tmp_path: Path) -> None:
    good = _write(tmp_path, "[collect]\ntick_s = 1.5\n", "agent.toml")
    bad = _write(tmp_path, "[server]\nlisten_port = 70000\n", "aggregator.toml")
    ok = subprocess.run(
        [sys.executable, "-m", "sentinel", "config", "check", str(good)], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert "ok" in ok.stdout
    fail = subprocess.run(
        [sys.executable, "-m", "sentinel", "config", "check", str(bad)], capture_output=True, text=True
    )
    assert fail.returncode == 2
    assert fail.stderr.strip() == f"error: {bad}: server.listen_port: expected int <= 65535"
    assert "Traceback" not in fail.stderr


def _check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "config", "check", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def test_config_check_of_a_device_a_fifo_or_a_huge_file_is_a_one_line_error(tmp_path: Path) -> None:
    """`config check /dev/zero` once grew to 4.6 GB; a FIFO blocked for ever; deep TOML raised RecursionError."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    deep = _write(tmp_path, "a = " + "[" * 50000 + "]" * 50000 + "\n", "deep.toml")
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"# " + b"x" * (2 * 1024 * 1024) + b"\n")
    for path, problem in (
        (Path("/dev/zero"), "is a device, not a regular file"),
        (fifo, "is a FIFO, not a regular file"),
        (deep, "invalid TOML: nested too deeply"),
        (huge, "larger than 1048576 bytes"),
        (tmp_path, "is a directory, not a regular file"),
    ):
        result = _check(str(path))
        assert result.returncode == 2
        assert result.stderr.strip() == f"error: {path}: {problem}", result.stderr
        assert "Traceback" not in result.stderr


def test_misspelled_environment_override_is_reported_with_a_suggestion(tmp_path: Path) -> None:
    good = _write(tmp_path, "[collect]\ntick_s = 1.5\n", "agent.toml")
    result = _check(str(good), env={"SENTINEL_AGENT_COLECT__TICK_S": "0.5"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: SENTINEL_AGENT_COLECT__TICK_S: unknown override: no such key "
        "(did you mean SENTINEL_AGENT_COLLECT__TICK_S?)"
    )
    with pytest.raises(ConfigError, match="unknown override"):
        _load_agent(good, env={"SENTINEL_AGENT_NONSENSE": "1"})


def test_checking_the_other_daemons_file_says_which_daemon_it_is_for(tmp_path: Path) -> None:
    aggregator = _write(tmp_path, "[server]\nlisten_port = 9400\n[fleet]\ncluster = 'a'\n", "site.toml")
    result = _check("--daemon", "agent", str(aggregator))
    assert result.returncode == 2
    assert "looks like the aggregator's configuration" in result.stderr
    assert f"sentinel config check --daemon aggregator {aggregator}" in result.stderr
    agent = _write(tmp_path, "[collect]\ntick_s = 1.0\n", "node.toml")
    assert "looks like the agent's configuration" in _check("--daemon", "aggregator", str(agent)).stderr
