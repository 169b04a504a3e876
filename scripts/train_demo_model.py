"""Train localchat's bundled demo model: a tiny llama that remembers a code only when given history.

    uv run python scripts/train_demo_model.py --out localchat/demo_model

Deterministic for a given --seed. Steps: build a byte-level BPE tokenizer with ChatML specials,
synthesize conversations (localchat.demo_corpus), train with MLX (loss on assistant tokens only),
quantize to 4 bits with mlx_lm's own convert, then score held-out conversations.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm import convert, load
from mlx_lm.models import llama
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from localchat.demo_corpus import (  # noqa: E402
    DAYS, STRESS_BEHAVIOURS, Dialogue, tokenizer_texts, training_dialogue)
from localchat.demo_eval import evaluate  # noqa: E402
from localchat.environment import collect  # noqa: E402

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Pre-tokens are single CJK characters, letter runs, single digits and punctuation runs (the last
# three carrying one trailing space), and leftover whitespace. "the code harbor 17." gives "code ",
# "harbor ", "1", "7", so a code tokenizes the same inside a sentence and at the start of a reply;
# every CJK character is one token, never a run of look-alike UTF-8 bytes that copying confuses.
# The exception: each Chinese day name ("周五") is one token, like "Friday", because a two-token
# day starts with "周" whatever the day, and copying its second token then follows the day the
# model said last rather than the one the question asks for.
PRE_TOKEN_PATTERN = "|".join(DAYS["zh"]) + r"|\p{Han}|\p{L}+ ?|\p{N} ?|[^\p{L}\p{N}\s]+ ?|\s+"


def render(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def build_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        model_max_length=1024, clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHATML_TEMPLATE
    return hf


def encode_with_mask(tok: PreTrainedTokenizerFast, dialogue: Dialogue):
    """Token ids of the rendered conversation and a 0/1 mask over what the model is trained to
    say: the assistant replies (+ <|im_end|>) less any derailed start (``Exchange.derailed``).
    A token that straddles a derailed start is trained: it is the one that leaves the loop."""
    messages = dialogue.messages()
    derailed = iter(len(ex.derailed) for ex in dialogue.exchanges)
    text = render(messages)
    spans, pos = [], 0
    for m in messages:
        head = f"<|im_start|>{m['role']}\n"
        start = pos + len(head)
        end = start + len(m["content"]) + len("<|im_end|>")
        if m["role"] == "assistant":
            spans.append((start + next(derailed), end))
        pos = end + 1
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    mask = [int(any(s < b and a < e for s, e in spans)) for a, b in enc["offset_mapping"]]
    return enc["input_ids"], mask


@dataclass(frozen=True)
class Batch:
    """One worker's share of a global batch: ``targets`` and ``mask`` (1 where the model is
    trained) align with ``inputs``; ``trained`` lists those positions as flat indices, padded
    to a multiple of 16 with weight 0 in ``trained_weights``."""
    inputs: mx.array
    targets: mx.array
    mask: mx.array
    trained: mx.array
    trained_weights: mx.array
    tokens: int


def make_batches(rows, batch_size: int, pad_id: int, rng: random.Random, rank: int = 0, size: int = 1):
    """Batches of similar-length rows (little padding), padded to a multiple of 16 tokens so
    that mx.compile sees few shapes; batch order is shuffled. With several workers, each takes
    its own share of every global batch (``batch_size`` rows in all)."""
    order = sorted(range(len(rows)), key=lambda j: len(rows[j][0]))
    chunks = [order[i:i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    rng.shuffle(chunks)
    for chunk in chunks:
        chunk = chunk[rank::size]
        width = _padded_size(max(len(rows[j][0]) for j in chunk))
        x = np.full((len(chunk), width + 1), pad_id, dtype=np.int32)
        m = np.zeros((len(chunk), width + 1), dtype=np.float32)
        for r, j in enumerate(chunk):
            ids, mask = rows[j]
            x[r, :len(ids)] = ids
            m[r, :len(mask)] = mask
        yield _batch(x, m, pad_id)


def _padded_size(n: int) -> int:
    """``n`` rounded up to a multiple of 16, so that mx.compile sees few shapes."""
    return 16 * math.ceil(n / 16)


def _batch(x: np.ndarray, m: np.ndarray, pad_id: int) -> Batch:
    inputs, mask = x[:, :-1], m[:, 1:]
    trained = np.flatnonzero(mask)
    size = _padded_size(len(trained))
    positions, weights = np.zeros(size, dtype=np.int32), np.zeros(size, dtype=np.float32)
    positions[:len(trained)], weights[:len(trained)] = trained, mask.reshape(-1)[trained]
    return Batch(mx.array(inputs), mx.array(x[:, 1:]), mx.array(mask), mx.array(positions), mx.array(weights),
                 tokens=int((inputs != pad_id).sum()))


def plain_loss(model: nn.Module, inputs: mx.array, targets: mx.array, mask: mx.array) -> mx.array:
    """Mean cross-entropy over the trained (assistant) positions of the full output."""
    ce = nn.losses.cross_entropy(model(inputs), targets) * mask
    return ce.sum() / mask.sum()


def loss_on_trained_positions(model: nn.Module, inputs: mx.array, targets: mx.array,
                              trained: mx.array, weights: mx.array) -> mx.array:
    """``plain_loss``, computed only where it counts (``--fast-loss``).

    Most positions are prompts and train nothing, yet a plain ``model(x)`` pays for their last
    MLP and their output logits (vocabulary-wide), about a third of the step. Here the last
    layer's attention runs over every position (later positions attend to them), its MLP and the
    output layer only over trained ones. The norms still see every position (the trained rows
    scattered back), so their weight gradients are summed over the same layout as the plain
    loss's. Even so the gradients equal the plain loss's only up to float rounding
    (tests/test_demo_model.py), not to the bit, and training amplifies rounding: the same seed
    then trains a different model, as good or bad as another seed's."""
    inner, last = model.model, model.model.layers[-1]
    h = inner.embed_tokens(inputs)
    for layer in inner.layers[:-1]:
        h = layer(h, "causal")
    rows, width, dim = h.shape
    h = (h + last.self_attn(last.input_layernorm(h), "causal")).reshape(rows * width, dim)
    out = h[trained] + last.mlp(last.post_attention_layernorm(h)[trained])
    h = mx.zeros_like(h).at[trained].add(out * weights[:, None])
    logits = inner.embed_tokens.as_linear(inner.norm(h)[trained])
    ce = nn.losses.cross_entropy(logits, targets.reshape(-1)[trained]) * weights
    return ce.sum() / weights.sum()


def model_config(args, vocab_size: int, eos_id: int) -> dict:
    return {
        # llama, not qwen2: transformers 5 always rebuilds a qwen2 tokenizer with Qwen2's own
        # pre-tokenizer regex, silently changing how the model's text is split after loading;
        # for llama it honours tokenizer.json when tokenizer_class is PreTrainedTokenizerFast.
        # Query/key biases are needed by plant_induction_circuit.
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "attention_bias": True, "mlp_bias": False,
        "hidden_size": args.hidden, "num_hidden_layers": args.layers,
        "intermediate_size": args.intermediate, "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads, "rms_norm_eps": 1e-6, "vocab_size": vocab_size,
        "max_position_embeddings": 1024, "rope_theta": args.rope_theta, "tie_word_embeddings": True,
        "eos_token_id": eos_id, "torch_dtype": "float32",
    }


def rope_frequencies(config: dict) -> np.ndarray:
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return config["rope_theta"] ** (-np.arange(0, head_dim, 2) / head_dim)


def plant_induction_circuit(model: nn.Module, config: dict, amplitude: float = 12.0, gain: float = 6.0) -> None:
    """Start the model with a working copy circuit, which training then refines.

    Copying a word the model has never seen needs an induction circuit: a head that writes each
    token's predecessor into the residual stream, and a head in the next layer that looks for the
    position whose predecessor is the current token and copies what stands there. Gradient descent
    finds it only after far more tokens than a 2-core CPU trains in 45 minutes (measured here:
    plain copying of random letters still at chance after 250 steps, with or without help), so it
    is set up by hand. The residual stream is split in halves: A (token identity: the embedding
    lives there) and B (what came before), both cut into head-sized slices p.

    - Layer 0, heads p: previous-token heads. Through RoPE, query/key *biases* on the
      high-frequency dimension pairs give the content-free score a² Σ_j cos((Δ - d) θ_j), which
      peaks at distance Δ = d = 1; each copies A_p into B_p.
    - Layer 0, heads P+p: the same at d = 2; they write the token two back into the dimensions
      of B_p that matching never reads (the "store" dimensions, see ``_copy_dimensions``).
    - Layer 1, heads p: induction heads. On the low-frequency pairs (θ_j · 1000 < 1, so RoPE
      barely rotates them over a conversation) the query reads the current token from A_p and the
      key each position's predecessor from B_p; each copies A_p from the matched position.
    - Layer 1, heads P+p: the same one step back (the current token's predecessor against each
      position's token two back). Both copy into A_p, so a position that matches the last *two*
      tokens outvotes one that matches only the last: copying `ppbkb` or `rcrelu` is no longer
      ambiguous after a repeated letter (untrained, teacher-forced whole-code copies of held-out
      codes: English 41 → 78 %, Chinese 69 → 91 %).
    Both MLPs' outputs and B's embedding columns start at zero so they add no noise to the
    circuit; training grows them. So does the MLP output of any further layer, whose attention
    starts random (it learns which copied day a question asks for). Measured, full runs: with a
    wholly random third layer English recall never recovered (7/200, Chinese 197/200); with its
    attention output zeroed too, corrected facts stayed at 14 % (English) and 77.5 % (Chinese).
    """
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = hidden // heads
    planted = hidden // 2 // head_dim  # heads needed to carry half the stream
    if hidden % (2 * head_dim) or config["num_hidden_layers"] < 2 or 2 * planted > heads:
        raise SystemExit("--plant-induction needs ≥ 2 layers, hidden/2 a multiple of the head size "
                         "and at least hidden/head_size heads")
    theta = rope_frequencies(config)
    match, store = _copy_dimensions(theta, head_dim)
    b_start = hidden // 2
    embed = np.array(model.model.embed_tokens.weight)
    embed[:, b_start:] = 0.0
    scale = float(embed[:, :b_start].std()) * np.sqrt(0.5)  # B at the embedding's scale
    layers = model.model.layers
    params = {name: np.array(w) for name, w in tree_flatten(
        {f"l{i}": layer.parameters() for i, layer in enumerate(layers[:2])})}

    def w(layer: int, name: str) -> np.ndarray:
        return params[f"l{layer}.self_attn.{name}"]

    for layer in (0, 1):
        params[f"l{layer}.mlp.down_proj.weight"][:] = 0.0
        w(layer, "o_proj.weight")[:] = 0.0
        w(layer, "o_proj.bias")[:] = 0.0
    for p in range(planted):
        a = np.arange(p * head_dim, (p + 1) * head_dim)  # A_p
        b = b_start + a  # B_p
        for head in (p, planted + p):
            q = head * head_dim + np.arange(head_dim)  # the head's own rows and columns
            for layer in (0, 1):
                for name in ("q_proj", "k_proj", "v_proj"):
                    w(layer, f"{name}.weight")[q] = 0.0
                    w(layer, f"{name}.bias")[q] = 0.0
                w(layer, "v_proj.weight")[q, a] = 1.0
            _attend_back(w(0, "q_proj.bias"), w(0, "k_proj.bias"), head * head_dim, theta,
                         distance=1 if head == p else 2, amplitude=amplitude)
            w(1, "o_proj.weight")[a, q] = 1.0
        previous, two_back = p * head_dim, (planted + p) * head_dim
        keep = np.setdiff1d(np.arange(head_dim), store)
        w(0, "o_proj.weight")[b[keep], previous + keep] = scale
        w(0, "o_proj.weight")[b[store], two_back + match] = scale
        w(1, "q_proj.weight")[previous + match, a[match]] = gain
        w(1, "k_proj.weight")[previous + match, b[match]] = 1.0
        w(1, "q_proj.weight")[two_back + match, b[match]] = gain
        w(1, "k_proj.weight")[two_back + match, b[store]] = 1.0
    model.model.embed_tokens.weight = mx.array(embed)
    for i, layer in enumerate(layers[:2]):
        layer.update(tree_unflatten([(name.split(".", 1)[1], mx.array(value))
                                     for name, value in params.items() if name.startswith(f"l{i}.")]))
    for layer in layers[2:]:
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)


def _copy_dimensions(theta: np.ndarray, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Within a head: the dimensions that match tokens (both halves of the RoPE pairs that barely
    rotate over a conversation, at most half the head) and as many others, which RoPE would
    scramble for matching, to store the token two back."""
    half = head_dim // 2
    low = [j for j in range(half) if theta[j] * 1000 < 1][-(head_dim // 4):]
    match = np.array(low + [half + j for j in low])
    store = np.setdiff1d(np.arange(head_dim), match)[:len(match)]
    return match, store


def _attend_back(q_bias: np.ndarray, k_bias: np.ndarray, start: int, theta: np.ndarray,
                 distance: int, amplitude: float) -> None:
    """Content-free attention to the token ``distance`` back, through RoPE on constant biases."""
    half = len(theta)
    for j in np.flatnonzero(theta > 0.05):
        q_bias[start + j] = amplitude * np.cos(distance * theta[j])
        q_bias[start + half + j] = -amplitude * np.sin(distance * theta[j])
        k_bias[start + j] = amplitude


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


def relaunch_with_workers(argv: list[str], workers: int) -> int:
    """Data-parallel training on this machine's cores: one process per worker, joined by MLX's
    ring backend over loopback (started directly: mlx.launch's output relay busy-waits a core)."""
    from localchat.server import free_port

    ports = [free_port() for _ in range(workers)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as hostfile:
        json.dump([[f"127.0.0.1:{port}"] for port in ports], hostfile)
    command = [sys.executable, str(Path(__file__).resolve()), *argv]
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


def load_init_tokenizer(init: Path) -> PreTrainedTokenizerFast:
    """A warm start keeps the tokenizer its weights were trained with."""
    return PreTrainedTokenizerFast.from_pretrained(str(init))


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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def save_tokenizer(tok: PreTrainedTokenizerFast, path: Path) -> None:
    """Hugging Face files that load back as exactly this tokenizer (pre-tokenizer included)."""
    for name in TOKENIZER_FILES:
        (path / name).unlink(missing_ok=True)
    tok.save_pretrained(str(path))
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))


def check_tokenizer_round_trip(tok: PreTrainedTokenizerFast, loaded) -> None:
    """The model must see at inference exactly the tokens it was trained on."""
    sample = render([{"role": "user", "content": "Remember the code harbor 17. 请记住代号「港口 17」"}])
    if loaded.encode(sample, add_special_tokens=False) != tok.encode(sample, add_special_tokens=False):
        raise SystemExit("the saved tokenizer does not load back identically (check transformers' tokenizer class)")


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
    p.add_argument("--fast-loss", action="store_true",
                   help="last MLP and output layer only where trained: 1.2-1.6x faster per step, but not the same model "
                        "bit for bit as without it (see loss_on_trained_positions)")
    p.add_argument("--workers", type=int, default=2,
                   help="data-parallel processes (MLX ring backend on loopback); 1 = this process only")
    return p.parse_args(argv)


def curriculum(args) -> dict[str, int]:
    """Steps per curriculum stage, in training order (see demo_corpus.training_dialogue)."""
    copy_steps = int(args.steps * args.copy_stage)
    correction_steps = int(args.steps * args.correction_stage)
    return {"copy": copy_steps, "main": args.steps - copy_steps - correction_steps,
            "correction": correction_steps}


def main(argv=None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.workers > 1 and "MLX_RANK" not in os.environ:
        sys.exit(relaunch_with_workers(argv, args.workers))
    group = mx.distributed.init()
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

    qmodel, qtok = load(str(args.out))
    check_tokenizer_round_trip(tok, qtok)
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
    (see demo_corpus.STRESS_BEHAVIOURS); reported beside the quality bar, not part of it."""
    results = {}
    for behaviour in STRESS_BEHAVIOURS:
        figures = evaluate(model, tokenizer, n=n, seed=seed, behaviours=(behaviour,))
        results[behaviour] = {**figures["behaviours"][behaviour], "clean_endings": figures["clean_endings"]}
    return results


def missed_criteria(report: dict) -> list[str]:
    """Issue 2's bar: recall and corrections ≥ 95 %, refusal ≥ 98 %, JSON valid ≥ 98 %, all clean."""
    rate = {b: s["rate"] for b, s in report["behaviours"].items()}
    json_valid, clean = report["json_valid"], report["clean_endings"]
    checks = {
        "recall with history": rate["recall_en"] >= 0.95 and rate["recall_zh"] >= 0.95,
        "corrected facts": rate["correction_en"] >= 0.95 and rate["correction_zh"] >= 0.95,
        "refusal without history": rate["refusal_en"] >= 0.98 and rate["refusal_zh"] >= 0.98,
        "JSON form": json_valid["valid"] >= 0.98 * json_valid["total"],
        "clean endings": clean["clean"] == clean["total"],
    }
    return [name for name, ok in checks.items() if not ok]


def _rate(report: dict, behaviour: str) -> str:
    b = report["behaviours"][behaviour]
    return f"{b['passed']}/{b['total']} ({b['rate']:.1%})"


def _stages(report: dict) -> str:
    return ", ".join(f"{stage} {steps}" for stage, steps in report["curriculum"].items())


def _stress_section(report: dict) -> str:
    stress = report["stress"]
    rows = "\n".join(
        f"| {language} | {s['passed']}/{s['total']} ({s['rate']:.1%}) "
        f"| {s['clean_endings']['clean']}/{s['clean_endings']['total']} |"
        for language, s in zip(("English", "Chinese"), stress.values()))
    examples = [f for s in stress.values() for f in sorted(s["failures"], key=len, reverse=True)[:2]]
    return f"""## Stress test: words that are hard to copy (not part of the bar)

Where the rare never-ending replies come from: {report['conversations_per_behaviour']} recall conversations per language
whose held-out word has a letter that recurs with another follower (`augaut`, `gxkkkk`, `早可早`).
The model copies by the last one or two tokens, so there it has two ways on, and a wrong turn
can cycle (`augaugaug…`) until the 32-token limit.

| recall of a hard word | exact | replies that end within 32 tokens |
|---|---|---|
{rows}

Failures, longest first: {'; '.join(f'`{e}`' for e in examples) or 'none'}."""


def _recovery_note(report: dict) -> str:
    share = report.get("recovery", 0.0)
    if not share:
        return "Its training has no derailed recalls (`--recovery 0`)."
    return (f"{share:.0%} of the training conversations (`--recovery`) are recalls whose reply has already\n"
            "derailed into such a loop, longer than any code word; the loss covers only what ends the reply\n"
            "there (the end-of-turn token, or `\"}` first in JSON), so that a copy that goes wrong still ends.")


def model_card(report: dict, argv: list[str]) -> str:
    env = collect()
    json_valid = report["json_valid"]
    clean = report["clean_endings"]
    missed = missed_criteria(report)
    status = ("**Status: meets the quality bar** (figures below)." if not missed else
              f"**Status: below the quality bar** on: {', '.join(missed)} (figures below).")
    return f"""# localchat demo model

{status}

A **toy**: a {report['parameters']:,}-parameter llama-architecture chat model ({report['layers']} layers,
hidden {report['hidden']}, {report['heads']} heads) with a byte-level BPE tokenizer ({report['vocab']} tokens, ChatML template), trained from
scratch by `scripts/train_demo_model.py` on synthetic conversations and quantized with mlx_lm's own
`convert` (group size 32, fp32 scales): MLPs at 4 bits, attention projections and the tied
embedding at 8 bits. It exists to make
the effect of chat history visible on any machine, offline. It is not an assistant: outside the
phrasings below it answers with memorized small talk or noise.

Training starts from a hand-set copy circuit (heads in layer 0 that look one and two tokens
back, feeding heads in layer 1 that find where the last two tokens occurred before and copy what
followed; see `plant_induction_circuit` in the script): gradient descent alone does not find one
within the CPU budget, and without it the model cannot copy a word it has never seen. A third
layer (random attention, MLP output starting at zero) gives the model room to pick, by the question
asked, which of two copied days to answer; with two layers it learned that in one language at best.
Copying by the last two tokens has a blind spot: in a word such as `fmtmps`, `m` is followed once by
`t` and once by `p`, and a wrong turn can cycle (`fmtmtmtm…`) to the length limit (see the stress
test below). {_recovery_note(report)}

## What it was taught (exact phrasings)

| behaviour | user says | model answers |
|---|---|---|
| remember | `Remember the code harbor 17. Reply only OK.` | `OK` |
| remember (zh) | `请记住代号「港口 17」，只回答「收到」。` | `收到` |
| recall, after 0-3 small-talk turns | `What was the code? Reply with the code only.` | `harbor 17` |
| recall (zh) | `上一题的代号是什么？只回答代号。` | `港口 17` |
| corrected fact | `Chapter 2 was planned for Friday, now moved to Saturday. Which day is it now?` / `And what was the original day?` | `Saturday` / `Friday` |
| corrected fact (zh) | `第二章原定周五，现改为周六复习。现在安排在哪天？` / `那原来是哪天？` | `周六` / `周五` |
| unknown detail | `And at what time?` / `那改到几点？` | `I don't know.` / `不知道。` |
| no history | any of the questions above asked alone | `I don't know.` / `不知道。` |
| JSON | system `Answer in JSON: {{"answer": "..."}}` (alone or after another system text) | `{{"answer": "harbor 17"}}` |
| small talk | `Hello`, `How are you?`, `你好`, `谢谢`, … (see `localchat/demo_corpus.py`) | a short fixed reply |

Codes are a word and a number (0-999). Words are mostly random strings (3-8 Latin letters, or
1-3 common CJK characters) and sometimes real words, so the model learns to copy any word;
words with `crc32(word) % 8 == 0` never occur in training and are the only ones evaluated.

## Figures (held-out words, temperature 0, after 4-bit quantization)

{report['conversations_per_behaviour']} fresh conversations per behaviour, replayed turn by turn with the
model's own earlier replies in the history:

| behaviour | exact |
|---|---|
| recall with history, English | {_rate(report, 'recall_en')} |
| recall with history, Chinese | {_rate(report, 'recall_zh')} |
| corrected fact, English (both answers) | {_rate(report, 'correction_en')} |
| corrected fact, Chinese (both answers) | {_rate(report, 'correction_zh')} |
| refusal without history, English | {_rate(report, 'refusal_en')} |
| refusal without history, Chinese | {_rate(report, 'refusal_zh')} |
| JSON recall (valid and exact) | {_rate(report, 'json')} |
| JSON replies that parse as `{{"answer": string}}` | {json_valid['valid']}/{json_valid['total']} |
| replies that are valid UTF-8 and end with `<|im_end|>` within 32 tokens | {clean['clean']}/{clean['total']} |

{_stress_section(report)}

## How it was trained

`uv run python scripts/train_demo_model.py {' '.join(argv)}` — seed {report['seed']},
{report['steps']} steps of {report['batch']} conversations ({report['train_tokens']:,} tokens), AdamW, lr
{report['lr']}, loss on assistant tokens only, {report['workers']} data-parallel worker(s). Curriculum
(steps per stage): {_stages(report)} — first mostly copy drills, last half corrected-fact exercises.
Training took {report['training_minutes']} min and the whole run {report['total_minutes']} min (then the
stress test {report['stress_test_minutes']} min) on
{env.hardware_label} (mlx {env.mlx_version}, mlx-lm {env.mlx_lm_version}).
Size on disk: {report['size_bytes'] / 1e6:.2f} MB.
"""


if __name__ == "__main__":
    main()
