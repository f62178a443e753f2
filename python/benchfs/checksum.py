"""Checksums of a file's bytes in chunk-aligned ranges: the xxh3-128 of `[i * chunk_size,
(i + 1) * chunk_size)` for each i, the last range cut at the file's size. The servers compute
them over the bytes they store (`Client.checksum`), one range per chunk on the server that
holds it; `ChunkHasher` computes the same over any stream of bytes, so a source read once
can be compared with what BenchFS stores without reading it back (docs/lifecycle.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xxhash


@dataclass(frozen=True)
class FileChecksum:
    size: int
    chunk_size: int
    chunks: tuple[str, ...]
    """Per range, the xxh3-128 as 32 hex digits (xxhash's hexdigest)."""

    @classmethod
    def from_core(cls, c: dict[str, Any]) -> FileChecksum:
        """From the extension's form: {"size", "chunk_size", "chunks"}."""
        return cls(c["size"], c["chunk_size"], tuple(c["chunks"]))

    def first_difference(self, other: FileChecksum) -> str | None:
        """Where `other` differs from this, in words; None if they are equal."""
        if (self.size, self.chunk_size) != (other.size, other.chunk_size):
            return (
                f"{other.size} bytes in {other.chunk_size}-byte ranges where "
                f"{self.size} in {self.chunk_size}-byte ranges were expected"
            )
        for i, (a, b) in enumerate(zip(self.chunks, other.chunks, strict=True)):
            if a != b:
                start = i * self.chunk_size
                end = min(start + self.chunk_size, self.size)
                return f"bytes {start}-{end} differ"
        return None


class ChunkHasher:
    """Hashes a stream of bytes, given in order in pieces of any size, range by range."""

    def __init__(self, chunk_size: int) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk size {chunk_size} must be positive")
        self.chunk_size = chunk_size
        self.size = 0
        self._done: list[str] = []
        self._hash = xxhash.xxh3_128()
        self._in_range = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            take = min(len(view), self.chunk_size - self._in_range)
            self._hash.update(view[:take])
            self._in_range += take
            self.size += take
            view = view[take:]
            if self._in_range == self.chunk_size:
                self._done.append(self._hash.hexdigest())
                self._hash = xxhash.xxh3_128()
                self._in_range = 0

    def result(self) -> FileChecksum:
        chunks = [*self._done, self._hash.hexdigest()] if self._in_range else self._done
        return FileChecksum(self.size, self.chunk_size, tuple(chunks))
