"""Train localchat's bundled demo model: a tiny llama that remembers a code only when given history.

    uv run python -m demo.train --out localchat/demo_model

Deterministic for a given --seed. Steps: build a byte-level BPE tokenizer with ChatML specials,
synthesize conversations (demo.corpus), train with MLX (loss on assistant tokens only),
quantize to 4 bits with mlx_lm's own convert, then score held-out conversations.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten
from mlx_lm import convert, load
from mlx_lm.models import llama

from demo.card import model_card
from demo.circuit import plant_induction_circuit
from demo.corpus import STRESS_BEHAVIOURS, tokenizer_texts, training_dialogue
from demo.evaluate import evaluate
from demo.losses import loss_on_trained_positions, make_batches, plain_loss
from demo.tokenizer import (
    build_tokenizer,
    check_tokenizer_round_trip,
    encode_with_mask,
    load_init_tokenizer,
    save_tokenizer,
)
from localchat.demo_codes import MODEL_DIR
from localchat.environment import collect


def model_config(args, vocab_size: int, eos_id: int) -> dict:
    return {
        # llama, not qwen2: transformers 5 always rebuilds a qwen2 tokenizer with Qwen2's own
        # pre-tokenizer regex, silently changing how the model's text is split after loading;
        # for llama it honours tokenizer.json when tokenizer_class is PreTrainedTokenizerFast.
        # Query/key biases are needed by plant_induction_circuit.
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "attention_bias": True, "mlp_bias": False,
        "hidden_size": args.hidden, "num_hidden_layers": args.layers,
        "intermediate_size": args.intermediate, "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads, "head_dim": args.hidden // args.heads, "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 1024, "rope_theta": args.rope_theta, "tie_word_embeddings": True,
        "eos_token_id": eos_id, "torch_dtype": "float32",
    }


def train(args, tok, stages, config, group, weights: dict | None = None) -> nn.Module:
    """``stages``: the curriculum's row lists, trained in order (each shuffled within itself);
    ``weights``: a warm start (see ``--init``) instead of random initial weights."""
    mx.random.seed(args.seed)  # the same initial weights on every worker
    model = llama.Model(llama.ModelArgs.from_dict(config))
    if weights is not None:
        model.load_weights(list(weights.items()))
    elif args.plant_induction:
        plant_induction_circuit(model, config)
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    log(group, f"model: llama, {n_params:,} parameters, {group.size()} worker(s)")
    warmup = min(args.warmup, max(1, args.steps // 10))
    schedule = optim.join_schedules(
        [optim.linear_schedule(1e-5, args.lr, warmup),
         optim.cosine_decay(args.lr, args.steps - warmup, args.lr / 10)], [warmup])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)

    if args.fast_loss:
        loss_fn, loss_inputs = loss_on_trained_positions, lambda b: (b.inputs, b.targets, b.trained, b.trained_weights)
    else:
        loss_fn, loss_inputs = plain_loss, lambda b: (b.inputs, b.targets, b.mask)
    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(*arrays):
        loss, grads = loss_and_grad(model, *arrays)
        grads = nn.average_gradients(grads, group=group)
        optimizer.update(model, grads)
        return mx.distributed.all_sum(loss, group=group) / group.size()

    rng = random.Random(args.seed)
    batches = itertools.chain.from_iterable(
        make_batches(rows, args.batch, tok.pad_token_id, rng, group.rank(), group.size()) for rows in stages)
    t0, seen, running = time.perf_counter(), 0, None
    for i, batch in zip(range(1, args.steps + 1), batches):
        loss = step(*loss_inputs(batch))
        mx.eval(loss, state)
        seen += batch.tokens * group.size()
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if i % args.log_every == 0 or i == args.steps:
            elapsed = time.perf_counter() - t0
            eta = elapsed / i * (args.steps - i)
            log(group, f"step {i:5d}/{args.steps}  loss {running:.4f}  {seen / elapsed:,.0f} tok/s"
                       f"  elapsed {elapsed / 60:.1f} min  ETA {eta / 60:.1f} min")
        if args.probe_every and i % args.probe_every == 0 and group.rank() == 0:
            log(group, probe(model, tok, args.seed))
    return model


def probe(model, tok, seed: int) -> str:
    """A quick look at held-out behaviours (float weights, 10 conversations each)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    figures = evaluate(model, TokenizerWrapper(tok), n=10, seed=seed + 777,
                       behaviours=("recall_en", "recall_zh", "correction_en", "correction_zh", "refusal_en", "json"))
    rates = " ".join(f"{b} {s['passed']}/{s['total']}" for b, s in figures["behaviours"].items())
    misses = [f for s in figures["behaviours"].values() for f in s["failures"][:1]]
    return f"        probe: {rates}" + (f"  e.g. {misses[0]}" if misses else "")


def log(group, message: str) -> None:
    if group.rank() == 0:
        print(message, flush=True)


def relaunch_with_workers(argv: list[str], workers: int, module: str = "demo.train") -> int:
    """Data-parallel training on this machine's cores: one process per worker, joined by MLX's
    ring backend over loopback (started directly: mlx.launch's output relay busy-waits a core)."""
    from localchat.server.launch import free_port

    ports = [free_port() for _ in range(workers)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as hostfile:
        json.dump([[f"127.0.0.1:{port}"] for port in ports], hostfile)
    command = [sys.executable, "-m", module, *argv]
    procs = [subprocess.Popen(command, env=os.environ | {"MLX_RANK": str(rank), "MLX_HOSTFILE": hostfile.name},
                              stdout=None if rank == 0 else subprocess.DEVNULL)
             for rank in range(workers)]
    try:
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            p.kill()
        os.unlink(hostfile.name)
    return max(codes, key=abs)


def quant_predicate(embedding_bits: int, attention_bits: int, group_size: int):
    """mlx_lm ``quant_predicate``: the tied embedding (also the output layer) and the attention
    projections at their own widths, everything else at 4 bits; None (mlx_lm's default, 4 bits
    everywhere) when both are 4. The hand-set circuit puts large weights (gain 6, identities) among
    small ones; in a 4-bit group of 32 they set a step of ~0.4 that erases their neighbours."""
    if embedding_bits == attention_bits == 4:
        return None

    def predicate(path: str, module) -> dict | bool:
        if "embed_tokens" in path:
            return {"bits": embedding_bits, "group_size": group_size}
        if "self_attn" in path:
            return {"bits": attention_bits, "group_size": group_size}
        return True

    return predicate


def init_weights(init: Path) -> dict:
    """Float weights of a model this script wrote (dequantized with mlx_lm's own convert)."""
    with tempfile.TemporaryDirectory() as tmp:
        convert(str(init), str(Path(tmp) / "float"), dequantize=True, dtype="float32")
        weights = mx.load(str(Path(tmp) / "float" / "model.safetensors"))
    weights.pop("lm_head.weight", None)  # tied to the embedding
    return weights


def save_float_model(model: nn.Module, tok, config: dict, path: Path) -> None:
    path.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(tok, path)


def save_quantized(model: nn.Module, tok, config: dict, args) -> None:
    """``args.out`` replaced by the model quantized with mlx_lm's convert (float32 scales, which
    the CPU wheel decodes far faster than float16 ones); ``args.keep_float`` keeps the float one."""
    with tempfile.TemporaryDirectory() as tmp:
        float_dir, quant_dir = Path(tmp) / "float", Path(tmp) / "q4"
        save_float_model(model, tok, config, float_dir)
        convert(str(float_dir), str(quant_dir), quantize=True, q_bits=4,
                q_group_size=args.group_size, dtype="float32",
                quant_predicate=quant_predicate(args.embedding_bits, args.attention_bits, args.group_size))
        if args.keep_float:
            shutil.rmtree(args.keep_float, ignore_errors=True)
            shutil.copytree(float_dir, args.keep_float)
        save_tokenizer(tok, quant_dir)  # convert re-saves it through AutoTokenizer: write ours again
        if args.out.exists():
            shutil.rmtree(args.out)
        shutil.copytree(quant_dir, args.out)


def save_and_reload(model: nn.Module, tok, config: dict, args):
    """``save_quantized``, then the saved model loaded back as mlx_lm loads it, with its tokenizer
    checked to tokenize exactly as in training."""
    save_quantized(model, tok, config, args)
    qmodel, qtok = load(str(args.out))
    check_tokenizer_round_trip(tok, qtok)
    return qmodel, qtok


def join_workers(argv: list[str], workers: int, module: str = "demo.train"):
    """This process's place in the data-parallel group; the first process relaunches itself as
    ``workers`` processes and exits with their status."""
    if workers > 1 and "MLX_RANK" not in os.environ:
        sys.exit(relaunch_with_workers(argv, workers, module=module))
    return mx.distributed.init()


def fine_tune_args(p: argparse.ArgumentParser, argv: list[str] | None, *, steps: int, lr: float,
                   eval_n: int) -> argparse.Namespace:
    """The options every fine-tune of the demo model takes (``demo.thinking``, ``demo.notes``),
    after the caller's own; the trainer's switches that only training from scratch uses are off."""
    p.add_argument("--out", type=Path, required=True, help="output directory (replaced)")
    p.add_argument("--demo", type=Path, default=MODEL_DIR, help="the model to start from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--group-size", type=int, default=32)
    p.add_argument("--embedding-bits", type=int, default=8, choices=[4, 8])
    p.add_argument("--attention-bits", type=int, default=8, choices=[4, 8])
    p.add_argument("--keep-float", type=Path, default=None)
    p.add_argument("--eval-n", type=int, default=eval_n, help="held-out conversations per card behaviour")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    return argparse.Namespace(**vars(args), fast_loss=False, probe_every=0, plant_induction=False)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output directory (replaced)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=1400)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--vocab", type=int, default=2048, help="upper bound; the fixed phrasings may need fewer")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=384)
    p.add_argument("--group-size", type=int, default=32, help="4-bit quantization group size")
    p.add_argument("--embedding-bits", type=int, default=8, choices=[4, 8],
                   help="bits for the tied embedding/output matrix (8 limits quantization damage)")
    p.add_argument("--attention-bits", type=int, default=8, choices=[4, 8],
                   help="bits for the attention projections (8 keeps the hand-set copy circuit intact)")
    p.add_argument("--keep-float", type=Path, default=None, help="also keep the float model here")
    p.add_argument("--eval-n", type=int, default=200, help="held-out conversations per behaviour")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--init", type=Path, default=None,
                   help="warm start from a model this script wrote (its tokenizer and weights)")
    p.add_argument("--plant-induction", action=argparse.BooleanOptionalAction, default=True,
                   help="start from a hand-set copy (induction) circuit (see plant_induction_circuit)")
    p.add_argument("--rope-theta", type=float, default=1e6,
                   help="RoPE base; a large one leaves low-frequency pairs for matching across turns")
    p.add_argument("--copy-stage", type=float, default=0.1,
                   help="fraction of steps in the first, echo-heavy curriculum stage")
    p.add_argument("--correction-stage", type=float, default=0.15,
                   help="fraction of steps in the last, correction-heavy curriculum stage")
    p.add_argument("--probe-every", type=int, default=700, help="steps between held-out recall probes (0: none)")
    p.add_argument("--recovery", type=float, default=0.04,
                   help="share of derailed recalls that teach a looping copy to end (see recovery_dialogue); "
                        "0 trains the previous model's recipe")
    p.add_argument(
        "--fast-loss",
        action="store_true",
        help="last MLP and output layer only where trained: 1.2-1.6x faster per step, but not the same model "
        "bit for bit as without it (see loss_on_trained_positions)",
    )
    p.add_argument("--workers", type=int, default=2,
                   help="data-parallel processes (MLX ring backend on loopback); 1 = this process only")
    return p.parse_args(argv)


def curriculum(args) -> dict[str, int]:
    """Steps per curriculum stage, in training order (see demo.corpus.training_dialogue)."""
    copy_steps = int(args.steps * args.copy_stage)
    correction_steps = int(args.steps * args.correction_stage)
    return {"copy": copy_steps, "main": args.steps - copy_steps - correction_steps,
            "correction": correction_steps}


def main(argv=None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    group = join_workers(argv, args.workers)
    started = time.perf_counter()
    rng = random.Random(args.seed)
    stage_steps = curriculum(args)
    dialogues = [training_dialogue(rng, stage, args.recovery) for stage, steps in stage_steps.items()
                 for _ in range(steps * args.batch)]
    tok = load_init_tokenizer(args.init) if args.init else build_tokenizer(tokenizer_texts(), args.vocab)
    encoded = [encode_with_mask(tok, d) for d in dialogues]
    bounds = list(itertools.accumulate(steps * args.batch for steps in stage_steps.values()))
    stages = [[r for r in encoded[start:end] if len(r[0]) <= 320]
              for start, end in zip([0, *bounds], bounds)]
    rows = [r for stage in stages for r in stage]
    n_tokens = sum(len(ids) for ids, _ in rows)
    log(group, f"corpus: {len(rows):,} conversations, {n_tokens:,} tokens, vocab {len(tok)}")
    config = model_config(args, len(tok), tok.convert_tokens_to_ids("<|im_end|>"))
    model = train(args, tok, stages, config, group, init_weights(args.init) if args.init else None)
    train_s = time.perf_counter() - started
    if group.rank() != 0:
        return None

    qmodel, qtok = save_and_reload(model, tok, config, args)
    figures = evaluate(qmodel, qtok, n=args.eval_n, seed=args.seed + 10_000)
    total_s = time.perf_counter() - started
    stress = stress_test(qmodel, qtok, n=args.eval_n, seed=args.seed + 20_000)
    stress_s = time.perf_counter() - started - total_s
    report = {
        "seed": args.seed, "steps": args.steps, "batch": args.batch, "lr": args.lr, "recovery": args.recovery,
        "workers": group.size(), "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
        "curriculum": curriculum(args),
        "parameters": sum(v.size for _, v in tree_flatten(model.parameters())),
        "train_tokens": n_tokens, "vocab": len(tok), "training_minutes": round(train_s / 60, 2),
        "total_minutes": round(total_s / 60, 2), "stress_test_minutes": round(stress_s / 60, 2),
        "size_bytes": sum(f.stat().st_size for f in args.out.iterdir()),
        "hardware": collect().hardware_label,
        **figures,
        "stress": stress,
    }
    (args.out / "eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (args.out / "README.md").write_text(model_card(report, argv), encoding="utf-8")
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return report


def stress_test(model, tokenizer, n: int, seed: int) -> dict:
    """Recall of words that are ambiguous to copy, per language, each with its clean endings
    (see demo.corpus.STRESS_BEHAVIOURS); reported beside the quality bar, not part of it."""
    results = {}
    for behaviour in STRESS_BEHAVIOURS:
        figures = evaluate(model, tokenizer, n=n, seed=seed, behaviours=(behaviour,))
        results[behaviour] = {**figures["behaviours"][behaviour], "clean_endings": figures["clean_endings"]}
    return results


if __name__ == "__main__":
    main()
