"""Kill-safe training checkpoints: atomic, checksummed, the newest valid one resumed.

A folder of checkpoints, one per save, named by the trainer's step:

    step-000000120.ckpt          one process: the whole state in one file
    step-000000120/              torch.distributed (every rank saves): torch.distributed.checkpoint's
        .metadata, __0_0.distcp    files for the model and optimizer,
        rank-00000.ckpt ...        each rank's own state (RNG, loss scaler, data position),
        MANIFEST.json              the sha256 of every file above, written last

Nothing appears under a final name half-written: a save writes `.tmp-*` in the same folder,
fsyncs it, renames it to its final name (atomic on POSIX file systems) and fsyncs the folder, so
a process killed at any instant leaves either the complete new checkpoint or none. A `.ckpt` file
is b"FP8MPCKPT1\\n", the payload's length (8 bytes, little-endian), its sha256 (32 bytes) and the
payload (torch.save bytes). Loading verifies length and checksum (a folder: its manifest) and, when
the newest checkpoint fails, logs why on the "fp8mp" logger, renames it `<name>.corrupt` and tries
the next older one. After each save only the newest `keep_last` checkpoints are kept, and leftover
`.tmp-*` entries of killed saves are removed.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
from pathlib import Path

import torch

from fp8mp.scaling.config_checks import check_int

__all__ = ["CheckpointFolder", "CorruptCheckpoint"]

logger = logging.getLogger("fp8mp")

MAGIC = b"FP8MPCKPT1\n"
_HEADER = len(MAGIC) + 8 + 32
_NAME = re.compile(r"^step-(\d{9})(\.ckpt)?$")
_MANIFEST = "MANIFEST.json"


class CorruptCheckpoint(Exception):
    """A checkpoint that fails verification (truncated, checksum mismatch, missing files)."""


# ----------------------------------------------------------------------------- files
def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _to_bytes(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def write_file(path: Path, state: dict) -> None:
    """`state` into `path` atomically (temporary file in the same folder, fsync, rename, fsync folder)."""
    payload = _to_bytes(state)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(MAGIC + len(payload).to_bytes(8, "little") + hashlib.sha256(payload).digest())
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_folder(path.parent)


def read_file(path: Path) -> dict:
    """The state `write_file` wrote; CorruptCheckpoint saying what is wrong otherwise."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CorruptCheckpoint(f"unreadable: {error}") from error
    if len(data) < _HEADER or not data.startswith(MAGIC):
        raise CorruptCheckpoint(f"no fp8mp checkpoint header ({len(data)} bytes)")
    length = int.from_bytes(data[len(MAGIC): len(MAGIC) + 8], "little")
    digest, payload = data[len(MAGIC) + 8: _HEADER], data[_HEADER:]
    if len(payload) != length:
        raise CorruptCheckpoint(f"truncated: {len(payload)} of {length} payload bytes")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint("checksum mismatch")
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)


def _remove(entry: Path) -> None:
    if entry.is_dir():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verify_folder(folder: Path) -> None:
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise CorruptCheckpoint(f"no readable {_MANIFEST}: {error}") from error
    for name, expected in manifest.items():
        if not (folder / name).is_file():
            raise CorruptCheckpoint(f"file {name} is missing")
        if _sha256_of(folder / name) != expected:
            raise CorruptCheckpoint(f"checksum mismatch in {name}")


# ----------------------------------------------------------------------------- the folder
def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1


class CheckpointFolder:
    """Saves and finds checkpoints in `path` (created if missing); see the module docstring.

    Under torch.distributed (initialized, more than one rank) every rank must call `save` and
    `load_newest` together: the model and optimizer go through torch.distributed.checkpoint, the
    rest into each rank's own file, and rank 0 renames, prunes and chooses what to resume.
    """

    def __init__(self, path: str | os.PathLike, keep_last: int = 3):
        self.path = Path(path)
        self.keep_last = check_int("CheckpointFolder: argument 'keep_last'", keep_last, 1)
        self.path.mkdir(parents=True, exist_ok=True)

    def steps(self) -> list[int]:
        """Steps of the checkpoints present under final names (not yet verified), newest first."""
        found = [_NAME.match(entry.name) for entry in self.path.iterdir()]
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def _entry(self, step: int, folder: bool) -> Path:
        return self.path / (f"step-{step:09d}" if folder else f"step-{step:09d}.ckpt")

    # ------------------------------------------------------------------- save
    def save(self, step: int, local: dict, sharded: dict | None = None) -> Path:
        """Save checkpoint `step`: `local` is this process's state; `sharded` (torch.distributed only)
        is what torch.distributed.checkpoint saves collectively (model and optimizer state dicts)."""
        if not _distributed():
            path = self._entry(step, folder=False)
            write_file(path, local if sharded is None else {**local, "sharded": sharded})
            self._prune()
            return path
        return self._save_distributed(step, local, sharded or {})

    def _save_distributed(self, step: int, local: dict, sharded: dict) -> Path:
        import torch.distributed.checkpoint as dcp

        dist = torch.distributed
        rank, final = dist.get_rank(), self._entry(step, folder=True)
        tmp = self.path / f".tmp-{final.name}"
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier()
        dcp.save(sharded, checkpoint_id=str(tmp))
        write_file(tmp / f"rank-{rank:05d}.ckpt", local)
        dist.barrier()
        if rank == 0:
            manifest = {entry.name: _sha256_of(entry) for entry in sorted(tmp.iterdir()) if entry.is_file()}
            (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1))
            with open(tmp / _MANIFEST, "rb") as f:
                os.fsync(f.fileno())
            _fsync_folder(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_folder(self.path)
            self._prune()
        dist.barrier()
        return final

    def _prune(self) -> None:
        """Keep the newest `keep_last` checkpoints; remove the `.tmp-*` leftovers of killed saves."""
        for step in self.steps()[self.keep_last:]:
            _remove(self._entry(step, folder=True))
            _remove(self._entry(step, folder=False))
        for entry in self.path.glob(".tmp-*"):
            if not entry.name.endswith(f"-{os.getpid()}"):
                _remove(entry)

    # ------------------------------------------------------------------- load
    def load_newest(self, sharded: dict | None = None) -> tuple[int, dict] | None:
        """(step, this process's state) of the newest checkpoint that verifies, or None when there is none.

        Under torch.distributed `sharded` (state dicts of the right structure, e.g. from
        torch.distributed.checkpoint.state_dict.get_state_dict) is filled in place from it.
        """
        if not _distributed():
            return self._load_local()
        return self._load_distributed(sharded or {})

    def _quarantine(self, entry: Path, reason: str) -> None:
        logger.warning("fp8mp: checkpoint %s is unusable (%s); renamed it %s.corrupt and trying an older one",
                       entry, reason, entry.name)
        target = entry.with_name(entry.name + ".corrupt")
        _remove(target)
        os.replace(entry, target)

    def _load_local(self) -> tuple[int, dict] | None:
        for step in self.steps():
            path = self._entry(step, folder=False)
            try:
                return step, read_file(path)
            except CorruptCheckpoint as error:
                self._quarantine(path, str(error))
        return None

    def _newest_valid_folder(self) -> int | None:
        for step in self.steps():
            folder = self._entry(step, folder=True)
            try:
                _verify_folder(folder)
                return step
            except CorruptCheckpoint as error:
                self._quarantine(folder, str(error))
        return None

    def _load_distributed(self, sharded: dict) -> tuple[int, dict] | None:
        import torch.distributed.checkpoint as dcp

        dist = torch.distributed
        choice = [self._newest_valid_folder() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(choice, src=0)
        if choice[0] is None:
            return None
        folder = self._entry(choice[0], folder=True)
        dcp.load(sharded, checkpoint_id=str(folder))
        return choice[0], read_file(folder / f"rank-{dist.get_rank():05d}.ckpt")
