"""GGUF tensors as MLX arrays: float types as they are, quantized blocks as MLX affine triples.

GGML's block formats are affine per group, ``x = scale · q + bias``, as MLX's quantization is, so
most map without loss: Q8_0 (8 bits, bias −128·d), Q4_0 (bias −8·d), Q4_1 (bias m), Q5_0/Q5_1
(5 bits) in groups of 32, and the K-quants Q4_K and Q5_K, whose 32-value sub-blocks carry a
6-bit scale and min (scale d·sc, bias −dmin·m, exact in float32). Q6_K's 16-value sub-blocks are
finer than MLX's smallest group (32): it is stored as 8 bits in groups of 32, and its measured
error is reported. Codes are read from the blocks as gguf-py reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from localchat.errors import LocalchatError

GROUP = 32


@dataclass(frozen=True)
class Quantized:
    """An MLX affine triple: packed codes, one scale and bias per group of ``group_size``."""

    weight: np.ndarray  # uint32, (rows, cols * bits / 32)
    scales: np.ndarray  # float32, (rows, cols / group_size)
    biases: np.ndarray
    bits: int
    group_size: int = GROUP
    max_error: float = 0.0  # against the GGUF values; 0 when the mapping is exact


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (rows, cols) of ``bits`` bits as MLX packs them: a little-endian bit stream in uint32."""
    rows = codes.shape[0]
    codes = codes.astype(np.uint8)
    if bits == 8:
        return np.ascontiguousarray(codes).view("<u4").reshape(rows, -1)
    if bits == 4:
        return np.ascontiguousarray(codes[:, 0::2] | (codes[:, 1::2] << 4)).view("<u4").reshape(rows, -1)
    stream = ((codes[..., None].astype(np.uint32) >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    packed = np.packbits(stream.reshape(rows, -1), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4").reshape(rows, -1)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[..., start:start + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """16 bytes → 32 codes: low nibbles first, then high nibbles (Q4_0, Q4_1, Q5_x)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q8_0(blocks):
    d = _f16(blocks, 0)
    codes = (blocks[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return codes, d, -128.0 * d, 8


def _q4_0(blocks):
    d = _f16(blocks, 0)
    return _nibbles_32(blocks[..., 2:18]), d, -8.0 * d, 4


def _q4_1(blocks):
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    return _nibbles_32(blocks[..., 4:20]), d, m, 4


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes → the 5th bit of each of 32 codes (Q5_0, Q5_1)."""
    bits = qh.copy().view("<u4")[..., 0:1] >> np.arange(32, dtype=np.uint32)
    return ((bits & 1) << 4).astype(np.uint8)


def _q5_0(blocks):
    d = _f16(blocks, 0)
    return _nibbles_32(blocks[..., 6:22]) | _high_bits(blocks[..., 2:6]), d, -16.0 * d, 5


def _q5_1(blocks):
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    return _nibbles_32(blocks[..., 8:24]) | _high_bits(blocks[..., 4:8]), d, m, 5


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of a Q4_K/Q5_K super-block (12 bytes), as gguf-py unpacks them."""
    shape = scales.shape[:-1]
    s = scales.reshape(*shape, 3, 4)
    d, m, m_d = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(blocks):
    """256 values a super-block: 8 sub-blocks of 32 (scale d·sc, min dmin·m)."""
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mn = _k_scale_min(blocks[..., 4:16])
    qs = blocks[..., 16:144].reshape(*blocks.shape[:-1], 4, 32)
    codes = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(*blocks.shape[:-1], 8, 32)
    return codes, d[..., None] * sc, -(dmin[..., None] * mn), 4


def _q5_k(blocks):
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mn = _k_scale_min(blocks[..., 4:16])
    qh = blocks[..., 16:48].reshape(*blocks.shape[:-1], 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)
    qs = blocks[..., 48:176].reshape(*blocks.shape[:-1], 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(*blocks.shape[:-1], 8, 32)
    return low | ((qh & 1) << 4), d[..., None] * sc, -(dmin[..., None] * mn), 5


EXACT = {"Q8_0": (_q8_0, 34), "Q4_0": (_q4_0, 18), "Q4_1": (_q4_1, 20), "Q5_0": (_q5_0, 22),
         "Q5_1": (_q5_1, 24), "Q4_K": (_q4_k, 144), "Q5_K": (_q5_k, 176)}
NEAREST = {"Q6_K": 8}  # stored with this many bits, groups of 32, error measured
FLOATS = {"F32", "F16", "BF16"}


def to_mlx(kind: str, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | Quantized:
    """One tensor's raw GGUF data (as gguf-py reads it) in its row-major ``shape``, MLX-ready."""
    if kind in FLOATS:
        return _floats(kind, raw).reshape(shape)
    if len(shape) != 2:
        raise LocalchatError(f"a {kind} tensor of shape {shape} is not a matrix")
    rows, cols = shape
    if kind in EXACT:
        decode, size = EXACT[kind]
        with np.errstate(over="ignore", invalid="ignore"):  # (a damaged scale: counted by ``non_finite``)
            codes, scales, biases, bits = decode(raw.reshape(rows, -1, size))
        codes = codes.reshape(rows, cols)
        return Quantized(weight=pack(codes, bits), scales=scales.reshape(rows, -1).astype(np.float32),
                         biases=biases.reshape(rows, -1).astype(np.float32), bits=bits)
    if kind in NEAREST:
        return _requantized(kind, raw, rows, cols, NEAREST[kind])
    raise LocalchatError(f"tensor type {kind} cannot be imported (supported: "
                         f"{', '.join([*sorted(FLOATS), *EXACT, *NEAREST])})")


def non_finite(value: np.ndarray | Quantized) -> int:
    """How many of a tensor's numbers (its values, or its scales and biases) are inf or NaN: a model
    never holds one, a damaged or hostile file may (an f16 scale of 0x7C00), and the model it gave
    would answer garbage."""
    arrays = (value.scales, value.biases) if isinstance(value, Quantized) else (value,)
    return sum(int(array.size - np.count_nonzero(np.isfinite(array))) for array in arrays)


def _floats(kind: str, raw: np.ndarray) -> np.ndarray:
    if kind == "F32":
        return raw.view(np.float32).astype(np.float32)
    if kind == "F16":
        return raw.view(np.float16).astype(np.float32)
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)  # BF16: exact in float32


def _requantized(kind: str, raw: np.ndarray, rows: int, cols: int, bits: int) -> Quantized:
    """The exact GGUF values, quantized again the MLX way; the largest error is reported."""
    import gguf
    import mlx.core as mx

    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(rows, cols).astype(np.float32)
    w, scales, biases = mx.quantize(mx.array(values), group_size=GROUP, bits=bits)
    back = np.array(mx.dequantize(w, scales, biases, group_size=GROUP, bits=bits))
    return Quantized(weight=np.array(w), scales=np.array(scales), biases=np.array(biases), bits=bits,
                     max_error=float(np.abs(back - values).max()))

