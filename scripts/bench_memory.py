"""The fit estimate against MLX's measured peak: does ``localchat.fit`` say what a load and a
prefill really take?

    uv run python scripts/bench_memory.py [--contexts 512,2048,8192] [--quick]

Each row runs in a process of its own: load the model with mlx_lm, prefill a prompt of the
context's length (mlx_lm's own ``generate_step``, chunked as in chat) and sample one token, then
read ``mx.get_peak_memory()``. The estimate comes from the same directory's config.json and
safetensors headers, never from the loaded model. Rows: the bundled toys, SmolLM2 (4-bit as
imported, and bf16), and random-weight models of several shapes (grouped-query attention, a tied
embedding, a large vocabulary, Gemma 3's sliding layers), with and without ``--kv-bits 8``, and
``serve --kv-bits 8`` (serve's engine batch, its cache quantized as it is written).
Target: every row within ±15 % of the measured peak.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from localchat.environment import collect
from localchat.fit.estimate import KVSettings, estimate
from localchat.fit.shape import local_shape
from localchat.registry import local_dir, resolve

TARGET = 0.15
RANDOM_SHAPES = {  # name: (model_type, config fields, dtype)
    "gqa-f32": ("llama", dict(hidden_size=512, num_hidden_layers=6, intermediate_size=1536, num_attention_heads=8,
                              num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=False), "float32"),
    "tied-bigvocab-f32": ("qwen3", dict(hidden_size=384, num_hidden_layers=4, intermediate_size=1024,
                                        num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                                        vocab_size=151936, tie_word_embeddings=True), "float32"),
    "mha-bf16": ("llama", dict(hidden_size=256, num_hidden_layers=4, intermediate_size=768, num_attention_heads=4,
                              num_key_value_heads=4, vocab_size=49152, tie_word_embeddings=True), "bfloat16"),
    "gemma3-sliding-f32": ("gemma3_text", dict(hidden_size=256, num_hidden_layers=6, intermediate_size=768,
                                               num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                               vocab_size=32000, sliding_window=512, sliding_window_pattern=6),
                           "float32"),
}
MEASURE = r"""
import json, sys
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.generate import generate_step
path, context, kv_bits = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
mx.reset_peak_memory()
model, _ = load_model(__import__('pathlib').Path(path))
prompt = mx.array([(7 * i) % 1000 + 3 for i in range(context)])
options = {"kv_bits": kv_bits, "kv_group_size": 32} if kv_bits else {}
for _ in zip(generate_step(prompt, model, max_tokens=1, **options), range(1)):
    pass
print(mx.get_peak_memory())
"""
MEASURE_SERVED = r"""
import sys
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from localchat.serve.engine.quantized_kv import KVQuantization, quantizing
path, context, bits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mx.reset_peak_memory()
model, _ = load_model(__import__('pathlib').Path(path))
make = quantizing(make_prompt_cache, KVQuantization(bits=bits, group_size=32, start=0))
batch = BatchGenerator(model, prefill_step_size=2048)
batch.insert_segments(segments=[[[(7 * i) % 1000 + 3 for i in range(context)]]], max_tokens=[1], caches=[make(model)])
while not batch.next()[1]:
    pass
print(mx.get_peak_memory())
"""


def random_model(root: Path, name: str) -> Path:
    """A model directory with random weights of the shape named, saved as mlx_lm saves models."""
    import mlx.core as mx
    from mlx_lm.utils import _get_classes, save_model

    model_type, fields, dtype = RANDOM_SHAPES[name]
    config = {"model_type": model_type, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "max_position_embeddings": 32768, **fields}
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(getattr(mx, dtype))
    path = root / name
    save_model(path, model)
    (path / "config.json").write_text(json.dumps(config))
    return path


def bf16_copy(root: Path, source: Path) -> Path:
    """SmolLM2 dequantized to bfloat16 (its published dtype), saved beside the others."""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model, load, save_model

    model, _ = load(str(source))
    model = dequantize_model(model)
    model.set_dtype(mx.bfloat16)
    path = root / "smollm2-bf16"
    save_model(path, model)
    config = json.loads((source / "config.json").read_text())
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    (path / "config.json").write_text(json.dumps(config))
    return path


def measured_peak(path: Path, context: int, kv_bits: int | None, served: bool = False) -> int:
    script, bits = (MEASURE_SERVED, str(kv_bits)) if served else (MEASURE, json.dumps(kv_bits))
    out = subprocess.run([sys.executable, "-c", script, str(path), str(context), bits],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def row(label: str, path: Path, context: int, kv_bits: int | None, peaks: dict[str, int],
        served: bool = False) -> float:
    """One row: mlx_lm's own generation (``chat``), or serve's engine batch with its quantizing
    caches (``served``: ``serve --kv-bits``, quantized from the first token)."""
    shape = local_shape(path)
    guess = estimate(shape, context, KVSettings(bits=kv_bits, group_size=32, on_write=served))
    key = f"{label} {context} {kv_bits}" + (" serve" if served else "")
    peak = peaks[key] = peaks.get(key) or measured_peak(path, context, kv_bits, served)
    error = guess.total / peak - 1
    mark = "ok" if abs(error) <= TARGET else "OFF"
    arm = (("serve " if served else "kv ") + str(kv_bits)) if kv_bits else ""
    print(f"{label:<22} {context:>6} {arm:>8} "
          f"{guess.weights / 2**20:>9.1f} {guess.kv_cache / 2**20:>8.1f} {guess.prefill / 2**20:>9.1f} "
          f"{guess.total / 2**20:>9.1f} {peak / 2**20:>9.1f} {error:>+7.1%} {mark}", flush=True)
    return error


def models(root: Path, quick: bool, only: str) -> list[tuple[str, Path]]:
    found = [(name, local_dir(resolve(name))) for name in ("demo", "demo-tools", "smollm2") if only in name]
    if not quick and only in "smollm2-bf16":
        found.append(("smollm2-bf16", bf16_copy(root, local_dir(resolve("smollm2")))))
    return found + [(name, random_model(root, name)) for name in RANDOM_SHAPES if only in name]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="512,2048,4096,8192")
    parser.add_argument("--quick", action="store_true", help="skip the bf16 SmolLM2 (slow on a CPU)")
    parser.add_argument("--only", default="", help="rows whose model name holds this text")
    parser.add_argument("--peaks", type=Path, help="a JSON file of measured peaks: rows found there are not "
                                                   "measured again (the estimate is), new ones are added")
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    env = collect()
    print(f"# {env.chip or env.machine} · {env.os} · MLX on {env.mlx_device} · mlx {env.mlx_version}")
    print(f"{'model':<22} {'ctx':>6} {'':>8} {'weights':>9} {'kv':>8} {'prefill':>9} {'estimate':>9} "
          f"{'peak':>9} {'error':>7}   (MiB)")
    errors = []
    peaks = json.loads(args.peaks.read_text()) if args.peaks and args.peaks.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in models(Path(tmp), args.quick, args.only):
            sliding = local_shape(path).sliding_window is not None  # mlx_lm cannot quantize a rotating cache
            for context in contexts:
                for kv_bits, served in ((None, False),) if sliding else ((None, False), (8, False), (8, True)):
                    errors.append(row(label, path, context, kv_bits, peaks, served))
                    if args.peaks:
                        args.peaks.write_text(json.dumps(peaks, indent=1))
    worst = max(errors, key=abs)
    print(f"# {len(errors)} rows; worst error {worst:+.1%}; "
          f"{sum(abs(e) <= TARGET for e in errors)}/{len(errors)} within ±{TARGET:.0%}")
    return 0 if abs(worst) <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
