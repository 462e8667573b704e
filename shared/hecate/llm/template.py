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
the form those templates teach. Tools that are not an array of function objects, or
nest deeper than :data:`MAX_TOOLS_DEPTH`, are a ``bad_request`` naming ``tools``.

A file without a template is rendered with its architecture's own where the engine knows
it (:data:`KNOWN_TEMPLATES`: Gemma 3's turns, as its makers publish them and as llama.cpp
recognises them), else as ChatML (SmolLM2's and Qwen2's, what most small chat models were
tuned on) with no default system message. Where the tokenizer adds BOS
itself (``add_bos_token``), a BOS the template writes first is left out, so that the
prompt does not start with two. A template that refuses the messages (many raise on
roles out of turn) is a ``bad_request`` naming its reason.

The sandbox bounds what a template may reach, not what it may spend, and a render runs
on a node serving others: each render is held to a budget. :data:`MAX_STEPS` loop
iterations and calls in all (nested loops multiply); no value built, and no output,
longer than :data:`MAX_CHARS` or :data:`CHARS_PER_INPUT` times the messages and tools;
:data:`WORK_PER_CHAR` times that built in all; :data:`RENDER_SECONDS` of wall clock. The
budget is counted where the template's code meets the environment: calls, filters,
arithmetic, each loop's iterable, each list, tuple, dict and ``~`` it builds, each
output; where an operation's result could outgrow its operands by an amount its
arguments choose (``'x' * n``, ``center(n)``, ``replace``, ``join``, formats), its size is
bounded before it is made. A render past its budget, or one that recurses or runs out
of memory, is a ``bad_request`` naming the limit. Real templates render in milliseconds
and write about their messages' size, far inside. :func:`vet` renders a template on a
sample conversation, to refuse a model whose template cannot render before it is added.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from hecate.llm.render_budget import (
    BUDGET,
    CHARS_PER_INPUT,
    MAX_CHARS,
    MAX_INT_BITS,
    MAX_STEPS,
    RENDER_SECONDS,
    WORK_PER_CHAR,
    Budget,
    Overrun,
)
from hecate.llm.sandbox import Meter, Refused, environment
from hecate.model.executor import ExecutorError

__all__ = [
    "CHARS_PER_INPUT",
    "CHATML",
    "GEMMA3",
    "KNOWN_TEMPLATES",
    "MAX_CHARS",
    "MAX_INT_BITS",
    "MAX_SOURCE_CHARS",
    "MAX_STEPS",
    "MAX_TOOLS_DEPTH",
    "RENDER_SECONDS",
    "WORK_PER_CHAR",
    "ChatTemplate",
    "load_template",
    "read_tools",
    "template_fields",
    "tools_block",
    "vet",
]

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
#: Gemma 3's template, as Google's instruction-tuned models carry it (their
#: ``tokenizer_config.json``): ``<start_of_turn>user`` and ``<start_of_turn>model`` turns
#: each closed by ``<end_of_turn>``, the system message folded into the first user turn.
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""
#: The template of a file that carries none (``tokenizer.chat_template``), by its
#: architecture (``general.architecture``); any other such file is rendered as ChatML.
KNOWN_TEMPLATES = {"gemma3": GEMMA3}
#: The longest template accepted (real ones are a few to tens of KB): compiling is
#: not bounded by the render's budget.
MAX_SOURCE_CHARS = 1 << 20
#: Brackets deep ``tools`` may nest, counting the array itself; json and Jinja's tojson
#: recurse per level and fail near 1,000.
MAX_TOOLS_DEPTH = 64


def _line(text: str, most: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= most else f"{text[: most - 3]}..."


class ChatTemplate:
    def __init__(
        self,
        source: str | None,
        *,
        bos: str = "",
        eos: str = "",
        adds_bos: bool = False,
        name: str = "the model's chat template",
    ) -> None:
        """Raises :class:`ExecutorError` (``bad_request``) if ``source`` does not compile."""
        self.source = source or CHATML
        self.own = source is not None
        self.bos, self.eos, self.adds_bos = bos, eos, adds_bos
        self.name = name
        env = environment()
        try:
            if len(self.source) > MAX_SOURCE_CHARS:
                raise ValueError(f"{len(self.source):,} characters, over {MAX_SOURCE_CHARS:,}")
            tree = Meter().visit(env.parse(self.source))
            tree.set_environment(env)
            self._template = env.from_string(tree)
        except Exception as exc:  # a syntax error, or nesting past the parser's recursion
            raise ExecutorError(
                "bad_request", _line(f"{name} does not compile: {type(exc).__name__}: {exc}")
            ) from None

    @property
    def takes_tools(self) -> bool:
        """Whether the template reads a ``tools`` list."""
        return self.own and "tools" in self.source

    def render(self, messages: Sequence[tuple[str, str]], tools: str = "") -> str:
        """The prompt for ``messages`` ((role, content) pairs) and ``tools`` (OpenAI's
        array, JSON; empty: none), ending where the assistant's answer begins. Raises
        :class:`ExecutorError` (``bad_request``)."""
        try:
            return self._attempt(messages, tools, add_generation_prompt=True)
        except Exception as exc:  # the template's code: anything it raises is its refusal
            raise self._failure(exc) from None

    def _attempt(
        self, messages: Sequence[tuple[str, str]], tools: str, *, add_generation_prompt: bool
    ) -> str:
        """The render, its template's own exceptions raised as they are."""
        turns = [{"role": role, "content": content} for role, content in messages]
        given: dict[str, Any] = {}
        if tools:
            declared = read_tools(tools)
            if self.takes_tools:
                given["tools"] = declared
            elif turns and turns[0]["role"] == "system":
                turns[0] = {"role": "system", "content": f"{turns[0]['content']}\n\n"
                            f"{tools_block(declared)}"}  # fmt: skip
            else:
                turns.insert(0, {"role": "system", "content": tools_block(declared)})
        size = len(tools) + sum(len(t["role"]) + len(t["content"]) for t in turns)
        token = BUDGET.set(Budget(size))
        try:
            text = self._template.render(
                messages=turns,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos,
                eos_token=self.eos,
                **given,
            )
        finally:
            BUDGET.reset(token)
        if self.adds_bos and self.bos and text.startswith(self.bos):
            text = text[len(self.bos) :]
        return text

    def _failure(self, exc: Exception) -> ExecutorError:
        """``exc``, raised rendering, as the ``bad_request`` it is: one line naming the
        template and its reason, or the limit it ran past."""
        if isinstance(exc, ExecutorError):  # the tools, refused before the render
            return exc
        if isinstance(exc, Overrun):
            reason = f"ran past its budget: {exc}"
        elif isinstance(exc, RecursionError):
            reason = "ran past its budget: recursion too deep"
        elif isinstance(exc, MemoryError):
            reason = "ran past its budget: out of memory"
        elif isinstance(exc, TemplateError):
            reason = f"refused the messages: {exc}"
        else:
            reason = f"failed: {type(exc).__name__}: {exc}"
        return ExecutorError("bad_request", _line(f"{self.name} {reason}"))


def _kind(value: object) -> str:
    """A JSON value's kind, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else "an object"


def _deeper_than(value: object, most: int) -> bool:
    """Whether ``value`` nests more than ``most`` arrays and objects deep (without
    recursion: the walk's own depth is not the interpreter's)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, list | dict):
            continue
        children = item.values() if isinstance(item, dict) else item
        if depth > most:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def read_tools(text: str) -> list[dict[str, Any]]:
    """OpenAI's ``tools`` array from its JSON: each an object of type ``function`` with a
    ``function`` object that has a string ``name``, nested at most
    :data:`MAX_TOOLS_DEPTH` deep. Raises :class:`ExecutorError` (``bad_request``) naming
    ``tools`` otherwise."""
    try:
        declared = json.loads(text)
    except RecursionError:
        raise ExecutorError("bad_request", f"tools: nested over {MAX_TOOLS_DEPTH} deep") from None
    except ValueError as exc:  # JSONDecodeError, or an integer past int's digit limit
        raise ExecutorError("bad_request", _line(f"tools: not JSON ({exc})")) from None
    if not isinstance(declared, list):
        raise ExecutorError(
            "bad_request", f"tools: {_kind(declared)}, not an array of function objects"
        )
    if _deeper_than(declared, MAX_TOOLS_DEPTH):
        raise ExecutorError("bad_request", f"tools: nested over {MAX_TOOLS_DEPTH} deep")
    for i, tool in enumerate(declared):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (
            isinstance(tool, dict)
            and tool.get("type") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and function["name"]
        ):
            raise ExecutorError(
                "bad_request",
                f'tools[{i}]: not a function object (type "function", and a function with a name)',
            )
    return declared


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


_SAMPLE = (
    ("system", "You are a helpful assistant."),
    ("user", "What is the weather in Oslo?"),
    ("assistant", "Let me look that up."),
    ("user", "Thank you."),
)
_SAMPLE_TOOLS = json.dumps(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
)


def vet(source: str, *, name: str = "the chat template") -> None:
    """Refuse a chat template that does not compile, or that fails or runs past its
    budget on a sample conversation (a system, a user, an assistant and a user message),
    rendered with the assistant's turn opened and without, and with a tool where it
    reads ``tools``: :class:`ExecutorError` (``bad_request``), one line naming ``name``
    and what failed. Some real templates refuse a system message (Gemma's, Mistral's
    first ones): one that refuses it with ``raise_exception`` is tried without it."""
    template = ChatTemplate(source, name=name)
    runs = [(True, ""), (False, "")] + ([(True, _SAMPLE_TOOLS)] if template.takes_tools else [])
    for prompt, tools in runs:
        try:
            template._attempt(_SAMPLE, tools, add_generation_prompt=prompt)
        except Refused:
            try:
                template._attempt(_SAMPLE[1:], tools, add_generation_prompt=prompt)
            except Exception as exc:
                raise template._failure(exc) from None
        except Exception as exc:
            raise template._failure(exc) from None


def template_fields(path: Path) -> dict[str, Any]:
    """What rendering needs of the GGUF at ``path`` (read once: the prepared folder
    keeps it): its own template, else its architecture's (:data:`KNOWN_TEMPLATES`),
    else None (ChatML)."""
    from hecate.llm.gguf_file import GGUFFile

    file = GGUFFile(path)
    meta = file.metadata

    def token(key: str) -> str:
        i = meta.get(key)
        return "" if i is None else str(file.field("tokenizer.ggml.tokens")[int(i)])

    source = meta.get("tokenizer.chat_template")
    if source is None:
        source = KNOWN_TEMPLATES.get(str(meta.get("general.architecture")))
    return {
        "source": None if source is None else str(source),
        "bos": token("tokenizer.ggml.bos_token_id"),
        "eos": token("tokenizer.ggml.eos_token_id"),
        "adds_bos": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    }


#: the prepared folder's copy of :func:`template_fields` (named anew when what they hold
#: changes, so that one kept before is not taken for it)
PREPARED = "chat_template.v2.json"


def load_template(path: Path) -> ChatTemplate:
    """The chat template of the GGUF at ``path``, from its prepared folder when there."""
    from hecate.llm.gguf_model import Prepared

    fields = json.loads(Prepared(path).text(PREPARED, lambda: json.dumps(template_fields(path))))
    return ChatTemplate(
        fields["source"], bos=fields["bos"], eos=fields["eos"], adds_bos=fields["adds_bos"]
    )
