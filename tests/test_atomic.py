"""vitfast.atomic: exclusive claims across processes, no clobbering, staging cleanup after SIGKILL,
and sidecar/artifact pairs that no interruption of the publishing renames can leave wrong."""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import signal
import stat
import time
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vitfast import atomic
from vitfast.atomic import STAGING, atomic_write, atomic_write_text, claim_output, clean_stale, reserve_output
from vitfast.errors import ArtifactError, OutputError
from vitfast.export.artifacts import read_sidecar, sidecar_path, write_sidecar
from vitfast.registry import get_config

CONFIG = get_config("vit_cifar_patch4_32").to_dict()


def write_pair(path: Path, payload: bytes, force: bool = False) -> None:
    """An artifact with `payload` and its bound sidecar recording the same payload, published atomically."""
    with claim_output(path, force) as out:
        out.tmp.write_bytes(payload)
        write_sidecar(out.tmp, {"config": CONFIG, "precision": "fp32", "payload": payload.decode()})


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if STAGING in p.parts)


def _claim_and_hold(path: str, barrier, tried, rivals: int, results) -> None:
    barrier.wait()
    try:
        with claim_output(path) as out:
            out.tmp.write_text(str(os.getpid()))
            for _ in range(rivals):  # hold the claim until every other process has tried and failed
                assert tried.acquire(timeout=60)
        results.put(("won", os.getpid()))
    except OutputError as exc:
        results.put(("lost", str(exc)))
        tried.release()


def test_concurrent_writers_exactly_one_wins(tmp_path):
    ctx = multiprocessing.get_context("fork")  # the children only touch files: no torch work after fork
    barrier, tried, results = ctx.Barrier(4), ctx.Semaphore(0), ctx.Queue()
    procs = [ctx.Process(target=_claim_and_hold, args=(str(tmp_path / "m.onnx"), barrier, tried, 3, results)) for _ in range(4)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    winners = [pid for kind, pid in outcomes if kind == "won"]
    assert len(winners) == 1, outcomes
    assert all("another vitfast process is writing" in msg for kind, msg in outcomes if kind == "lost")
    assert (tmp_path / "m.onnx").read_text() == str(winners[0])
    assert leftovers(tmp_path) == []


def _write_many(folder: str, worker: int, results) -> None:
    try:
        for i in range(10):
            atomic_write_text(Path(folder) / f"w{worker}-{i}.txt", f"{worker}:{i}")
        results.put("ok")
    except Exception as exc:  # reported to the parent, which asserts on it
        results.put(repr(exc))


def test_concurrent_writers_of_different_files_in_one_folder_all_succeed(tmp_path):
    """The shared staging folder comes and goes as claims start and end: no writer may trip on that."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), w, results)) for w in range(6)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert outcomes == ["ok"] * 6
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"w{w}-{i}.txt" for w in range(6) for i in range(10))


def test_a_file_that_appears_meanwhile_is_never_clobbered(tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(OutputError, match="appeared while vitfast was writing"):
        with claim_output(path) as out:
            out.tmp.write_text("vitfast's")
            path.write_text("someone else's")  # not vitfast: no lock to respect
    assert path.read_text() == "someone else's" and leftovers(tmp_path) == []


def test_reserved_path_refuses_a_second_process_and_reenters_in_this_one(tmp_path):
    path = tmp_path / "m.onnx"
    with reserve_output(path) as scratch:
        assert scratch.parent.name == STAGING
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        child = ctx.Process(target=lambda: results.put(_try_claim(path)))
        child.start()
        assert "another vitfast process is writing" in results.get(timeout=60)
        child.join()
        write_pair(path, b"mine")  # the same process: the reservation is re-entered
    assert read_sidecar(path)["payload"] == "mine" and leftovers(tmp_path) == []


def _try_claim(path: Path) -> str:
    try:
        with claim_output(path) as out:
            out.tmp.write_text("x")
    except OutputError as exc:
        return str(exc)
    return "claimed"


def test_sigkilled_writer_leaves_only_staging_which_the_next_claim_removes(tmp_path):
    ctx = multiprocessing.get_context("fork")
    started = ctx.Event()

    def writer():
        with claim_output(tmp_path / "m.onnx") as out:
            out.tmp.write_bytes(b"x" * 1000)
            (out.scratch_dir / "big.tmp").write_bytes(b"y" * 1000)
            started.set()
            time.sleep(60)

    child = ctx.Process(target=writer)
    child.start()
    assert started.wait(60)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == [STAGING]  # nothing under the output name
    assert leftovers(tmp_path)  # the killed process's staging folder, with its temporaries
    atomic_write_text(tmp_path / "other.txt", "a later run in the same folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt"]


def test_a_killed_refill_of_a_folder_leaves_staging_in_it_which_clean_leftovers_removes_once_its_writer_is_gone(tmp_path):
    """An existing folder (a mount point) is refilled from `FOLDER/.vitfast-staging/`: a writer killed meanwhile leaves it
    there, where a server that loads every subfolder (tritonserver) trips on it. While the writer lives it is kept."""
    folder = tmp_path / "repo"
    (folder / "old").mkdir(parents=True)
    ctx = multiprocessing.get_context("fork")
    started = ctx.Event()

    def writer():
        with claim_output(folder, force=True, directory=True) as out:
            (out.tmp / "new").mkdir(parents=True)
            started.set()
            time.sleep(60)

    child = ctx.Process(target=writer)
    child.start()
    try:
        assert started.wait(60)
        assert sorted(os.listdir(folder)) == [STAGING, "old"]
        assert not atomic.clean_leftovers(folder)  # a live writer's: kept
        assert [p.suffix for p in (folder / STAGING).iterdir()] == [".work"]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    assert sorted(os.listdir(folder)) == [STAGING, "old"]
    assert atomic.clean_leftovers(folder)
    assert sorted(os.listdir(folder)) == ["old"]
    assert not atomic.clean_leftovers(folder) and not atomic.clean_leftovers(tmp_path / "absent")


def test_a_folders_staging_removed_by_a_rivals_clean_up_just_as_a_claim_made_it_is_made_again(tmp_path, monkeypatch):
    """`clean_leftovers(FOLDER)` runs without the folder's claim (a repository check): it may remove the empty staging
    folder a claim made just now, before the claim's work folder is in it. The claim makes it again instead of failing."""
    folder = tmp_path / "repo"
    folder.mkdir()
    real_new_work, raced = atomic._new_work, []

    def new_work_after_a_rival_cleans(staging, name):
        if staging == folder / STAGING and not raced:
            raced.append(staging)
            assert atomic.clean_leftovers(folder)  # the rival: finds it empty, removes it
        return real_new_work(staging, name)

    monkeypatch.setattr(atomic, "_new_work", new_work_after_a_rival_cleans)
    with claim_output(folder, directory=True) as out:
        out.tmp.mkdir()
        (out.tmp / "m.txt").write_text("kept")
    assert raced and (folder / "m.txt").read_text() == "kept" and sorted(os.listdir(folder)) == ["m.txt"] and leftovers(tmp_path) == []


def test_staging_of_a_live_process_is_not_cleaned(tmp_path):
    with claim_output(tmp_path / "m.onnx") as out:
        out.tmp.write_text("x")
        clean_stale(tmp_path / STAGING)  # what another process's claim does
        assert out.tmp.exists() and (out.work / "lock").exists()
    assert (tmp_path / "m.onnx").read_text() == "x"


def test_unwritable_output_locations_are_one_clear_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        write_pair(tmp_path / "afile" / "m.onnx", b"x")
    with pytest.raises(OutputError, match="not a file name"):
        write_pair(tmp_path / "..", b"x")
    (tmp_path / "adir").mkdir()
    with pytest.raises(OutputError, match="exists and is not a file"):
        write_pair(tmp_path / "adir", b"x")
    write_pair(tmp_path / "m.onnx", b"x")
    with pytest.raises(OutputError, match="already exists; pass --force") as refused:
        write_pair(tmp_path / "m.onnx", b"y")
    assert "force=True" not in str(refused.value) and read_sidecar(tmp_path / "m.onnx")["payload"] == "x"


def test_a_filesystem_that_cannot_lock_folders_still_writes(tmp_path, monkeypatch):
    """NFS emulates flock with fcntl locks, which refuse a folder (EBADF): writes must still work, and a
    dead writer's name lock waits for the next claim of its own name instead of any claim's clean-up."""
    real_flock = fcntl.flock

    def flock_refusing_folders(fd, op):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_refusing_folders)
    (tmp_path / STAGING).mkdir()
    (tmp_path / STAGING / "dead.onnx.lock").touch()  # left by a writer killed mid-claim
    atomic_write_text(tmp_path / "m.txt", "kept")
    assert (tmp_path / "m.txt").read_text() == "kept" and leftovers(tmp_path) == [STAGING, f"{STAGING}/dead.onnx.lock"]
    atomic_write_text(tmp_path / "dead.onnx", "its own name's next claim")
    assert leftovers(tmp_path) == []


def test_a_file_where_the_staging_folder_goes_is_named(tmp_path):
    (tmp_path / STAGING).write_text("not vitfast's")
    with pytest.raises(OutputError, match=f"{STAGING} is a file.*remove the file or choose another output folder"):
        atomic_write_text(tmp_path / "m.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [STAGING]


def test_disk_full_while_publishing_leaves_nothing(tmp_path, monkeypatch):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.Claim, "publish", full)
    with pytest.raises(OutputError, match="the disk is full"):
        write_pair(tmp_path / "m.onnx", b"x")
    assert list(tmp_path.iterdir()) == []


RENAMES = ("replace", "link", "unlink", "rename")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fail_at=st.integers(0, 12), old=st.booleans(), payload=st.binary(min_size=1, max_size=64).map(bytes.hex))
def test_no_interruption_of_the_renames_leaves_a_wrong_pair(tmp_path_factory, fail_at, old, payload):
    """Stop publishing at the n-th rename/link/unlink (what SIGKILL does there): whatever is left
    under the output name is either refused on load or a matching pair, old or new."""
    folder = tmp_path_factory.mktemp("pair")
    path = folder / "m.onnx"
    if old:
        write_pair(path, b"old")
    calls = {"n": 0}

    def failing(name):
        def op(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] > fail_at:
                raise KeyboardInterrupt  # not an OSError: nothing converts it, like a kill
            return getattr(os, name)(*args, **kwargs)

        return op

    fake_os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    for name in RENAMES:
        setattr(fake_os, name, failing(name))
    real = atomic.os
    atomic.os = fake_os
    try:
        write_pair(path, payload.encode(), force=True)
    except KeyboardInterrupt:
        pass
    finally:
        atomic.os = real
    if path.exists() or sidecar_path(path).exists():
        try:
            meta = read_sidecar(path)
        except ArtifactError:
            return  # refused: an interrupted pair is never trusted
        assert meta["payload"] == path.read_bytes().decode()
        assert meta["payload"] in ("old", payload)


def test_sidecar_records_and_checks_its_artifact(tmp_path):
    path = tmp_path / "m.onnx"
    write_pair(path, b"first")
    meta = json.loads(sidecar_path(path).read_text())
    assert meta["files"][0] | {"sha256": None} == {"role": "artifact", "name": "m.onnx", "size": 5, "sha256": None}
    os.rename(path, tmp_path / "n.onnx")  # a renamed pair still checks out
    os.rename(sidecar_path(path), sidecar_path(tmp_path / "n.onnx"))
    assert read_sidecar(tmp_path / "n.onnx")["payload"] == "first"
    os.rename(tmp_path / "n.onnx", path)
    os.rename(sidecar_path(tmp_path / "n.onnx"), sidecar_path(path))
    path.write_bytes(b"fIrst")  # same size, other bytes
    with pytest.raises(ArtifactError, match="is not the file its sidecar"):
        read_sidecar(path)
    path.write_bytes(b"second")
    with pytest.raises(ArtifactError, match="is not the file its sidecar"):
        read_sidecar(path)
    del meta["files"]
    sidecar_path(path).write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="does not record which file"):
        read_sidecar(path)


def test_files_published_beside_the_output_are_guarded_like_it(tmp_path):
    """A sidecar or `.data` file already beside the output needs --force, and --force replaces only vitfast's: the
    output's own sidecar, and the `.data` weights it records; another tool's file of that name stays, and nothing is written."""
    path = tmp_path / "m.onnx"

    def write(force: bool, data: bytes | None = None) -> None:
        with claim_output(path, force) as out:
            out.tmp.write_bytes(b"new")
            if data is not None:
                Path(str(out.tmp) + ".data").write_bytes(data)
            write_sidecar(out.tmp, {"config": CONFIG, "precision": "fp32"})

    notes = sidecar_path(path)
    notes.write_text('{"my": "notes"}')
    for force, message in [(False, "m.onnx.json already exists; pass --force"), (True, "m.onnx.json is not a vitfast sidecar, so --force will not")]:
        with pytest.raises(OutputError, match=message):
            write(force)
        with pytest.raises(OutputError, match=message):
            atomic.check_output_free(path, force, beside=(".json",))  # the same, up front
        assert notes.read_text() == '{"my": "notes"}' and not path.exists() and leftovers(tmp_path) == []
    notes.unlink()
    write(False)
    data = tmp_path / "m.onnx.data"
    data.write_bytes(b"theirs")  # beside a vitfast pair whose sidecar does not record it
    with pytest.raises(OutputError, match="m.onnx.data is not a file m.onnx.json records as vitfast's"):
        write(True, b"weights")
    assert data.read_bytes() == b"theirs" and read_sidecar(path)["files"][0]["size"] == 3
    data.unlink()
    write(True, b"weights")
    write(True, b"weights 2")  # recorded by the sidecar of the output it replaces: vitfast's own
    assert data.read_bytes() == b"weights 2" and read_sidecar(path)["files"][1]["name"] == "m.onnx.data"


def test_a_live_work_folder_is_never_taken_for_a_dead_one(tmp_path, monkeypatch):
    """The worst moment for a rival's clean-up: it runs in another process just as this one locks its
    new work folder. It must see that folder as live (its lock not yet there, or held), not delete it."""
    real_flock, rivals = fcntl.flock, []

    def flock_after_a_rival_cleans(fd, op):
        if ".work/" in os.readlink(f"/proc/self/fd/{fd}") and not rivals:
            rivals.append(os.fork())
            if rivals[0] == 0:  # the rival process: a clean-up of the shared staging folder, then gone
                atomic.clean_stale(tmp_path / STAGING)
                os._exit(0)
            os.waitpid(rivals[0], 0)
        return real_flock(fd, op)

    monkeypatch.setattr(atomic.fcntl, "flock", flock_after_a_rival_cleans)
    atomic_write_text(tmp_path / "m.txt", "kept")
    assert rivals and (tmp_path / "m.txt").read_text() == "kept" and leftovers(tmp_path) == []


def test_a_staging_folder_removed_just_as_it_is_found_is_made_again(tmp_path, monkeypatch):
    """Another claim's staging folder is there when this one's mkdir runs, and that claim, ending,
    removes it before this one looks again: the writer makes it afresh instead of failing "File exists"."""
    real_mkdir, raced = os.mkdir, []

    def mkdir_as_a_rival_leaves(path, mode=0o777, **kw):
        if Path(path).name == STAGING and not raced:
            raced.append(path)
            real_mkdir(path)  # the rival's claim made it
            try:
                return real_mkdir(path, mode, **kw)  # FileExistsError
            finally:
                os.rmdir(path)  # the rival's last claim removes it before this one checks
        return real_mkdir(path, mode, **kw)

    monkeypatch.setattr(os, "mkdir", mkdir_as_a_rival_leaves)
    atomic_write_text(tmp_path / "m.txt", "kept")
    assert raced and (tmp_path / "m.txt").read_text() == "kept" and leftovers(tmp_path) == []


def test_a_rival_clean_up_is_never_taken_for_a_live_writer(tmp_path, monkeypatch):
    """Another process's clean-up tests every name lock by taking it. If it does so between this claim
    creating its name lock and locking it, the claim must not fail "another vitfast process is writing"."""
    real_flock, parent, rivals = fcntl.flock, os.getpid(), []

    def is_name_lock(fd):
        return os.readlink(f"/proc/self/fd/{fd}").endswith("m.txt.lock")

    def flock_while_a_rival_tests_it(fd, op):
        if os.getpid() != parent or rivals or not is_name_lock(fd):
            return real_flock(fd, op)
        told, go = os.pipe(), os.pipe()
        rivals.append(os.fork())
        if rivals[0] == 0:  # the rival: cleans the shared staging folder, holding any lock it takes until told
            def rival_flock(fd2, op2):
                real_flock(fd2, op2)
                if is_name_lock(fd2):
                    os.write(told[1], b"h")
                    os.read(go[0], 1)

            fcntl.flock = rival_flock
            atomic.clean_stale(tmp_path / STAGING)
            os.write(told[1], b"x")
            os._exit(0)
        os.read(told[0], 1)  # the rival holds this claim's name lock now, or finished without taking it
        try:
            return real_flock(fd, op)
        finally:
            os.write(go[1], b"g")
            os.waitpid(rivals[0], 0)

    monkeypatch.setattr(fcntl, "flock", flock_while_a_rival_tests_it)
    atomic_write_text(tmp_path / "m.txt", "kept")
    assert rivals and (tmp_path / "m.txt").read_text() == "kept" and leftovers(tmp_path) == []


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_outputs_get_the_permissions_open_gives_under_the_umask(tmp_path, umask):
    """safetensors writes its files 0600, so a checkpoint was unreadable to a Triton server running as another user;
    published files now get 0666 less the umask, as any file open() makes."""
    import torch
    from safetensors.torch import save_file

    old = os.umask(umask)
    try:
        out = atomic_write(tmp_path / "w.safetensors", lambda tmp: save_file({"a": torch.zeros(2)}, tmp))
    finally:
        os.umask(old)
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~umask
