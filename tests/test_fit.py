"""The fit estimate's arithmetic against hand-computed values for published configs (kept in
tests/reference/model_configs), the verdicts, and the budget a user sets."""

import json
from pathlib import Path

import pytest

from localchat.errors import UsageError
from localchat.fit.budget import MemoryBudget, machine_budget, parse_limit
from localchat.fit.estimate import KVSettings, estimate, kv_cache_bytes
from localchat.fit.shape import local_shape, shape_from
from localchat.fit.verdict import judge, summary
from localchat.registry import resolve

CONFIGS = Path(__file__).parent / "reference" / "model_configs"
GB = 10**9


def published(name: str, weights: int = 2 * GB, dtype: str = "BF16"):
    return shape_from(json.loads((CONFIGS / f"{name}.json").read_text()), {"weights": (dtype, weights)})


# (layers over the whole context, KV heads, head dim) as each model card gives them
@pytest.mark.parametrize("name, layers, kv_heads, head_dim", [
    ("llama-3.2-1b-instruct", 16, 8, 64),
    ("llama-3.2-3b-instruct", 28, 8, 128),
    ("qwen3-4b", 36, 8, 128),
    ("qwen3-8b", 36, 8, 128),
])
def test_the_kv_cache_is_layers_by_kv_heads_by_head_dim_by_tokens_by_bytes(name, layers, kv_heads, head_dim):
    shape = published(name)
    assert kv_cache_bytes(shape, 8192) == layers * 2 * kv_heads * head_dim * 8192 * 2
    assert kv_cache_bytes(shape, 1000) == layers * 2 * kv_heads * head_dim * 1024 * 2  # whole steps of 256
    # 8-bit: a byte a value, plus a bf16 scale and bias for each group of 64
    assert kv_cache_bytes(shape, 16384, KVSettings(bits=8)) == int(layers * 2 * kv_heads * head_dim * 16384 *
                                                                   (1 + 2 * 2 / 64))
    assert kv_cache_bytes(shape, 8192, KVSettings(max_tokens=2048)) == layers * 2 * kv_heads * head_dim * 2048 * 2


def test_llama_3_2_1b_at_8k_is_256_mib_of_kv_cache():
    assert kv_cache_bytes(published("llama-3.2-1b-instruct"), 8192) == 256 * 2**20


def test_gemma_3_4b_reads_the_heads_its_config_leaves_out_and_caps_its_sliding_layers():
    """Gemma 3 4B's published config names no head counts (mlx_lm's defaults: 8 heads, 4 KV heads of
    256); five of its 34 layers are global, the others keep a window of 1024 (+ a prefill chunk)."""
    shape = published("gemma-3-4b-it")
    assert (shape.heads, shape.kv_heads, shape.head_dim, shape.global_layers, shape.sliding_window) == \
        (8, 4, 256, 5, 1024)
    per_token = 2 * 4 * 256 * 2
    assert kv_cache_bytes(shape, 8192) == 5 * 8192 * per_token + 29 * (1024 + 2047) * per_token
    assert kv_cache_bytes(shape, 512) == 5 * 512 * per_token + 29 * 512 * per_token


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.json")))
def test_a_config_read_without_mlx_lm_gives_the_shape_mlx_lm_gives(name, monkeypatch):
    """A config that states every number is read as written (no mlx_lm import, 1.4 s here); one
    that leaves one out is read by mlx_lm's ``ModelArgs``: both give the shape mlx_lm builds."""
    from localchat.fit import shape as shapes

    config = json.loads((CONFIGS / f"{name}.json").read_text())
    as_written = shapes._states_every_count(shapes._as_written(config))
    assert as_written == (name != "gemma-3-4b-it")  # (Gemma 3 4B names no head counts)
    read = published(name)
    monkeypatch.setattr(shapes, "_states_every_count", lambda part: False)  # mlx_lm reads every config
    assert published(name) == read


def test_a_front_estimates_our_demo_models_without_importing_mlx_lm():
    import subprocess
    import sys

    script = ("import sys; from localchat.fit.shape import local_shape; from localchat.registry import resolve; "
              "from pathlib import Path; [local_shape(Path(resolve(m).location)) for m in ('demo', 'demo-tools', "
              "'demo-think')]; "
              "print('mlx_lm' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_the_prefill_counts_materialized_attention_off_metal_and_not_with_metals_fused_kernel():
    shape = published("qwen3-8b")
    cpu, metal = estimate(shape, 8192), estimate(shape, 8192, metal=True)
    scores = 2048 * 8192 * (32 * 2 + 1)  # a whole chunk's scores (bf16) and boolean mask, at the end
    assert cpu.prefill - metal.prefill == scores
    assert estimate(shape, 8192, KVSettings(bits=8), metal=True).prefill > metal.prefill  # quantized: not fused
    assert cpu.weights == 2 * GB and cpu.total == cpu.weights + cpu.kv_cache + cpu.prefill + cpu.overhead


def test_a_quantized_model_computes_in_its_scales_dtype():
    config = json.loads((CONFIGS / "qwen3-4b.json").read_text())
    f32_scales = shape_from(config, {"l.weight": ("U32", 100), "l.scales": ("F32", 10), "l.biases": ("F32", 10)})
    f16_scales = shape_from(config, {"l.weight": ("U32", 100), "l.scales": ("F16", 10), "l.biases": ("F16", 10)})
    assert (f32_scales.activation_bytes, f16_scales.activation_bytes) == (4, 2)
    assert f32_scales.weights_bytes == 120


def test_verdicts_and_what_would_help():
    shape = published("qwen3-8b", weights=4_600_000_000)
    needs = estimate(shape, 8192).total
    assert judge(shape, MemoryBudget(bytes=needs * 2, source="x")).verdict == "fits"
    tight = judge(shape, MemoryBudget(bytes=int(needs / 0.9), source="x"), smaller=("qwen3-8b@4bit",))
    assert tight.verdict == "tight"
    assert any(h.startswith("--max-context-tokens ") for h in tight.helps)
    assert any(h.startswith("--kv-bits 8") for h in tight.helps) and "a smaller variant: qwen3-8b@4bit" in tight.helps
    short = int(next(h for h in tight.helps if h.startswith("--max-context-tokens")).split()[1])
    assert estimate(shape, short).total <= needs / 0.9 * 0.85 < estimate(shape, short + 512).total
    refused = judge(shape, MemoryBudget(bytes=GB, source="your memory limit"))
    assert refused.verdict == "does not fit" and refused.helps == ()  # nothing here would fit 1 GB
    line = summary("qwen3-8b", refused)
    assert "at 8,192 tokens of context" in line and "your memory limit is 1.00 GB" in line and "does not fit" in line


def test_the_context_judged_is_the_users_and_never_past_the_models_window():
    shape = published("qwen3-4b")
    assert judge(shape, None).estimate.context == 8192
    assert judge(shape, None, context=100_000).estimate.context == 40960
    assert judge(shape, None, context=2048).estimate.context == 2048
    assert judge(shape, None).verdict == "unknown"


@pytest.mark.parametrize("text, value", [("12GB", 12 * 10**9), ("512M", 512 * 10**6), ("20MB", 20 * 10**6),
                                         ("1GiB", 2**30), ("123456B", 123456), ("1.5 GB", 1_500_000_000)])
def test_a_memory_limit_is_a_size_in_one_convention(text, value):
    from localchat.sizes import shown_size

    assert parse_limit(text) == value
    assert shown_size(parse_limit("20MB")) == "20.0 MB" and shown_size(parse_limit("1GB")) == "1.00 GB"


@pytest.mark.parametrize("text", ["0", "twelve", "-1GB", "", "12", "1000", "9" * 400 + "GB", "nanGB", "1e9GB"])
def test_a_memory_limit_that_is_not_one_is_a_usage_error(text):
    with pytest.raises(UsageError):
        parse_limit(text)


def test_the_config_files_memory_limit_is_the_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    (tmp_path / "config.yaml").write_text("memory_limit: 6GB\n")
    assert machine_budget() == MemoryBudget(bytes=6 * 10**9, source="your memory limit")
    assert machine_budget(2**30).bytes == 2**30  # the flag wins
    (tmp_path / "config.yaml").write_text("memory_limit: lots\n")
    with pytest.raises(UsageError, match="memory_limit"):
        machine_budget()


def test_a_local_model_is_read_from_its_headers():
    shape = local_shape(Path(resolve("demo").location))
    assert (shape.layers, shape.hidden, shape.heads) == (3, 128, 4)
    assert 700_000 < shape.weights_bytes < 900_000 and shape.context_window == 1024


def test_registry_variants_resolve_and_an_unknown_one_is_named():
    ref = resolve("qwen3-8b@8bit")
    assert (ref.id, ref.location, ref.kind) == ("qwen3-8b@8bit", "mlx-community/Qwen3-8B-8bit", "hub")
    with pytest.raises(UsageError, match="no variant '3bit'.*4bit, 8bit, bf16"):
        resolve("qwen3-8b@3bit")


def test_a_quantized_cache_is_full_precision_until_its_start_and_a_chunk_past_it():
    """mlx_lm quantizes the cache between prefill chunks once past --quantized-kv-start, and the peak
    is a full-precision cache's until two chunks past it (bench_memory measures it)."""
    shape = published("qwen3-8b")
    per_token = 36 * 2 * 8 * 128
    assert kv_cache_bytes(shape, 4096, KVSettings(bits=8)) == per_token * 4096 * 2
    assert kv_cache_bytes(shape, 16384, KVSettings(bits=8)) == int(per_token * 16384 * 1.0625)
    assert kv_cache_bytes(shape, 8192, KVSettings(bits=8, quantized_start=5000)) == per_token * 8192 * 2
    assert kv_cache_bytes(shape, 32768, KVSettings(bits=8, quantized_start=5000)) == int(per_token * 32768 * 1.0625)


def test_a_six_layer_gemma_prefills_without_its_only_global_layers_attention():
    """MLX evaluates only the caches between chunks: the last layer's attention is never computed
    there, so a Gemma 3 whose only global layer is its last attends at most a window and a chunk."""
    config = {"model_type": "gemma3_text", "hidden_size": 256, "num_hidden_layers": 6, "intermediate_size": 768,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 32000,
              "sliding_window": 512, "sliding_window_pattern": 6, "rope_theta": 10000.0, "rms_norm_eps": 1e-6}
    six = shape_from(config, {"w": ("F32", 1000)})
    twelve = shape_from({**config, "num_hidden_layers": 12}, {"w": ("F32", 1000)})
    assert (six.global_layers, six.last_layer_global, twelve.global_layers) == (1, True, 2)
    assert estimate(six, 8192).prefill < estimate(twelve, 8192).prefill - 2048 * (8192 - 2560) * 4 * 4


@pytest.mark.parametrize("command", [["chat", "hi"], ["bench"], ["load", "--launch"], ["serve", "--port", "1"]])
def test_every_command_that_loads_a_model_checks_it_first(command, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from localchat.cli.app import app

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    result = CliRunner().invoke(app, [*command, "--memory-limit", "1MB"])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "demo needs ~" in errors[0] and "does not fit (--force to try anyway)" in errors[0]
    assert "Traceback" not in result.stderr


def test_models_and_doctor_show_the_budget_and_verdicts(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from localchat.cli.app import app

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    (tmp_path / "config.yaml").write_text("memory_limit: 10MB\n")
    models = CliRunner().invoke(app, ["models"])
    assert "demo (default, tiny) · demo family · present · 870 KB · 4-bit · needs ~" in models.stdout
    assert " at 1,024 tokens: does not fit" in models.stdout  # 10 MB is too little even for the demo
    doctor = CliRunner().invoke(app, ["doctor", "--base-url", "http://127.0.0.1:9/v1"])
    assert "memory budget" in doctor.stdout and "10.0 MB (your memory limit" in doctor.stdout
