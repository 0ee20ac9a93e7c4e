"""Filters over nvidia-smi and /proc output, using the agent's parsers (one implementation)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from agent import gpu  # noqa: E402


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"nvidia_query_csv": gpu.parse_query_csv, "nvidia_proc_driver": gpu.driver_from_proc}
