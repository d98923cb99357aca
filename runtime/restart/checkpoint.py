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
a crafted one runs code. ``load`` reads every file the signed manifest lists once, checks its size and SHA-256
and hands DCP those bytes (``VerifiedReader``: no file is read from disk a second time, so a file swapped after
the check is never parsed); ``.metadata`` is unpickled with an allow-list of DCP's own classes, and non-tensor
entries (``optim.param_groups.0.lr``), which DCP itself reads with ``torch.load(weights_only=False)``
(torch/distributed/checkpoint/default_planner.py ``load_bytes``), go through ``torch.load(weights_only=True)``
(``TensorsOnlyPlanner``), so a valid signature is not the only wall. Tensors DCP reads with
``weights_only=True`` itself (filesystem.py ``read_data``).
The model and optimizer state go through torch.distributed.checkpoint.state_dict (``get_state_dict`` /
``set_state_dict``: keys by parameter name, the optimizer's state created before loading into it).
"""
from __future__ import annotations

import contextlib
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
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint._traverse import set_element

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
MANIFEST = "MANIFEST.json"
FORMAT = "distlab-checkpoint/1"
MAX_MANIFEST = 1 << 20              # bytes: a manifest lists a few files per rank
MAX_FILE = 64 << 30                 # bytes of one checkpoint file, read into memory to be verified once


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
    for name, want in body["files"].items():
        if not (isinstance(want, dict) and isinstance(want.get("bytes"), int) and 0 <= want["bytes"] <= MAX_FILE
                and isinstance(want.get("sha256"), str) and "/" not in name and name not in ("", ".", "..")):
            raise CheckpointError(f"{path}: entry {name!r} is not a file of at most {MAX_FILE} bytes")
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


# What DCP's .metadata may name when unpickled (torch 2.13 pickles these: Metadata and its parts, torch.Size, a
# dtype, a layout, the storage paths); anything else, a ``posix.system`` say, is refused before it is looked up.
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                              "_MEM_FORMAT_ENCODING", "ChunkStorageMetadata",
                                              "BytesStorageMetadata", "MetadataIndex", "StorageMeta"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}


def load_metadata(data: bytes, path: str):
    """Unpickle DCP's .metadata allowing only ``_METADATA_CLASSES`` (and torch's dtypes): CheckpointError
    naming the first other global, which is never imported."""
    import io
    import pickle

    import torch

    class Allowed(pickle.Unpickler):
        def find_class(self, module, name):
            if name in _METADATA_CLASSES.get(module, ()) or (
                    module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                return super().find_class(module, name)
            raise CheckpointError(f"{path} names {module}.{name}, which a DCP checkpoint's metadata never "
                                  "holds; not read")
    try:
        return Allowed(io.BytesIO(data)).load()
    except CheckpointError:
        raise
    except Exception as e:                         # noqa: BLE001 - a malformed pickle: any error is its own
        raise CheckpointError(f"{path} is not DCP metadata ({type(e).__name__})") from None


def read_verified(folder: str, name: str, want: dict) -> bytes:
    """The bytes of ``folder/name``, read once (O_NOFOLLOW, a regular file, at most the signed size), whose size
    and SHA-256 are the signed ones (``want``: the manifest's entry); else CheckpointError."""
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise CheckpointError(f"{path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise CheckpointError(f"{path} is not a regular file")
        data = f.read(want["bytes"] + 1)
    if len(data) != want["bytes"]:
        raise CheckpointError(f"{path} is truncated or grown ({len(data)} bytes, {want['bytes']} were written)")
    if hashlib.sha256(data).hexdigest() != want["sha256"]:
        raise CheckpointError(f"{path} has changed since it was written (SHA-256 differs)")
    return data


class VerifiedFiles(FileSystem):
    """DCP's file access, for reading only, serving each file of the signed manifest from bytes read once and
    verified (``read_verified``): what DCP parses is what was checked, never a second read of the disk."""

    def __init__(self, folder: str, files: dict):
        super().__init__()
        self.folder, self.files, self.cache = folder, files, {}

    def bytes_of(self, name: str) -> bytes:
        if name not in self.files:
            raise CheckpointError(f"{os.path.join(self.folder, name)} is not in the signed manifest; not read")
        if name not in self.cache:
            self.cache[name] = read_verified(self.folder, name, self.files[name])
        return self.cache[name]

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        import io
        if mode != "rb":
            raise CheckpointError(f"{path}: a verified checkpoint is only read")
        yield io.BytesIO(self.bytes_of(os.path.basename(str(path))))


class VerifiedReader(FileSystemReader):
    """DCP's file reader over ``VerifiedFiles``: .metadata is unpickled from its verified bytes with the
    allow-list of ``load_metadata``, every shard is read from its verified bytes."""

    def __init__(self, path: str, files: dict):
        super().__init__(path)
        self.fs = VerifiedFiles(str(path), files)

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta
        path = os.path.join(str(self.path), ".metadata")
        metadata = load_metadata(self.fs.bytes_of(".metadata"), path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorsOnlyPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but a non-tensor entry (``optim.param_groups.0.lr``) is read with
    ``torch.load(weights_only=True)`` (tensors, numbers, strings, lists, dicts), not DCP's
    ``weights_only=False`` (torch/distributed/checkpoint/default_planner.py ``load_bytes``: any pickle)."""

    def load_bytes(self, read_item, value) -> None:
        import pickle

        import torch
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            why = next((ln.strip() for ln in str(e).splitlines() if "Unsupported global" in ln), "not plain data")
            raise CheckpointError(f"entry {read_item.dest_index.fqn} is not plain data; torch.load(weights_only="
                                  f"True) refused it ({why[:200]})") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load(root: str, step: int, model, optimizer, key: bytes) -> float:
    """Load the checkpoint of ``step`` into ``model`` and ``optimizer`` in place (all ranks). Seconds taken.
    Each rank checks the manifest's signature itself; every file is then read once, checked against the signed
    size and SHA-256, and parsed from those bytes (VerifiedReader); non-tensor entries go through
    TensorsOnlyPlanner."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    t0 = time.perf_counter()
    body = manifest(root, step, key)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    from torch.distributed.checkpoint.api import CheckpointException
    try:
        dcp.load(state, storage_reader=VerifiedReader(step_dir(root, step), body["files"]),
                 planner=TensorsOnlyPlanner())
    except CheckpointException as e:             # DCP gathers every rank's exception: name this rank's first
        failure = next(iter(e.failures.values()), None)
        failure = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(failure, CheckpointError):
            raise CheckpointError(str(failure)) from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return time.perf_counter() - t0


def state_bytes(model, optimizer) -> int:
    """Bytes of the model's parameters and buffers plus the optimizer's tensors: what a checkpoint holds."""
    import torch
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for state in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return total
