"""fusewire's client side: the HTTP client (`client.http`), the artifact runtime
(`client.runtime`), the torch.compile backend (`client.backend`) and the CLI (`client.cli`).

Import-light on purpose: importing `client` imports nothing else, so `fusewire status`
starts fast and the HTTP client works without torch. Import the submodule you need.
"""

__all__ = ["http", "runtime", "backend", "cli"]
