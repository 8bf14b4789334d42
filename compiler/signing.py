"""Ed25519 signatures of artifacts: workers sign what they built, clients verify it against
public keys they were configured with (never a key the service hands out).

What is signed is a *statement*: the artifact's key and the sha256 of every file in the
bundle, `manifest.json` included. It travels inside the bundle as `signature.json`, so a
bundle is verifiable wherever it lies (Redis, the service's memory, a node's disk cache):

    signature.json = {"format": "fusewire-signature/1", "key_id": "3f9c...",
                      "statement": "<canonical JSON text>", "signature": "<base64>"}

Verification fails closed: a bundle with no signature, a key nobody trusts, a signature that
does not check, or any file added, removed or changed since signing is refused.

    private = generate_key();  public_line(private.public_key())   # 'fusewire-ed25519 <b64> ...'
    sign_artifact(artifact, private)                                # worker, before to_bytes()
    verify_artifact(artifact, TrustedKeys.from_env())               # client, before any kernel loads
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

if TYPE_CHECKING:
    from compiler.artifact import Artifact

SIGNATURE_FORMAT = "fusewire-signature/1"
KEY_TYPE = "fusewire-ed25519"
TRUSTED_KEYS_ENV = "FUSEWIRE_TRUSTED_KEYS"
TRUSTED_KEYS_FILE_ENV = "FUSEWIRE_TRUSTED_KEYS_FILE"


class SignatureError(ValueError):
    """An artifact that is unsigned, signed by an untrusted key, or whose signature does not check."""


class KeyFileError(ValueError):
    """A key file or key text that cannot be read; the message names where."""


# -- keys -------------------------------------------------------------------------------


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def key_id(public: Ed25519PublicKey) -> str:
    """16 hex digits naming a public key: the start of the sha256 of its raw bytes."""
    return hashlib.sha256(_raw(public)).hexdigest()[:16]


def public_line(public: Ed25519PublicKey, comment: str = "") -> str:
    """One line of a trusted-keys file: 'fusewire-ed25519 <base64 raw key> <comment>'."""
    text = f"{KEY_TYPE} {base64.b64encode(_raw(public)).decode()}"
    return f"{text} {comment}".rstrip()


def private_pem(private: Ed25519PrivateKey) -> bytes:
    return private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())


def write_private_key(private: Ed25519PrivateKey, path: Path) -> None:
    """PEM (PKCS#8) readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as f:
        f.write(private_pem(private))


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise KeyFileError(f"signing key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"signing key {path}: not an Ed25519 key")
    return key


def parse_public_key(text: str, where: str = "key") -> Ed25519PublicKey:
    """'fusewire-ed25519 <base64> [comment]' or the bare base64 of the 32 raw bytes."""
    words = text.split()
    encoded = words[1] if words and words[0] == KEY_TYPE and len(words) > 1 else (words[0] if words else "")
    try:
        raw = base64.b64decode(encoded, validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError) as exc:
        raise KeyFileError(f"{where}: not an Ed25519 public key ({exc})") from None


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys a client accepts signatures from, by key id. Several at once: rotation."""

    keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    @classmethod
    def of(cls, *publics: Ed25519PublicKey) -> "TrustedKeys":
        return cls({key_id(p): p for p in publics}, ("given",))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "TrustedKeys":
        """FUSEWIRE_TRUSTED_KEYS (keys separated by commas or newlines) and the file named by
        FUSEWIRE_TRUSTED_KEYS_FILE (default ~/.config/fusewire/trusted_keys, if it exists)."""
        env = os.environ if environ is None else environ
        keys: dict[str, Ed25519PublicKey] = {}
        sources: list[str] = []
        inline = env.get(TRUSTED_KEYS_ENV, "")
        for number, line in enumerate(inline.replace(",", "\n").splitlines(), 1):
            if line.strip():
                public = parse_public_key(line, f"{TRUSTED_KEYS_ENV} entry {number}")
                keys[key_id(public)] = public
        if inline.strip():
            sources.append(TRUSTED_KEYS_ENV)
        path = Path(env[TRUSTED_KEYS_FILE_ENV]).expanduser() if env.get(TRUSTED_KEYS_FILE_ENV) \
            else default_trusted_keys_file(env)
        if env.get(TRUSTED_KEYS_FILE_ENV) or path.exists():
            keys.update(read_trusted_keys_file(path))
            sources.append(str(path))
        return cls(keys, tuple(sources))

    def describe(self) -> str:
        if not self.keys:
            return (f"no trusted keys are configured (set {TRUSTED_KEYS_ENV} or {TRUSTED_KEYS_FILE_ENV}; "
                    "see docs/TRUST.md)")
        return f"trusted keys {', '.join(sorted(self.keys))} from {', '.join(self.sources)}"


def default_trusted_keys_file(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/fusewire/trusted_keys, by default ~/.config/fusewire/trusted_keys."""
    env = os.environ if environ is None else environ
    config = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "fusewire" / "trusted_keys"


def read_trusted_keys_file(path: Path) -> dict[str, Ed25519PublicKey]:
    """One key per line ('fusewire-ed25519 <base64> [comment]'); blank lines and '#' comments skipped."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise KeyFileError(f"trusted keys file {path}: {exc}") from None
    keys = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            public = parse_public_key(line, f"{path} line {number}")
            keys[key_id(public)] = public
    return keys


def add_trusted_key(path: Path, public: Ed25519PublicKey, comment: str) -> bool:
    """Appends `public` to a trusted-keys file unless it is there already; True when added."""
    path = Path(path)
    if path.exists() and key_id(public) in read_trusted_keys_file(path):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(public_line(public, comment) + "\n")
    return True


# -- signing and verifying ----------------------------------------------------------------


def statement_of(artifact: "Artifact") -> str:
    """Canonical JSON of {format, key, files: {name: sha256}}: what a signature covers."""
    files = {name: hashlib.sha256(blob).hexdigest() for name, blob in artifact.entries().items()}
    body = {"format": SIGNATURE_FORMAT, "key": artifact.key, "files": files}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def sign_artifact(artifact: "Artifact", private: Ed25519PrivateKey) -> str:
    """Signs `artifact` in place (its signature.json); returns the signing key's id."""
    statement = statement_of(artifact)
    public = private.public_key()
    artifact.signature = {
        "format": SIGNATURE_FORMAT,
        "key_id": key_id(public),
        "statement": statement,
        "signature": base64.b64encode(private.sign(statement.encode())).decode(),
    }
    return artifact.signature["key_id"]


def verify_artifact(artifact: "Artifact", trusted: TrustedKeys) -> str:
    """Returns the id of the trusted key that signed `artifact`; raises SignatureError otherwise."""
    signature = artifact.signature
    name = f"artifact {artifact.key[:12]}"
    if not signature:
        raise SignatureError(f"{name} is not signed; {trusted.describe()}")
    if not trusted.keys:
        raise SignatureError(f"{name} cannot be verified: {trusted.describe()}")
    public = trusted.keys.get(str(signature.get("key_id")))
    if public is None:
        raise SignatureError(f"{name} is signed by key {signature.get('key_id')!r}, which is not trusted "
                             f"({trusted.describe()})")
    statement = signature.get("statement")
    try:
        public.verify(base64.b64decode(signature.get("signature", ""), validate=True), str(statement).encode())
    except (InvalidSignature, binascii.Error, ValueError):
        raise SignatureError(f"{name}: its signature by key {signature['key_id']} does not check") from None
    if statement != statement_of(artifact):
        raise SignatureError(f"{name}: its files or key differ from what key {signature['key_id']} signed")
    return signature["key_id"]
