"""A GGUF file's metadata and tensor table, read with ``struct``; tensor data memory-mapped.

gguf-py's ``GGUFReader`` builds a numpy view for every value of every field: for SmolLM2's 49,152
tokens and 48,900 merges that is 3.6 s and 160 MB before the first tensor (measured here), more
than the whole import may cost. This reads the same layout (GGUF v2/v3, little-endian) into plain
Python values; gguf-py still names the tensor types and decodes the blocks.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from localchat.errors import LocalchatError

MAGIC = b"GGUF"
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 16
MAX_NESTING = 2  # an array of arrays at most (no file needs more; deeper is a damaged or hostile file)
MAX_ELEMENTS = 1 << 40  # a tensor with more values than this is not one localchat can hold


class GgufFormatError(LocalchatError):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # row-major (GGUF stores the innermost dimension first)
    kind: str  # the GGML type's name: F32, Q4_1, Q4_K, …
    offset: int  # from the start of the file
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


class GgufFile:
    """An open GGUF file: ``metadata``, ``tensors`` and each tensor's raw bytes."""

    def __init__(self, path: Path):
        self.path = path
        with path.open("rb") as f:
            self.metadata, infos, data_start = _read_header(f)
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.tensors = [_tensor(name, dims, kind, data_start + offset) for name, dims, kind, offset in infos]
        for t in self.tensors:
            if t.offset + t.n_bytes > len(self._map):
                raise GgufFormatError(f"{path} is truncated: tensor '{t.name}' ends past the end of the file")

    def raw(self, tensor: TensorInfo) -> np.ndarray:
        """The tensor's bytes, read-only, straight from the mapped file."""
        return np.frombuffer(self._map, dtype=np.uint8, count=tensor.n_bytes, offset=tensor.offset)

    def release(self, tensor: TensorInfo) -> None:
        """Let the kernel drop the pages ``tensor`` was read from: the import touches each once."""
        start = tensor.offset - tensor.offset % mmap.PAGESIZE
        try:
            self._map.madvise(mmap.MADV_DONTNEED, start, tensor.offset + tensor.n_bytes - start)
        except (AttributeError, OSError, ValueError):
            pass

    def close(self) -> None:
        """Unmap the file; while arrays still view it (an error mid-import) the mapping stays until
        they are gone, so closing never replaces the error that got us here."""
        try:
            self._map.close()
        except BufferError:
            pass


def _tensor(name: str, dims: list[int], kind: int, offset: int) -> TensorInfo:
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType(kind)
    except ValueError:
        raise GgufFormatError(f"tensor '{name}' has an unknown type number {kind}") from None
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    elements = 1
    for dim in dims:
        elements *= dim
    if not 0 < elements <= MAX_ELEMENTS:
        raise GgufFormatError(f"tensor '{name}' has an implausible shape {tuple(dims)}")
    if dims and dims[0] % block:
        raise GgufFormatError(f"tensor '{name}': {dims[0]} values a row is not a whole number of {qtype.name} blocks")
    return TensorInfo(name=name, shape=tuple(reversed(dims)), kind=qtype.name, offset=offset,
                      n_bytes=elements // block * size)


def _read_header(f: BinaryIO) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]], int]:
    if f.read(4) != MAGIC:
        raise GgufFormatError("not a GGUF file (it does not start with 'GGUF')")
    version, = _unpack(f, "<I")
    if version not in (2, 3):
        raise GgufFormatError(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_fields = _unpack(f, "<QQ")
    if n_tensors > 1_000_000 or n_fields > 1_000_000:
        raise GgufFormatError("the GGUF header's counts are implausible (a damaged file?)")
    metadata = {}
    for _ in range(n_fields):
        key = _string(f)
        if key in metadata:
            raise GgufFormatError(f"the GGUF header has the key '{key}' twice")
        metadata[key] = _value(f, _unpack(f, "<I")[0])
    infos = []
    for _ in range(n_tensors):
        name = _string(f)
        n_dims, = _unpack(f, "<I")
        if n_dims > 4:
            raise GgufFormatError(f"tensor '{name}' has {n_dims} dimensions")
        dims = list(_unpack(f, f"<{n_dims}Q"))
        kind, offset = _unpack(f, "<IQ")
        infos.append((name, dims, kind, offset))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or not 0 < alignment <= MAX_ALIGNMENT or alignment & (alignment - 1):
        raise GgufFormatError(f"general.alignment {alignment!r} is not a power of two up to {MAX_ALIGNMENT}")
    position = f.tell()
    return metadata, infos, position + (-position % alignment)


def _unpack(f: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GgufFormatError("the GGUF header ends early (a truncated file?)")
    return struct.unpack(fmt, data)


def _string(f: BinaryIO) -> str:
    length, = _unpack(f, "<Q")
    if length > 1 << 30:
        raise GgufFormatError("a string in the GGUF header is implausibly long (a damaged file?)")
    data = f.read(length)
    if len(data) != length:
        raise GgufFormatError("the GGUF header ends early (a truncated file?)")
    return data.decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, depth: int = 0) -> Any:
    if kind in SCALARS:
        return _unpack(f, SCALARS[kind])[0]
    if kind == STRING:
        return _string(f)
    if kind == ARRAY:
        if depth >= MAX_NESTING:
            raise GgufFormatError("the GGUF header nests arrays too deep (a damaged file?)")
        item, count = _unpack(f, "<IQ")
        if count > 1 << 28:
            raise GgufFormatError("an array in the GGUF header is implausibly long (a damaged file?)")
        if item in SCALARS:
            fmt = SCALARS[item]
            return list(_unpack(f, f"<{count}{fmt[1]}")) if count else []
        return [_value(f, item, depth + 1) for _ in range(count)]
    raise GgufFormatError(f"unknown GGUF value type {kind}")
