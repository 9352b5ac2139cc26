"""Every file the loop reads from a user is bounded by size before it is read.

`config --file /dev/zero`, `solve --instance /dev/zero` and `telemetry probe --endpoint
/dev/zero` once read until memory ran out (8 GB): a character device or a FIFO has no size
and never ends. So an input must be a regular file (or, for the few readers that take one, a
URL whose body is cut at the limit), no larger than its limit, and a text read never returns
more than the limit even if the file grows while it is read.

It imports nothing of the domain, so every package (the pure solver and forecaster included)
may use it. `InputFileError` is a ValueError: the CLI reports it as one line, exit 2.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import BinaryIO

MB = 1024 * 1024
# A hand-written document: a config, a market instance, a metrics page, a journal.
MAX_TEXT_BYTES = 16 * MB
# A data table (node list, pod list, load or history CSV, telemetry file).
MAX_TABLE_BYTES = 1024 * MB


class InputFileError(ValueError):
    """An input file is missing, not a regular file, too large, or not text; one line."""


def _size(limit: int) -> str:
    return f"{limit // MB} MB" if limit >= MB else f"{limit} bytes"


def checked_file(path: str | Path, what: str, limit: int = MAX_TABLE_BYTES) -> Path:
    """`path` if it is an existing regular file of at most `limit` bytes; InputFileError naming
    `what` and the problem otherwise (a directory, a device such as /dev/zero, a FIFO)."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputFileError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise InputFileError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputFileError(f"{what} {path} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(f"{what} {path} is not a regular file (a device, FIFO or socket)")
    if info.st_size > limit:
        raise InputFileError(f"{what} {path} is larger than the {_size(limit)} limit ({info.st_size} bytes)")
    return path


def read_limited(handle: BinaryIO, limit: int, what: str) -> bytes:
    """At most `limit` bytes of a stream (a file or an HTTP body); InputFileError past that."""
    data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputFileError(f"{what} is larger than the {_size(limit)} limit")
    return data


def read_bytes_bounded(path: str | Path, what: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    path = checked_file(path, what, limit)
    try:
        with path.open("rb") as handle:
            return read_limited(handle, limit, f"{what} {path}")
    except OSError as exc:
        raise InputFileError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None


def read_text_bounded(path: str | Path, what: str, limit: int = MAX_TEXT_BYTES) -> str:
    """A regular file's UTF-8 text, at most `limit` bytes; InputFileError otherwise."""
    data = read_bytes_bounded(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{what} {path} is not UTF-8 text (byte {exc.start})") from None
