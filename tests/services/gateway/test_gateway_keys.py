"""API keys: the file keeps only hashes, a key names its tenant, and ``hecate keys add``
prints a key once."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hecate.cli.main import main
from hecate_gateway import keys
from hecate_gateway.keys import KeyFileAuth, KeyRing, KeysError, OpenAccess, add, bearer, read


def test_the_file_keeps_hashes_never_keys(tmp_path: Path) -> None:
    path = tmp_path / "state" / "gateway-keys.json"
    key = add(path, "acme", now=1000.0)
    assert key.startswith(keys.PREFIX)
    assert len(key) > 40
    text = path.read_text()
    assert key not in text
    assert key[len(keys.PREFIX) + 4 :] not in text
    (record,) = json.loads(text)["keys"]
    assert record["sha256"] == keys.digest(key)
    assert (record["tenant"], record["created"]) == ("acme", 1000.0)
    assert key.startswith(record["prefix"])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_key_names_its_tenant_and_nothing_else_does(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    a, b = add(path, "acme"), add(path, "globex")
    ring = KeyRing(read(path))
    assert (ring.tenant_for(a), ring.tenant_for(b)) == ("acme", "globex")
    assert ring.tenant_for(a + "x") is None
    assert ring.tenant_for("") is None
    assert len(ring) == 2


def test_bearer_headers() -> None:
    assert bearer("Bearer sk-1") == "sk-1"
    assert bearer("bearer  sk-1 ") == "sk-1"
    assert bearer("Basic abc") is None
    assert bearer("Bearer ") is None
    assert bearer(None) is None


def test_the_gateway_sees_a_key_added_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys.json"
    auth = KeyFileAuth(path)  # no file yet: nobody gets in
    assert auth.tenant("Bearer anything") is None
    key = add(path, "acme")
    monkeypatch.setattr(keys, "RELOAD_S", 0.0)  # no waiting for the once-a-second look
    assert auth.tenant(f"Bearer {key}") == "acme"
    assert auth.tenant(None) is None
    assert auth.tenant(key) is None  # not a bearer header


def test_a_broken_file_or_tenant_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "keys.json"
    bad.write_text('{"keys": [{"sha256": "nope"}]}')
    with pytest.raises(KeysError):
        read(bad)
    with pytest.raises(KeysError):
        add(tmp_path / "k.json", "not a tenant")


def test_open_access_is_tenant_default() -> None:
    assert OpenAccess().tenant(None) == "default"


def test_keys_add_prints_the_key_once_and_stores_its_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.json"
    assert main(["keys", "add", "acme", "--file", str(path)]) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    assert out == key + "\n"
    assert key.startswith(keys.PREFIX)
    assert "acme" in err
    assert str(path) in err
    assert KeyRing(read(path)).tenant_for(key) == "acme"
    assert main(["keys", "add", "bad tenant", "--file", str(path)]) == 2


def test_keys_add_defaults_to_the_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HECATE_STATE", str(tmp_path / "st"))
    assert main(["keys", "add", "acme"]) == 0
    key = capsys.readouterr().out.strip()
    assert KeyRing(read(tmp_path / "st" / "gateway-keys.json")).tenant_for(key) == "acme"
