"""A chat template is code from the model file's author, and each render of it is held
to a budget: a template that loops past its steps, builds past its size, recurses,
writes past its output, or runs past its clock is a bad_request naming the limit, in
well under a couple of seconds, and so is one that raises or does not compile. Tools
that are not an array of function objects are a bad_request naming ``tools``, never
another exception. Real templates render exactly as the plain sandbox renders them,
and ``vet`` accepts them and refuses the hostile ones."""

from __future__ import annotations

import functools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

import hecate.llm.render_budget as render_budget
from hecate.llm.template import (
    CHATML,
    MAX_CHARS,
    MAX_STEPS,
    MAX_TOOLS_DEPTH,
    RENDER_SECONDS,
    ChatTemplate,
    load_template,
    read_tools,
    vet,
)
from hecate.model.executor import ExecutorError

ROLES = st.sampled_from(["system", "user", "assistant"])
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
CONVERSATIONS = st.lists(st.tuples(ROLES, TEXT), min_size=1, max_size=6)
# A budget overrun must be refused at least this soon after the clock's limit.
SLACK_S = 1.5

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]

# -- real templates, as their GGUFs carry them ------------------------------------------

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with \
JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument \
name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first \
user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument \
name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ \
message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Mistral's first instruct template: no system role, turns strictly alternating.
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user')"
    " != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
DEEPSEEK_R1 = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, "
    "system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}"
    "{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.is_tool = false -%}{{'<\uff5cUser\uff5c>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<\uff5cAssistant\uff5c>' + content + '<\uff5cend\u2581of\u2581sentence\uff5c>'}}"
    "{%- endif %}{%- endfor -%}{% if add_generation_prompt and not ns.is_tool %}"
    "{{'<\uff5cAssistant\uff5c><think>\\n'}}{% endif %}"
)
PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
# What templates reach for beyond the above: a recursive macro over a JSON schema (as
# gpt-oss's renders parameters), namespaces, filters, formats, loop lookbehind.
FEATURES = """{%- macro render_type(schema) -%}
{%- if schema.type == 'object' -%}{ {%- for name, sub in schema.properties | dictsort -%}
{{ name }}: {{ render_type(sub) }}{{ ', ' if not loop.last }}{%- endfor -%} }
{%- elif schema.type == 'array' -%}{{ render_type(schema['items']) }}[]
{%- else -%}{{ schema.type | default('any') }}{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(users=0, last='') -%}
{%- for message in messages -%}
{%- if message.role == 'user' %}{% set ns.users = ns.users + 1 %}\
{% set ns.last = message.content %}{% endif -%}
{%- endfor -%}
{{ '%d user turns; last: %s\\n' % (ns.users, ns.last | truncate(20)) }}
{{- '{} messages, roles {}\\n'.format(messages | length, \
messages | map(attribute='role') | unique | sort | join('/')) }}
{%- if tools is defined -%}
{%- for tool in tools -%}
{{ tool.function.name | upper }}({{ render_type(tool.function.parameters) }})
{{ tool | tojson(indent=2) }}
{% endfor -%}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.previtem is defined and loop.previtem.role == message.role %}(again) {% endif -%}
[{{ loop.index }}/{{ loop.length }}] {{ message.role | capitalize }}: \
{{ message.content | trim | replace('\\n', ' ') }}
{{ '-' * 8 }}{{ ('=' * 3) | center(9) }}
{% endfor -%}
{{ (messages | selectattr('role', 'equalto', 'assistant') | list | length) ~ ' answers' }}
{%- if add_generation_prompt %}
<assistant>{% endif %}"""
REAL = {
    "chatml": CHATML,
    "qwen2.5": QWEN25,
    "llama3.1": LLAMA31,
    "mistral": MISTRAL,
    "gemma": GEMMA,
    "deepseek-r1": DEEPSEEK_R1,
    "phi3": PHI3,
    "features": FEATURES,
}
NESTED_SCHEMA = [
    {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": {
                "type": "object",
                "properties": {
                    "who": {"type": "array", "items": {"type": "string"}},
                    "when": {
                        "type": "object",
                        "properties": {"day": {"type": "string"}, "hour": {"type": "integer"}},
                    },
                },
            },
        },
    }
]


def refuse(message: str) -> None:
    raise TemplateError(message)


@functools.cache
def plain(source: str) -> Template:
    """The template in the plain sandbox, as renders were before they had a budget."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda value, indent=None, ensure_ascii=False: json.dumps(
        value, indent=indent, ensure_ascii=ensure_ascii
    )
    env.globals["raise_exception"] = refuse
    return env.from_string(source)


@functools.cache
def budgeted(source: str) -> ChatTemplate:
    return ChatTemplate(source, bos="<s>", eos="</s>")


def reference(source: str, messages: list[tuple[str, str]], tools: Any = None) -> str:
    given = {} if tools is None else {"tools": tools}
    return plain(source).render(
        messages=[{"role": r, "content": c} for r, c in messages],
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
        **given,
    )


def refusal(source: str, messages: list[tuple[str, str]], tools: str = "") -> ExecutorError:
    with pytest.raises(ExecutorError) as refused:
        budgeted(source).render(messages, tools)
    return refused.value


@pytest.mark.parametrize("name", list(REAL))
@given(messages=CONVERSATIONS)
def test_a_real_template_renders_exactly_as_before(
    name: str, messages: list[tuple[str, str]]
) -> None:
    source = REAL[name]
    try:
        before = reference(source, messages)
    except TemplateError as exc:  # its own refusal, refused the same now
        reason = str(exc.message)
    else:
        assert budgeted(source).render(messages) == before
        return
    refused = refusal(source, messages)
    assert refused.code == "bad_request"
    assert reason in refused.message


@pytest.mark.parametrize("name", ["qwen2.5", "llama3.1", "features"])
@pytest.mark.parametrize("tools", [WEATHER, NESTED_SCHEMA])
def test_a_real_template_renders_its_tools_exactly_as_before(
    name: str, tools: list[dict[str, Any]]
) -> None:
    messages = [("system", "Be brief."), ("user", "Weather in Oslo?")]
    template = ChatTemplate(REAL[name], bos="<s>", eos="</s>")
    assert template.takes_tools
    assert template.render(messages, json.dumps(tools)) == reference(REAL[name], messages, tools)


def test_a_long_conversation_renders_within_the_budget() -> None:
    # A 2 MB conversation: its output may be its own size and more.
    messages = [("user" if i % 2 == 0 else "assistant", "word " * 1000) for i in range(400)]
    for source in (QWEN25, LLAMA31, FEATURES):
        rendered = ChatTemplate(source, bos="<s>", eos="</s>").render(messages)
        assert len(rendered) > MAX_CHARS
        assert rendered == reference(source, messages)


@pytest.mark.usefixtures("prepared_model")
def test_smollm2s_own_template_is_vetted() -> None:
    from hecate.llm.store import pull

    template = load_template(pull("smollm2-135m", progress=lambda _line: None))
    assert template.own
    vet(template.source)


@pytest.mark.parametrize("name", list(REAL))
def test_vet_accepts_real_templates(name: str) -> None:
    vet(REAL[name])  # Mistral's and Gemma's refuse the system message: vetted without


def test_strftime_now_dates_the_prompt() -> None:
    text = ChatTemplate("{{ strftime_now('%Y') }}").render([("user", "x")])
    assert text in {time.strftime("%Y"), str(int(time.strftime("%Y")) + 1)}


# -- hostile templates -------------------------------------------------------------------

HOSTILE = {
    "nested ranges": (
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        f"over {MAX_STEPS:,} steps",
    ),
    "nested loops over a list": (
        "{% set l = range(1000) | list %}{% for a in l %}{% for b in l %}{% for c in l %}"
        "{% endfor %}{% endfor %}{% endfor %}",
        "steps",
    ),
    "300 MB string": ("{{ 'x' * 300000000 }}", "'*' of 300,000,000 characters"),
    "300 MB string, its size a variable": (
        "{% set n = 300000000 %}{{ ('x' * n) | length }}",
        "'*' of 300,000,000 characters",
    ),
    "list of lists multiplied": (
        "{% set l = ['x' * 1000] * 1000 %}{{ ([l] * 1000) | length }}",
        "'*'",
    ),
    "doubling a string": (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}",
        "a value of",
    ),
    "doubling a shared list": (
        "{% set ns = namespace(x=[1]) %}{% for i in range(64) %}{% set ns.x = [ns.x, ns.x] %}"
        "{% endfor %}{{ ns.x }}",
        "a value of",
    ),
    "squaring a number": (
        "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}"
        "{% endfor %}{{ ns.n > 0 }}",
        "bits",
    ),
    "a power": ("{{ (10 ** 100000000) > 0 }}", "bits"),
    "recursive macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
    "recursive loop": (
        "{% for x in [1, 2] recursive %}{{ loop([1, 2]) }}{% endfor %}",
        "recursion",
    ),
    "a macro calling itself twice": (
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(40) }}",
        "",
    ),
    "huge output via loops": (
        "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
        f"output over {MAX_CHARS:,} characters",
    ),
    "huge output of the template's own text": (
        "{% for i in range(100000) %}" + "y" * 100 + "{% endfor %}",
        "output over",
    ),
    "fresh strings into a macro's buffer": (
        "{% set big = 'x' * 1000000 %}{% macro m() %}{% for i in range(1000) %}{{ big ~ i }}"
        "{% endfor %}{% endmacro %}{{ m() | length }}",
        "characters built",
    ),
    "center": ("{{ 'x' | center(1000000000) }}", "center"),
    "striptags": ("{{ ('<>' * 100000) | striptags }}", "striptags"),
    "striptags on markup": ("{{ (('<>' * 100000) | e).striptags() }}", "striptags()"),
    "ljust": ("{{ 'x'.ljust(1000000000) }}", "ljust()"),
    "replace": ("{% set s = 'x' * 1000000 %}{{ s | replace('x', s) }}", "replace"),
    "join": (
        "{% set s = 'x' * 1000000 %}{{ range(100000) | map('string') | join(s) }}",
        "join()",
    ),
    "% width": ("{{ '%0999999999d' % 1 }}", "'%' format"),
    "% width from the values": ("{{ '%*d' % (999999999, 1) }}", "'%' format"),
    "format width": ("{{ '{:>999999999}'.format(1) }}", "a format"),
    "format width from a field": ("{{ '{:>{w}}'.format(1, w=999999999) }}", "a format"),
    "format filter": ("{{ '%999999999s' | format('x') }}", "'%' format"),
    "slice": ("{{ [1] | slice(1000000000) | list }}", "slice"),
    "batch": ("{{ [1] | batch(1000000000, 'x') | list }}", "batch"),
    "to_bytes": ("{{ (1).to_bytes(1000000000, 'big') }}", "to_bytes()"),
    "expandtabs": ("{{ ('\t' * 100000).expandtabs(100000) }}", "expandtabs()"),
    "indent": ("{{ ('\n' * 100000) | indent(100000) }}", "indent"),
    "tojson indent": ("{{ messages | tojson(indent=1000000000) }}", "indent"),
    "strftime_now padding": ("{{ strftime_now('%c' * 100000) }}", "strftime_now"),
    "lorem ipsum": ("{{ lipsum(100000000) }}", "lipsum"),
    "raises": ("{{ raise_exception('no chat for you') }}", "refused the messages: no chat for you"),
    "divides by zero": ("{{ 1 / 0 }}", "ZeroDivisionError"),
    "spins within its steps": (
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'zz' in s %}{% endif %}"
        "{% endfor %}",
        "",
    ),
}


@pytest.fixture
def quick_clock(monkeypatch: pytest.MonkeyPatch) -> float:
    """A render's clock cut to half a second, for the templates only the clock stops."""
    monkeypatch.setattr(render_budget, "RENDER_SECONDS", 0.5)
    return 0.5


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_is_refused_quickly(name: str, quick_clock: float) -> None:
    source, says = HOSTILE[name]
    start = time.monotonic()
    refused = refusal(source, [("user", "hi")])
    assert time.monotonic() - start < quick_clock + SLACK_S
    assert refused.code == "bad_request"
    assert refused.message.startswith("the model's chat template ")
    assert says in refused.message
    assert "\n" not in refused.message


def test_the_clock_stops_a_render_that_stays_within_its_other_limits() -> None:
    source, _ = HOSTILE["spins within its steps"]
    start = time.monotonic()
    refused = refusal(source, [("user", "hi")])
    assert time.monotonic() - start < RENDER_SECONDS + SLACK_S
    assert f"over {RENDER_SECONDS:g} s" in refused.message


def test_each_render_has_its_own_budget_across_threads(quick_clock: float) -> None:
    # A node renders on worker threads: one template's overrun is not another's.
    hostile, _ = HOSTILE["spins within its steps"]
    messages = [("system", "Be brief."), ("user", "Hi")]
    with ThreadPoolExecutor(4) as pool:
        spinning = [pool.submit(refusal, hostile, [("user", "hi")]) for _ in range(2)]
        real = [pool.submit(budgeted(QWEN25).render, messages) for _ in range(20)]
        assert all(r.result() == reference(QWEN25, messages) for r in real)
        assert all(f"over {quick_clock:g} s" in s.result().message for s in spinning)


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("{% for %}", "does not compile: TemplateSyntaxError"),
        ("{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}", "does not compile"),
        ("{{ 'x' }}" * 200_000, "does not compile: ValueError"),
    ],
)
def test_a_template_that_does_not_compile_is_refused(source: str, says: str) -> None:
    with pytest.raises(ExecutorError) as refused:
        ChatTemplate(source)
    assert refused.value.code == "bad_request"
    assert says in refused.value.message


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_a_repeated_string_is_built_or_refused_never_past_the_limit(times: int) -> None:
    template = ChatTemplate("{{ ('ab' * TIMES) | length }}".replace("TIMES", str(times)))
    if 2 * times > MAX_CHARS:
        with pytest.raises(ExecutorError, match="'\\*' of"):
            template.render([("user", "hi")])
    else:
        assert int(template.render([("user", "hi")])) == max(0, 2 * times)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_vet_refuses_a_hostile_template(name: str, quick_clock: float) -> None:
    source, says = HOSTILE[name]
    start = time.monotonic()
    with pytest.raises(ExecutorError) as refused:
        vet(source, name="evil.gguf's chat template")
    assert time.monotonic() - start < quick_clock + SLACK_S
    assert refused.value.code == "bad_request"
    assert refused.value.message.startswith("evil.gguf's chat template ")
    assert says in refused.value.message
    assert "\n" not in refused.value.message


@pytest.mark.parametrize(
    "source",
    [
        "{% for %}",
        "{% if messages | length > 2 %}{{ raise_exception('too long') }}{% endif %}",
        "{% if not add_generation_prompt %}{{ 1 / 0 }}{% endif %}",
        "{% if tools %}{{ tools[0].function.name.nope.nope() }}{% endif %}",
    ],
)
def test_vet_refuses_a_template_that_fails_on_any_sample(source: str) -> None:
    with pytest.raises(ExecutorError) as refused:
        vet(source)
    assert refused.value.code == "bad_request"
    assert refused.value.message.startswith("the chat template ")


# -- malformed tools ---------------------------------------------------------------------


def nested(levels: int) -> Any:
    """An array ``levels`` arrays deep."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def function(parameters: Any) -> list[dict[str, Any]]:
    """One function: the array, the tool and the function are three levels around
    ``parameters``."""
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


MALFORMED = {
    "a number": ("1", "tools: a number, not an array of function objects"),
    "null": ("null", "tools: null, not an array"),
    "an object": ('{"a":1}', "tools: an object, not an array"),
    "a string": ('"tools"', "tools: a string, not an array"),
    "3,000 nested brackets": ("[" * 3000 + "]" * 3000, f"nested over {MAX_TOOLS_DEPTH} deep"),
    "3,000 nested objects": ('{"a":' * 3000 + "1" + "}" * 3000, "nested over"),
    "a schema one level too deep": (
        json.dumps(function(nested(MAX_TOOLS_DEPTH - 2))),
        f"nested over {MAX_TOOLS_DEPTH} deep",
    ),
    "a function without a name": ('[{"type": "function", "function": {}}]', "tools[0]"),
    "a name that is not a string": ('[{"type": "function", "function": {"name": 3}}]', "tools[0]"),
    "an empty name": ('[{"type": "function", "function": {"name": ""}}]', "tools[0]"),
    "not a function": ('[{"type": "retrieval", "function": {"name": "f"}}]', "tools[0]"),
    "a function that is a string": ('[{"type": "function", "function": "f"}]', "tools[0]"),
    "a number among the tools": (
        '[{"type": "function", "function": {"name": "f"}}, 1]',
        "tools[1]: not a function object",
    ),
    "not JSON": ("[not json", "tools: not JSON"),
    "an integer past int's digits": ("[" + "9" * 5000 + "]", "tools: not JSON"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
@pytest.mark.parametrize("source", [QWEN25, CHATML])
def test_malformed_tools_are_a_bad_request_naming_tools(name: str, source: str) -> None:
    tools, says = MALFORMED[name]
    start = time.monotonic()
    refused = refusal(source, [("user", "hi")], tools)
    assert time.monotonic() - start < SLACK_S
    assert refused.code == "bad_request"
    assert refused.message.startswith("tools")
    assert says in refused.message


def test_tools_at_the_depth_limit_are_read() -> None:
    tools = function(nested(MAX_TOOLS_DEPTH - 3))
    assert read_tools(json.dumps(tools)) == tools
    assert ChatTemplate(QWEN25).render([("user", "hi")], json.dumps(tools))


def is_tools(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, dict)
        and t.get("type") == "function"
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        and t["function"]["name"] != ""
        for t in value
    )


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["type", "function", "name", "x"]), children, max_size=4)
    ),
    max_leaves=20,
)
FUNCTION = st.fixed_dictionaries(
    {"name": st.text(max_size=8) | JSON}, optional={"parameters": JSON, "description": JSON}
)
TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "retrieval"]) | JSON, "function": FUNCTION | JSON}
)
TOOLS = st.lists(TOOL, max_size=3) | JSON


@given(TOOLS, st.sampled_from([QWEN25, LLAMA31, CHATML]))
def test_any_json_that_is_not_function_objects_is_refused_naming_tools(
    value: Any, source: str
) -> None:
    text = json.dumps(value)
    if is_tools(value):
        assert budgeted(source).render([("user", "hi")], text)
    else:
        refused = refusal(source, [("user", "hi")], text)
        assert refused.code == "bad_request"
        assert refused.message.startswith("tools")


@given(st.text(max_size=60) | st.from_regex(r"[\[\]{}\"0-9a-z:,]{0,80}", fullmatch=True))
def test_any_text_for_tools_is_read_or_refused_naming_tools(text: str) -> None:
    try:
        declared: Any = read_tools(text)
    except ExecutorError as exc:
        declared = exc
    if isinstance(declared, ExecutorError):
        assert declared.code == "bad_request"
        assert declared.message.startswith("tools")
    else:
        assert is_tools(declared)
