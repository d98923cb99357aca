"""Sharded checkpoints with torch.distributed.checkpoint (DCP): ``DIR/step_000004/`` per saved step, each with a
signed manifest; only checkpoints of this run family are ever read.

    saved = save(root, 4, model, opt, key)          # every rank; rank 0 signs MANIFEST.json last
    step, skipped = latest_good(root, key)          # rank 0: the newest checkpoint that verifies, and why the others do not
    load(root, step, model, opt, key)               # every rank

``save`` is a collective: every rank writes its own file (``__R_0.distcp``) in parallel; tensors every rank
holds alike (a replicated model) are written once, by one rank each (DCP's default planner deduplicates them,
spreading the bytes over the ranks); rank 0 writes ``.metadata`` at the end of DCP's save, then, last and
atomically, ``MANIFEST.json``: every file's size and SHA-256, signed with HMAC-SHA256 under ``key`` (derived from
the run's secret, runtime/ranks/secret.py: the run family is the runs that share it). A checkpoint whose manifest is
missing, unsigned, signed with another key, or whose files are missing, truncated or changed is not read at all:
``latest_good`` names the file and falls back to the previous good checkpoint. That matters because DCP reads
``.metadata`` with ``pickle.load`` (torch/distributed/checkpoint/filesystem.py, FileSystemReader.read_metadata):
a crafted one runs code. ``load`` reads it through ``VerifiedReader``, which unpickles only bytes whose SHA-256
is the signed one; the shards are read with ``torch.load(weights_only=True)`` by DCP itself.
The model and optimizer state go through torch.distributed.checkpoint.state_dict (``get_state_dict`` /
``set_state_dict``: keys by parameter name, the optimizer's state created before loading into it).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
import time

# Imported with this module, so before any process group exists (runtime/restart/elastic.py imports this module first):
# torch.distributed.checkpoint imports torch/distributed/nn/functional.py and fsdp/sharded_grad_scaler.py, whose
# default arguments (``group=group.WORLD``) capture the default group when imported after init_process_group.
# That reference kept ProcessGroupGloo, its worker threads and its socket loop alive past
# destroy_process_group until the interpreter's exit, where a rank could abort (SIGABRT, "terminate called
# without an active exception") at the end of a finished elastic run (tests/test_elastic.py).
import torch.distributed.checkpoint.state_dict  # noqa: F401  (imports DCP and FSDP's scaler too)
from torch.distributed.checkpoint import FileSystemReader

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
MANIFEST = "MANIFEST.json"
FORMAT = "distlab-checkpoint/1"
MAX_MANIFEST = 1 << 20              # bytes: a manifest lists a few files per rank
MAX_METADATA = 256 << 20            # bytes of DCP's .metadata read into memory


class CheckpointError(RuntimeError):
    """A checkpoint that must not be read: which file, and why."""


def family_key(secret: bytes) -> bytes:
    """The manifests' HMAC key: the run's secret, for this one purpose."""
    return hashlib.sha256(b"distlab-checkpoint/1 " + secret).digest()


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:06d}")


def steps(root: str) -> list[int]:
    """The steps with a checkpoint folder in ``root``, newest first (verified or not)."""
    found = []
    if os.path.isdir(root):
        for name in os.listdir(root):
            m = _STEP_DIR.match(name)
            if m:
                found.append(int(m.group(1)))
    return sorted(found, reverse=True)


def _sha256(path: str, limit: int | None = None) -> tuple[int, str]:
    """(bytes, hex SHA-256) of a regular file, opened without following a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise CheckpointError(f"{path} is not a regular file")
        h, n = hashlib.sha256(), 0
        while chunk := f.read(1 << 20):
            n += len(chunk)
            if limit is not None and n > limit:
                raise CheckpointError(f"{path} is larger than {limit} bytes")
            h.update(chunk)
    return n, h.hexdigest()


def _sign(key: bytes, body: dict) -> str:
    return hmac.new(key, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def write_manifest(path: str, step: int, key: bytes) -> None:
    """Rank 0, after every rank's files and .metadata are written: sizes, checksums, signature; atomically."""
    from distlab.sim.io import write_atomic
    files = {}
    for name in sorted(os.listdir(path)):
        if name != MANIFEST and not name.startswith("."):
            size, digest = _sha256(os.path.join(path, name))
            files[name] = {"bytes": size, "sha256": digest}
    if ".metadata" in os.listdir(path):
        size, digest = _sha256(os.path.join(path, ".metadata"))
        files[".metadata"] = {"bytes": size, "sha256": digest}
    body = {"format": FORMAT, "step": step, "files": files}
    write_atomic(os.path.join(path, MANIFEST), json.dumps({"manifest": body, "hmac": _sign(key, body)}, indent=1))


def manifest(root: str, step: int, key: bytes) -> dict:
    """The verified manifest of ``step``'s checkpoint (its signature only; ``verify`` checks the files too)."""
    path = os.path.join(step_dir(root, step), MANIFEST)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_MANIFEST + 1)
    except OSError as e:
        raise CheckpointError(f"{path}: {e.strerror} (a save cut short, or not written by distlab)") from None
    if len(data) > MAX_MANIFEST:
        raise CheckpointError(f"{path} is larger than {MAX_MANIFEST} bytes")
    try:
        d = json.loads(data)
        body, mac = d["manifest"], d["hmac"]
        ok = isinstance(mac, str) and hmac.compare_digest(mac, _sign(key, body))
    except (ValueError, KeyError, TypeError, RecursionError):
        raise CheckpointError(f"{path} is not a distlab checkpoint manifest") from None
    if not ok:
        raise CheckpointError(f"{path} is not signed with this run family's secret (another run's checkpoint, "
                              f"or edited)")
    if body.get("format") != FORMAT or body.get("step") != step or not isinstance(body.get("files"), dict) \
            or ".metadata" not in body["files"]:
        raise CheckpointError(f"{path} does not describe step {step}")
    return body


def verify(root: str, step: int, key: bytes) -> dict:
    """The manifest of ``step`` once every file it lists has its signed size and checksum; else CheckpointError
    naming the first file that does not."""
    body = manifest(root, step, key)
    folder = step_dir(root, step)
    for name, want in body["files"].items():
        path = os.path.join(folder, name)
        try:
            size, digest = _sha256(path)
        except OSError as e:
            raise CheckpointError(f"{path}: {e.strerror}") from None
        if size != want["bytes"]:
            raise CheckpointError(f"{path} is truncated or grown ({size} bytes, {want['bytes']} were written)")
        if digest != want["sha256"]:
            raise CheckpointError(f"{path} has changed since it was written (SHA-256 differs)")
    return body


def latest_good(root: str, key: bytes) -> tuple[int | None, list[str]]:
    """(the newest step whose checkpoint verifies, or None; the reasons the newer ones were skipped)."""
    skipped = []
    for step in steps(root):
        try:
            verify(root, step, key)
            return step, skipped
        except CheckpointError as e:
            skipped.append(str(e))
    return None, skipped


def save(root: str, step: int, model, optimizer, key: bytes, extra: dict | None = None) -> dict:
    """Write the checkpoint of ``step`` (all ranks call it). Returns {time_s, bytes (this rank's files)}."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    t0 = time.perf_counter()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    path = step_dir(root, step)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0 and os.path.lexists(path):
        if os.path.islink(path) or not os.path.isdir(path):
            raise CheckpointError(f"{path} exists and is not a folder distlab made; it is left as it is")
        for name in os.listdir(path):                  # an older attempt's: its manifest goes first
            os.unlink(os.path.join(path, name))
    dcp.save({"model": model_sd, "optim": optim_sd, **(extra or {})}, checkpoint_id=path)
    if rank == 0:
        write_manifest(path, step, key)               # last: a folder without it is never read
    elapsed = time.perf_counter() - t0
    mine = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.startswith(f"__{rank}_"))
    return {"step": step, "time_s": elapsed, "bytes": mine}


class VerifiedReader(FileSystemReader):
    """DCP's file reader, but ``.metadata`` (a pickle) is unpickled only if its SHA-256 is the signed one."""

    def __init__(self, path: str, metadata_sha256: str):
        super().__init__(path)
        self.metadata_sha256 = metadata_sha256

    def read_metadata(self, *args, **kwargs):
        import pickle

        from torch.distributed.checkpoint.metadata import StorageMeta
        path = os.path.join(str(self.path), ".metadata")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_METADATA + 1)
        if len(data) > MAX_METADATA or hashlib.sha256(data).hexdigest() != self.metadata_sha256:
            raise CheckpointError(f"{path} changed after it was verified; not read")
        metadata = pickle.loads(data)                 # noqa: S301 - these exact bytes are the signed ones
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def load(root: str, step: int, model, optimizer, key: bytes) -> float:
    """Load the checkpoint of ``step`` into ``model`` and ``optimizer`` in place (all ranks). Seconds taken.
    Each rank checks the manifest's signature itself and reads .metadata only through VerifiedReader."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    t0 = time.perf_counter()
    body = manifest(root, step, key)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=VerifiedReader(step_dir(root, step), body["files"][".metadata"]["sha256"]))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return time.perf_counter() - t0


def state_bytes(model, optimizer) -> int:
    """Bytes of the model's parameters and buffers plus the optimizer's tensors: what a checkpoint holds."""
    import torch
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for state in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return total
