"""Kernel lines around the GPU that are not Xids (kind ``other``): severity and PCI address."""

from __future__ import annotations

import pytest

from sentinel.signals import classify_line, classify_text


@pytest.mark.parametrize(
    ("line", "severity", "pci"),
    [
        (
            "[   21.091872] NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:894)",
            "critical",
            "0000:01:00",
        ),
        ("NVRM: GPU at PCI:0000:3b:00: GPU-8e9a6b1c-0000-0000-0000-000000000000", "info", "0000:3b:00"),
        (
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023",
            "info",
            None,
        ),
        (
            "NVRM: GPU0 _kgspRpcGspEventPmuHalted: Received signal from GSP that PMU has halted.",
            "critical",
            None,
        ),
        (
            "pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0",
            "critical",
            "0000:3b:00",
        ),
        ("pcieport 0000:3a:00.0: AER: Corrected error received: 0000:3b:00.0", "info", "0000:3b:00"),
        (
            "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer",
            "warning",
            "0000:3b:00",
        ),
        (
            "[ERROR] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3",
            "critical",
            "0000:86:00",
        ),
        ("mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN", "warning", None),
        ("mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE", "info", None),
        (
            "[   18.6] mlx5_core 0000:9c:00.0: 252.056 Gb/s available PCIe bandwidth, limited by 32.0 GT/s PCIe x8 link at 0000:97:01.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)",
            "warning",
            None,
        ),
        ("INFO: task python:1234 blocked for more than 120 seconds.", "warning", None),
        ("[host:1234:0:5678] Caught signal 7 (Bus error: nonexistent physical address)", "critical", None),
        (
            "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
            "critical",
            "0000:3b:00",
        ),
        ("Failed to initialize NVML: Driver/library version mismatch", "critical", None),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "critical", None),
        ("[12345.6] Out of memory: Killed process 1234 (python) total-vm:123kB", "critical", None),
        ("watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [python:1234]", "warning", None),
        ("mce: [Hardware Error]: Machine check events logged", "warning", None),
        (
            "infiniband mlx5_0: mlx5_handle_error_cqe:332:(pid 0): WC error: 12, Message: transport retry counter exceeded",
            "critical",
            None,
        ),
        ("python[1234]: segfault at 8 ip 00007f sp 00007f error 4 in libnccl.so.2[7f+1]", "critical", None),
        (
            "NVRM: API mismatch: the client has the version 535.54.03, but this kernel module has the version 550.54.15.",
            "critical",
            None,
        ),
    ],
)
def test_kernel_other_lines(line: str, severity: str, pci: str | None) -> None:
    event = classify_text(line)
    assert (event.kind, event.xid, event.severity, event.pci_bus) == ("other", None, severity, pci)


def test_info_kernel_lines_are_noise_for_the_tailer() -> None:
    assert classify_line("mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE") is None
    assert (
        classify_line("pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0")
        is not None
    )
