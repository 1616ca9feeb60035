"""NVLink through NVML: which links exist, their state and their error counters."""

from __future__ import annotations

from typing import Any

import pynvml

from sentinel.components.nvlink.record import NvLink
from sentinel.components.nvml_read import Get, GpuLostError

MAX_LINKS = int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))
_NOT_SUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)


def probe_links(index: int, handle: Any, max_links: int = MAX_LINKS) -> list[int]:
    """Links that exist: NVML answers NOT_SUPPORTED / INVALID_ARGUMENT for the others (asked once, at open)."""
    links: list[int] = []
    for link in range(max_links):
        try:
            pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(f"GPU {index}: GPU is lost") from None
            if code in _NOT_SUPPORTED and link == 0:
                break
            continue
        links.append(link)
    return links


def read(get: Get, gpu: int, h: Any, links: list[int]) -> list[NvLink] | None:
    if not links:
        return None
    out: list[NvLink] = []
    counter = pynvml.nvmlDeviceGetNvLinkErrorCounter
    for link in links:
        state = get(gpu, f"nvlink{link}_state", pynvml.nvmlDeviceGetNvLinkState, h, link)
        crc = get(gpu, f"nvlink{link}_crc", counter, h, link, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
        replay = get(gpu, f"nvlink{link}_replay", counter, h, link, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)
        recovery = get(gpu, f"nvlink{link}_recovery", counter, h, link, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)
        out.append(
            NvLink(
                link=link,
                active=bool(state) if state is not None else False,
                crc_errors=int(crc or 0),
                replay_errors=int(replay or 0),
                recovery_errors=int(recovery or 0),
            )
        )
    return out
