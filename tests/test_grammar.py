"""Answers that always parse: every schema feature localchat documents, compiled for a real
tokenizer and walked token by token (valid instances accepted, invalid ones refused); the mask in
real decoding (the demo and demo-think in-process, SmolLM2 for real), tool-call arguments under
their tool's schema, hostile and bad formats refused in one line before any call, and a format
that leaves the answer no way on ending the turn in one line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localchat.cli.app import app
from localchat.grammar.answer_formats import AnswerFormat, choice_format, regex_format
from localchat.grammar.compile import CallMarkers, grammars, llg_tokenizer
from localchat.grammar.mask import MaskedDecoding

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
PERSON = ROOT / "examples" / "schemas" / "person.json"
REMEMBER = "Remember the code harbor 17. Reply only OK."


@pytest.fixture(scope="module")
def demo_tokens():
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(ROOT / "localchat" / "demo_tools_model")
    return tokenizer, llg_tokenizer(tokenizer, len(tokenizer._tokenizer))


def accepts(tokens, fmt: AnswerFormat, text: str) -> bool:
    """Whether the answer grammar of ``fmt`` takes ``text`` whole, then its end."""
    from llguidance import LLMatcher

    tokenizer, llg = tokens
    matcher = LLMatcher(llg, grammars(fmt, [], None, llg).answer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.consume_tokens(ids) and matcher.consume_token(llg.eos_token) and not matcher.is_error()


FEATURES = {  # a schema, an instance it admits, one it refuses
    "required and additionalProperties": ({"type": "object", "properties": {"a": {"type": "integer"}},
                                           "required": ["a"], "additionalProperties": False},
                                          {"a": 3}, {"b": 3}),
    "string maxLength": ({"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}, "required": ["s"]},
                         {"s": "abc"}, {"s": "abcd"}),
    "integer bounds": ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 99}},
                        "required": ["n"]}, {"n": 42}, {"n": 100}),
    "number": ({"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}, {"x": 2.5}, {"x": "2"}),
    "boolean and null": ({"type": "object", "properties": {"b": {"type": "boolean"}, "z": {"type": "null"}},
                          "required": ["b", "z"]}, {"b": True, "z": None}, {"b": 1, "z": None}),
    "enum": ({"enum": ["yes", "no", "unsure"]}, "unsure", "maybe"),
    "const": ({"type": "object", "properties": {"v": {"const": 1}}, "required": ["v"]}, {"v": 1}, {"v": 2}),
    "array minItems maxItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
                                [1, 2], [1, 2, 3]),
    "nested object": ({"type": "object", "properties": {"p": {"type": "object", "properties": {
        "q": {"type": "string"}}, "required": ["q"], "additionalProperties": False}}, "required": ["p"]},
        {"p": {"q": "x"}}, {"p": {}}),
    "anyOf": ({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]}, "ab", "abc"),
    "string pattern": ({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]$"}},
                        "required": ["id"]}, {"id": "AB1"}, {"id": "ab1"}),
    "$ref": ({"$defs": {"n": {"type": "integer"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}},
              "required": ["a"]}, {"a": 1}, {"a": "1"}),
    "recursion through $ref": ({"$defs": {"t": {"type": "object", "properties": {"k": {"type": "array", "items": {
        "$ref": "#/$defs/t"}, "maxItems": 2}}, "required": ["k"], "additionalProperties": False}}, "$ref": "#/$defs/t"},
        {"k": [{"k": []}]}, {"k": [{}]}),
}


@pytest.mark.parametrize("feature", FEATURES)
def test_every_documented_schema_feature_admits_its_instances_and_refuses_others(demo_tokens, feature):
    schema, good, bad = FEATURES[feature]
    fmt = AnswerFormat("", schema)
    assert accepts(demo_tokens, fmt, json.dumps(good)) and fmt.check(json.dumps(good))[1] is None
    assert not accepts(demo_tokens, fmt, json.dumps(bad)) and fmt.check(json.dumps(bad))[1] is not None


def test_a_regex_and_a_choice_are_the_whole_answer(demo_tokens):
    code = regex_format(r"[A-Z]{2}-[0-9]{3}")
    assert accepts(demo_tokens, code, "DB-318") and not accepts(demo_tokens, code, "DB-3180")
    choice = choice_format("yes,no,unsure")
    assert all(accepts(demo_tokens, choice, c) for c in ("yes", "no", "unsure"))
    assert not accepts(demo_tokens, choice, "yes, ") and not accepts(demo_tokens, choice, "ye")


@pytest.mark.parametrize("pattern, good, bad", [
    (r"a\/b", "a/b", "a\\/b"),  # a slash the user escaped
    (r"x/y", "x/y", "x\\/y"),  # one they did not
    (r"a\\/b", "a\\/b", "a/b"),  # an escaped backslash, then a slash
    (r"[/]+", "//", "/a"),
])
def test_a_regex_with_slashes_means_what_python_reads_in_it(demo_tokens, pattern, good, bad):
    fmt = regex_format(pattern)
    assert accepts(demo_tokens, fmt, good) and fmt.check(good)[1] is None
    assert not accepts(demo_tokens, fmt, bad) and fmt.check(bad)[1] is not None


# --- in real decoding -------------------------------------------------------------------------------------

def test_a_model_that_would_write_other_json_writes_the_schemas_under_the_mask(tmp_path):
    schema = tmp_path / "code.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"code": {"type": "integer", "minimum": 0,
                                                                            "maximum": 99}},
                                  "required": ["code"], "additionalProperties": False}))
    masked = runner.invoke(app, ["chat", "--json-schema", str(schema), "--system", 'Answer in JSON: {"answer": "..."}',
                                 "--record", str(tmp_path / "r"), REMEMBER])
    assert masked.exit_code == 0, masked.stderr
    value = json.loads(masked.stdout)
    assert set(value) == {"code"} and isinstance(value["code"], int) and 0 <= value["code"] <= 99
    response = json.loads(next((tmp_path / "r").glob("*-response.json")).read_text())
    assert response["stats"]["masked_tokens"] > 0 and response["stats"]["mask_s"] > 0


def test_a_choice_and_a_regex_hold_for_the_demo():
    chose = runner.invoke(app, ["chat", "--choice", "yes,no,unsure", "Is the sky blue?"])
    assert chose.exit_code == 0 and chose.stdout.strip() in ("yes", "no", "unsure"), chose.stderr
    code = runner.invoke(app, ["chat", "--regex", "[A-Z]{2}-[0-9]{3}", "Give me a code."])
    assert code.exit_code == 0 and __import__("re").fullmatch(r"[A-Z]{2}-[0-9]{3}\n", code.stdout), code.stdout


def test_a_thinking_model_reasons_freely_and_then_answers_under_the_mask():
    done = runner.invoke(app, ["chat", "-m", "demo-think", "--think", "--show-thinking", "--json", REMEMBER])
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout) == {"answer": "OK"}
    assert "I should reply" in done.stderr  # the reasoning, written as the model likes it


def test_drafting_with_the_mask_the_target_decides():
    done = runner.invoke(app, ["chat", "--draft-model", "demo", "--json", REMEMBER])
    assert done.exit_code == 0 and json.loads(done.stdout) == {"answer": "OK"}, done.stderr
    assert "drafted" in done.stderr


def test_smollm2_always_writes_json_that_validates(smollm2, monkeypatch, tmp_path):
    """A real model in this process under the mask. (SmolLM2 writes ~7 tokens a second here: a short
    schema: the example's long ``known_for`` would add ~30 tokens, and the mask's coverage of every
    schema kind is in the tests above.)"""
    import jsonschema

    monkeypatch.setenv("LOCALCHAT_MODELS", str(ROOT / "localchat" / "models.yaml"))
    schema = json.loads(PERSON.read_text())
    schema["properties"]["known_for"]["maxLength"] = 24
    short = tmp_path / "person.json"
    short.write_text(json.dumps(schema))
    done = runner.invoke(app, ["chat", "-m", str(smollm2), "--json-schema", str(short), "--max-tokens", "200",
                               "Describe Ada Lovelace"])
    assert done.exit_code == 0, done.stderr
    jsonschema.validate(json.loads(done.stdout), schema)


# --- tool calls ----------------------------------------------------------------------------------------

ADD = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}}}


def decode_greedily(tokens, processor: MaskedDecoding, wanted: str, steps: int = 60) -> str:
    """A model that wants to write ``wanted`` (its next token's logit highest), one token at a time,
    through the processor: what comes out under the mask."""
    import mlx.core as mx

    tokenizer, llg = tokens
    want = tokenizer.encode(wanted, add_special_tokens=False)
    out: list[int] = []
    for step in range(steps):
        preferred = want[step] if step < len(want) else llg.eos_token
        logits = mx.zeros((1, llg.vocab_size)) + mx.arange(llg.vocab_size)[None] * -1e-4  # a fixed second choice
        logits = mx.where(mx.arange(llg.vocab_size)[None] == preferred, 10.0, logits)
        token = int(mx.argmax(processor(mx.array(out, dtype=mx.int32), logits), axis=-1).item())
        if token == llg.eos_token:
            break
        out.append(token)
    return tokenizer.decode(out)


def test_a_calls_arguments_are_decoded_under_the_tools_schema(demo_tokens):
    tokenizer, llg = demo_tokens
    made = grammars(None, [ADD], CallMarkers("<tool_call>", "</tool_call>"), llg)
    processor = MaskedDecoding(llg, made, offset=0, decode=tokenizer.decode)
    text = decode_greedily(demo_tokens, processor, 'Sure. <tool_call>{"name": "add", "arguments": {"a": "two", "b": 3}}'
                                                   '</tool_call>')
    assert text.startswith("Sure. <tool_call>")  # free until the marker, then under the grammar
    call = text.split("<tool_call>")[1].split("</tool_call>")[0]
    value = json.loads(call)  # it parses, and fits add: its wish for a string was not allowed
    assert value["name"] == "add" and set(value["arguments"]) == {"a", "b"}
    assert all(isinstance(v, int) for v in value["arguments"].values())


def test_a_format_and_tools_together_admit_the_answer_or_calls(demo_tokens):
    from llguidance import LLMatcher

    tokenizer, llg = demo_tokens
    made = grammars(AnswerFormat("", {"type": "object", "properties": {"answer": {"type": "string"}},
                                      "required": ["answer"]}), [ADD], CallMarkers("<tool_call>", "</tool_call>"), llg)
    for text, ok in (
        ('{"answer": "5"}', True),
        ('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', True),
        ("The answer is 5.", False),
    ):
        matcher = LLMatcher(llg, made.answer)
        taken = matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and not matcher.is_error()
        assert taken == ok, text


# --- bad and hostile formats ------------------------------------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--regex", "[^\\s\\S]"], "matches no text at all"),
    (["--regex", "(a"], "is not a regular expression"),
    (["--regex", "(?<=x)a"], "cannot be enforced"),
    (["--choice", "yes"], "--choice takes 2 to 1000 answers"),
    (["--json", "--regex", "x"], "--json and --regex are alternatives"),
    (["--choice", "a,b", "--json-schema", "{schema}"], "--json-schema and --choice are alternatives"),
    (["--json-schema", "{lookbehind}"], "cannot be enforced"),
])
def test_a_format_that_cannot_be_enforced_is_one_line_exit_2_before_any_call(tmp_path, args, needle):
    (tmp_path / "s.json").write_text('{"type": "object"}')
    (tmp_path / "lb.json").write_text('{"type": "string", "pattern": "(?<=x)a"}')
    args = [a.replace("{schema}", str(tmp_path / "s.json")).replace("{lookbehind}", str(tmp_path / "lb.json"))
            for a in args]
    done = runner.invoke(app, ["chat", *args, "--record", str(tmp_path / "r"), "Hi"])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.exit_code == 2 and len(errors) == 1 and needle in errors[0], done.stderr
    assert not (tmp_path / "r").exists() and "loaded" not in done.stderr  # no call, and no model loaded


@pytest.mark.parametrize("schema, needle", [
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "/$defs/missing"),
    ({"$ref": "http://example.com/person.json"}, "http://example.com/person.json"),  # never fetched
    ({"type": "string", "pattern": "(?<=x)a"}, "cannot be enforced"),
])
def test_a_schema_that_cannot_compile_is_refused_before_the_model_loads(tmp_path, schema, needle):
    (tmp_path / "s.json").write_text(json.dumps(schema))
    done = runner.invoke(app, ["chat", "-m", "demo", "--no-log", "--json-schema", str(tmp_path / "s.json"), "Hi"])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.exit_code == 2 and len(errors) == 1 and needle in errors[0], done.stderr
    assert "loaded demo" not in done.stderr


HOSTILE = {
    "nested 100 deep": {"type": "object", "properties": {"a": {}}, "required": ["a"]},
    "an enum of 20,000 values": {"enum": [f"value-{i}" for i in range(20_000)]},
    "a $ref cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "a backtracking pattern": {"type": "string", "pattern": "^(a+)+$"},
    "a pattern of a thousand alternatives": {"type": "string", "pattern": "^(" + "|".join(f"w{i}" for i in range(1000))
                                             + ")$"},
}


def _deep(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


HOSTILE["nested 100 deep"] = _deep(100)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_schema_is_compiled_or_refused_within_seconds(tmp_path, name):
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(HOSTILE[name]))
    started = time.monotonic()
    done = runner.invoke(app, ["chat", "--json-schema", str(path), "--max-tokens", "24", "Hi"])
    assert time.monotonic() - started < 30, name
    assert done.exit_code in (0, 1, 2) and "Traceback" not in done.stderr, done.stderr
    if done.exit_code == 2:
        assert len([line for line in done.stderr.splitlines() if line.startswith("error:")]) == 1
    if done.exit_code == 0:
        printed = done.stdout.strip()  # (a JSON string is printed as its text)
        assert any(AnswerFormat("", HOSTILE[name]).check(text)[1] is None for text in (printed, json.dumps(printed)))


def test_tokens_that_left_the_format_end_the_reply_in_one_line(demo_tokens):
    """What a sampler or another processor could do: a token the mask did not allow. The next step
    has no way on, and says so (the turn ends; nothing is kept: a LocalchatError in the stream)."""
    import mlx.core as mx

    from localchat.errors import LocalchatError
    from localchat.grammar.mask import DeadEnd

    tokenizer, llg = demo_tokens
    processor = MaskedDecoding(llg, grammars(choice_format("yes,no"), [], None, llg), offset=0,
                               decode=tokenizer.decode)
    logits = mx.zeros((1, llg.vocab_size))
    processor(mx.array([], dtype=mx.int32), logits)
    wrong = mx.array(tokenizer.encode("maybe", add_special_tokens=False), dtype=mx.int32)
    with pytest.raises(DeadEnd) as ended:
        processor(wrong, logits)
    assert isinstance(ended.value, LocalchatError) and "the reply left the format it must follow" in str(ended.value)
