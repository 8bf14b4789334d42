"""The artifact bundle: manifest (with the launch plan), Triton sources, cubins.

Data only, no pickle: a deterministic ZIP archive (fixed timestamps, sorted entries)
holding `manifest.json`, the files the manifest names and, once a worker has signed it,
`signature.json` (compiler/signing.py). Importable without torch.

    blob = artifact.to_bytes();  same = Artifact.from_bytes(blob);  artifact.digest
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compiler.graph import Graph
    from compiler.options import CompileOptions

FORMAT_VERSION = 1
SIGNATURE_FILE = "signature.json"  # the worker's signature of every other file (compiler/signing.py)
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024
_EPOCH = (1980, 1, 1, 0, 0, 0)


class ArtifactError(ValueError):
    """Bytes that are not a well-formed fusewire artifact."""


@dataclass
class Artifact:
    """`signature` is the worker's signature.json (compiler/signing.py), None when unsigned;
    `built_here` marks an artifact this process compiled itself (never set by from_bytes)."""

    manifest: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    signature: dict[str, Any] | None = None
    built_here: bool = field(default=False, compare=False)

    @property
    def key(self) -> str:
        return self.manifest["key"]

    @property
    def plan(self) -> dict[str, Any]:
        return self.manifest["plan"]

    def kernel_source(self, kernel: dict[str, Any]) -> str:
        return self.files[kernel["source"]].decode()

    def entries(self) -> dict[str, bytes]:
        """Every file of the bundle but the signature, as to_bytes writes them: what a signature covers."""
        return {"manifest.json": _manifest_bytes(self.manifest), **self.files}

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            entries = self.entries()
            if self.signature is not None:
                entries[SIGNATURE_FILE] = json.dumps(self.signature, sort_keys=True).encode()
            for name in sorted(entries):
                info = zipfile.ZipInfo(name, date_time=_EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, entries[name])
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "Artifact":
        if len(blob) > MAX_ARTIFACT_BYTES:
            raise ArtifactError(f"artifact is {len(blob)} bytes, over {MAX_ARTIFACT_BYTES}")
        try:
            with zipfile.ZipFile(io.BytesIO(blob)) as archive:
                entries = {name: archive.read(name) for name in archive.namelist()}
        except (zipfile.BadZipFile, EOFError, ValueError) as exc:
            raise ArtifactError(f"not a fusewire artifact: {exc}") from None
        if "manifest.json" not in entries:
            raise ArtifactError("artifact has no manifest.json")
        raw_manifest = entries.pop("manifest.json")
        manifest = _json_entry(raw_manifest, "manifest.json")
        if not isinstance(manifest, dict) or _manifest_bytes(manifest) != raw_manifest:
            raise ArtifactError("manifest.json is not a JSON object in canonical form")
        signature = _json_entry(entries.pop(SIGNATURE_FILE), SIGNATURE_FILE) if SIGNATURE_FILE in entries else None
        if signature is not None and not isinstance(signature, dict):
            raise ArtifactError(f"{SIGNATURE_FILE} is not a JSON object")
        if manifest.get("format") != FORMAT_VERSION:
            raise ArtifactError(f"artifact format {manifest.get('format')!r}, this fusewire reads {FORMAT_VERSION}")
        for kernel in manifest.get("kernels", []):
            for role in ("source", "cubin"):
                if kernel.get(role) and kernel[role] not in entries:
                    raise ArtifactError(f"manifest names {kernel[role]} for kernel {kernel.get('name')}, which is missing")
        for constant in manifest.get("plan", {}).get("constants", []):
            if constant_file(constant) not in entries:
                raise ArtifactError(f"manifest names constant {constant.get('constant')}, whose file is missing")
        return cls(manifest=manifest, files=entries, signature=signature)

    @property
    def digest(self) -> str:
        return digest_of(self.to_bytes())


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def _json_entry(raw: bytes, name: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{name} is not JSON: {exc}") from None


def constant_file(entry: dict[str, Any]) -> str:
    """The file holding a plan constant's raw bytes."""
    return f"constants/{int(entry['constant'])}.bin"


def tensor_buffers(value: Any) -> set[str]:
    """The plan buffers an extern step's arguments name (`{"tensor": {"buffer": ...}}`, at any depth
    of lists and dicts)."""
    if isinstance(value, dict):
        if "tensor" in value and isinstance(value["tensor"], dict):
            return {value["tensor"]["buffer"]}
        return set().union(*(tensor_buffers(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(tensor_buffers(v) for v in value)) if value else set()
    return set()


def digest_of(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def build_artifact(graph: "Graph", target: str, options: "CompileOptions", generated: Any) -> Artifact:
    """Packs codegen's output (kernels, plan, fusion log) with the key and versions."""
    from compiler.graph import key
    from compiler.version import ABI_VERSION, installed_triton_version

    manifest = {
        "format": FORMAT_VERSION,
        "key": key(graph, target, options),
        "target": target,
        "abi": ABI_VERSION,
        "triton": installed_triton_version(),
        "options": options.model_dump(mode="json"),
        "kernels": generated.kernel_entries(),
        "fusion": generated.fusion_log,
        "plan": generated.plan,
        "autotune": generated.autotune_note,
    }
    files = dict(generated.files)
    for entry in generated.plan.get("constants", []):
        files[constant_file(entry)] = graph.constants[entry["constant"]].raw_bytes()
    return Artifact(manifest=manifest, files=files, built_here=True)
