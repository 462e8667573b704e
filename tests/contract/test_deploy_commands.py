"""Every ``hecate`` command the deployment files run is one the CLI accepts.

docker-compose.yml and deploy/k8s/*.yaml start the services with argument lists that
argparse first sees at container start, so a renamed flag would only show up as a crash
loop. This test reads those lists and runs each through ``build_parser()``: the subcommand
must exist, every ``--flag`` must be one of its options (spelled out: argparse would also
take an abbreviation) and the whole line must parse (required flags, value types).

PyYAML is not a dependency, so the files are read by :func:`load_documents`, a small
parser for the YAML subset they are written in: block mappings and sequences, ``- key:``
items, flow lists of scalars, ``{}``, ``|`` block scalars, comments and ``---``. Anything
else (anchors, tags, flow mappings, folded scalars) is refused with the file and line,
rather than misread. Scalars stay strings.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from hecate.cli.main import build_parser
from hecate.sim.topology import parse_topology
from hecate.wire import permissions, subjects
from hecate_gateway import identities
from hecate_launcher import kvbuckets, natsconfig

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "Dockerfile"
EXAMPLE_TOPOLOGY = ROOT / "examples" / "swarm.json"

SERVICES = {"node", "telemetry", "planner", "router", "breaker"}
# What `$(POD_NAME)` (downward API, metadata.name) stands for here: a pod-name-like slug.
POD_NAME_VALUE = "hecate-pod-0"


# --- the YAML subset -------------------------------------------------------------------


class YamlSubsetError(ValueError):
    """The file uses YAML this reader does not handle (or is malformed)."""


@dataclass(frozen=True)
class _Line:
    number: int
    indent: int
    text: str  # without indentation and comment


def _strip_comment(text: str) -> str:
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'" and (i == 0 or text[i - 1] in " [,:"):
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] == " "):
            return text[:i].rstrip()
    return text.rstrip()


def _is_item(text: str) -> bool:
    return text == "-" or text.startswith("- ")


def _split_key(text: str) -> tuple[str, str] | None:
    """``key: rest`` -> (key, rest); None when the text is not a mapping entry."""
    if text[:1] in "\"'[{":
        return None
    for i, ch in enumerate(text):
        if ch == ":" and (i + 1 == len(text) or text[i + 1] == " "):
            return text[:i].strip(), text[i + 1 :].strip()
    return None


def _split_flow(inner: str) -> list[str]:
    items: list[str] = []
    quote = ""
    start = 0
    for i, ch in enumerate(inner):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == ",":
            items.append(inner[start:i].strip())
            start = i + 1
    last = inner[start:].strip()
    if last:
        items.append(last)
    return items


class _Parser:
    def __init__(self, raw: list[tuple[int, str]], source: str) -> None:
        self.raw = raw
        self.pos = 0
        self.source = source

    def error(self, number: int, message: str) -> YamlSubsetError:
        return YamlSubsetError(f"{self.source}:{number}: {message}")

    def peek(self) -> _Line | None:
        while self.pos < len(self.raw):
            number, raw = self.raw[self.pos]
            stripped = raw.strip()
            if not stripped or stripped.startswith("#"):
                self.pos += 1
                continue
            if "\t" in raw[: len(raw) - len(raw.lstrip())]:
                raise self.error(number, "tab in indentation")
            return _Line(number, len(raw) - len(raw.lstrip(" ")), _strip_comment(stripped))
        return None

    def document(self) -> Any:
        line = self.peek()
        if line is None:
            return None
        value = self.block(line.indent)
        extra = self.peek()
        if extra is not None:
            raise self.error(extra.number, "unexpected indentation")
        return value

    def block(self, indent: int) -> Any:
        line = self.peek()
        assert line is not None
        return self.sequence(indent) if _is_item(line.text) else self.mapping(indent)

    def mapping(self, indent: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while (line := self.peek()) is not None and line.indent == indent:
            if _is_item(line.text):
                raise self.error(line.number, "sequence item where a mapping key was expected")
            entry = _split_key(line.text)
            if entry is None:
                raise self.error(line.number, f"expected `key: value`, got {line.text!r}")
            key, rest = entry
            if key in result:
                raise self.error(line.number, f"duplicate key {key!r}")
            self.pos += 1
            result[key] = self.value(rest, indent, line.number, in_mapping=True)
        line = self.peek()
        if line is not None and line.indent > indent:
            raise self.error(line.number, "unexpected indentation")
        return result

    def sequence(self, indent: int) -> list[Any]:
        items: list[Any] = []
        while (line := self.peek()) is not None and line.indent == indent:
            if not _is_item(line.text):
                break
            rest = line.text[1:].lstrip()
            if rest and _split_key(rest) is not None:
                # `- key: value` opens a mapping whose keys line up after the dash.
                inner = indent + len(line.text) - len(rest)
                self.raw[self.pos] = (line.number, " " * inner + rest)
                items.append(self.mapping(inner))
            else:
                self.pos += 1
                items.append(self.value(rest, indent, line.number, in_mapping=False))
        return items

    def value(self, rest: str, indent: int, number: int, *, in_mapping: bool) -> Any:
        if rest in ("|", "|-"):
            return self.block_scalar(indent, keep_newline=rest == "|")
        if rest:
            return self.scalar(rest, number)
        following = self.peek()
        if following is None:
            return None
        if following.indent > indent:
            return self.block(following.indent)
        if in_mapping and following.indent == indent and _is_item(following.text):
            return self.sequence(indent)  # `key:` then `- item` at the key's own indent
        return None

    def block_scalar(self, indent: int, *, keep_newline: bool) -> str:
        lines: list[str] = []
        while self.pos < len(self.raw):
            raw = self.raw[self.pos][1]
            if raw.strip() and len(raw) - len(raw.lstrip(" ")) <= indent:
                break
            lines.append(raw.rstrip())
            self.pos += 1
        body = [line for line in lines if line]
        if not body:
            return ""
        cut = min(len(line) - len(line.lstrip(" ")) for line in body)
        text = "\n".join(line[cut:] for line in lines).rstrip("\n")
        return text + "\n" if keep_newline else text

    def scalar(self, text: str, number: int) -> Any:
        if text.startswith("["):
            if not text.endswith("]"):
                raise self.error(number, "a flow list must close on its own line")
            return [self.scalar(item, number) for item in _split_flow(text[1:-1])]
        if text == "{}":
            return {}
        if text[0] in "{&*!>|%@`":
            raise self.error(number, f"YAML feature not handled here: {text!r}")
        if text.startswith('"'):
            try:
                value: str = json.loads(text)
            except json.JSONDecodeError:
                raise self.error(number, f"bad double-quoted string {text!r}") from None
            return value
        if text.startswith("'"):
            if len(text) < 2 or not text.endswith("'"):
                raise self.error(number, f"bad single-quoted string {text!r}")
            return text[1:-1].replace("''", "'")
        return text


def load_documents(text: str, source: str) -> list[Any]:
    """The documents of a multi-document file (``---``), empty ones left out."""
    chunks: list[list[tuple[int, str]]] = [[]]
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw.rstrip() == "---":
            chunks.append([])
        else:
            chunks[-1].append((number, raw))
    documents = [_Parser(chunk, source).document() for chunk in chunks]
    return [doc for doc in documents if doc is not None]


# --- what the files run ----------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One ``hecate`` invocation in a deployment file (argv after ``hecate``)."""

    source: str  # file and place, for messages
    argv: tuple[str, ...]
    # Where --topology paths come from: mount point -> readable files under it.
    mounts: dict[str, dict[str, str]] = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return f"{self.source}: `hecate {shlex.join(self.argv)}`"

    def flag_value(self, flag: str) -> str | None:
        for i, token in enumerate(self.argv):
            if token == flag and i + 1 < len(self.argv):
                return self.argv[i + 1]
            if token.startswith(flag + "="):
                return token.split("=", 1)[1]
        return None


def _is_hecate_image(image: Any) -> bool:
    if not isinstance(image, str):
        return False
    return image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0] == "hecate"


def _as_argv(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise AssertionError(f"{where}: command/args must be a list of strings, got {value!r}")


def _strip_entrypoint(entry: list[str], argv: list[str], where: str) -> list[str]:
    """argv after `hecate`: an explicit entrypoint/command must be hecate itself."""
    if not entry:
        return argv  # the image's ENTRYPOINT ["hecate"] (checked below)
    assert PurePosixPath(entry[0]).name == "hecate", f"{where}: runs {entry[0]!r}, not hecate"
    return entry[1:] + argv


def compose_commands() -> list[Command]:
    (compose,) = load_documents(COMPOSE.read_text(), COMPOSE.name)
    commands = []
    for name, service in compose["services"].items():
        if "build" not in service and not _is_hecate_image(service.get("image")):
            continue
        where = f"{COMPOSE.name}, service {name!r}"
        argv = _as_argv(service.get("command"), where)
        argv = _strip_entrypoint(_as_argv(service.get("entrypoint"), where), argv, where)
        mounts: dict[str, dict[str, str]] = {}
        for volume in service.get("volumes") or []:
            host, _, rest = volume.partition(":")
            target = rest.split(":", 1)[0]
            source = (COMPOSE.parent / host).resolve()
            if host.startswith(".") and source.is_dir():
                files = {p.name: p.read_text() for p in source.iterdir() if p.is_file()}
                mounts[target] = files
        commands.append(Command(where, tuple(argv), mounts))
    return commands


def _k8s_documents() -> Iterator[tuple[str, Any]]:
    for path in sorted(K8S.glob("*.yaml")):
        name = str(path.relative_to(ROOT))
        for index, doc in enumerate(load_documents(path.read_text(), name)):
            yield f"{name} #{index + 1}", doc


def _pod_specs(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for value in node.values():
            yield from _pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pod_specs(value)


def _expand(token: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion from the container's env (unknown ones stay)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), token)


def _container_env(
    container: dict[str, Any], config_maps: dict[str, dict[str, str]]
) -> dict[str, str]:
    """The container's env as far as it is known here: literal values, the pod name (as
    :data:`POD_NAME_VALUE`) and keys of ConfigMaps in deploy/k8s."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        env.update(config_maps.get(source.get("configMapRef", {}).get("name"), {}))
    for entry in container.get("env") or []:
        ref = entry.get("valueFrom") or {}
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif ref.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[entry["name"]] = POD_NAME_VALUE
        elif "configMapKeyRef" in ref:
            key = ref["configMapKeyRef"]
            value = config_maps.get(key["name"], {}).get(key["key"])
            if value is not None:
                env[entry["name"]] = value
    return env


def k8s_commands() -> list[Command]:
    documents = list(_k8s_documents())
    config_maps = {
        doc["metadata"]["name"]: doc.get("data") or {}
        for _, doc in documents
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap"
    }
    commands = []
    for where_doc, doc in documents:
        name = doc.get("metadata", {}).get("name", "?") if isinstance(doc, dict) else "?"
        for pod in _pod_specs(doc):
            volumes = {
                v["name"]: config_maps.get(v["configMap"]["name"], {})
                for v in pod.get("volumes") or []
                if "configMap" in v
            }
            for container in [*(pod.get("initContainers") or []), *pod["containers"]]:
                if not _is_hecate_image(container.get("image")):
                    continue
                where = f"{where_doc} ({name}), container {container.get('name')!r}"
                env = _container_env(container, config_maps)
                argv = _strip_entrypoint(
                    _as_argv(container.get("command"), where),
                    _as_argv(container.get("args"), where),
                    where,
                )
                mounts = {
                    m["mountPath"]: volumes[m["name"]]
                    for m in container.get("volumeMounts") or []
                    if m["name"] in volumes
                }
                argv = [_expand(token, env) for token in argv]
                commands.append(Command(where, tuple(argv), mounts))
    return commands


# --- checking a command against the CLI ------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("hecate's parser has no subcommands")


def problems_with(argv: tuple[str, ...]) -> list[str]:
    """Why ``hecate <argv>`` would be refused; empty when the CLI accepts it."""
    parser = build_parser()
    subcommands = _subparsers(parser)
    if not argv:
        return ["no subcommand"]
    sub = subcommands.get(argv[0])
    if sub is None:
        return [f"unknown subcommand {argv[0]!r} (known: {', '.join(sorted(subcommands))})"]
    problems = []
    for token in argv[1:]:
        if token.startswith("-") and len(token) > 1 and not token[1].isdigit():
            flag = token.split("=", 1)[0]
            if flag not in sub._option_string_actions:
                known = sorted(o for o in sub._option_string_actions if o.startswith("--"))
                problems.append(f"`hecate {argv[0]}` has no flag {flag} (known: {known})")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _, extras = parser.parse_known_args(list(argv))
    except SystemExit:
        message = err.getvalue().strip().splitlines()
        problems.append(f"argparse refuses it: {message[-1] if message else '?'}")
    else:
        if extras:
            problems.append(f"arguments argparse does not take: {extras}")
    return problems


def parsed(command: Command) -> argparse.Namespace:
    return build_parser().parse_args(list(command.argv))


ALL_COMMANDS = compose_commands() + k8s_commands()


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda c: c.source)
def test_every_deployed_command_is_accepted_by_the_cli(command: Command) -> None:
    problems = problems_with(command.argv)
    assert not problems, f"{command}: " + "; ".join(problems)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("nodes", "--id", "a"), "unknown subcommand 'nodes'"),
        (("node", "--id", "a", "--capacity-layers", "4", "--cap", "1"), "has no flag --cap"),
        (("router", "--capacity-layers", "4"), "has no flag --capacity-layers"),
        (("node",), "argparse refuses it"),  # --id is required
        (("node", "--id", "a", "--memory", "lots"), "expected a size"),
        (("node", "--id", "a", "--capacity-layers", "$(N)"), "invalid int value"),
    ],
)
def test_the_check_names_what_is_wrong(argv: tuple[str, ...], expected: str) -> None:
    assert any(expected in p for p in problems_with(argv)), problems_with(argv)


def test_the_files_run_every_service() -> None:
    for label, commands in (("compose", compose_commands()), ("k8s", k8s_commands())):
        run = {c.argv[0] for c in commands if c.argv}
        assert run >= SERVICES, f"{label} runs no {sorted(SERVICES - run)}"


def test_the_image_entrypoint_is_hecate() -> None:
    # compose `command:` and k8s `args:` are arguments to this entrypoint.
    assert re.search(r'^ENTRYPOINT\s+\[\s*"hecate"\s*\]', DOCKERFILE.read_text(), re.M), (
        f'{DOCKERFILE.name}: ENTRYPOINT must be ["hecate"]'
    )


def _nodes_declared_and_expected(
    commands: list[Command],
) -> tuple[list[Command], set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """The node commands among ``commands``, what they declare (id, capacity, latency,
    score), and what the example topology says."""
    nodes = [c for c in commands if c.argv[:1] == ("node",)]
    declared = {
        (a.id, a.capacity_layers, a.latency_ms, a.score) for a in (parsed(c) for c in nodes)
    }
    example = json.loads(EXAMPLE_TOPOLOGY.read_text())["nodes"]
    expected = {
        (n["id"], n["capacity_layers"], n.get("latency_ms", 0.0), n.get("score", 1.0))
        for n in example
    }
    return nodes, declared, expected


def test_compose_nodes_have_distinct_ids_and_match_the_example_topology() -> None:
    nodes, declared, expected = _nodes_declared_and_expected(compose_commands())
    ids = [parsed(c).id for c in nodes]
    assert len(ids) == len(set(ids)), f"{COMPOSE.name}: node ids repeat: {sorted(ids)}"
    assert declared == expected, f"{COMPOSE.name} nodes differ from {EXAMPLE_TOPOLOGY.name}"


def test_k8s_nodes_are_the_example_topology_each_its_own_workload() -> None:
    nodes, declared, expected = _nodes_declared_and_expected(k8s_commands())
    assert len(nodes) == len(expected), "one node container per node of the topology"
    assert declared == expected, f"deploy/k8s nodes differ from {EXAMPLE_TOPOLOGY.name}"


# --- the bus is locked down where it is deployed ---------------------------------------


def _user_of(argv: tuple[str, ...]) -> str:
    """The NATS user ``hecate <argv>`` must log in as (permissions.node_user for a node)."""
    if argv[0] == "node":
        return permissions.node_user(parsed_argv(argv).id)
    return argv[0]


def parsed_argv(argv: tuple[str, ...]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def _compose() -> dict[str, Any]:
    (compose,) = load_documents(COMPOSE.read_text(), COMPOSE.name)
    services: dict[str, Any] = compose["services"]
    return services


def _hecate_compose_services() -> list[tuple[str, dict[str, Any], tuple[str, ...]]]:
    out = []
    for name, service in _compose().items():
        if "build" in service or _is_hecate_image(service.get("image")):
            out.append((name, service, tuple(_as_argv(service.get("command"), name))))
    return out


def test_every_compose_service_logs_in_as_its_own_user_over_tls() -> None:
    for name, service, argv in _hecate_compose_services():
        user = _user_of(argv)
        assert service.get("env_file") == [f"./.hecate/deploy/users/{user}.env"], (
            f"{COMPOSE.name}, {name!r}: env_file must be the generated {user}.env"
        )
        assert "./.hecate/deploy/ca:/etc/hecate/tls:ro" in service.get("volumes", []), (
            f"{COMPOSE.name}, {name!r}: the CA is not mounted at /etc/hecate/tls"
        )
        env = service.get("environment") or {}
        assert not {"HECATE_NATS_USER", "HECATE_NATS_PASSWORD"} & set(env), (
            f"{COMPOSE.name}, {name!r}: credentials belong in the generated env file"
        )
    assert natsconfig.CLIENT_CA.startswith("/etc/hecate/tls/")


def test_compose_nats_runs_tls_and_accounts_from_the_generated_directory() -> None:
    nats = _compose()["nats"]
    assert nats["command"] == ["--config", "/etc/nats/server.conf"]
    assert nats["env_file"] == ["./.hecate/deploy/nats-server.env"]
    assert "./.hecate/deploy/nats:/etc/nats:ro" in nats["volumes"]
    assert natsconfig.SERVER_DIR == "/etc/nats"
    # deploy/nats/server.conf is what the generator writes next to accounts.conf.
    server_conf = (ROOT / "deploy" / "nats" / "server.conf").read_text()
    assert server_conf == natsconfig.SERVER_CONF
    assert "include ./accounts.conf" in server_conf
    assert "auth.conf" not in server_conf
    assert re.search(r"^tls \{", server_conf, re.M)


def _k8s_objects() -> dict[tuple[str, str], Any]:
    return {(d["kind"], d["metadata"]["name"]): d for _, d in _k8s_documents() if "metadata" in d}


def _k8s_containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for where, doc in _k8s_documents():
        for pod in _pod_specs(doc):
            for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
                yield f"{where} {c.get('name')!r}", pod, c


def test_every_k8s_hecate_container_logs_in_as_its_own_user_over_tls() -> None:
    commands = {c.source: c for c in k8s_commands()}
    checked = 0
    for where, pod, container in _k8s_containers():
        if not _is_hecate_image(container.get("image")):
            continue
        (command,) = [
            c
            for s, c in commands.items()
            if s.endswith(f"{container['name']!r}")
            and s.split(" ")[0] == where.split(" ")[0]
            and s.split(" ")[1] == where.split(" ")[1]
        ]
        refs = _secret_refs(container)
        if command.argv[0] != "kv-buckets":
            user = _user_of(command.argv)
            assert refs == [natsconfig.secret_name(user)], f"{where}: secrets {refs}, not {user}'s"
        elif container in (pod.get("initContainers") or []):
            # Waiting for buckets as the pod's own service: the same user.
            (service,) = [c for c in pod["containers"] if _is_hecate_image(c.get("image"))]
            assert refs == _secret_refs(service), f"{where}: not the user of its pod"
        else:  # the Job: each container is named after the bucket owner it logs in as
            assert container["name"] in kvbuckets.owners(), f"{where}: not a bucket owner"
            assert refs == [natsconfig.secret_name(container["name"])], f"{where}: {refs}"
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts") or []}
        assert mounts.get("nats-ca") == "/etc/hecate/tls", f"{where}: no CA mount"
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        assert volumes["nats-ca"]["secret"]["secretName"] == "hecate-nats-ca"
        checked += 1
    assert checked >= len(SERVICES) + 1
    (env,) = [
        doc["data"]
        for _, doc in _k8s_documents()
        if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == "hecate-env"
    ]
    assert env["HECATE_NATS_CA"] == natsconfig.CLIENT_CA


def _secret_refs(container: dict[str, Any]) -> list[str]:
    return [e["secretRef"]["name"] for e in container.get("envFrom") or [] if "secretRef" in e]


def test_k8s_runs_no_nats_cli() -> None:
    # What prepares the buckets is `hecate kv-buckets`, tested on a locked-down server
    # (tests/services/launcher/test_kv_buckets.py); the nats CLI's needs are not.
    for where, _, container in _k8s_containers():
        assert "nats-box" not in str(container.get("image")), f"{where}: use hecate kv-buckets"


def _kv_commands(kind: str, name: str) -> list[tuple[dict[str, Any], argparse.Namespace]]:
    """The ``hecate kv-buckets`` containers of the workload ``kind``/``name`` (init
    containers first), each with its parsed arguments."""
    pod = _k8s_objects()[(kind, name)]["spec"]["template"]["spec"]
    out = []
    for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
        argv = _as_argv(c.get("args"), name)
        if _is_hecate_image(c.get("image")) and argv[:1] == ["kv-buckets"]:
            out.append((c, parsed_argv(tuple(argv))))
    return out


def test_the_kv_job_creates_every_bucket_with_3_replicas_as_its_owner() -> None:
    job = _k8s_objects()[("Job", "hecate-kv-buckets")]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    made = {}
    for container, args in _kv_commands("Job", "hecate-kv-buckets"):
        assert not args.await_
        assert args.replicas == 3
        assert args.wait_s > 0, "the Job must outwait a NATS cluster still starting"
        # No --bucket: every bucket the owner has, as the contract says.
        made[container["name"]] = kvbuckets.buckets_to_create(container["name"], args.bucket)
    assert made == kvbuckets.owners()


def _user_permissions(secret: str) -> permissions.Permissions:
    user = secret.removeprefix("hecate-nats-")
    if user.startswith("node-"):
        return permissions.node_permissions(user.removeprefix("node-"))
    return permissions.user_permissions(user, accounts=True)


def test_every_kv_service_waits_for_its_buckets_as_a_reader_it_is() -> None:
    """No service that would create a missing bucket with one replica starts before the
    Job has made it, and every wait is for a bucket its user may look up (one it may
    not would be refused, not wait forever)."""
    expected = {
        ("Deployment", "hecate-planner"): [subjects.PLAN_BUCKET],
        ("Deployment", "hecate-telemetry"): [subjects.TELEMETRY_BUCKET],
        ("Deployment", "hecate-breaker"): [subjects.BREAKER_BUCKET],
        ("Deployment", "hecate-router"): [subjects.PLAN_BUCKET, subjects.TELEMETRY_BUCKET],
        **{
            ("StatefulSet", f"hecate-node-{n['id']}"): [subjects.PLAN_BUCKET]
            for n in json.loads(EXAMPLE_TOPOLOGY.read_text())["nodes"]
        },
    }
    for (kind, name), buckets in expected.items():
        (waits,) = _kv_commands(kind, name)
        container, args = waits
        assert args.await_, f"{name}: its init container creates buckets"
        assert args.bucket == buckets, f"{name}: awaits {args.bucket}"
        assert args.wait_s > 0
        (secret,) = _secret_refs(container)
        granted = _user_permissions(secret).publish
        for bucket in buckets:
            assert permissions.allows(granted, f"$JS.API.STREAM.INFO.KV_{bucket}"), (
                f"{name}: {secret} may not look up {bucket}"
            )


def test_k8s_nats_runs_tls_and_accounts_from_secrets() -> None:
    docs = _k8s_objects()
    conf = docs[("ConfigMap", "nats-config")]["data"]["nats.conf"]
    assert "include ./accounts.conf" in conf
    assert "cert_file: /etc/nats-config/server.pem" in conf
    assert "verify: true" in conf
    pod = docs[("StatefulSet", "nats")]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    sources = volume["projected"]["sources"]
    assert {"name": "nats-server"} in [s.get("secret") for s in sources]
    (server,) = pod["containers"]
    assert {"secretRef": {"name": "nats-server-passwords"}} in server["envFrom"]


def test_routers_take_the_tenant_from_the_bus_and_the_gateway_asks_as_tenants() -> None:
    for command in ALL_COMMANDS:
        args = parsed(command)
        if command.argv[0] == "router":
            assert args.tenant_from == "bus", f"{command}: routers must run --tenant-from bus"
        if command.argv[0] == "gateway":
            directory = command.flag_value("--tenant-identities")
            assert directory == "/etc/hecate/tenants", f"{command}: no --tenant-identities"
    gateway = _compose()["gateway"]
    assert "./.hecate/deploy/tenants:/etc/hecate/tenants:ro" in gateway["volumes"]
    docs = _k8s_objects()
    pod = docs[("Deployment", "hecate-gateway")]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tenants"]["secret"]["secretName"] == "hecate-gateway-tenants"


def test_the_readme_says_whether_the_shipped_setups_enforce_quotas() -> None:
    """The README tells users what a 429 is; it may promise the quota desk's booked
    slot only where a shipped setup runs it: routers with --enforce-quotas and the
    breaker with --quotas. None does, so it must say quotas are off there."""
    from hecate_launcher import plan_commands

    up = plan_commands(build_parser().parse_args(["up", "--topology", str(EXAMPLE_TOPOLOGY)]), "")
    shipped = [c.argv for c in ALL_COMMANDS] + [list(spec.argv) for spec in up]
    enforcing = [a for a in shipped if a[0] == "router" and "--enforce-quotas" in a]
    desk = [a for a in shipped if a[0] == "breaker" and "--quotas" in a]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert not enforcing, enforcing
    assert not desk, desk
    assert "quotas" in readme
    assert "are off in every shipped setup (`hecate up`, compose, Kubernetes)" in readme


def test_the_generator_writes_every_identity_the_deployment_uses(tmp_path: Path) -> None:
    topology = parse_topology(EXAMPLE_TOPOLOGY.read_bytes())
    out = tmp_path / "deploy"
    natsconfig.write_deployment(
        out,
        permissions.DEFAULT_TENANTS,
        [n.id for n in topology.nodes],
        hosts=natsconfig.deployment_hosts(),
    )
    for _, _, argv in _hecate_compose_services():
        assert (out / "users" / f"{_user_of(argv)}.env").is_file()
    for node in topology.nodes:
        env = identities.read_env_file(out / "users" / f"{permissions.node_user(node.id)}.env")
        assert env["HECATE_NATS_USER"] == permissions.node_user(node.id)
        assert env["HECATE_NATS_CA"] == natsconfig.CLIENT_CA
    for tenant in permissions.DEFAULT_TENANTS:
        assert identities.read_env_file(out / "tenants" / f"{tenant}.env")["HECATE_NATS_USER"]
    server_env = identities.read_env_file(out / "nats-server.env")
    accounts = (out / "nats" / "accounts.conf").read_text()
    for variable in re.findall(r"\$(HECATE_[A-Z0-9_]+)", accounts):
        assert server_env.get(variable), f"{variable} is not in nats-server.env"
    assert (out / "nats" / "server.conf").read_text() == natsconfig.SERVER_CONF
    assert out.stat().st_mode & 0o077 == 0
    assert (out / "nats-server.env").stat().st_mode & 0o077 == 0
    with pytest.raises(FileExistsError):
        natsconfig.write_deployment(out, (), (), hosts=())


def test_the_generator_command_line(tmp_path: Path) -> None:
    from hecate.cli.main import main

    out = tmp_path / "d"
    code = main(
        [
            "nats-config",
            "--secrets",
            str(out),
            "--topology",
            str(EXAMPLE_TOPOLOGY),
            "--host",
            "nats.example.org",
        ]
    )
    assert code == 0
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((out / "nats" / "server.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    assert {"nats", "nats.hecate.svc.cluster.local", "nats.example.org"} <= dns


@pytest.mark.parametrize(
    "command",
    [c for c in ALL_COMMANDS if c.flag_value("--topology") is not None],
    ids=lambda c: c.source,
)
def test_topology_paths_resolve_to_a_valid_topology(command: Command) -> None:
    path = PurePosixPath(command.flag_value("--topology") or "")
    files = command.mounts.get(str(path.parent))
    assert files is not None, f"{command}: nothing from the repo is mounted at {path.parent}"
    assert path.name in files, f"{command}: {path.name} is not in the mount at {path.parent}"
    parse_topology(files[path.name].encode())


def test_the_planner_topology_configmap_is_the_example() -> None:
    (data,) = [
        doc["data"]
        for _, doc in _k8s_documents()
        if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == "hecate-topology"
    ]
    assert json.loads(data["swarm.json"]) == json.loads(EXAMPLE_TOPOLOGY.read_text()), (
        "deploy/k8s/topology-configmap.yaml has drifted from examples/swarm.json"
    )


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = load_documents((K8S / "kustomization.yaml").read_text(), "kustomization")
    listed = set(kustomization["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present, (
        f"kustomization.yaml lists {sorted(listed)}, dir has {sorted(present)}"
    )


def test_the_yaml_subset_reader() -> None:
    text = (
        "a: 1  # comment\n"
        "b:\n"
        "- x\n"
        '- "y # not a comment"\n'
        "c:\n"
        "  - name: n\n"
        "    value: v\n"
        '  - args: ["p", \'q\', "--r=1"]\n'
        "d: |\n"
        "  line 1\n"
        "    # kept\n"
        "e: {}\n"
        "---\n"
        "f: g\n"
    )
    assert load_documents(text, "t") == [
        {
            "a": "1",
            "b": ["x", "y # not a comment"],
            "c": [{"name": "n", "value": "v"}, {"args": ["p", "q", "--r=1"]}],
            "d": "line 1\n  # kept\n",
            "e": {},
        },
        {"f": "g"},
    ]
    with pytest.raises(YamlSubsetError, match="t:1"):
        load_documents("a: &anchor x\n", "t")
