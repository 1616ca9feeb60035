"""GPU detail: every NVML metric the agent exports for the selected host/GPU."""

from __future__ import annotations

from grafanalib.core import Dashboard

from sentinel.ops.dashboards.common import GPU, RATE, Size, bargauge, dashboard, table, target, timeseries

UID = "sentinel-gpu"

LEGEND = "{{host}}/{{gpu}}"


def _series(
    title: str, metric: str, *, unit: str = "", legend: str = LEGEND, by: str = ""
) -> tuple[object, Size]:
    expr = f"{metric}{{{GPU}}}"
    if by:
        expr = f"max by (host, gpu, {by}) ({expr})"
    return timeseries(title, [target(expr, legend)], unit=unit), Size(8, 8)


def build() -> Dashboard:
    return dashboard(
        UID,
        "sentinel / GPU detail",
        "Every NVML metric of the selected GPUs: state, load, memory, thermals, power, clocks, throttling, "
        "PCIe, ECC, row remapping, retired pages, NVLink, Xids.",
        [
            [
                (
                    table(
                        "Identity",
                        f"max by (host, gpu, uuid, pci_bus, name, serial, driver, vbios, job, rank) "
                        f"(sentinel_gpu_info{{{GPU}}})",
                    ),
                    Size(16, 6),
                ),
                (
                    timeseries(
                        "State (1 = current)",
                        [
                            target(
                                f"max by (host, gpu, state) (sentinel_gpu_state{{{GPU}}})",
                                LEGEND + " {{state}}",
                            )
                        ],
                    ),
                    Size(8, 6),
                ),
            ],
            [
                _series("GPU up", "sentinel_gpu_up"),
                _series("GPU utilisation", "sentinel_gpu_utilization_ratio", unit="percentunit"),
                _series("Memory utilisation", "sentinel_gpu_memory_utilization_ratio", unit="percentunit"),
            ],
            [
                (
                    timeseries(
                        "Memory used / total",
                        [
                            target(f"sentinel_gpu_memory_used_bytes{{{GPU}}}", LEGEND + " used"),
                            target(f"sentinel_gpu_memory_total_bytes{{{GPU}}}", LEGEND + " total"),
                        ],
                        unit="bytes",
                    ),
                    Size(8, 8),
                ),
                _series("Temperature", "sentinel_gpu_temperature_celsius", unit="celsius"),
                (
                    timeseries(
                        "Power / limit",
                        [
                            target(f"sentinel_gpu_power_watts{{{GPU}}}", LEGEND + " power"),
                            target(f"sentinel_gpu_power_limit_watts{{{GPU}}}", LEGEND + " limit"),
                        ],
                        unit="watt",
                    ),
                    Size(8, 8),
                ),
            ],
            [
                (
                    timeseries(
                        "SM clock / max",
                        [
                            target(f"sentinel_gpu_sm_clock_hertz{{{GPU}}}", LEGEND + " SM"),
                            target(f"sentinel_gpu_sm_clock_max_hertz{{{GPU}}}", LEGEND + " SM max"),
                        ],
                        unit="hertz",
                    ),
                    Size(8, 8),
                ),
                _series("Memory clock", "sentinel_gpu_memory_clock_hertz", unit="hertz"),
                _series("Performance state (P0 fastest)", "sentinel_gpu_performance_state"),
            ],
            [
                (
                    timeseries(
                        "Clocks held back (share of time, NVML violation time)",
                        [
                            target(
                                "max by (host, gpu, policy) "
                                f"(rate(sentinel_gpu_clock_violation_seconds_total{{{GPU}}}[{RATE}]))",
                                LEGEND + " {{policy}}",
                            )
                        ],
                        unit="percentunit",
                        description="Share of time each NVML clock policy held the clocks below target; a "
                        "straggler held back by power or thermal half the time or more is named for it.",
                    ),
                    Size(12, 8),
                ),
                (
                    timeseries(
                        "NVLink bit-error rate (Blackwell)",
                        [
                            target(
                                f"max by (host, gpu, link, type) (sentinel_gpu_nvlink_bit_error_rate{{{GPU}}})",
                                LEGEND + " link {{link}} {{type}}",
                            )
                        ],
                        description="symbol: before forward error correction (corrected); effective: after it.",
                    ),
                    Size(12, 8),
                ),
            ],
            [
                _series(
                    "Throttle reasons",
                    "sentinel_gpu_throttle_reason",
                    legend=LEGEND + " {{reason}}",
                    by="reason",
                ),
                (
                    timeseries(
                        "PCIe replays per second",
                        [target(f"rate(sentinel_gpu_pcie_replay_total{{{GPU}}}[{RATE}])", LEGEND)],
                        unit="ops",
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "PCIe throughput",
                        [
                            target(f"sentinel_gpu_pcie_tx_bytes_per_second{{{GPU}}}", LEGEND + " tx"),
                            target(f"sentinel_gpu_pcie_rx_bytes_per_second{{{GPU}}}", LEGEND + " rx"),
                        ],
                        unit="Bps",
                    ),
                    Size(8, 8),
                ),
            ],
            [
                _series(
                    "ECC errors",
                    "sentinel_gpu_ecc_errors",
                    legend=LEGEND + " {{type}} {{scope}}",
                    by="type, scope",
                ),
                _series(
                    "Uncorrectable ECC errors by location",
                    "sentinel_gpu_ecc_uncorrected_location_errors",
                    legend=LEGEND + " {{location}}",
                    by="location",
                ),
                _series(
                    "Remapped rows",
                    "sentinel_gpu_remapped_rows",
                    legend=LEGEND + " {{type}}",
                    by="type",
                ),
            ],
            [
                (
                    bargauge(
                        "Row-remap bank availability (histogram)",
                        [
                            target(
                                f"sum by (level) (sentinel_gpu_row_remap_bank_availability{{{GPU}}})",
                                "{{level}}",
                            )
                        ],
                        description="Memory banks by how many spare rows they have left: max, high, "
                        "partial, low, none. Banks at 'none' cannot remap again.",
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "Row remap pending / failure",
                        [
                            target(f"sentinel_gpu_row_remap_pending{{{GPU}}}", LEGEND + " pending"),
                            target(f"sentinel_gpu_row_remap_failure{{{GPU}}}", LEGEND + " failure"),
                        ],
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "Retired pages (pre-Ampere)",
                        [
                            target(
                                f"max by (host, gpu, cause) (sentinel_gpu_retired_pages{{{GPU}}})",
                                LEGEND + " {{cause}}",
                            ),
                            target(f"sentinel_gpu_retired_pages_pending{{{GPU}}}", LEGEND + " pending"),
                        ],
                    ),
                    Size(8, 8),
                ),
            ],
            [
                _series(
                    "NVLink links up", "sentinel_gpu_nvlink_up", legend=LEGEND + " link {{link}}", by="link"
                ),
                (
                    timeseries(
                        "NVLink errors per second",
                        [
                            target(
                                "sum by (host, gpu, link, type) "
                                f"(rate(sentinel_gpu_nvlink_errors_total{{{GPU}}}[{RATE}]))",
                                LEGEND + " link {{link}} {{type}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Size(8, 8),
                ),
                (
                    timeseries(
                        "Xid events",
                        [
                            target(
                                f"sum by (host, gpu, xid) (increase(sentinel_gpu_xid_events_total{{{GPU}}}[{RATE}]))",
                                LEGEND + " Xid {{xid}}",
                            ),
                            target(
                                f"max by (host, gpu, xid) (sentinel_gpu_xid_events_total{{{GPU}}})",
                                LEGEND + " Xid {{xid}} (total)",
                            ),
                        ],
                    ),
                    Size(8, 8),
                ),
            ],
        ],
    )
