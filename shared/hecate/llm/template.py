"""A GGUF's own chat template (``tokenizer.chat_template``), rendered as transformers and
llama.cpp's Jinja path render it: Jinja2 in its immutable sandbox (a template is code
from the file's author: it may read what it is given and nothing else), blocks trimmed,
``tojson`` and ``raise_exception`` at hand, ``bos_token`` and ``eos_token`` given, the
assistant's turn opened at the end (``add_generation_prompt``).

Tools (OpenAI's ``tools`` array) go to a template that takes them (one that reads
``tools``, as Qwen2.5's, Llama 3.1's and Hermes' do) as its ``tools``; to any other, as
a system block in Hermes' form (:func:`tools_block`, what Qwen2 and Hermes were tuned
on), after the system message's own words or as the first message. The calls the model
writes are held to the ``<tool_call>`` form by the grammar the gateway asks for, which is
the form those templates teach.

A file without a template is rendered as ChatML (SmolLM2's and Qwen2's, what most small
chat models were tuned on) with no default system message. Where the tokenizer adds BOS
itself (``add_bos_token``), a BOS the template writes first is left out, so that the
prompt does not start with two. A template that refuses the messages (many raise on
roles out of turn) is a ``bad_request`` naming its reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hecate.model.executor import ExecutorError

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _refuse(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


class ChatTemplate:
    def __init__(
        self, source: str | None, *, bos: str = "", eos: str = "", adds_bos: bool = False
    ) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _refuse
        env.globals["strftime_now"] = time.strftime  # Llama 3's templates date the prompt
        self.source = source or CHATML
        self.own = source is not None
        self.bos, self.eos, self.adds_bos = bos, eos, adds_bos
        self._template = env.from_string(self.source)

    @property
    def takes_tools(self) -> bool:
        """Whether the template reads a ``tools`` list."""
        return self.own and "tools" in self.source

    def render(self, messages: Sequence[tuple[str, str]], tools: str = "") -> str:
        """The prompt for ``messages`` ((role, content) pairs) and ``tools`` (OpenAI's
        array, JSON; empty: none), ending where the assistant's answer begins. Raises
        :class:`ExecutorError` (``bad_request``)."""
        turns = [{"role": role, "content": content} for role, content in messages]
        given: dict[str, Any] = {}
        if tools:
            try:
                declared = json.loads(tools)
            except json.JSONDecodeError as exc:
                raise ExecutorError("bad_request", f"tools: not JSON ({exc})") from None
            if self.takes_tools:
                given["tools"] = declared
            elif turns and turns[0]["role"] == "system":
                turns[0] = {"role": "system", "content": f"{turns[0]['content']}\n\n"
                            f"{tools_block(declared)}"}  # fmt: skip
            else:
                turns.insert(0, {"role": "system", "content": tools_block(declared)})
        try:
            text = self._template.render(
                messages=turns,
                add_generation_prompt=True,
                bos_token=self.bos,
                eos_token=self.eos,
                **given,
            )
        except TemplateError as exc:
            raise ExecutorError(
                "bad_request", f"the model's chat template refused the messages: {exc}"
            ) from None
        if self.adds_bos and self.bos and text.startswith(self.bos):
            text = text[len(self.bos) :]
        return text


def tools_block(tools: list[dict[str, Any]]) -> str:
    """The tools as Qwen2's and Hermes' chat formats tell them: each function's JSON
    signature within ``<tools></tools>``, and the form of a call."""
    signatures = "\n".join(json.dumps(t) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{signatures}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def template_fields(path: Path) -> dict[str, Any]:
    """What rendering needs of the GGUF at ``path`` (read once: the prepared folder
    keeps it as ``chat_template.json``)."""
    from hecate.llm.gguf_file import GGUFFile

    file = GGUFFile(path)
    meta = file.metadata

    def token(key: str) -> str:
        i = meta.get(key)
        return "" if i is None else str(file.field("tokenizer.ggml.tokens")[int(i)])

    source = meta.get("tokenizer.chat_template")
    return {
        "source": None if source is None else str(source),
        "bos": token("tokenizer.ggml.bos_token_id"),
        "eos": token("tokenizer.ggml.eos_token_id"),
        "adds_bos": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    }


def load_template(path: Path) -> ChatTemplate:
    """The chat template of the GGUF at ``path``, from its prepared folder when there."""
    from hecate.llm.gguf_model import Prepared

    fields = json.loads(
        Prepared(path).text("chat_template.json", lambda: json.dumps(template_fields(path)))
    )
    return ChatTemplate(
        fields["source"], bos=fields["bos"], eos=fields["eos"], adds_bos=fields["adds_bos"]
    )
