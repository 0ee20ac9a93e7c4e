"""Filters over nvidia-smi and /proc output: the agent's parsers (agent.gpu, the one implementation)."""
from __future__ import annotations

from typing import Any

from agent import gpu


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"nvidia_query_csv": gpu.parse_query_csv, "nvidia_proc_driver": gpu.driver_from_proc}
