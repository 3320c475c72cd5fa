"""A write-only stream that sends its bytes in fixed-size chunks in the background: what S3's multipart
upload (:class:`twophase.sinks._s3.MultipartStream`) and Azure's staged blocks
(:class:`twophase.sinks._azure.BlockBlobStream`) have in common. Nothing a chunk sends is visible to a
reader until the object is committed (CompleteMultipartUpload, Put Block List), which is not this class's.
"""

from __future__ import annotations

import contextlib
import io
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class ChunkedUploadStream(io.RawIOBase):
    """Bytes are buffered and handed to :meth:`_send` as chunk ``0, 1, ...`` whenever ``chunk_size`` is
    reached, on ``pool``, with at most two chunks in flight (the writer waits for the oldest: bounded
    memory); :meth:`finish_chunks` sends the rest as the last chunk (an empty one if nothing was written)
    and returns what each :meth:`_send` returned, in order."""

    def __init__(self, chunk_size: int, pool: ThreadPoolExecutor) -> None:
        super().__init__()
        self.chunk_size, self.pool = chunk_size, pool
        self._buf = bytearray()
        self._pos = 0
        self._futures: list[Future] = []

    def _send(self, index: int, chunk: bytes) -> Any:
        """Send chunk ``index`` (runs on the pool); what it returns is the chunk's entry in :meth:`finish_chunks`."""
        raise NotImplementedError

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def write(self, b: Any) -> int:
        data = memoryview(b).cast("B")
        self._buf += data
        self._pos += len(data)
        while len(self._buf) >= self.chunk_size:
            chunk = bytes(self._buf[:self.chunk_size])
            del self._buf[:self.chunk_size]
            self._submit(chunk)
        return len(data)

    def _submit(self, chunk: bytes) -> None:
        self._futures.append(self.pool.submit(self._send, len(self._futures), chunk))
        pending = [f for f in self._futures if not f.done()]
        if len(pending) > 2:  # bound memory: wait for the oldest chunk in flight
            pending[0].result()

    def finish_chunks(self) -> list[Any]:
        """Send what is buffered as the last chunk; wait for every chunk; return their results in order."""
        if self._buf or not self._futures:
            self._submit(bytes(self._buf))
            self._buf = bytearray()
        return [f.result() for f in self._futures]

    def wait_in_flight(self) -> None:
        """Wait for the chunks in flight, ignoring their failures (before an abort)."""
        for f in self._futures:
            with contextlib.suppress(Exception):  # the abort that follows cleans up whatever was sent
                f.result()
