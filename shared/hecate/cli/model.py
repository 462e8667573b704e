"""``hecate model pull|add|list|generate``: the models a node can run, and a
single-process run."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _cmd_pull(args: argparse.Namespace) -> int:
    from hecate.llm.gguf_model import prepare
    from hecate.llm.store import pull

    # SIGTERM (a supervisor stopping it, or dying) unwinds like Ctrl-C: the download it
    # runs is killed and its temporary files removed, not left running on their own.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    path = pull(args.name, progress=lambda line: print(line, file=sys.stderr))
    what = "float32 weights and tokenizer" if args.float32 else "tokenizer"
    print(f"{args.name}: preparing its {what}", file=sys.stderr)
    prepare(path, float32=args.float32)
    return 0


def _cmd_add(args: argparse.Namespace) -> int:
    from hecate.llm.store import add

    entry = add(args.name, args.path, progress=lambda line: print(line, file=sys.stderr))
    print(
        f"{args.name}: {entry.arch}, {entry.layers} layers, {entry.size:,} bytes, sha256 "
        f'{entry.sha256}\nserve it with "executor": "{args.name}" on a topology\'s model '
        "and nodes"
    )
    return 0


def _cmd_list(_args: argparse.Namespace) -> int:
    from hecate.llm.store import MODELS, known, present, registered

    entries = registered()
    for name in known():
        if name in MODELS:
            where = "built in, " + ("in the cache" if present(name) else "not pulled yet")
        else:
            e = entries[name]
            state = "" if present(name) else " (CHANGED or gone since added)"
            where = f"{e.path}{state}, {e.arch}, {e.layers} layers"
        print(f"{name}\t{where}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    """Greedy generation in this process (the reference the swarm is compared with)."""
    import numpy as np

    from hecate.llm.gguf_model import load_stage
    from hecate.llm.llama import LlamaStage
    from hecate.llm.store import pull
    from hecate.llm.tokenizer import TextStream, load_tokenizer

    path = pull(args.name, progress=lambda line: print(line, file=sys.stderr))
    stage = LlamaStage(load_stage(path, 0, load_stage_layers(path)))
    tokenizer = load_tokenizer(path)
    text = TextStream(tokenizer)
    ids = tokenizer.encode(args.prompt).ids
    cache = stage.new_cache()
    started = time.perf_counter()
    hidden = stage.forward(stage.embed(ids), cache)
    first = time.perf_counter() - started
    out: list[int] = []
    for _ in range(args.max_tokens):
        token = int(np.argmax(stage.logits(hidden)))
        out.append(token)
        sys.stdout.write(text.push(token))
        sys.stdout.flush()
        hidden = stage.forward(stage.embed([token]), cache)
    elapsed = time.perf_counter() - started
    print(
        f"\n-- first token {first * 1000:.0f} ms, {len(out) / max(elapsed - first, 1e-9):.1f} "
        "tokens/s (single process, greedy)",
        file=sys.stderr,
    )
    return 0


def load_stage_layers(path: Any) -> int:
    from hecate.llm.gguf_model import model_config

    return model_config(path).layers


def add_parser(sub: Any) -> None:
    model: argparse.ArgumentParser = sub.add_parser("model", help="the real model's files")
    verbs = model.add_subparsers(dest="verb", required=True, metavar="VERB")
    pull = verbs.add_parser(
        "pull", help="fetch a model into the cache and prepare it (no-op if present)"
    )
    pull.add_argument("name", help="e.g. smollm2-135m")
    pull.add_argument(
        "--float32",
        action="store_true",
        help="also prepare the float32 reference's weights (smollm2-numpy nodes)",
    )
    pull.set_defaults(run=_cmd_pull)
    add = verbs.add_parser(
        "add",
        help="register a local GGUF as NAME (checked whole and checksummed; not copied)",
    )
    add.add_argument("name", help="the model's name in topologies (lower-case, digits, - _)")
    add.add_argument("path", type=Path, help="the .gguf file")
    add.set_defaults(run=_cmd_add)
    listing = verbs.add_parser("list", help="the models a node can run")
    listing.set_defaults(run=_cmd_list)
    gen = verbs.add_parser("generate", help="greedy generation in this process")
    gen.add_argument("name")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=16)
    gen.set_defaults(run=_cmd_generate)
