"""A tiny real llama whose replies follow a script: the model file of the family tests' models.

mlx_lm loads it as a custom architecture (``model_file`` in config.json, ``trust_remote_code``), in
this process and in a real mlx_lm.server. Every call runs the real llama (random weights) on the real
KV cache; one more cache layer keeps the token ids seen (stored as keys, so mlx_lm's trimming,
copying and batching handle it like any other layer). Only the last position's logits are replaced,
when the ids seen end with a prefix of one of the scripted replies:

    variant = generation prompt tail + reply tokens, with -1 for a free token and the end token last

A free token is the real model's greedy choice among plain letter tokens, so with and without KV reuse
the same logits must win; the end token makes every turn end with ``stop``.
"""

# No `from __future__ import annotations`: mlx_lm runs this file as a module that is not in
# sys.modules, where dataclasses cannot resolve string annotations.
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

FREE = -1


@dataclass
class ModelArgs(llama.ModelArgs):
    script: dict = field(default_factory=dict)  # {"variants": [[ids]], "tail": [len], "free": [ids]}


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.inner = llama.Model(args)
        self.variants = [list(v) for v in args.script["variants"]]
        self.tails = list(args.script["tail"])
        self.free_ids = list(args.script["free"])  # ints, not an array: no parameter to load

    @property
    def layers(self):
        return self.inner.layers

    def make_cache(self):
        return [KVCache() for _ in self.inner.layers] + [KVCache()]

    def __call__(self, inputs, cache=None, **kwargs):
        cache = cache or self.make_cache()
        logits = self.inner(inputs, cache=cache[:-1])
        ids = inputs.astype(mx.float32)[:, None, :, None]
        seen, _ = cache[-1].update_and_fetch(ids, ids)
        target = self._next(seen[0, 0, :, 0].astype(mx.int32).tolist(), logits[0, -1])
        if target is None:
            return logits
        forced = mx.where(mx.arange(logits.shape[-1]) == target, 0.0, -1e9).astype(logits.dtype)
        return mx.concatenate([logits[:, :-1], forced[None, None]], axis=1)

    def _next(self, seen: list[int], last: mx.array) -> int | None:
        """The scripted next token: the variant matched furthest (its tail at least) decides."""
        best = None
        for variant, tail in zip(self.variants, self.tails):
            for done in range(len(variant) - 1, tail - 1, -1):
                if done <= len(seen) and _matches(seen[len(seen) - done:], variant[:done]):
                    if best is None or done > best[0]:
                        best = (done, variant[done])
                    break
        if best is None:
            return None
        if best[1] != FREE:
            return best[1]
        free = mx.array(self.free_ids)
        return int(free[mx.argmax(last[free])].item())

    def sanitize(self, weights):
        return weights


def _matches(seen: list[int], pattern: list[int]) -> bool:
    return all(p == FREE or p == s for s, p in zip(seen, pattern))
