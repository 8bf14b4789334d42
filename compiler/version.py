"""Versions that go into every key: the wire format, fusewire, and the toolchain series.

The ABI names the Triton series the generated code is built with, not whatever Triton a
client happens to have, so that a client and the service compute the same key. A worker
checks at start-up that its Triton belongs to this series (`check_toolchain`).
"""

from importlib import metadata

FUSEWIRE_VERSION = "0.1.0"
WIRE_VERSION = 1
TRITON_SERIES = "3.6"
ABI_VERSION = f"fusewire-{FUSEWIRE_VERSION}/wire-{WIRE_VERSION}/triton-{TRITON_SERIES}"


def installed_triton_version() -> str | None:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def check_toolchain() -> None:
    """Raises if the installed Triton cannot produce code for this ABI."""
    found = installed_triton_version()
    if found is None or ".".join(found.split(".")[:2]) != TRITON_SERIES:
        raise RuntimeError(f"fusewire {FUSEWIRE_VERSION} builds with Triton {TRITON_SERIES}.x, found {found}")
