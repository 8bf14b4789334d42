"""fusewire's client side: the HTTP client (`client.http`), the artifact runtime
(`client.runtime`), the torch.compile backend (`client.backend`) and the CLI (`client.cli`).

Import-light on purpose: importing `client` imports nothing but the standard library, so `fusewire status`
starts fast and the HTTP client works without torch. Import the submodule you need.
"""

import os
from pathlib import Path

__all__ = ["http", "runtime", "backend", "cli", "default_cache_dir"]


def default_cache_dir() -> Path:
    """$FUSEWIRE_CACHE_DIR, else ~/.cache/fusewire: the backend's artifacts and the runtime's
    kernel sources (each under its own subfolder)."""
    return Path(os.environ.get("FUSEWIRE_CACHE_DIR") or Path.home() / ".cache" / "fusewire")
