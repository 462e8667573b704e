"""A GGUF's own chat template, rendered as transformers renders it: SmolLM2's gives the
prompt the engine was always given, other families' templates render in the sandbox, and
a template's refusal is a bad_request naming it. A file without one gets its
architecture's (Gemma 3's turns) where the engine knows it, else ChatML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFWriter
from hypothesis import given
from hypothesis import strategies as st

from hecate.llm.template import (
    GEMMA3,
    KNOWN_TEMPLATES,
    ChatTemplate,
    load_template,
    template_fields,
    tools_block,
    vet,
)
from hecate.llm.tokenizer import chat_prompt
from hecate.model.executor import ExecutorError

ROLES = st.sampled_from(["system", "user", "assistant"])
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)

# Llama 3's template, as its GGUFs carry it (shortened to the part that renders turns).
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
STRICT = (
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
    "{{ message['content'] }}{% endfor %}"
)


@pytest.fixture(scope="module")
def smollm2() -> ChatTemplate:
    from hecate.llm.store import pull

    return load_template(pull("smollm2-135m", progress=lambda _line: None))


@pytest.mark.usefixtures("prepared_model")
@given(st.lists(st.tuples(ROLES, TEXT), min_size=1, max_size=5))
def test_smollm2s_own_template_renders_the_prompt_the_engine_always_had(
    smollm2: ChatTemplate, messages: list[tuple[str, str]]
) -> None:
    assert smollm2.own
    assert smollm2.render(messages) == chat_prompt(messages)


def test_a_template_that_writes_bos_leaves_it_to_a_tokenizer_that_adds_it() -> None:
    template = ChatTemplate(LLAMA3, bos="<|begin_of_text|>", adds_bos=True)
    text = template.render([("user", " Hi ")])
    assert text == (
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    kept = ChatTemplate(LLAMA3, bos="<|begin_of_text|>", adds_bos=False)
    assert kept.render([("user", "Hi")]).startswith("<|begin_of_text|>")


def test_a_template_refusing_the_messages_is_a_bad_request_saying_why() -> None:
    with pytest.raises(ExecutorError) as refused:
        ChatTemplate(STRICT).render([("assistant", "first")])
    assert refused.value.code == "bad_request"
    assert "roles must alternate" in refused.value.message


def test_a_template_cannot_reach_outside_its_sandbox() -> None:
    sneaky = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ExecutorError) as refused:
        ChatTemplate(sneaky).render([("user", "x")])
    assert refused.value.code == "bad_request"


def test_a_file_without_a_template_gets_chatml_with_no_default_system() -> None:
    template = ChatTemplate(None)
    assert not template.own
    chatml = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert template.render([("user", "Hi")]) == chatml


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
# Qwen2.5's way with tools, shortened: its own system block from the ``tools`` it is given.
TAKES_TOOLS = (
    "{% if tools %}{{ '<|im_start|>system\\n# Tools\\n' }}{% for tool in tools %}"
    "{{ tool | tojson }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_template_that_takes_tools_is_given_them() -> None:
    template = ChatTemplate(TAKES_TOOLS)
    assert template.takes_tools
    text = template.render([("user", "Weather in Oslo?")], json.dumps(WEATHER))
    assert text.startswith('<|im_start|>system\n# Tools\n{"type": "function"')
    assert '"name": "get_weather"' in text
    assert "<tools>" not in text  # its own words, not the Hermes block


@pytest.mark.usefixtures("prepared_model")
def test_a_template_without_tools_gets_the_hermes_block_in_its_system_message(
    smollm2: ChatTemplate,
) -> None:
    assert not smollm2.takes_tools
    block = tools_block(WEATHER)
    tools = json.dumps(WEATHER)
    merged = smollm2.render([("system", "Be brief."), ("user", "Weather?")], tools)
    assert merged == chat_prompt([("system", f"Be brief.\n\n{block}"), ("user", "Weather?")])
    first = smollm2.render([("user", "Weather?")], tools)
    assert first == chat_prompt([("system", block), ("user", "Weather?")])
    with pytest.raises(ExecutorError) as refused:
        smollm2.render([("user", "x")], "[not json")
    assert refused.value.code == "bad_request"


def _header_only(path: Path, arch: str, template: str | None = None) -> Path:
    """A GGUF of ``arch`` with a small SentencePiece vocabulary and no weights."""
    w = GGUFWriter(str(path), arch)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def test_a_file_without_a_template_gets_its_architecture_s_if_the_engine_knows_it(
    tmp_path: Path,
) -> None:
    gemma = template_fields(_header_only(tmp_path / "g.gguf", "gemma3"))
    assert gemma["source"] == KNOWN_TEMPLATES["gemma3"] == GEMMA3
    other = template_fields(_header_only(tmp_path / "l.gguf", "llama"))
    assert other["source"] is None  # ChatML
    own = template_fields(_header_only(tmp_path / "o.gguf", "gemma3", template=STRICT))
    assert own["source"] == STRICT  # the file's own comes first


def test_gemma_s_template_folds_the_system_message_into_the_first_user_turn() -> None:
    vet(GEMMA3)
    template = ChatTemplate(GEMMA3, bos="<bos>", eos="<eos>", adds_bos=True)
    chat = [("system", "Be brief."), ("user", " Hi "), ("assistant", "Hello."), ("user", "Bye")]
    assert template.render(chat) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    assert ChatTemplate(GEMMA3, bos="<bos>").render([("user", "Hi")]).startswith("<bos><start")
    with pytest.raises(ExecutorError, match="roles must alternate"):
        template.render([("user", "a"), ("user", "b")])
