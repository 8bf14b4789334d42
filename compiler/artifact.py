"""The artifact bundle: manifest (with the launch plan), Triton sources, cubins.

Data only, no pickle: a deterministic ZIP archive (fixed timestamps, sorted entries)
holding `manifest.json` and the files the manifest names. Importable without torch.

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
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024
_EPOCH = (1980, 1, 1, 0, 0, 0)


class ArtifactError(ValueError):
    """Bytes that are not a well-formed fusewire artifact."""


@dataclass
class Artifact:
    manifest: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.manifest["key"]

    @property
    def plan(self) -> dict[str, Any]:
        return self.manifest["plan"]

    def kernel_source(self, kernel: dict[str, Any]) -> str:
        return self.files[kernel["source"]].decode()

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            entries = {"manifest.json": json.dumps(self.manifest, indent=1, sort_keys=True).encode()}
            entries.update(self.files)
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
        manifest = json.loads(entries.pop("manifest.json"))
        if manifest.get("format") != FORMAT_VERSION:
            raise ArtifactError(f"artifact format {manifest.get('format')!r}, this fusewire reads {FORMAT_VERSION}")
        for kernel in manifest.get("kernels", []):
            for role in ("source", "cubin"):
                if kernel.get(role) and kernel[role] not in entries:
                    raise ArtifactError(f"manifest names {kernel[role]} for kernel {kernel.get('name')}, which is missing")
        for constant in manifest.get("plan", {}).get("constants", []):
            if constant_file(constant) not in entries:
                raise ArtifactError(f"manifest names constant {constant.get('constant')}, whose file is missing")
        return cls(manifest=manifest, files=entries)

    @property
    def digest(self) -> str:
        return digest_of(self.to_bytes())


def constant_file(entry: dict[str, Any]) -> str:
    """The file holding a plan constant's raw bytes."""
    return f"constants/{int(entry['constant'])}.bin"


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
    return Artifact(manifest=manifest, files=files)
