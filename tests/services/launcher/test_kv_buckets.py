"""`hecate kv-buckets` on a real locked-down server (TLS, an account per tenant): each
owner creates its buckets, a second run changes nothing, and no one else may create
them; `--await` waits as a reader and is refused a bucket the reader may not look up.
What deploy/k8s runs before the services (kv-buckets-job.yaml, the init containers)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from hecate.bus.secure import SecureBus, prepare
from hecate.bus.server import NatsServer
from hecate.cli.main import main
from hecate.wire import permissions, subjects
from hecate_launcher import kvbuckets
from tests.support.securebus import secure_server

# A loaded machine's server may be slow to answer JetStream at first: where creating a
# bucket is not what a test is about, the command retries as deploy/ runs it.
PATIENT = ("--wait-s", "10")
OWNERS = {
    "planner": subjects.PLAN_BUCKET,
    "telemetry": subjects.TELEMETRY_BUCKET,
    "breaker": subjects.BREAKER_BUCKET,
}


@pytest.fixture
def bus(tmp_path: Path) -> SecureBus:
    return prepare(tmp_path / "secure")


@pytest.fixture
def server(tmp_path: Path, bus: SecureBus) -> Iterator[NatsServer]:
    with secure_server(tmp_path / "nats", bus, layout="accounts") as started:
        yield started


def run_as(
    user: str,
    bus: SecureBus,
    server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *args: str,
) -> tuple[int, str, str]:
    """``hecate kv-buckets --nats URL ARGS`` with ``user``'s credentials in the env."""
    for key, value in bus.credentials(user).to_env().items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = main(["kv-buckets", "--nats", server.url, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_contract_names_one_owner_per_bucket() -> None:
    assert kvbuckets.owners() == {user: (bucket,) for user, bucket in OWNERS.items()}


def test_each_owner_creates_its_bucket_once(
    bus: SecureBus,
    server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for user, bucket in OWNERS.items():
        history = subjects.BUCKET_HISTORY[bucket]
        code, out, err = run_as(user, bus, server, monkeypatch, capsys, "--replicas", "1", *PATIENT)
        assert (code, err) == (0, ""), err
        assert out == f"{bucket}: created (replicas 1, history {history})\n"
    for user, bucket in OWNERS.items():
        history = subjects.BUCKET_HISTORY[bucket]
        code, out, err = run_as(user, bus, server, monkeypatch, capsys, "--replicas", "1", *PATIENT)
        assert (code, err) == (0, ""), err
        assert out == f"{bucket}: exists (replicas 1, history {history}), left as it is\n"
    # Asked for more replicas than the bucket has: still left alone, and said so.
    code, out, _ = run_as("planner", bus, server, monkeypatch, capsys, "--replicas", "3", *PATIENT)
    assert code == 0
    assert out.startswith(f"{subjects.PLAN_BUCKET}: exists (replicas 1, history 10)")
    assert "asked for 3 replicas" in out


def test_who_is_not_the_owner_is_refused(
    bus: SecureBus,
    server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_as("router", bus, server, monkeypatch, capsys)
    assert (code, out) == (2, "")
    assert "user 'router' owns no KV bucket" in err
    assert "hecate-plan (planner)" in err
    code, _, err = run_as(
        "planner", bus, server, monkeypatch, capsys, "--bucket", subjects.TELEMETRY_BUCKET
    )
    assert code == 2
    assert "may not create KV bucket 'hecate-telemetry': its owner is 'telemetry'" in err
    # Past the command's own check, the server refuses it (and says so at once, rather
    # than leaving the request to time out).
    for user in ("router", permissions.node_user("gpu"), "telemetry"):
        with pytest.raises(kvbuckets.Refused) as refused:
            asyncio.run(
                kvbuckets.create(
                    server.url, bus.credentials(user), [subjects.PLAN_BUCKET], replicas=1
                )
            )
        assert f"the server refused {user} KV bucket 'hecate-plan'" in refused.value.message
        assert "permissions violation" in refused.value.message.lower()
    code, out, err = run_as(
        "router", bus, server, monkeypatch, capsys, "--await", "--bucket", subjects.PLAN_BUCKET
    )
    assert code == 2
    assert "does not exist after 0s" in err  # nobody created it


def test_await_waits_as_a_reader_for_what_it_may_read(
    bus: SecureBus,
    server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for user in OWNERS:
        code, _, err = run_as(user, bus, server, monkeypatch, capsys, *PATIENT)
        assert code == 0, err
    waits = {
        "router": [subjects.PLAN_BUCKET, subjects.TELEMETRY_BUCKET],
        permissions.node_user("gpu"): [subjects.PLAN_BUCKET],
        "planner": [subjects.PLAN_BUCKET],
        "telemetry": [subjects.TELEMETRY_BUCKET],
        "breaker": [subjects.BREAKER_BUCKET],
    }
    for user, buckets in waits.items():
        flags = [a for b in buckets for a in ("--bucket", b)]
        code, out, err = run_as(user, bus, server, monkeypatch, capsys, "--await", *flags)
        assert (code, err) == (0, ""), f"{user}: {err}"
        assert out == "".join(f"{b}: exists\n" for b in buckets)
    # A reader the contract does not give the bucket is refused, not left waiting.
    code, _, err = run_as(
        "planner",
        bus,
        server,
        monkeypatch,
        capsys,
        "--await",
        "--bucket",
        subjects.TELEMETRY_BUCKET,
        "--wait-s",
        "60",
    )
    assert code == 2
    assert "the server refused planner looking up KV bucket 'hecate-telemetry'" in err


def test_without_credentials_nothing_is_created(bus: SecureBus, server: NatsServer) -> None:
    with pytest.raises(kvbuckets.KvBucketsError):
        asyncio.run(
            kvbuckets.create(
                server.url,
                kvbuckets.Credentials(ca_file=str(bus.ca_file)),
                [subjects.PLAN_BUCKET],
                replicas=1,
            )
        )
