"""File input and output at the edges of synth.

Input: every file synth reads from a user path goes through :func:`read_input_bytes` (or
:func:`read_input_text`), which reads at most :data:`MAX_INPUT_BYTES` + 1 bytes, so ``/dev/zero``,
``/dev/urandom`` or a huge file end with one clear error instead of exhausting memory or hanging.

Output: atomic, so a reader never sees a half-written file and a failure leaves none behind, except
that a target that exists and is not a regular file (``/dev/null``, a FIFO) is written in place:
renaming over it would replace the device node. :func:`atomic_write_chunks` streams a document given as
pieces (a program of a million steps is never one string in memory) with the same guarantee: the pieces go
to the temporary file as they come, and only a complete file gets the target's name.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path

from synth.errors import SynthError

#: Largest input file synth reads (topologies, programs, tables): far above any real one.
MAX_INPUT_BYTES = 256 * 2**20

_READ_BLOCK = 2**20
#: Streamed output is gathered into writes of about this many bytes.
_WRITE_BLOCK = 2**20
#: How long a FIFO or device may go without giving data before a read of it fails.
INPUT_IDLE_SECONDS = 10


def read_input_bytes(path: str | os.PathLike, what: str = "file", limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a user file, at most ``limit`` of them; devices and FIFOs are read the same way.

    Raises :class:`SynthError` naming the file for a directory, an unreadable file, one larger than
    ``limit``, or a FIFO or device that gives nothing for :data:`INPUT_IDLE_SECONDS` (a FIFO with no
    writer would block ``open`` forever); ``what`` names the kind of file in the message ("topology file", ...).
    """
    source = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading blocks until a writer opens it, possibly never.
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise _input_error(source, f"is a directory, not a {what}") from None
    except OSError as exc:
        raise _input_error(source, f"cannot read {what}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise _input_error(source, f"is a directory, not a {what}")
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise _too_large(source, limit)  # no need to read a file we already know is too big
        parts = _read_capped(fd, source, limit, waits=not stat.S_ISREG(info.st_mode))
    except OSError as exc:
        raise _input_error(source, f"cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if sum(map(len, parts)) > limit:
        raise _too_large(source, limit)
    return b"".join(parts)


def _read_capped(fd: int, source: str, limit: int, waits: bool) -> list[bytes]:
    """Blocks of ``fd`` up to ``limit`` + 1 bytes (one read(limit + 1) would allocate the whole limit up front).

    ``waits``: a FIFO or device, read as data arrives; more than :data:`INPUT_IDLE_SECONDS` without any
    is an error, and end of file counts only once poll reports the writer gone (a FIFO without a writer
    yet also reads as empty).
    """
    parts: list[bytes] = []
    total = 0
    while total <= limit:
        if waits and not _readable(fd):
            raise _input_error(source, f"nothing to read for {INPUT_IDLE_SECONDS} s (a FIFO or device with no "
                                       "writer?)")
        try:
            block = os.read(fd, min(_READ_BLOCK, limit + 1 - total))
        except BlockingIOError:
            continue    # woken without data (a writer came and went): poll again
        if not block:
            break
        parts.append(block)
        total += len(block)
    return parts


def _readable(fd: int) -> bool:
    """Whether ``fd`` has data or its writer's end of file within :data:`INPUT_IDLE_SECONDS`."""
    import select

    if not hasattr(select, "poll"):     # no poll(): read blocking, as before
        os.set_blocking(fd, True)
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(INPUT_IDLE_SECONDS * 1000))


def read_input_text(path: str | os.PathLike, what: str = "file", limit: int = MAX_INPUT_BYTES) -> str:
    """:func:`read_input_bytes` decoded as UTF-8, with one clear error for other bytes."""
    data = read_input_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _input_error(os.fspath(path), f"not UTF-8 text (byte {exc.start}; expected a {what})") from None


def _input_error(source: str, problem: str) -> SynthError:
    return SynthError(f"{source}: {problem}")


def _too_large(source: str, limit: int) -> SynthError:
    return _input_error(source, f"larger than the {limit // 2**20} MiB limit")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring for non-regular targets)."""
    return atomic_write_chunks(path, (data,))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_chunks(path, (text,))


def atomic_write_chunks(path: str | os.PathLike, chunks: Iterable[str | bytes]) -> Path:
    """Write the concatenation of ``chunks`` (``str`` pieces as UTF-8) to ``path`` atomically, as they come.

    The first piece is taken before the file system is touched, so a writer that checks its input before
    its first piece fails without creating the target's directory or a file. Pieces go to an unnamed (or
    hidden) temporary file in blocks of about :data:`_WRITE_BLOCK` bytes; the target gets its name only once
    the last piece is written and synced. An exception from ``chunks`` (or the disk) propagates and leaves
    no file behind and any previous target as it was. A target that exists and is not a regular file
    (``/dev/null``, a FIFO) is written through in place, so there a failure part way leaves what was written.
    """
    pieces = iter(chunks)
    first = next(pieces, b"")
    blocks = _blocks(chain((first,), pieces))
    target = Path(path)
    if _is_special(target):
        # /dev/null, a FIFO, a terminal: write through it; never rename over it.
        with open(target, "wb") as handle:
            for block in blocks:
                handle.write(block)
        return target
    directory = target.parent if str(target.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    if not _write_unnamed(directory, target, blocks):
        _write_named(directory, target, blocks)
    return target


def _blocks(pieces: Iterable[str | bytes]) -> Iterator[bytes]:
    """``pieces`` as bytes, gathered into blocks of at least :data:`_WRITE_BLOCK` bytes (the last may be
    shorter), so that many small pieces cost few system calls."""
    pending: list[bytes] = []
    size = 0
    for piece in pieces:
        data = piece.encode("utf-8") if isinstance(piece, str) else piece
        pending.append(data)
        size += len(data)
        if size >= _WRITE_BLOCK:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def _is_special(target: Path) -> bool:
    """Whether ``target`` exists and is not a regular file (a symlink counts as what it points to)."""
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _finish(fd: int, blocks: Iterable[bytes]) -> None:
    """Write every block to ``fd``, sync it and give it the mode a plain open() would."""
    for data in blocks:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    os.fsync(fd)
    # Temp files are created 0600; runtimes may run as another user.
    os.fchmod(fd, 0o666 & ~_current_umask())


def _write_unnamed(directory: Path, target: Path, blocks: Iterable[bytes]) -> bool:
    """Linux ``O_TMPFILE``: the file has no name until it is complete, so a kill leaves nothing behind.

    Returns False (nothing written) where the platform or file system does not support it.
    """
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return False
    try:
        fd = os.open(directory, flag | os.O_WRONLY, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return False
        raise
    tmp = None
    try:
        _finish(fd, blocks)
        tmp = _free_name(directory, target)
        # linkat(AT_SYMLINK_FOLLOW) gives the open file a name; a dir fd makes os.link use linkat
        # (plain link() would link the /proc symlink itself and fail with EXDEV).
        proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.link(str(fd), tmp, src_dir_fd=proc, follow_symlinks=True)
        finally:
            os.close(proc)
        os.replace(tmp, target)
        tmp = None
    finally:
        os.close(fd)
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
    return True


def _free_name(directory: Path, target: Path) -> str:
    """A temp name next to ``target`` that nothing uses (the link for :func:`os.replace`)."""
    return os.path.join(directory, f".{target.name}.{os.urandom(6).hex()}.tmp")


def _write_named(directory: Path, target: Path, blocks: Iterable[bytes]) -> None:
    """The portable path: a named temp file, renamed over the target once complete."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        try:
            _finish(fd, blocks)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
