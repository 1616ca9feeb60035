"""Component tests use the agent's fixtures: the fake NVML installed at pynvml's library handle."""

from tests.agent.conftest import fake_nvml

__all__ = ["fake_nvml"]
