"""``hecate model pull|generate``: the real model's cache, and a single-process run."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any


def _cmd_pull(args: argparse.Namespace) -> int:
    from hecate.llm.gguf_model import prepare
    from hecate.llm.store import pull

    # SIGTERM (a supervisor stopping it, or dying) unwinds like Ctrl-C: the download it
    # runs is killed and its temporary files removed, not left running on their own.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    path = pull(args.name, progress=lambda line: print(line, file=sys.stderr))
    print(f"{args.name}: preparing float32 weights and tokenizer", file=sys.stderr)
    prepare(path)
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    """Greedy generation in this process (the reference the swarm is compared with)."""
    import numpy as np

    from hecate.llm.gguf_model import load_stage
    from hecate.llm.llama import LlamaStage
    from hecate.llm.store import pull
    from hecate.llm.tokenizer import load_tokenizer

    path = pull(args.name, progress=lambda line: print(line, file=sys.stderr))
    stage = LlamaStage(load_stage(path, 0, load_stage_layers(path)))
    tokenizer = load_tokenizer(path)
    ids = tokenizer.encode(args.prompt).ids
    cache = stage.new_cache()
    started = time.perf_counter()
    hidden = stage.forward(stage.embed(ids), cache)
    first = time.perf_counter() - started
    out: list[int] = []
    for _ in range(args.max_tokens):
        token = int(np.argmax(stage.logits(hidden)))
        out.append(token)
        sys.stdout.write(tokenizer.decode([token]))
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
    pull.set_defaults(run=_cmd_pull)
    gen = verbs.add_parser("generate", help="greedy generation in this process")
    gen.add_argument("name")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=16)
    gen.set_defaults(run=_cmd_generate)
