"""The fusewire HTTP API (`service.app:app`) and its Redis store.

Never imports torch or triton: the API must start fast and stay small. It uses only the
torch-free parts of the compiler package (graph, options, artifact, version).
"""
