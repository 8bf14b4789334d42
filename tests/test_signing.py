"""Artifact signatures (compiler/signing.py): what verifies, and every way a bundle can be
changed after signing is refused; trusted keys from the environment and files; rotation;
nothing of an unverified artifact is ever imported by the runtime."""

from __future__ import annotations

import json

import pytest

import compiler
from client.runtime import load
from compiler.artifact import SIGNATURE_FILE, Artifact, ArtifactError
from compiler.signing import (KeyFileError, SignatureError, TrustedKeys, add_trusted_key, generate_key, key_id,
                              load_private_key, parse_public_key, public_line, sign_artifact, verify_artifact,
                              write_private_key)
from tests.corpus import corpus_inputs, load_graph


@pytest.fixture(scope="module")
def worker_key():
    return generate_key()


@pytest.fixture(scope="module")
def built():
    return compiler.compile(load_graph("softmax_fp32"), "cpu")


def _signed_copy(artifact: Artifact, private) -> Artifact:
    copy = Artifact.from_bytes(artifact.to_bytes())
    sign_artifact(copy, private)
    return Artifact.from_bytes(copy.to_bytes())


def test_a_signed_artifact_verifies_and_runs(built, worker_key, tmp_path):
    artifact = _signed_copy(built, worker_key)
    trusted = TrustedKeys.of(worker_key.public_key())
    assert verify_artifact(artifact, trusted) == key_id(worker_key.public_key())
    assert SIGNATURE_FILE not in artifact.files and artifact.signature["key_id"] == key_id(worker_key.public_key())
    inputs = corpus_inputs("softmax_fp32", seed=0)
    assert load(artifact.to_bytes(), tmp_path, trusted)(*inputs)[0].isfinite().all()


def _tamper_file(artifact: Artifact) -> None:
    name = next(n for n in artifact.files if n.endswith(".py"))
    artifact.files[name] = artifact.files[name] + b"\nimport os  # injected\n"


def _tamper_manifest(artifact: Artifact) -> None:
    artifact.manifest["kernels"][0]["num_warps"] = 1


def _add_file(artifact: Artifact) -> None:
    artifact.files["extra.py"] = b"print('hi')\n"


def _remove_file(artifact: Artifact) -> None:
    del artifact.files[next(iter(artifact.files))]


def _swap_statement_key(artifact: Artifact) -> None:
    statement = json.loads(artifact.signature["statement"])
    statement["key"] = "0" * 64
    artifact.signature["statement"] = json.dumps(statement, sort_keys=True, separators=(",", ":"))


def _flip_signature(artifact: Artifact) -> None:
    raw = artifact.signature["signature"]
    artifact.signature["signature"] = ("B" if raw[0] == "A" else "A") + raw[1:]


@pytest.mark.parametrize("tamper", [_tamper_file, _tamper_manifest, _add_file, _remove_file, _swap_statement_key,
                                    _flip_signature])
def test_any_change_after_signing_is_refused(built, worker_key, tamper):
    artifact = _signed_copy(built, worker_key)
    tamper(artifact)
    try:
        reread = Artifact.from_bytes(artifact.to_bytes())
    except ArtifactError:  # removing a file the manifest names is refused even earlier
        return
    with pytest.raises(SignatureError):
        verify_artifact(reread, TrustedKeys.of(worker_key.public_key()))


def test_unsigned_untrusted_and_unconfigured_are_refused(built, worker_key):
    unsigned = Artifact.from_bytes(built.to_bytes())
    with pytest.raises(SignatureError, match="not signed"):
        verify_artifact(unsigned, TrustedKeys.of(worker_key.public_key()))
    signed = _signed_copy(built, worker_key)
    with pytest.raises(SignatureError, match="not trusted"):
        verify_artifact(signed, TrustedKeys.of(generate_key().public_key()))
    with pytest.raises(SignatureError, match="no trusted keys are configured"):
        verify_artifact(signed, TrustedKeys())


def test_a_signature_made_by_another_key_under_a_trusted_id_is_refused(built, worker_key):
    """An attacker names the trusted key's id but signs with their own key."""
    forged = _signed_copy(built, generate_key())
    forged.signature["key_id"] = key_id(worker_key.public_key())
    with pytest.raises(SignatureError, match="does not check"):
        verify_artifact(forged, TrustedKeys.of(worker_key.public_key()))


def test_rotation_trusts_old_and_new_keys_at_once(built, worker_key, tmp_path, monkeypatch):
    new_key = generate_key()
    path = tmp_path / "trusted_keys"
    assert add_trusted_key(path, worker_key.public_key(), "old")
    assert add_trusted_key(path, new_key.public_key(), "new")
    assert not add_trusted_key(path, new_key.public_key(), "again")  # no duplicate lines
    monkeypatch.setenv("FUSEWIRE_TRUSTED_KEYS_FILE", str(path))
    monkeypatch.delenv("FUSEWIRE_TRUSTED_KEYS", raising=False)
    trusted = TrustedKeys.from_env()
    for private in (worker_key, new_key):
        assert verify_artifact(_signed_copy(built, private), trusted) == key_id(private.public_key())
    # the old key retired: only the new one verifies
    path.write_text(public_line(new_key.public_key()) + "\n")
    with pytest.raises(SignatureError, match="not trusted"):
        verify_artifact(_signed_copy(built, worker_key), TrustedKeys.from_env())


def test_trusted_keys_from_the_environment(worker_key, tmp_path):
    line = public_line(worker_key.public_key(), "comment words")
    other = generate_key().public_key()
    env = {"FUSEWIRE_TRUSTED_KEYS": f"{line},{public_line(other)}", "FUSEWIRE_TRUSTED_KEYS_FILE": ""}
    env["XDG_CONFIG_HOME"] = str(tmp_path)  # no default file there
    trusted = TrustedKeys.from_env(env)
    assert set(trusted.keys) == {key_id(worker_key.public_key()), key_id(other)}
    with pytest.raises(KeyFileError, match="FUSEWIRE_TRUSTED_KEYS entry 1"):
        TrustedKeys.from_env({"FUSEWIRE_TRUSTED_KEYS": "fusewire-ed25519 bm90IGEga2V5"})
    with pytest.raises(KeyFileError, match="no-such-file"):
        TrustedKeys.from_env({"FUSEWIRE_TRUSTED_KEYS_FILE": str(tmp_path / "no-such-file")})
    bad = tmp_path / "bad_keys"
    bad.write_text("# a comment\n\nnot-base64!!\n")
    with pytest.raises(KeyFileError, match="line 3"):
        TrustedKeys.from_env({"FUSEWIRE_TRUSTED_KEYS_FILE": str(bad)})


def test_key_files_round_trip_and_are_private(worker_key, tmp_path):
    path = tmp_path / "keys" / "worker.pem"
    write_private_key(worker_key, path)
    assert path.stat().st_mode & 0o077 == 0
    assert key_id(load_private_key(path).public_key()) == key_id(worker_key.public_key())
    assert key_id(parse_public_key(public_line(worker_key.public_key()))) == key_id(worker_key.public_key())
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(KeyFileError, match="junk.pem"):
        load_private_key(tmp_path / "junk.pem")


def test_no_code_of_an_unverified_artifact_is_imported(built, worker_key, tmp_path):
    """A kernel source that would write a file when imported: load() refuses the artifact first."""
    marker = tmp_path / "imported"
    evil = Artifact.from_bytes(built.to_bytes())
    name = evil.manifest["kernels"][0]["source"]
    evil.files[name] = f"open({str(marker)!r}, 'w').write('pwned')\n".encode() + evil.files[name]
    sign_artifact(evil, generate_key())  # well signed, by a key nobody trusts
    cache = tmp_path / "cache"
    for blob in (evil.to_bytes(), Artifact(evil.manifest, evil.files).to_bytes()):  # signed, then unsigned
        with pytest.raises(SignatureError):
            load(blob, cache, TrustedKeys.of(worker_key.public_key()))
    assert not marker.exists() and not cache.exists()


def test_malformed_signature_entries_are_artifact_errors(built):
    blob = Artifact.from_bytes(built.to_bytes())
    blob.files[SIGNATURE_FILE] = b"{not json"
    with pytest.raises(ArtifactError, match=SIGNATURE_FILE):
        Artifact.from_bytes(blob.to_bytes())


def test_built_here_is_never_carried_by_bytes(built):
    assert built.built_here
    assert not Artifact.from_bytes(built.to_bytes()).built_here
