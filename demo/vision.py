"""Train ``demo-vision``: a tiny vision-language toy that says what is in a synthetic picture.

    uv run --extra vision python -m demo.vision --out localchat/demo_vision_model

It is mlx-vlm's own ``idefics3`` architecture (SmolVLM's): a small ViT whose patches are pooled
into 16 image tokens that replace ``<image>`` markers in a llama's input. It keeps the demo
model's byte-level BPE tokenizer (plus the image specials) and a ChatML template. It is trained
from scratch on the conversations of ``demo.pictures``, each rendered exactly as mlx-vlm (and
so ``mlx_vlm.server``) renders it (``localchat.vision.prompt``), with the loss on the answers;
with ``--plant`` its vision tower is set to ``demo.vision_circuit``'s and frozen from then on.
Deterministic for a given --seed. The card's figures come from ``demo.vision_card``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from demo.pictures import ANY, FRAMED, Framing, conversation, one_question
from demo.vision_circuit import fit_readout, plant_readout, plant_shape_circuit, pooled_features
from localchat.vision.prompt import vlm_prompt

IMAGE_SPECIALS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}"
            "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SIDE = 128  # every picture is resized to SIDE × SIDE: 8 × 8 patches of 16 pixels
FRAMINGS = {"any": ANY, "framed": FRAMED}
DEMO_TOKENIZER = Path(__file__).resolve().parent.parent / "localchat" / "demo_model" / "tokenizer.json"


def image_tokens(scale: int, patch: int = 16) -> int:
    """Tokens a picture takes: the patch grid pooled ``scale`` × ``scale`` (idefics3's pixel shuffle)."""
    return (SIDE // patch // scale) ** 2


def build_processor(out: Path, scale: int = 2, patch: int = 16):
    """The demo tokenizer with the image specials, an Idefics3 processor at SIDE pixels, saved to ``out``."""
    from transformers import AutoProcessor, Idefics3Processor, PreTrainedTokenizerFast
    from transformers.models.idefics3 import Idefics3ImageProcessorPil

    tok = PreTrainedTokenizerFast(tokenizer_file=str(DEMO_TOKENIZER), eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": IMAGE_SPECIALS})
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": SIDE},
                                       max_image_size={"longest_edge": SIDE})
    Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=image_tokens(scale, patch),
                      chat_template=TEMPLATE).save_pretrained(out)
    return AutoProcessor.from_pretrained(out)


def model_config(args, processor) -> dict:
    tok = processor.tokenizer
    vocab = len(tok)
    return {
        "model_type": "idefics3", "architectures": ["Idefics3ForConditionalGeneration"], "scale_factor": args.scale,
        "image_token_id": tok.convert_tokens_to_ids("<image>"), "vocab_size": vocab,
        "eos_token_id": [tok.convert_tokens_to_ids("<|im_end|>")],
        "text_config": {"model_type": "llama", "hidden_size": args.hidden, "intermediate_size": 8 * args.hidden // 3,
                        "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": args.hidden // 4,
                        "rms_norm_eps": 1e-5, "vocab_size": vocab, "num_hidden_layers": args.layers,
                        "max_position_embeddings": 2048},
        "vision_config": {"model_type": "idefics3_vision", "hidden_size": args.vision_hidden,
                          "num_attention_heads": 4, "patch_size": args.patch, "num_hidden_layers": args.vision_layers,
                          "intermediate_size": 256, "image_size": SIDE},
    }


def new_model(config: dict):
    from mlx_vlm.models import idefics3

    cfg = idefics3.ModelConfig.from_dict(config)
    cfg.text_config = idefics3.TextConfig.from_dict(config["text_config"])
    cfg.vision_config = idefics3.VisionConfig.from_dict(config["vision_config"])
    return idefics3.Model(cfg)


def pixels_of(processor, pictures: list) -> np.ndarray:
    """The pixel values the processor makes of ``pictures`` (``demo.pictures.Picture``): (N, 3, SIDE, SIDE)."""
    return np.concatenate([processor.image_processor(p.image, return_tensors="np")["pixel_values"][0]
                           for p in pictures])


def plant_vision_circuit(vision_model, processor, rng: random.Random, pictures: int = 1500) -> None:
    """The shape circuit, then a readout of shape and colour fitted on ``pictures`` framed pictures."""
    from demo.pictures import COLOURS, SHAPES, random_picture

    plant_shape_circuit(vision_model)
    drawn = [random_picture(rng, FRAMED) for _ in range(pictures)]
    features = pooled_features(vision_model, pixels_of(processor, drawn))
    repeat = len(features) // pictures
    shapes = np.repeat([SHAPES.index(p.shape) for p in drawn], repeat)
    colours = np.repeat([list(COLOURS).index(p.colour) for p in drawn], repeat)
    (shape_w, shape_b), (colour_w, colour_b) = fit_readout(features, shapes, 3), fit_readout(features, colours, 4)
    plant_readout(vision_model, np.concatenate([shape_w, colour_w]), np.concatenate([shape_b, colour_b]))


def messages_of(system: str | None, turns) -> tuple[list[dict], list]:
    """OpenAI-shaped messages (an image part where a turn has a picture) and the pictures in order."""
    messages = [{"role": "system", "content": system}] if system else []
    pictures = []
    for picture, question, answer in turns:
        content = [{"type": "text", "text": question}]
        if picture is not None:
            content.insert(0, {"type": "image_url", "image_url": {"url": "picture"}})
            pictures.append(picture.image)
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]
    return messages, pictures


def example(processor, config: dict, rng: random.Random, focus: float = 0.0, framing: Framing = ANY):
    """Token ids of one whole conversation (one question about a picture, with probability
    ``focus``), the positions of its answers, and its pixel values."""
    system, turns = one_question(rng, framing) if rng.random() < focus else conversation(rng, framing)
    messages, pictures = messages_of(system, turns)
    full = vlm_prompt(processor, config, messages, add_generation_prompt=False)
    batch = processor(text=full, images=pictures or None, return_tensors="np")
    ids = batch["input_ids"][0].tolist()
    keep = np.zeros(len(ids), dtype=np.float32)
    tok = processor.tokenizer
    for i in range(len(turns)):
        upto = messages[:len(messages) - 2 * (len(turns) - i) + 1]
        start = len(processor.tokenizer(vlm_prompt(processor, config, upto).replace(
            "<image>", _expanded(processor.image_seq_len)))["input_ids"])
        answer = tok.encode(turns[i][2], add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        assert ids[start:start + len(answer)] == answer, "an answer tokenizes differently inside the conversation"
        keep[start:start + len(answer)] = 1
    pixels = batch["pixel_values"][0] if pictures else np.zeros((0, 3, SIDE, SIDE), np.float32)
    return ids, keep, pixels


def _expanded(tokens: int) -> str:
    """A picture's marker as the processor expands it (without image splitting)."""
    return "<fake_token_around_image><global-img>" + "<image>" * tokens + "<fake_token_around_image>"


def batches(processor, config: dict, rng: random.Random, size: int, pool: int = 4, focus: float = 0.0,
            framing: Framing = ANY):
    """Batches of ``size`` conversations, drawn ``pool`` batches at a time and grouped by length, so
    little of each batch is padding."""
    while True:
        examples = sorted((example(processor, config, rng, focus, framing) for _ in range(size * pool)),
                          key=lambda e: len(e[0]))
        order = list(range(pool))
        rng.shuffle(order)
        for k in order:
            yield batch_of(processor, examples[k * size:(k + 1) * size])


def batch_of(processor, examples: list):
    size = len(examples)
    length = max(len(e[0]) for e in examples)
    pad = processor.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = np.full((size, length), pad, dtype=np.int32)
    keep = np.zeros((size, length), dtype=np.float32)
    for row, (e_ids, e_keep, _) in enumerate(examples):
        ids[row, :len(e_ids)] = e_ids
        keep[row, :len(e_keep)] = e_keep
    pixels = np.concatenate([e[2] for e in examples])[None]
    answers = np.flatnonzero(keep[:, 1:].reshape(-1))  # the positions whose next token is an answer's
    return mx.array(ids), mx.array(answers), mx.array(pixels)


def loss_fn(model, ids, answers, pixels):
    """Cross-entropy on the answers' tokens. The model's own layers, but the output head runs on the
    answer positions only: on mlx[cpu]'s reference BLAS it would cost a fifth of each step."""
    from mlx_vlm.models.base import create_attention_mask

    inputs = ids[:, :-1]
    h = model.get_input_embeddings(inputs, pixels if pixels.shape[1] else None).inputs_embeds
    text = model.language_model
    mask = create_attention_mask(h)
    for layer in text.layers:
        h = layer(h, mask, None)
    h = text.norm(h).reshape(-1, h.shape[-1])[answers]
    return nn.losses.cross_entropy(text.lm_head(h), ids[:, 1:].reshape(-1)[answers]).mean()


def train(model, processor, config: dict, args) -> float:
    rng = random.Random(args.seed)
    mx.random.seed(args.seed)
    schedule = optim.cosine_decay(args.lr, args.steps, args.lr / 20)
    opt = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    step = nn.value_and_grad(model, loss_fn)
    started = time.time()
    source = batches(processor, config, rng, args.batch, focus=args.focus, framing=FRAMINGS[args.framing])
    for n in range(1, args.steps + 1):
        loss, grads = step(model, *next(source))
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        if n % 50 == 0 or n == 1:
            print(f"step {n}: loss {loss.item():.4f} ({time.time() - started:.0f} s)", flush=True)
    return time.time() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--hidden", type=int, default=96)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vision-hidden", type=int, default=96)
    parser.add_argument("--vision-layers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=int, choices=(1, 2, 4, 8), default=2,
                        help="Pool the 8 × 8 patches this many a side into image tokens (8: one token sees all).")
    parser.add_argument("--patch", type=int, choices=(8, 16), default=16, help="Pixels a side of a ViT patch.")
    parser.add_argument("--focus", type=float, default=0.0,
                        help="Share of conversations that are one question about one picture (shapes need many).")
    parser.add_argument("--framing", choices=sorted(FRAMINGS), default="any",
                        help="any: 48-400 px sides, shapes 0.25-0.7 of the short one; framed: 2.5:1 at most, 0.35-0.85")
    parser.add_argument("--plant", action="store_true",
                        help="Set the vision tower to the shape circuit of demo.vision_circuit and train the rest.")
    parser.add_argument("--start", type=Path, help="Go on from this trained model (its weights and stages).")
    args = parser.parse_args(argv)
    stages = json.loads((args.start / "training.json").read_text())["stages"] if args.start else []
    start = args.start / "model.safetensors" if args.start else None
    if start is not None:
        shutil.copy(start, scratch := Path(f"/tmp/demo-vision-start-{time.time_ns()}.safetensors"))
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    processor = build_processor(args.out, args.scale, args.patch)
    config = model_config(args, processor)
    model = new_model(config)
    if start is not None:
        model.load_weights(str(scratch))
        scratch.unlink()
    if args.plant:
        plant_vision_circuit(model.vision_model, processor, random.Random(args.seed))
    elif any(stage.get("plant") for stage in stages):
        model.vision_model.freeze()  # a planted tower stays as it was planted
    print("parameters:", sum(v.size for _, v in tree_flatten(model.parameters())), flush=True)
    seconds = train(model, processor, config, args)
    model.save_weights(str(args.out / "model.safetensors"))
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    stage = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()} | {"train_seconds": round(seconds)}
    (args.out / "training.json").write_text(json.dumps({"stages": [*stages, stage]}, indent=2) + "\n")
    print(f"trained in {seconds:.0f} s; saved to {args.out}")


if __name__ == "__main__":
    main()
