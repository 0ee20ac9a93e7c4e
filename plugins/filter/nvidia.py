"""Filters for NVIDIA GPU passthrough into LXC containers: the functions of `controller.passthrough`."""
from __future__ import annotations

from typing import Any

from controller import passthrough


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {name: getattr(passthrough, name) for name in passthrough.FILTERS}
