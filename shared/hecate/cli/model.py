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


#: what runs the model, by ``--reference``, as the summary line names it
ENGINES = {False: ("onnx", "the engine"), True: ("numpy", "the float32 numpy reference")}


def _cmd_generate(args: argparse.Namespace) -> int:
    """Greedy generation in this process, on the engine the nodes run (ONNX Runtime on
    the file's own quantised blocks), or with ``--reference`` on the float32 numpy model
    (its weights dequantised: several times slower, several times the file's memory).
    The text is :func:`hecate.llm.reference.greedy_text`'s, streamed: the prompt in the
    chunks a first stage runs it in, then a step a token, up to the end of the turn."""
    import numpy as np

    from hecate.core.errors import HecateError
    from hecate.llm.chunks import PREFILL_CHUNK
    from hecate.llm.reference import whole_model
    from hecate.llm.store import pull
    from hecate.llm.tokenizer import TextStream, eos_ids, load_tokenizer

    path = pull(args.name, progress=lambda line: print(line, file=sys.stderr))
    engine, what = ENGINES[bool(args.reference)]
    tokenizer = load_tokenizer(path)
    ids = tokenizer.encode(args.prompt).ids
    if not ids:
        raise HecateError("the prompt is empty: nothing to continue")
    # This process has the machine to itself: every core, its threads spinning between
    # steps (the engine's fastest alone, as `hecate bench llm` runs it).
    stage = whole_model(path, engine, threads=None, spin=True)
    context = stage.config.context
    if len(ids) + args.max_tokens > context:
        raise HecateError(
            f"a prompt of {len(ids)} tokens and --max-tokens {args.max_tokens} exceed "
            f"{args.name}'s context of {context} positions"
        )
    ends = eos_ids(path)
    text = TextStream(tokenizer)
    chunk = PREFILL_CHUNK
    cache = stage.new_cache()
    started = time.perf_counter()
    for start in range(0, len(ids) - chunk, chunk):  # every chunk but the last
        stage.forward_batch([stage.embed(ids[start : start + chunk])], [cache])
    x = stage.embed(ids[(len(ids) - 1) // chunk * chunk :])
    first: float | None = None
    steps = 0
    for _ in range(args.max_tokens):
        token = int(np.argmax(stage.logits_of(stage.forward_batch([x], [cache]))[0]))
        steps += 1
        first = time.perf_counter() - started if first is None else first
        if token in ends:
            break
        sys.stdout.write(text.push(token))
        sys.stdout.flush()
        x = stage.embed([token])
    elapsed = time.perf_counter() - started
    stage.free(cache)
    rate = (steps - 1) / max(elapsed - first, 1e-9) if first is not None and steps > 1 else 0.0
    print(
        f"\n-- first token {(first or 0.0) * 1000:.0f} ms, {rate:.1f} tokens/s (single "
        f"process, greedy, on {what})",
        file=sys.stderr,
    )
    return 0


def add_parser(sub: Any) -> None:
    from hecate.cli.main import positive_int

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
    gen = verbs.add_parser(
        "generate", help="greedy generation in this process, on the nodes' engine"
    )
    gen.add_argument("name")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=positive_int, default=16)
    gen.add_argument(
        "--reference",
        action="store_true",
        help="run the float32 numpy reference model instead of the engine (slower, "
        "several times the memory; what the engine is checked against)",
    )
    gen.set_defaults(run=_cmd_generate)
