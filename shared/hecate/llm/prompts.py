"""A first stage's prompts: rendered with the model's chat template, tokenized, and
remembered a while by what they were made from (the prompt, or the messages and tools).

A step asks for its prompt's tokens twice: the node's batching, on the event loop, to
know how many rows it runs, and the batch, to run them. The event loop only looks
(:meth:`Prompts.known`); a worker thread works them out (:meth:`Prompts.ids`) before
the step waits for a batch, so a long prompt or a slow template never holds the
loop that the node's heartbeats share.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from tokenizers import Tokenizer

from hecate.llm.template import ChatTemplate
from hecate.model.executor import ExecutorError, StepInput, own_fault

__all__ = ["Prompts"]


class Prompts:
    """The token ids of the prompts worked out lately, the oldest forgotten first;
    shared by the threads that work them out and the event loop that only looks."""

    def __init__(
        self,
        template: Callable[[], ChatTemplate],
        tokenizer: Callable[[], Tokenizer],
        kept: int = 256,
    ) -> None:
        self.template = template
        self.tokenizer = tokenizer
        self.kept = kept
        self._ids: OrderedDict[tuple[object, ...], tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(req: StepInput) -> tuple[object, ...]:
        return (req.messages, req.tools) if req.messages else (req.prompt,)

    def known(self, req: StepInput) -> tuple[int, ...] | None:
        """The prompt's ids if they were worked out lately; never works them out."""
        with self._lock:
            return self._ids.get(self._key(req))

    def ahead(self, step: StepInput) -> None:
        """Work out a first step's prompt ids (on a worker thread, before the step
        waits for a batch). Raises :class:`ExecutorError`: the template's refusal, or
        any other fault this prompt met, as its own error (``own_fault``)."""
        if step.tokens is not None or step.layer_start != 0 or step.position != 0:
            return
        try:
            self.ids(step)
        except ExecutorError:
            raise
        except Exception as exc:  # this prompt's, not the node's
            raise own_fault(step, "prompt", exc) from None

    def ids(self, req: StepInput) -> list[int]:
        """The prompt's ids, rendered and tokenized unless known. Raises what the
        template raises (:class:`hecate.llm.template` refuses one that overruns)."""
        known = self.known(req)
        if known is not None:
            return list(known)
        text = self.template().render(req.messages, req.tools) if req.messages else req.prompt
        # encode_batch lets go of the interpreter's lock while it works; encode holds it
        # (80 ms for a 64 KB prompt, which the event loop would wait out beside it).
        ids = tuple(self.tokenizer().encode_batch([text])[0].ids)
        key = self._key(req)
        with self._lock:
            self._ids[key] = ids
            self._ids.move_to_end(key)
            while len(self._ids) > self.kept:
                self._ids.popitem(last=False)
        return list(ids)
