"""Issue 41, item 1: a checkpoint is loaded only from the bytes that were verified. Single-process DCP (no
process group: DCP saves and loads in this process), small models, no ranks started."""
from __future__ import annotations

import os
import types

import pytest

torch = pytest.importorskip("torch")

from distlab.runtime.restart import checkpoint  # noqa: E402

KEY = checkpoint.family_key(b"test secret")


class Planted:
    """A pickle that creates the file ``marker`` when unpickled: code run by loading."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def planted_shard(root: str, step: int, marker: str) -> bytes:
    """``__0_0.distcp`` of the checkpoint in ``root`` with its entry optim.param_groups.0.lr replaced, in place and
    at the same length, by a pickle that creates ``marker``: what the issue swapped in after verification (torch's
    legacy torch.save format: a plain pickle, run as soon as it is loaded; zeros pad it to the entry's length)."""
    import io
    import pickle
    folder = checkpoint.step_dir(root, step)
    with open(os.path.join(folder, ".metadata"), "rb") as f:
        meta = pickle.load(f)                   # our own file, just written
    (info,) = [v for k, v in meta.storage_data.items() if k.fqn == "optim.param_groups.0.lr"]
    buf = io.BytesIO()
    torch.save(Planted(marker), buf, _use_new_zipfile_serialization=False)
    planted = buf.getvalue()
    assert len(planted) <= info.length
    data = bytearray(open(os.path.join(folder, info.relative_path), "rb").read())
    data[info.offset:info.offset + info.length] = planted.ljust(info.length, b"\0")
    return bytes(data)


def planted_checkpoint(root: str, step: int, marker: str) -> None:
    """A checkpoint with the planted shard, signed with the family key: what someone who has the key could make."""
    model, opt = model_and_optimizer()
    checkpoint.save(root, step, model, opt, KEY)
    evil = planted_shard(root, step, marker)
    with open(shard(root), "wb") as f:
        f.write(evil)
    checkpoint.write_manifest(checkpoint.step_dir(root, step), step, KEY)


@pytest.fixture
def saved(tmp_path):
    model, opt = model_and_optimizer()
    root = str(tmp_path / "ckpt")
    os.makedirs(root)
    checkpoint.save(root, 2, model, opt, KEY)
    os.makedirs(tmp_path / "evil")
    planted_checkpoint(str(tmp_path / "evil"), 2, str(tmp_path / "PWNED-by-checkpoint"))
    return root, model, tmp_path


def shard(root: str) -> str:
    return os.path.join(checkpoint.step_dir(root, 2), "__0_0.distcp")


def test_a_shard_swapped_after_verification_runs_no_code(saved):
    """The issue's attack: latest_good verifies, then __0_0.distcp is swapped for a planted one, then load.
    Before: DCP read the shard again from disk and unpickled the planted entry (the marker was written)."""
    root, _, tmp = saved
    assert checkpoint.latest_good(root, KEY) == (2, [])
    os.replace(shard(str(tmp / "evil")), shard(root))
    model, opt = model_and_optimizer()
    with pytest.raises(checkpoint.CheckpointError, match="__0_0.distcp (has changed|is truncated)"):
        checkpoint.load(root, 2, model, opt, KEY)
    assert not (tmp / "PWNED-by-checkpoint").exists()


def test_a_shard_swapped_after_it_was_read_is_not_read_again(saved, monkeypatch):
    """DCP parses the very bytes that were checked: a swap after the check changes nothing that is loaded."""
    root, original, tmp = saved
    read = checkpoint.read_verified

    def read_then_swap(folder, name, want):
        data = read(folder, name, want)
        if name == "__0_0.distcp":
            os.replace(shard(str(tmp / "evil")), shard(root))
        return data
    monkeypatch.setattr(checkpoint, "read_verified", read_then_swap)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(fresh.parameters(), lr=0.5, momentum=0.9)
    checkpoint.load(root, 2, fresh, opt, KEY)
    assert not (tmp / "PWNED-by-checkpoint").exists()
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), original.state_dict().values()))
    assert opt.param_groups[0]["lr"] == 0.1


def test_a_signed_checkpoint_with_a_planted_entry_runs_no_code(saved):
    """A valid signature is not the only wall: non-tensor entries are read with weights_only=True."""
    _, _, tmp = saved
    model, opt = model_and_optimizer()
    with pytest.raises(checkpoint.CheckpointError,
                       match="param_groups.0.lr is not plain data.*Unsupported global: GLOBAL io.open"):
        checkpoint.load(str(tmp / "evil"), 2, model, opt, KEY)
    assert not (tmp / "PWNED-by-checkpoint").exists()


def test_metadata_is_unpickled_with_an_allow_list(tmp_path):
    import pickle
    marker = tmp_path / "PWNED-by-metadata"
    with pytest.raises(checkpoint.CheckpointError, match="names io.open, which a DCP checkpoint"):
        checkpoint.load_metadata(pickle.dumps(Planted(str(marker))), "x/.metadata")
    assert not marker.exists()


def test_a_file_not_in_the_manifest_is_never_served(saved):
    root, _, _ = saved
    files = checkpoint.manifest(root, 2, KEY)["files"]
    assert set(files) == {".metadata", "__0_0.distcp"}
    with pytest.raises(checkpoint.CheckpointError, match="not in the signed manifest"):
        checkpoint.VerifiedFiles(checkpoint.step_dir(root, 2), files).bytes_of("__1_0.distcp")


def test_the_elastic_dir_must_be_yours_and_not_writable_by_others(tmp_path, capsys):
    """--dir writable by others (chmod o+w) is refused in one line; ownership through folder_problem, with a
    fake stat (the tests run as root, who owns every folder they make)."""
    from distlab.runtime.restart import elastic
    from distlab.sim.files import folder_problem
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert elastic.main(["--dir", str(shared)]) == 2
    err = capsys.readouterr().err
    assert "writable by every user (mode 777)" in err and err.count("\n") == 1
    fake = types.SimpleNamespace(st_uid=1234, st_gid=1234, st_mode=0o40700)
    assert "owned by another user (uid 1234)" in folder_problem(fake, uid=1000, gid=1000)
    assert folder_problem(types.SimpleNamespace(st_uid=1000, st_gid=1000, st_mode=0o40700), 1000, 1000) is None
    assert folder_problem(types.SimpleNamespace(st_uid=0, st_gid=0, st_mode=0o41777), 1000, 1000) is None  # /tmp
    assert "writable by group 50" in folder_problem(types.SimpleNamespace(st_uid=1000, st_gid=50,
                                                                          st_mode=0o40770), 1000, 1000)
