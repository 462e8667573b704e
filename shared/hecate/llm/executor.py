"""The node executor for a real generative model (``--executor smollm2``).

It loads only the layer ranges the plan gives its node (first stage: also the
embedding and the tokenizer; last stage: the final norm and the tied head), keeps one
KV cache per session per range, and answers generation steps, several sessions' at
once (``execute``: one forward pass per range for all of them): the ``steps`` kind of
:mod:`hecate.model.executor`, whose typed inputs and outputs are all it knows of a
request. The node decides
where each call runs, not this module: it keeps every step off its event loop so that
heartbeats keep flowing.

A prompt is run in chunks on the first stage: at most ``chunk`` positions a step, so
that no activation outgrows the bus (``max_payload``) and no prompt holds a batch for
its whole length. Every reply says how many positions the step ran (``positions``); the
caller sends the rest of the sequence from there, and ignores the token sampled after
a chunk that was not the sequence's last. A sequence that could not fit the model's
context with the tokens it asks for is refused up front (``prompt_too_long``).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, get_args

import numpy as np
from tokenizers import Tokenizer

from hecate.llm.budget import engine_threads as engine_threads
from hecate.llm.budget import kv_positions
from hecate.llm.chunks import PREFILL_CHUNK, chunk_of, prefill_chunk
from hecate.llm.constrain import ConstraintError, Constraints, logprob_of
from hecate.llm.gguf_file import GGUFFile
from hecate.llm.gguf_model import load_stage, read_config
from hecate.llm.kv_pool import KV_TYPE
from hecate.llm.llama import Array, LlamaStage
from hecate.llm.prefix_news import Announcer
from hecate.llm.prompts import Prompts
from hecate.llm.sessions import (
    Sessions,
    Stage,
    Step,
    kv_bytes_per_position,
    kv_itemsize,
    sample,
)
from hecate.llm.steps import step_of
from hecate.llm.store import pull
from hecate.llm.template import ChatTemplate, load_template
from hecate.llm.tokenizer import TextStream, eos_ids, load_tokenizer
from hecate.model.executor import ExecutorError, StepInput, StepOutput, TokenLogprob, own_fault
from hecate.model.footprint import Footprint
from hecate.model.prints import ModelNews

#: What ``warm_up`` runs: the prompt's first token on the first stage, one position elsewhere.
WARM_UP_PROMPT = "The capital of France is"
WARM_UP_POSITIONS = 1  # the size of a decode step, what most stage requests are


Engine = Literal["numpy", "onnx"]
ENGINES: tuple[str, ...] = get_args(Engine)


class LlmExecutor:
    name = "smollm2"
    kind: Literal["steps"] = "steps"

    def __init__(
        self,
        model: str = "smollm2-135m",
        path: Path | None = None,
        *,
        prefill_chunk: int = PREFILL_CHUNK,
        engine: Engine = "onnx",
        threads: int | None = None,
        name: str | None = None,
    ) -> None:
        """``engine``: what runs each range, ONNX Runtime on the GGUF's own blocks
        (:mod:`hecate.llm.onnx_stage`, on ``threads`` threads, default every core), or
        the numpy model (float32 weights, the reference the engine is tested against)."""
        self.model = model
        self.path = path
        self.engine: Engine = engine
        self.threads = threads if threads is not None else engine_threads()
        if name is not None:
            self.name = name  # a registered model's executor is named as the model
        elif engine != "onnx":
            self.name = f"smollm2-{engine}"
        self.prefill_chunk = prefill_chunk
        self.kv_positions = kv_positions()
        self.max_payload: int | None = None  # the bus's, once the node has connected
        self._ranges: dict[tuple[int, int], Sessions] = {}
        self._lock = threading.Lock()
        self._tokenizer: Tokenizer | None = None
        self._eos: frozenset[int] | None = None
        #: on the last stage, the tokens of a character a session's text has begun and
        #: not finished (its UTF-8 bytes span tokens); no entry for the others
        self._held: dict[str, list[int]] = {}
        self._constraints: Constraints | None = None
        self._template: ChatTemplate | None = None
        #: the prompts tokenized lately: a step asks twice (rows, then its tokens)
        self._prompts = Prompts(self.template, self.tokenizer)
        #: what the first stage keeps, by the prints routers name prompts with
        self.announcer = Announcer()

    def eos(self) -> frozenset[int]:
        """The ids that end a generation, as the model's file names them."""
        if self._eos is None:
            self._eos = eos_ids(self._gguf())
        return self._eos

    def _gguf(self) -> Path:
        if self.path is None:
            self.path = pull(self.model, progress=lambda _line: None)
        return self.path

    def prepare(self, ranges: list[tuple[int, int]]) -> None:
        """Load the ranges the plan gives this node (and drop the others), and the
        tokenizer with a first or last stage: loading is paid here, not by the timed
        warm-up pass nor by the first request."""
        with self._lock:
            for r in list(self._ranges):
                if r not in ranges:
                    del self._ranges[r]
            for r in ranges:
                if r not in self._ranges:
                    stage = self._stage(*r)
                    per_position = kv_bytes_per_position(
                        stage.config, stage.block_count, kv_itemsize(stage)
                    )
                    budget = self.kv_positions * per_position
                    self._ranges[r] = Sessions(stage, max_bytes=budget)
            ends = any(s.stage.first or s.stage.last for s in self._ranges.values())
        if ends:  # the first stage encodes prompts, the last decodes tokens: load it now too
            self.tokenizer()
            self.template()

    def footprint(self) -> Footprint:
        """What ranges of this model cost a node (:class:`Footprint`), from the file's
        header: the engine's weights as held, :attr:`kv_positions` of KV a layer."""
        from hecate.llm.onnx_load import footprint

        file = GGUFFile(self._gguf())
        # the engine's KV type; the numpy model keeps float32
        itemsize = np.dtype(KV_TYPE if self.engine == "onnx" else np.float32).itemsize
        return footprint(file, read_config(file), self.kv_positions, itemsize)

    def _stage(self, layer_start: int, layer_end: int) -> Stage:
        if self.engine == "onnx":
            from hecate.llm.onnx_stage import OnnxStage

            # Several stages share a node's cores with its event loop: threads that
            # spin between runs would take them from the heartbeats.
            return OnnxStage(
                self._gguf(), layer_start, layer_end, threads=self.threads, slots=64, spin=False
            )
        return LlamaStage(load_stage(self._gguf(), layer_start, layer_end))

    def _sessions(self, layer_start: int, layer_end: int) -> Sessions:
        """The range's stage and sessions, loaded now if the plan's ``prepare`` has not."""
        with self._lock:
            sessions = self._ranges.get((layer_start, layer_end))
        if sessions is None:
            self.prepare([*self._ranges, (layer_start, layer_end)])
            sessions = self._ranges[(layer_start, layer_end)]
        return sessions

    def warm_up(self, model_id: str, layer_start: int, layer_end: int) -> None:
        """One position through the range, the size of a decode step: the first token of
        a fixed prompt on the first stage, a made-up hidden state on the others, the head
        too on the last. It runs on a KV cache of its own that is never registered as a
        session and is dropped on return, so no cache is left behind and no live session is
        evicted for it; on the way it pages the memory-mapped weights in, which the
        first real request would otherwise pay for."""
        del model_id  # this executor serves the one model it was built with
        stage = self._sessions(layer_start, layer_end).stage
        if stage.first:
            x = stage.embed(self.tokenizer().encode(WARM_UP_PROMPT).ids[:WARM_UP_POSITIONS])
        else:
            rng = np.random.default_rng(0)
            x = rng.standard_normal((WARM_UP_POSITIONS, stage.config.hidden), dtype=np.float32)
        cache = stage.new_cache()
        try:
            outs = stage.forward_batch([x], [cache])
            if stage.last:
                stage.logits_of(outs)
        finally:
            stage.free(cache)

    def _text(self, req: StepInput, token: int) -> str:
        """The text ``token`` adds to ``req``'s generation, characters whole (a session's
        first token starts its text afresh)."""
        held = self._held.pop(req.session, None)
        stream = TextStream(self.tokenizer(), held if req.step else None)
        text = stream.push(token)
        if stream.held:
            self._held[req.session] = stream.held
        return text

    def release(self, session: str) -> None:
        """Drop ``session``'s caches on every range held here. Run it on the compute
        thread, between batches, like a step."""
        self._held.pop(session, None)
        if self._constraints is not None:
            self._constraints.forget(session)
        with self._lock:
            held = list(self._ranges.values())
        for sessions in held:
            sessions.close(session)

    def session_count(self) -> int:
        """Sessions holding a cache here, over all ranges (read from any thread: a
        figure for STATS, not a decision)."""
        return sum(len(s.caches) for s in list(self._ranges.values()))

    def prefix_counts(self) -> dict[str, int]:
        """:meth:`Prefixes.counts <hecate.llm.prefixes.Prefixes.counts>` summed over the
        ranges held (STATS figures, read from any thread; as :meth:`engine_counts`)."""
        return _summed(s.prefixes.counts() for s in list(self._ranges.values()))

    def prefix_news(self) -> list[ModelNews]:
        """What the first stages' prefix stores newly keep and dropped since the last
        call (:meth:`Announcer.news <hecate.llm.prefix_news.Announcer.news>`): on the
        thread that steps, as the stores change there."""
        with self._lock:
            stores = [s.prefixes for s in self._ranges.values() if s.stage.first]
        return self.announcer.news(stores)

    def prefix_state(self) -> list[ModelNews]:
        """Everything the news has told and not dropped since."""
        return self.announcer.state()

    def engine_counts(self) -> dict[str, int]:
        """``OnnxStage.counts`` summed over the ranges held (none from the numpy model)."""
        return _summed(getattr(s.stage, "counts", {}) for s in list(self._ranges.values()))

    def limit_payload(self, max_payload: int) -> None:
        """The largest message the bus carries: first-stage chunks are sized to fit it."""
        self.max_payload = max_payload

    def chunk(self, hidden: int) -> int:
        return prefill_chunk(hidden, self.max_payload, self.prefill_chunk)

    def rows(self, step: StepInput) -> int | None:
        """How many positions ``req`` would run here, when that is known without loading
        a range or tokenizing a prompt (``None`` otherwise): the node's batching uses it
        to keep prefill rows out of decode batches."""
        # Read without the lock: ``prepare`` holds it while it loads a range (seconds,
        # the first time), and this is asked on the node's event loop.
        sessions = self._ranges.get((step.layer_start, step.layer_end))
        if sessions is None:
            return None
        hidden = sessions.stage.config.hidden
        if sessions.stage.first:
            # Only a prompt tokenized already (:meth:`tokenize`, before the step waits
            # for a batch): a template or a long prompt is never worked on here, on the
            # event loop the node's heartbeats share.
            tokens = step.tokens if step.tokens is not None else self._prompts.known(step)
            if tokens is None:
                return None
            return len(chunk_of(step, tokens, self.chunk(hidden)))
        return len(step.activation) // (4 * hidden)

    def tokenize(self, step: StepInput) -> None:
        """A first step's prompt tokens, worked out ahead (:meth:`Prompts.ahead`)."""
        self._prompts.ahead(step)

    def template(self) -> ChatTemplate:
        """The model's own chat template (the GGUF's), loaded when first needed."""
        if self._template is None:
            self._template = load_template(self._gguf())
        return self._template

    def step(self, req: StepInput) -> StepOutput:
        """One generation step. Raises :class:`ExecutorError`."""
        reply = self.execute([req])[0]
        if isinstance(reply, ExecutorError):
            raise reply
        return reply

    def execute(self, reqs: Sequence[StepInput]) -> list[StepOutput | ExecutorError]:
        """Several sessions' steps at once: one forward pass per layer range for all the
        steps of that range, one head matmul for the ones that end on the last stage.
        Each step is checked on its own before (range, prompt, context, session
        position), and answered on its own: one refused step (``bad_request``,
        ``prompt_too_long``, ``session_lost``, ...) fails only itself, and so does an
        exception raised in its own part (its prompt, its sampling: :func:`own_fault`).
        Anything raised computing the batch together (out of memory) fails the batch."""
        results: list[StepOutput | ExecutorError | None] = [None] * len(reqs)
        groups: dict[int, tuple[Sessions, list[tuple[int, Step, list[int] | None]]]] = {}
        for i, req in enumerate(reqs):
            try:
                sessions = self._load(req.layer_start, req.layer_end)
                step, prompt_tokens = step_of(
                    sessions, req, self._prompts.ids, self.chunk, self.announcer
                )
            except ExecutorError as exc:
                results[i] = exc
                continue
            except Exception as exc:  # this request's data met a fault: its error alone
                results[i] = own_fault(req, "prepare", exc)
                continue
            groups.setdefault(id(sessions), (sessions, []))[1].append((i, step, prompt_tokens))
        for sessions, items in groups.values():
            stage = sessions.stage
            outs = sessions.step_batch([step for _, step, _ in items])
            done: list[tuple[int, Array, list[int] | None]] = []
            for (i, _, prompt_tokens), out in zip(items, outs, strict=True):
                if isinstance(out, ExecutorError):
                    results[i] = out
                else:
                    done.append((i, out, prompt_tokens))
            if not done:
                continue
            reused = {i: step.reuse for i, step, _ in items}
            if not stage.last:
                for i, hidden, prompt_tokens in done:
                    results[i] = StepOutput(
                        activation=hidden.astype("<f4").tobytes(),
                        prompt_tokens=prompt_tokens,
                        positions=reused[i] + hidden.shape[0],
                        reused=reused[i],
                    )
                continue
            logits = stage.logits_of([out for _, out, _ in done])
            ran = {i: step.rows(stage.config.hidden) for i, step, _ in items}
            for row, (i, _, prompt_tokens) in enumerate(done):
                req = reqs[i]
                try:
                    token, logprob = self._sample(req, logits[row])
                    text = self._text(req, token)
                except ConstraintError as exc:
                    results[i] = ExecutorError("bad_request", f"output format: {exc}")
                    continue
                except Exception as exc:  # as above: the batch's others are answered
                    results[i] = own_fault(req, "sample", exc)
                    continue
                results[i] = StepOutput(
                    token=token,
                    text=text,
                    eos=token in self.eos(),
                    prompt_tokens=prompt_tokens,
                    positions=reused[i] + ran[i],
                    logprob=logprob,
                    reused=reused[i],
                )
        return [r if r is not None else ExecutorError("internal", "step not run") for r in results]

    def _sample(self, req: StepInput, logits: Array) -> tuple[int, TokenLogprob | None]:
        """The next token of ``req``, drawn only among those its output format allows
        after the tokens sampled so far, and its log-probability when asked (the
        model's own distribution, before the format's mask)."""
        drawn_from = logits
        if req.output_format is not None:
            allowed = self.constraints(len(logits)).allowed(
                req.session, req.output_format, req.sampled
            )
            drawn_from = np.where(allowed, logits, np.float32(-np.inf))
        token = sample(
            drawn_from, temperature=req.temperature, top_p=req.top_p, seed=req.seed, step=req.step
        )
        if req.logprobs is None:
            return token, None
        return token, logprob_of(logits, token, req.logprobs, self.constraints(len(logits)).piece)

    def constraints(self, vocab: int) -> Constraints:
        """The last stage's constraints and token pieces, made when first needed."""
        if self._constraints is None:
            self._constraints = Constraints(self.tokenizer(), sorted(self.eos()), vocab)
        return self._constraints

    def _load(self, layer_start: int, layer_end: int) -> Sessions:
        try:
            return self._sessions(layer_start, layer_end)
        except ValueError as exc:  # a range outside the model
            raise ExecutorError("bad_range", str(exc)) from None

    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._gguf())
        return self._tokenizer


def _summed(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for c in counts:
        out.update(c)
    return dict(out)
