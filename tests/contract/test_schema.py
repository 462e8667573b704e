"""``hecate schema``: the AsyncAPI document is the whole wire contract, and stays so.

Adding a subject to ``hecate.wire.subjects`` or a struct to ``hecate.wire.messages``
without documenting it in ``hecate.wire.contract`` fails here; so does changing the
client-facing infer messages without reviewing the change (golden file).

Regenerate the golden file after reviewing a wire change with::

    HECATE_UPDATE_GOLDEN=1 .venv/bin/pytest -q tests/contract
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hecate.cli.main import main
from hecate.core.plan import SLUG_PATTERN
from hecate.wire import contract, messages, subjects
from hecate.wire.contract import asyncapi
from hecate.wire.errors import STATUS, error_headers, is_code
from hecate.wire.messages import ErrorBody, InferReply, InferRequest

GOLDEN = Path(__file__).parent / "golden" / "infer.json"
UPDATE_ENV = "HECATE_UPDATE_GOLDEN"

# Names in hecate.wire.subjects that are not subjects of their own, and why.
NOT_SUBJECTS = {
    "annotations": "from __future__",
    "re": "a module",
    "SLUG_PATTERN": "the id rule: checked as every channel parameter's pattern",
    "SLUG": "the id rule, compiled",
    "INFER_PREFIX": "the prefix of hecate.infer.{model_id}",
    "STREAM_PREFIX": "the prefix of hecate.stream.{model_id}",
    "is_stream": "a parser, not a subject builder",
    "model_from_infer_subject": "a parser, not a subject builder",
    "SERVICE_NAMES": "names on the NATS service API: checked in info.description",
    "BUCKET_HISTORY": "bucket configuration (history), not an address",
    "INBOX_ROOT": "the inbox rule: checked in info.description",
    "inbox_prefix": "the inbox rule: checked in info.description",
    "NODE_USER_PREFIX": "node users' names (node-<id>), part of the inbox rule",
    "node_of": "a parser, not a subject builder",
    "INTAKE_PARTITIONS": "the heartbeat channel's partitions: checked in its description",
    "intake": "the heartbeat channel as the server maps it: checked in its description",
    "INTAKE_ALL": "every intake partition: checked in the heartbeat channel's description",
    "MAPPINGS": "server configuration (subject mappings): checked against deploy/nats",
    "render_mappings": "renders MAPPINGS for a server's configuration",
    "shard_partitions": "which partitions a telemetry replica takes, not an address",
}


def test_the_heartbeat_intake_is_documented(doc: dict[str, Any]) -> None:
    described = doc["channels"]["heartbeat"]["description"]
    for named in (subjects.INTAKE_ALL, subjects.intake("<partition>", "<node_id>")):
        assert f"`{named}`" in described
    assert f"{subjects.INTAKE_PARTITIONS} partitions" in described


def test_the_inbox_rule_is_documented(doc: dict[str, Any]) -> None:
    assert "`_INBOX.<user>`" in doc["info"]["description"]


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return asyncapi()


def _addresses(doc: dict[str, Any]) -> dict[str, str]:
    """Channel address -> channel id, for every channel that has an address."""
    return {c["address"]: cid for cid, c in doc["channels"].items() if c["address"] is not None}


def _concrete(address: str) -> str:
    """A subject matching ``address``: each ``{param}`` becomes a token."""
    return re.sub(r"\{([^{}]+)\}", r"\1", address)


def _nats_match(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or token not in ("*", s[i]):
            return False
    return len(p) == len(s)


def _subject_builders() -> Iterator[tuple[str, str]]:
    """(name, address with ``{param}`` placeholders) of every subject builder."""
    for name, value in vars(subjects).items():
        if isinstance(value, types.FunctionType) and value.__module__ == subjects.__name__:
            if typing.get_type_hints(value).get("return") is not str:
                continue  # not a builder (e.g. a parser returning str | None)
            params = inspect.signature(value).parameters
            yield name, value(*(f"{{{p}}}" for p in params))


def _buckets() -> list[str]:
    return [v for n, v in vars(subjects).items() if n.endswith("_BUCKET")]


def _walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"only local refs are used, got {ref!r}"
    node: Any = doc
    for raw in ref[2:].split("/"):
        key = raw.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict), f"{ref}: {key!r} is not under an object"
        assert key in node, f"{ref} does not resolve: no {key!r}"
        node = node[key]
    return node


# -- shape -----------------------------------------------------------------------------


def test_the_document_is_asyncapi_3(doc: dict[str, Any]) -> None:
    assert doc["asyncapi"] == "3.0.0"
    assert doc["info"]["title"] == "HECATE"
    assert doc["info"]["version"]
    assert {"channels", "operations", "components"} <= set(doc)
    assert {"schemas", "messages"} <= set(doc["components"])
    assert doc["servers"]["local"] == {
        "host": "127.0.0.1:4222",
        "protocol": "nats",
        "description": doc["servers"]["local"]["description"],
    }
    key = re.compile(r"^[a-zA-Z0-9\.\-_]+$")  # AsyncAPI's rule for map keys
    for section in (doc["channels"], doc["operations"], *doc["components"].values()):
        assert all(key.fullmatch(k) for k in section), sorted(section)
    for op in doc["operations"].values():
        assert op["action"] in ("send", "receive")


def test_every_ref_resolves(doc: dict[str, Any]) -> None:
    refs = [n["$ref"] for n in _walk(doc) if isinstance(n, dict) and "$ref" in n]
    assert refs
    for ref in refs:
        _resolve(doc, ref)


# -- channels: every subject documented, nothing invented -------------------------------


def test_every_subject_in_hecate_wire_subjects_is_a_documented_channel(
    doc: dict[str, Any],
) -> None:
    addresses = _addresses(doc)
    concrete = [_concrete(a) for a in addresses]
    queues = {
        op.get("bindings", {}).get("nats", {}).get("queue") for op in doc["operations"].values()
    }
    builders = dict(_subject_builders())
    undocumented: list[str] = []
    for name, value in vars(subjects).items():
        if name.startswith("_") or name in NOT_SUBJECTS:
            continue
        if name in builders and name.endswith("_key"):  # a KV key, one per id
            ok = any(f"$KV.{b}.{builders[name]}" in addresses for b in _buckets())
        elif name in builders:
            ok = builders[name] in addresses
        elif not isinstance(value, str):
            ok = False  # a new kind of name: classify it here and document it
        elif name.endswith("_QUEUE"):
            ok = value in queues
        elif name.endswith("_BUCKET"):
            key = getattr(subjects, name.removesuffix("_BUCKET") + "_KEY", None)
            ok = (
                f"$KV.{value}.{key}" in addresses
                if key is not None  # one fixed key, or
                else any(a.startswith(f"$KV.{value}.") and "{" in a for a in addresses)
            )  # one per id
        elif name.endswith("_KEYS"):  # every key of one per id
            bucket = getattr(subjects, name.removesuffix("_KEYS") + "_BUCKET")
            ok = any(_nats_match(f"$KV.{bucket}.{value}", subject) for subject in concrete)
        elif name.endswith("_KEY"):
            bucket = getattr(subjects, name.removesuffix("_KEY") + "_BUCKET")
            ok = f"$KV.{bucket}.{value}" in addresses
        elif "*" in value or ">" in value:
            ok = any(_nats_match(value, subject) for subject in concrete)
        else:
            ok = value in addresses
        if not ok:
            shown = f"{name}(...) -> {builders[name]!r}" if name in builders else repr(value)
            undocumented.append(f"{name}: {shown}")
    assert not undocumented, (
        "hecate.wire.subjects has names the AsyncAPI document does not cover: "
        f"{undocumented}; add their channel/operation to hecate.wire.contract "
        "(or, if it is not a subject, to NOT_SUBJECTS here, with the reason)"
    )


def test_every_documented_address_is_built_by_hecate_wire_subjects(
    doc: dict[str, Any],
) -> None:
    known = set(dict(_subject_builders()).values())
    known |= {v for v in vars(subjects).values() if isinstance(v, str)}
    known |= {
        # A bucket with one fixed key, or one key per target.
        f"$KV.{getattr(subjects, n)}."
        + getattr(subjects, n.removesuffix("_BUCKET") + "_KEY", "{target}")
        for n in vars(subjects)
        if n.endswith("_BUCKET")
    }
    known |= {  # a key per id, in one of the buckets
        f"$KV.{b}.{key}" for n, key in _subject_builders() if n.endswith("_key") for b in _buckets()
    }
    assert set(_addresses(doc)) <= known, set(_addresses(doc)) - known


def test_channel_parameters_are_slugs(doc: dict[str, Any]) -> None:
    for cid, channel in doc["channels"].items():
        names = re.findall(r"\{([^{}]+)\}", channel["address"] or "")
        assert sorted(channel.get("parameters", {})) == sorted(names), cid
        for param in channel.get("parameters", {}).values():
            assert param["x-pattern"] == SLUG_PATTERN == subjects.SLUG.pattern
            assert SLUG_PATTERN in param["description"]
            assert all(subjects.SLUG.fullmatch(e) for e in param["examples"])


def test_every_service_name_is_documented(doc: dict[str, Any]) -> None:
    for name in subjects.SERVICE_NAMES.values():
        assert f"`{name}`" in doc["info"]["description"]


# -- operations -------------------------------------------------------------------------


def test_every_subject_has_a_sender_and_a_receiver(doc: dict[str, Any]) -> None:
    actions: dict[str, set[str]] = {cid: set() for cid in doc["channels"]}
    replies: set[str] = set()
    for op in doc["operations"].values():
        actions[op["channel"]["$ref"].rsplit("/", 1)[-1]].add(op["action"])
        if "reply" in op:
            replies.add(op["reply"]["channel"]["$ref"].rsplit("/", 1)[-1])
    for cid, channel in doc["channels"].items():
        if channel["address"] is None:  # a reply inbox: used by request/reply only
            assert cid in replies
            assert not actions[cid], cid
        else:
            assert actions[cid] == {"send", "receive"}, cid


def test_operation_messages_belong_to_their_channel(doc: dict[str, Any]) -> None:
    for oid, op in doc["operations"].items():
        pairs = [(op["channel"], op["messages"])]
        if "reply" in op:
            pairs.append((op["reply"]["channel"], op["reply"]["messages"]))
        for channel_ref, refs in pairs:
            assert refs, oid
            for ref in refs:
                assert ref["$ref"].startswith(channel_ref["$ref"] + "/messages/"), (oid, ref)


def test_request_reply_pairs_agree(doc: dict[str, Any]) -> None:
    ops = doc["operations"]
    for sender, receiver in [
        ("client.sendInfer", "router.receiveInfer"),
        ("router.sendStageRun", "node.receiveStageRun"),
    ]:
        assert ops[sender]["channel"] == ops[receiver]["channel"]
        assert ops[sender]["reply"] == ops[receiver]["reply"]


def test_routers_share_the_infer_queue_group(doc: dict[str, Any]) -> None:
    op = doc["operations"]["router.receiveInfer"]
    assert op["bindings"] == {"nats": {"queue": subjects.ROUTER_QUEUE, "bindingVersion": "0.1.0"}}
    assert _resolve(doc, op["channel"]["$ref"])["address"] == subjects.infer("{model_id}")


def test_stage_traffic_and_prefixes_kept_are_msgpack_and_the_rest_json(
    doc: dict[str, Any],
) -> None:
    stage = {
        subjects.node_run("{node_id}"),
        subjects.node_kept("{node_id}"),
        subjects.node_kept_whole("{node_id}"),
    }
    for op in doc["operations"].values():
        channel = _resolve(doc, op["channel"]["$ref"])
        want = "application/msgpack" if channel["address"] in stage else "application/json"
        refs = op["messages"] + op.get("reply", {}).get("messages", [])
        for ref in refs:
            message = _resolve(doc, _resolve(doc, ref["$ref"])["$ref"])
            assert message["contentType"] == want, (channel["address"], message["name"])


# -- messages ---------------------------------------------------------------------------


def _wire_structs() -> dict[str, type[msgspec.Struct]]:
    return {
        v.__name__: v
        for v in vars(messages).values()
        if isinstance(v, type) and issubclass(v, msgspec.Struct)
    }


def test_every_wire_struct_is_in_components(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    structs = _wire_structs()
    # A fact that an event extends (Failover, FailoverEvent) is on the wire inside it.
    bases = {
        n
        for n, s in structs.items()
        if any(o is not s and issubclass(o, s) for o in structs.values())
    }
    missing = sorted(set(structs) - set(schemas) - bases)
    assert not missing, (
        f"structs of hecate.wire.messages no message uses: {missing}; "
        "add their Message/Channel to hecate.wire.contract"
    )


def test_component_schemas_are_msgspec_schemas(doc: dict[str, Any]) -> None:
    structs = _wire_structs()
    _refs, expected = msgspec.json.schema_components(
        structs.values(), ref_template="#/components/schemas/{name}"
    )
    schemas = doc["components"]["schemas"]
    for name, schema in expected.items():
        if name in schemas:  # a missing one fails test_every_wire_struct_is_in_components
            assert schemas[name] == schema, name


def test_infer_request_requires_only_the_prompt(doc: dict[str, Any]) -> None:
    assert doc["components"]["schemas"]["InferRequest"]["required"] == ["prompt"]


def test_error_replies_carry_the_error_headers(doc: dict[str, Any]) -> None:
    assert dict(contract.ERROR_STATUS) == dict(STATUS)
    headers = doc["components"]["schemas"]["ErrorHeaders"]
    assert set(headers["required"]) == set(error_headers("internal", "y"))
    errors = []
    for name, message in doc["components"]["messages"].items():
        narrow = message["payload"].get("allOf", [{}, {}])[1].get("properties", {})
        if narrow.get("ok") == {"const": False}:
            errors.append(name)
            assert message["headers"] == {"$ref": "#/components/schemas/ErrorHeaders"}, name
    assert sorted(errors) == ["InferError", "StageError"]


def test_message_examples_are_valid_messages(doc: dict[str, Any]) -> None:
    table = {m.name: m for c in contract.CHANNELS for m in c.messages}
    seen = 0
    for name, message in doc["components"]["messages"].items():
        payload_type = table[name].payload
        for example in message.get("examples", []):
            assert payload_type is not None
            value = msgspec.convert(example["payload"], payload_type)
            for prop, rule in table[name].narrow.items():
                if "const" in rule:
                    assert getattr(value, prop) == rule["const"], (name, prop)
            error = getattr(value, "error", None)
            if isinstance(error, ErrorBody):
                assert is_code(error.code), (name, error.code)
                assert example["headers"] == error_headers(error.code, error.message)
            seen += 1
    assert seen


# -- golden: the client-facing infer schemas ------------------------------------------------


def _infer_schemas(doc: dict[str, Any]) -> dict[str, Any]:
    """InferRequest, InferReply and every schema they reference."""
    schemas = doc["components"]["schemas"]
    out: dict[str, Any] = {}
    todo = ["InferRequest", "InferReply"]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = schemas[name]
        for node in _walk(schemas[name]):
            if isinstance(node, dict) and isinstance(node.get("$ref"), str):
                todo.append(node["$ref"].rsplit("/", 1)[-1])
    return dict(sorted(out.items()))


def _pretty(value: Any) -> str:
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n"


def test_infer_schemas_match_the_golden_file(doc: dict[str, Any]) -> None:
    current = _pretty(_infer_schemas(doc))
    if os.environ.get(UPDATE_ENV):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(current)
    golden = GOLDEN.read_text() if GOLDEN.exists() else "{}\n"
    if json.loads(golden) != json.loads(current):
        diff = "".join(
            difflib.unified_diff(
                golden.splitlines(keepends=True),
                current.splitlines(keepends=True),
                fromfile=str(GOLDEN),
                tofile="hecate schema (now)",
            )
        )
        pytest.fail(
            "The wire schema of InferRequest/InferReply changed. Review the wire change "
            "(clients in other languages depend on it: add fields only with defaults, never "
            "rename, remove or change the meaning of one), then regenerate the golden file: "
            f"{UPDATE_ENV}=1 .venv/bin/pytest -q tests/contract\n{diff}",
            pytrace=False,
        )


# -- golden: wire messages -------------------------------------------------------------------


def test_an_infer_request_ignores_unknown_fields() -> None:
    request = msgspec.json.decode(b'{"prompt": "hi", "unknown_field": 1}', type=InferRequest)
    assert request == InferRequest(prompt="hi", max_tokens=16, tenant="default", request_id="")


def test_an_infer_reply_encodes_every_key_including_null_error() -> None:
    reply = InferReply(ok=True, output="hello", attempts=1, request_id="r-1", model_id="toy")
    assert msgspec.json.encode(reply) == (
        b'{"ok":true,"output":"hello","route":null,"degraded":false,"attempts":1,'
        b'"error":null,"request_id":"r-1","model_id":"toy","retry_after_s":null,'
        b'"quota_ticket":null,"prompt_tokens":null,"completion_tokens":null,'
        b'"finish_reason":null,"logprobs":null,"prefix":null}'
    )


# -- the command -----------------------------------------------------------------------------


def test_hecate_schema_prints_the_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == json.loads(msgspec.json.encode(asyncapi()))
    assert out.startswith('{\n  "asyncapi": "3.0.0"')


def test_hecate_schema_writes_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "hecate.asyncapi.json"
    assert main(["schema", "--output", str(target)]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads(target.read_text())["asyncapi"] == "3.0.0"
