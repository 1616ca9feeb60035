"""The systemd units: `systemd-analyze verify` is clean, hardening stays within the agreed exposure, and the
units keep the properties deployments rely on (notify + watchdog, restart, state, users, devices)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sentinel.config import DAEMONS
from sentinel.config.loader import env_name, iter_leaf_paths
from tests.support import REPO, need_binary

SYSTEMD_DIR = REPO / "systemd"
UNITS = {
    "agent": SYSTEMD_DIR / "sentinel-agent.service",
    "aggregator": SYSTEMD_DIR / "sentinel-aggregator.service",
}
MAX_EXPOSURE = {"agent": 4.0, "aggregator": 2.0}
INSTALLED_BINARY = "/opt/sentinel/bin/sentinel"
EXPOSURE = re.compile(r"Overall exposure level for \S+: (?P<level>\d+(\.\d+)?)")


def unit_settings(path: Path) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file, values in order (systemd allows repeating a key)."""
    settings: dict[str, list[str]] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_verify_is_clean(tmp_path: Path) -> None:
    """The units as shipped, with ExecStart pointed at a stand-in binary (verify insists it exists)."""
    analyze = need_binary("systemd-analyze")
    binary = tmp_path / "sentinel"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    copies = []
    for path in UNITS.values():
        text = path.read_text(encoding="utf-8")
        assert INSTALLED_BINARY in text
        copy = tmp_path / path.name
        copy.write_text(text.replace(INSTALLED_BINARY, str(binary)))
        copies.append(str(copy))
    result = subprocess.run([analyze, "verify", *copies], capture_output=True, text=True, timeout=60)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@pytest.mark.parametrize("daemon", sorted(UNITS))
def test_security_exposure(daemon: str, capsys: pytest.CaptureFixture[str]) -> None:
    analyze = need_binary("systemd-analyze")
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(UNITS[daemon])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = EXPOSURE.search(result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    level = float(match["level"])
    with capsys.disabled():
        print(f"\nsystemd-analyze security --offline=yes {UNITS[daemon].name}: exposure {level}")
    assert level <= MAX_EXPOSURE[daemon]


@pytest.mark.parametrize("daemon", sorted(UNITS))
def test_service_basics(daemon: str) -> None:
    settings = unit_settings(UNITS[daemon])
    assert settings["Type"] == ["notify"]
    assert settings["NotifyAccess"] == ["main"]
    assert settings["Restart"] == ["on-failure"]
    assert settings["WatchdogSec"] and settings["WatchdogSec"][0] not in ("0", "infinity")
    (exec_start,) = settings["ExecStart"]
    assert exec_start == f"{INSTALLED_BINARY} {daemon} run --config /etc/sentinel/{daemon}.toml"
    assert settings["StateDirectory"]
    assert settings["NoNewPrivileges"] == ["yes"]


def test_aggregator_runs_as_its_own_user_without_privileges() -> None:
    settings = unit_settings(UNITS["aggregator"])
    assert settings["DynamicUser"] == ["yes"]
    assert settings["CapabilityBoundingSet"] == [""]
    assert settings["PrivateDevices"] == ["yes"]


def test_agent_gets_exactly_its_devices_and_capabilities() -> None:
    settings = unit_settings(UNITS["agent"])
    assert settings["User"] == ["sentinel"]
    assert settings["DevicePolicy"] == ["closed"]
    allowed = {value.split()[0]: value.split()[1] for value in settings["DeviceAllow"]}
    assert allowed == {
        "char-nvidia-frontend": "rw",  # /dev/nvidia<N>, /dev/nvidiactl (older drivers' group name)
        "char-nvidia": "rw",  # the same major 195, as newer drivers name it
        "char-nvidia-uvm": "rw",
        "char-nvidia-caps": "r",
        "char-nvidia-nvswitch": "rw",
        "/dev/kmsg": "r",
    }
    assert set(settings["CapabilityBoundingSet"][0].split()) == {"CAP_SYSLOG", "CAP_SYS_PTRACE"}
    assert settings["AmbientCapabilities"] == settings["CapabilityBoundingSet"]
    # the capability is for /proc/<pid>/environ; ptrace() itself stays forbidden
    assert any("@debug" in value for value in settings["SystemCallFilter"] if value.startswith("~"))
    assert settings["RuntimeDirectory"] == ["sentinel"]  # /run/sentinel/probe.sock
    assert settings["ProtectProc"] == ["default"]


@pytest.mark.parametrize("daemon", sorted(UNITS))
def test_environment_overrides_name_real_config_keys(daemon: str) -> None:
    """A misspelt SENTINEL_* variable would be silently ignored by the daemon: check each one exists."""
    spec = DAEMONS[daemon]
    known = {env_name(spec.env_prefix, path) for path, _ in iter_leaf_paths(spec.struct)}
    settings = unit_settings(UNITS[daemon])
    names = [value.split("=", 1)[0] for value in settings.get("Environment", [])]
    assert names, "the unit passes state/credential paths through the environment"
    assert set(names) <= known
    state_dirs = settings["StateDirectory"]
    for value in settings["Environment"]:
        name, _, path = value.partition("=")
        if name.endswith("__STATE_DIR"):
            assert path == f"/var/lib/{state_dirs[0]}"


def test_sysusers_and_tmpfiles_apply_to_a_fresh_root(tmp_path: Path) -> None:
    sysusers = need_binary("systemd-sysusers")
    tmpfiles = need_binary("systemd-tmpfiles")
    for kind in ("sysusers.d", "tmpfiles.d"):
        target = tmp_path / "usr/lib" / kind
        target.mkdir(parents=True)
        shutil.copy(SYSTEMD_DIR / kind / "sentinel.conf", target / "sentinel.conf")
    (tmp_path / "etc/sentinel").mkdir(parents=True)
    result = subprocess.run([sysusers, f"--root={tmp_path}"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    passwd = (tmp_path / "etc/passwd").read_text()
    (entry,) = [line for line in passwd.splitlines() if line.startswith("sentinel:")]
    uid = int(entry.split(":")[2])
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles --create needs root to chown")
    token = tmp_path / "etc/sentinel/token"
    token.write_text("secret\n")
    token.chmod(0o644)
    result = subprocess.run(
        [tmpfiles, f"--root={tmp_path}", "--create"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert token.stat().st_mode & 0o777 == 0o600
    state = tmp_path / "var/lib/sentinel"
    assert state.stat().st_uid == uid
    assert state.stat().st_mode & 0o777 == 0o750


@pytest.mark.parametrize(
    ("daemon", "memory_max_mib", "cpu_quota_pct"),
    [("agent", 512, 50), ("aggregator", 4096, 200)],
)
def test_resource_limits_contain_a_runaway_daemon(
    daemon: str, memory_max_mib: int, cpu_quota_pct: int
) -> None:
    """MemoryMax/MemoryHigh/CPUQuota/TasksMax are set, and sized above what the benchmarks measured (agent
    under 60 MB plus its bounded buffers; aggregator 492 MB at 65,536 GPUs) so that only a runaway hits them."""
    settings = unit_settings(UNITS[daemon])

    def mib(value: str) -> float:
        units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
        return float(value[:-1]) * units[value[-1]] if value[-1] in units else float(value) / (1 << 20)

    (memory_max,) = settings["MemoryMax"]
    (memory_high,) = settings["MemoryHigh"]
    assert mib(memory_max) == memory_max_mib
    assert mib(memory_high) < mib(memory_max)
    assert settings["CPUQuota"] == [f"{cpu_quota_pct}%"]
    (tasks,) = settings["TasksMax"]
    assert 16 <= int(tasks) <= 1024
