"""Checkpoint layout of the training simulator (Pivot lab TEST DOUBLE).

One directory per saved step, ``<checkpoint-dir>/step_<step, 9 digits>/``
(``step_000005400``: zero-padded, so names sort like steps), written in place,
in this order:

1. ``model.safetensors`` -- a valid safetensors file (one small F32 tensor,
   8 KiB of data), written in chunks: with a slow checkpoint it grows visibly
   (a pause of at most about 0.1 s between chunks, like a save that streams);
2. ``optimizer.pt`` -- 16 KiB of opaque bytes;
3. ``trainer_state.json`` -- ``{"global_step": N, "train_minutes": M, ...}``;
4. ``COMPLETE`` -- the completion marker, written LAST: every other file is
   complete and fsynced before it appears, and it appears atomically (written
   to a temporary name, fsynced, renamed). It holds JSON:
   ``{"step": N, "files": {name: {"bytes": B, "sha256": H}}}``.

What a consumer can rely on: a directory is a usable checkpoint if and only if
its ``COMPLETE`` exists. A directory without it is a save in progress, or the
debris of a save that was interrupted (a killed trainer leaves it behind
forever). ``*.tmp`` names inside are never final files.

With ``marker=False`` (the trainer's ``--no-marker``) step 4 is left out, as by
trainers that write no marker at all. The trainer itself then counts a
directory as complete when ``trainer_state.json`` (written last) parses with its
``global_step``; a consumer has only the files' sizes and times to go by.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import random
import re
import struct
import time
from array import array
from collections.abc import Callable
from pathlib import Path

MARKER = "COMPLETE"
DIR_PATTERN = re.compile(r"^step_(\d{9})$")
MODEL_FLOATS = 2048  # 8 KiB of F32
OPTIMIZER_BYTES = 16 * 1024
# Each file is written in at least this many chunks, with a pause after each; a slow save gets more of them, so that
# no pause is much longer than MAX_PAUSE_S. A real trainer's save streams its bytes: a watcher that polls every 0.5 s
# (Pivot's stop_training) sees it grow at every poll, not only at one poll in three.
CHUNKS_PER_FILE = 8
MAX_PAUSE_S = 0.1


def directory_name(step: int) -> str:
    return f"step_{step:09d}"


def is_complete(path: Path, marker: bool = True) -> bool:
    """With a marker: the marker exists. Without: trainer_state.json, written last, names the step."""
    if marker:
        return (path / MARKER).is_file()
    return "global_step" in read_trainer_state(path)


def complete_checkpoints(root: Path, marker: bool = True) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = DIR_PATTERN.match(entry.name)
        if match and entry.is_dir() and is_complete(entry, marker):
            found.append((int(match.group(1)), entry))
    return sorted(found)


def newest_complete(root: Path, marker: bool = True) -> tuple[int, Path] | None:
    found = complete_checkpoints(root, marker)
    return found[-1] if found else None


def read_trainer_state(path: Path) -> dict:
    try:
        return json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return {}


def safetensors_bytes(step: int) -> bytes:
    """A real safetensors file: u64 header length, JSON header, tensor data."""
    generator = random.Random(step)
    data = array("f", (generator.gauss(0.0, 0.02) for _unused in range(MODEL_FLOATS))).tobytes()
    header = {
        "__metadata__": {"format": "pt", "global_step": str(step)},
        "draft.lm_head.weight": {"dtype": "F32", "shape": [32, MODEL_FLOATS // 32], "data_offsets": [0, len(data)]},
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return struct.pack("<Q", len(encoded)) + encoded + data


def optimizer_bytes(step: int) -> bytes:
    return random.Random(-step - 1).randbytes(OPTIMIZER_BYTES)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _chunks(payload: bytes, count: int) -> list[bytes]:
    size = max(1, -(-len(payload) // count))
    return [payload[offset : offset + size] for offset in range(0, len(payload), size)]


class DiskRoom:
    """What is left on the checkpoint disk for this save (None: plenty); a write beyond it fails as a full disk does."""

    def __init__(self, room_bytes: int | None) -> None:
        self.left = room_bytes

    def take(self, path: Path, size: int) -> None:
        if self.left is None:
            return
        if size > self.left:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.left -= size


def _write_in_chunks(path: Path, chunks: list[bytes], pause: Callable[[], None], room: DiskRoom) -> None:
    with open(path, "wb") as handle:
        for chunk in chunks:
            room.take(path, len(chunk))
            handle.write(chunk)
            handle.flush()
            pause()
        os.fsync(handle.fileno())


def write_checkpoint(root: Path, step: int, seconds: float, trainer_state: dict, *, marker: bool = True,
                     room_bytes: int | None = None) -> Path:
    """Save step ``step`` under ``root``, spreading the work over ``seconds``; the marker last unless ``marker`` is
    False. With ``room_bytes``, the disk fills after that many bytes of this save: OSError ENOSPC, the save cut
    short (no marker)."""
    room = DiskRoom(room_bytes)
    target = root / directory_name(step)
    target.mkdir(parents=True, exist_ok=True)
    (target / MARKER).unlink(missing_ok=True)
    (target / "trainer_state.json").unlink(missing_ok=True)
    state = {"global_step": step, **trainer_state}
    files = {
        "model.safetensors": safetensors_bytes(step),
        "optimizer.pt": optimizer_bytes(step),
        "trainer_state.json": (json.dumps(state, indent=2) + "\n").encode(),
    }
    count = max(CHUNKS_PER_FILE, math.ceil(seconds / (MAX_PAUSE_S * len(files))))
    chunks = {name: _chunks(payload, count) for name, payload in files.items()}
    pause_seconds = seconds / sum(len(parts) for parts in chunks.values())

    def pause() -> None:
        if pause_seconds > 0:
            time.sleep(pause_seconds)

    for name, parts in chunks.items():
        _write_in_chunks(target / name, parts, pause, room)
    if not marker:
        _fsync_directory(target)
        _fsync_directory(root)
        return target
    content = {
        "step": step,
        "files": {
            name: {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
            for name, payload in files.items()
        },
    }
    temporary = target / f"{MARKER}.tmp"
    with open(temporary, "w") as handle:
        handle.write(json.dumps(content) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target / MARKER)
    _fsync_directory(target)
    _fsync_directory(root)
    return target
