"""The node executor for a real generative model (``--executor smollm2``).

It loads only the layer ranges the plan gives its node (first stage: also the
embedding and the tokenizer; last stage: the final norm and the tied head), keeps one
KV cache per session per range, and answers generation steps. The node decides where
each call runs, not this module: loading (``prepare``), the warm-up pass that follows
it (``warm_up``) and prefills or replays (a whole prompt) go to a worker thread so
heartbeats keep flowing; a decode step (one new token, a few milliseconds) runs on the
node's event loop, where a thread hand-off cost more than it saved.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from hecate.llm.gguf_model import load_stage
from hecate.llm.llama import LlamaStage
from hecate.llm.sessions import Sessions, sample
from hecate.llm.store import pull
from hecate.llm.tokenizer import chat_prompt, load_tokenizer
from hecate.model.executor import ExecutorError
from hecate.wire.messages import StageReply, StageRequest

EOS = 2  # <|im_end|>
#: What ``warm_up`` runs: the prompt's first token on the first stage, one position elsewhere.
WARM_UP_PROMPT = "The capital of France is"
WARM_UP_POSITIONS = 1  # the size of a decode step, what most stage requests are


class LlmExecutor:
    name = "smollm2"
    generative = True
    whole_model = False

    def __init__(self, model: str = "smollm2-135m", path: Path | None = None) -> None:
        self.model = model
        self.path = path
        self._ranges: dict[tuple[int, int], Sessions] = {}
        self._lock = threading.Lock()
        self._tokenizer: Tokenizer | None = None

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
                    self._ranges[r] = Sessions(LlamaStage(load_stage(self._gguf(), *r)))
            ends = any(s.stage.first or s.stage.last for s in self._ranges.values())
        if ends:  # the first stage encodes prompts, the last decodes tokens: load it now too
            self.tokenizer()

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
        hidden = stage.forward(x, stage.new_cache())
        if stage.last:
            stage.logits(hidden)

    def step(self, req: StageRequest) -> StageReply:
        sessions = self._sessions(req.layer_start, req.layer_end)
        stage = sessions.stage
        prompt_tokens = None
        if stage.first:
            tokens = req.tokens
            if tokens is None:
                text = req.prompt
                if req.messages:
                    text = chat_prompt([(m.role, m.content) for m in req.messages])
                tokens = prompt_tokens = self.tokenizer().encode(text).ids
            if not tokens:
                raise ExecutorError("bad_request", "nothing to generate from: empty prompt")
            hidden = sessions.step(req.session, req.position, tokens=list(tokens))
        else:
            hidden = sessions.step(req.session, req.position, hidden=req.activation)
        if not stage.last:
            return StageReply(
                ok=True, activation=hidden.astype("<f4").tobytes(), prompt_tokens=prompt_tokens
            )
        token = sample(
            stage.logits(hidden),
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            step=req.step,
        )
        return StageReply(
            ok=True,
            token=token,
            text=self.tokenizer().decode([token]),
            eos=token == EOS,
            prompt_tokens=prompt_tokens,
        )

    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._gguf())
        return self._tokenizer

    # The layer interface of the toy executors does not apply to a generative model.
    def embed(self, model_id: str, prompt: str) -> bytes:
        del model_id, prompt
        raise ExecutorError("bad_request", "smollm2 runs generation steps")

    def run(self, model_id: str, layer_start: int, layer_end: int, activation: bytes) -> bytes:
        del model_id, layer_start, layer_end, activation
        raise ExecutorError("bad_request", "smollm2 runs generation steps")

    def decode(self, model_id: str, layers: int, activation: bytes, max_tokens: int) -> str:
        del model_id, layers, activation, max_tokens
        raise ExecutorError("bad_request", "smollm2 runs generation steps")
