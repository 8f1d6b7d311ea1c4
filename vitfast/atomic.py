"""Atomic, exclusive outputs: the one way vitfast writes a file or folder.

    with claim_output(path, force=False) as out:
        write(out.tmp)                    # the output (and any sidecar / `.data` file beside it)
        scratch = out.scratch_dir         # temporaries that are never published
    # success: renamed into place, sidecar last; any error: nothing at `path`, temporaries gone

- Exclusive: a claim holds an `flock` on `PARENT/.vitfast-staging/NAME.lock` from start to finish,
  so of two processes writing one path exactly one proceeds; the other fails at once. Without
  `force` the final rename refuses to replace anything (a hard link, which fails if the name exists).
- Staging: everything is written under `PARENT/.vitfast-staging/` (same filesystem, so renames are
  atomic). A process killed with SIGKILL leaves its folder there; the next claim in that folder
  removes every staging folder whose owner is gone (its lock is free), and the empty staging folder.
  Testing a name lock takes it, so a claim creates and locks its own under a shared flock on the staging
  folder and the clean-up tests under an exclusive one: a rival's test is never taken for a live writer.
- Existing folders: a folder output may be an existing empty folder (or, with `force`, the caller's old output). It is
  kept and refilled entry by entry, staged in `FOLDER/.vitfast-staging/`: it may be a mount point (a Docker or
  Kubernetes volume), which cannot be renamed or replaced, and only staging on its own filesystem makes each rename
  atomic. Each entry appears whole; the set of entries is swapped one rename at a time, not at once. Only the claim's
  own writing and publishing happen there (a pipeline's long work stays in the parent's staging folder), but a run killed
  meanwhile leaves `FOLDER/.vitfast-staging/`, which a server that takes every subfolder for a model (tritonserver)
  refuses: `clean_leftovers(FOLDER)` removes it once no live process uses it (the next claim of the folder does too).
- Pairs: files beside the output in `out.tmp`'s folder are published first, the sidecar last, and each is guarded as
  the output is (`check_beside`: an existing one needs `force`, and then must be vitfast's, never another tool's); and
  an old sidecar is removed before its artifact is replaced; the sidecar records each file's size
  and sha256 (`vitfast.export.artifacts`), so any interruption leaves either a valid pair or a pair
  that loading refuses.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from .errors import ArtifactError, OutputError

STAGING = ".vitfast-staging"
SIDECAR_SUFFIX = ".json"
_held: dict[tuple[int, Path], int] = {}  # (pid, lock file) this process holds -> claim depth (nested claims share it);
# keyed by pid so that a forked child does not believe it holds its parent's locks
_held_guard = threading.Lock()


def check_output_free(path: str | os.PathLike, force: bool, *, directory: bool = False, beside: tuple[str, ...] = ()) -> Path:
    """`path` if it may be written: absent, an empty folder (`directory`), or (with `force`) an existing output of the same kind.
    `beside`: suffixes of files that will be published beside it (`.json` for a sidecar), checked as `Claim.publish` does."""
    path = Path(path)
    if str(path) in ("", ".", "..") or path.name in ("", ".", ".."):
        raise OutputError(f"{str(path)!r} is not a file name; give an output path such as out/model.onnx")
    if path.exists() and path.is_dir() != directory:
        want = "a folder" if directory else "a file"
        raise OutputError(f"{path} exists and is not {want}; choose another output path")
    if path.exists() and not force and not (directory and is_empty_folder(path)):
        raise OutputError(f"{path} already exists; pass --force to overwrite it, or choose another output path")
    _check_parent(path.parent)
    check_beside(path, [path.name + suffix for suffix in beside], force)
    return path


def check_beside(path: Path, names: list[str], force: bool) -> None:
    """Files of these `names` beside `path` (its sidecar, `.data` weights) are guarded as `path` is: one that exists needs
    `force`, and even then is replaced only if it is vitfast's: `path`'s sidecar, or a file that sidecar records."""
    there = [path.parent / name for name in names if (path.parent / name).exists() or (path.parent / name).is_symlink()]
    if there and not force:
        raise OutputError(f"{there[0]} already exists; pass --force to overwrite it, or choose another output path")
    side = path.parent / (path.name + SIDECAR_SUFFIX)
    old = _old_sidecar(path) if there else None
    # a file's sidecar records it (under the name it was written as: a renamed pair keeps it); a repository's says its kind
    ours = bool(_recorded(old, "artifact")) or (old or {}).get("kind") == "triton-repository"
    recorded = {r.get("name") for r in _recorded(old, "external-data")}
    for file in there:
        if file.is_symlink() or not (ours if file == side else ours and file.name in recorded):
            whose = "a vitfast sidecar" if file == side else f"a file {side.name} records as vitfast's"
            raise OutputError(f"{file} is not {whose}, so --force will not replace it; move it away or choose another output path")


def _old_sidecar(path: Path) -> dict | None:
    """The JSON object in `path`'s sidecar; None where there is none, or it is no JSON object (not one vitfast wrote)."""
    try:
        old = json.loads(Path(str(path) + SIDECAR_SUFFIX).read_text())
    except (OSError, ValueError):
        return None
    return old if isinstance(old, dict) else None


def _recorded(sidecar: dict | None, role: str) -> list[dict]:
    """The `files` records of `sidecar` (`vitfast.export.artifacts`) with this role ("artifact", "external-data")."""
    files = sidecar.get("files") if sidecar else None
    return [r for r in files if isinstance(r, dict) and r.get("role") == role] if isinstance(files, list) else []


def is_empty_folder(path: Path) -> bool:
    """A real folder (not a link) holding nothing, or only vitfast's staging folder."""
    return path.is_dir() and not path.is_symlink() and set(os.listdir(path)) <= {STAGING}


def _default_file_mode() -> int:
    """The permissions `open()` gives a new file here: 0o666 less the process's umask (read by setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _check_parent(parent: Path) -> None:
    for p in (parent, *parent.parents):
        if p.exists():
            if not p.is_dir():
                raise OutputError(f"cannot write under {parent}: {p} is a file, not a folder; choose another output path")
            if not os.access(p, os.W_OK | os.X_OK):
                raise OutputError(f"cannot write under {parent}: {p} is not writable; choose another output path")
            return


class Claim:
    """A claimed output: `tmp` is where to write it, `scratch_dir` holds unpublished temporaries. `inside`: a work
    folder inside the existing folder `path`, which is refilled (see the module docstring); `work` is beside `path`."""

    def __init__(self, path: Path, force: bool, work: Path, inside: Path | None = None):
        self.path, self.force, self.outside, self.inside = path, force, work, inside
        work = self.work = inside or work
        (work / "out").mkdir()
        self.scratch_dir = work / "scratch"
        self.scratch_dir.mkdir()
        self.tmp = work / "out" / path.name

    def publish(self) -> None:
        """Rename what was written into place: the old sidecar goes first, then companions
        (`.data` weights), then the output (exclusively unless `force`), then the old output's companions that the new
        one does not replace (`_stale_companions`), then the new sidecar."""
        staged = self.work / "out"
        sidecar = staged / (self.path.name + SIDECAR_SUFFIX)
        if not self.tmp.exists():
            raise ArtifactError(f"nothing was written for {self.path}")  # a bug in the writer, not user input
        check_beside(self.path, sorted(item.name for item in staged.iterdir() if item != self.tmp), self.force)
        mode = _default_file_mode()  # once: reading the umask sets it, process-wide
        for item in staged.iterdir():  # some writers (safetensors) make their files 0600: unreadable to a server's user
            if item.is_file() and not item.is_symlink():
                os.chmod(item, os.stat(item).st_mode & 0o7777 | mode)
        stale: list[Path] = []
        if self.force and not self.tmp.is_dir():  # a folder keeps its sidecar: it marks the folder as vitfast's
            stale = self._stale_companions(staged)  # read before the old sidecar goes
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(self.path) + SIDECAR_SUFFIX)  # never an old sidecar beside a new artifact
        for item in sorted(staged.iterdir()):
            if item not in (self.tmp, sidecar):
                os.replace(item, self.path.parent / item.name)
        if self.inside:
            _refill(self.tmp, self.path, trash=self.work / "replaced")
        else:
            _place(self.tmp, self.path, exclusive=not self.force, trash=self.work / "replaced")
        for old in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(old)
        if sidecar.exists():
            if self.inside:  # staged on the folder's filesystem; the parent, where it goes, may be another
                sidecar = Path(shutil.copyfile(sidecar, self.outside / sidecar.name))
            os.replace(sidecar, self.path.parent / sidecar.name)

    def _stale_companions(self, staged: Path) -> list[Path]:
        """The old output's companions (`PATH.data` weights) that the new output does not bring: an fp32 graph over 2 GiB
        re-exported as fp16, inline, left its `.data` behind, which a Triton repository then copied. Only files the
        old sidecar records as its output's external data, still of the recorded size: never a file of someone else's."""
        stale = []
        for record in _recorded(_old_sidecar(self.path), "external-data"):  # none without a sidecar vitfast wrote
            name = record.get("name")
            old = self.path.parent / name if isinstance(name, str) and name == Path(name).name else None
            if old and not (staged / name).exists() and old.is_file() and not old.is_symlink() and old.stat().st_size == record.get("size"):
                stale.append(old)
        return stale


def _refill(src: Path, dst: Path, *, trash: Path) -> None:
    """Replace the entries of the folder `dst` by those of `src`, one rename each; `dst` itself stays (a mount point
    cannot be renamed). Both on `dst`'s filesystem; the old entries go with the staging folder."""
    trash.mkdir()
    for name in sorted(os.listdir(dst)):
        if name != STAGING:
            os.replace(dst / name, trash / name)
    for item in sorted(src.iterdir()):
        os.rename(item, dst / item.name)


def _place(src: Path, dst: Path, *, exclusive: bool, trash: Path) -> None:
    """Rename `src` to `dst`; `exclusive`: fail if `dst` exists (even if it appeared just now)."""
    taken = OutputError(f"{dst} appeared while vitfast was writing it; nothing was replaced")
    if src.is_dir():
        if dst.exists() or dst.is_symlink():
            if exclusive:
                raise taken
            os.replace(dst, trash)  # the old folder goes with the staging folder
        os.rename(src, dst)
    elif not exclusive:
        os.replace(src, dst)
    else:
        try:
            os.link(src, dst)  # fails if dst exists: whatever raced us is never clobbered
        except FileExistsError:
            raise taken from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
            if dst.exists():
                raise taken from None
            os.replace(src, dst)  # a filesystem without hard links: checked, then renamed
        else:
            os.unlink(src)


@contextlib.contextmanager
def reserve_output(path: str | os.PathLike, force: bool = False, *, directory: bool = False) -> Iterator[Path]:
    """Hold `path` for this process (a second process fails at once) without writing it yet;
    yields a scratch folder in the staging folder. `claim_output` of the same path inside it
    re-enters the reservation, so a long pipeline fails fast and keeps its temporaries beside the output."""
    path = check_output_free(path, force, directory=directory)
    with contextlib.ExitStack() as stack:
        with output_errors(path):
            staging = Path(os.path.abspath(path.parent)) / STAGING
            _make_staging(staging)
            stack.callback(_remove_if_empty, staging)
            clean_stale(staging)
            stack.enter_context(_name_lock(staging / f"{path.name}.lock", path))
            check_output_free(path, force, directory=directory)  # again, now that nobody else can claim it
            work = _new_work(staging, path.name)
            stack.callback(_remove_work, work)
        with output_errors(path, only=_FULL):  # the caller fills the staging folder, on the output's disk
            yield work


@contextlib.contextmanager
def claim_output(path: str | os.PathLike, force: bool = False, *, directory: bool = False) -> Iterator[Claim]:
    """Claim `path` exclusively, yield a `Claim`, publish on success; clean up on every exit. An existing folder
    (`directory`) is refilled in place, staged inside it (see the module docstring)."""
    with reserve_output(path, force, directory=directory) as work, contextlib.ExitStack() as stack:
        inside = stack.enter_context(_work_in(Path(path) / STAGING, Path(path))) if directory and Path(path).is_dir() else None
        claim = Claim(Path(path), force, work, inside)
        yield claim
        with output_errors(claim.path):
            claim.publish()


@contextlib.contextmanager
def _work_in(staging: Path, path: Path) -> Iterator[Path]:
    """A work folder of this process in `staging`, removed on exit (with `staging` once empty); the caller holds `path`'s lock."""
    with output_errors(path):
        _make_staging(staging)
        clean_stale(staging)
        while True:
            try:
                work = _new_work(staging, path.name)
                break
            except FileNotFoundError:  # emptied and removed just now by another process's `clean_leftovers(path)`
                _make_staging(staging)
    try:
        yield work
    finally:
        _remove_work(work)
        _remove_if_empty(staging)


def clean_leftovers(folder: str | os.PathLike) -> bool:
    """Remove `FOLDER/.vitfast-staging/` where a run killed while refilling the existing folder left it (its work folders'
    locks are free); a live writer's work folder, and with it the staging folder, is kept. True if it was removed."""
    staging = Path(folder) / STAGING
    if staging.is_symlink() or not staging.is_dir():
        return False
    clean_stale(staging)
    _remove_if_empty(staging)
    return not staging.exists()


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], *, force: bool = True) -> Path:
    """Write one file through `write(tmp_path)` and rename it into place (`force`: replace an old one)."""
    with claim_output(path, force) as out:
        write(out.tmp)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str, *, force: bool = True) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text), force=force)


@contextlib.contextmanager
def temporaries_in(folder: Path) -> Iterator[None]:
    """Point Python's `tempfile` default at `folder` meanwhile, so libraries that make their own
    temporaries (ONNX Runtime's quantizer writes 100s of MB) make them in a staging folder, which a
    later run cleans if this process is killed. Process-wide: for the CLI's single-threaded work."""
    previous = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = previous


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@contextlib.contextmanager
def output_errors(path: Path, only: tuple[int, ...] | None = None) -> Iterator[None]:
    """OS errors while writing `path` (full disk, permissions, a file where a folder should be)
    become one `OutputError` line naming the path; `only`: just these errnos."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, OutputError) or (only is not None and exc.errno not in only):
            raise
        reason = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded", errno.EFBIG: "file too large",
                  errno.EACCES: "permission denied", errno.EPERM: "permission denied", errno.EROFS: "read-only filesystem",
                  errno.ENOTDIR: "a parent is a file, not a folder"}.get(exc.errno, exc.strerror or str(exc))  # fmt: skip
        raise OutputError(f"cannot write {path}: {reason}; free space or choose another output path") from exc


def clean_stale(staging: Path) -> None:
    """Remove staging folders and name locks left by processes that no longer run."""
    try:
        entries = list(staging.iterdir())
    except (FileNotFoundError, NotADirectoryError):  # removed by another process's last claim meanwhile
        return
    for entry in entries:
        if entry.suffix == ".work" and entry.is_dir() and _is_stale(entry / "lock"):
            shutil.rmtree(entry, ignore_errors=True)
    # testing a name lock means locking it, which a claim creating that lock right now would take
    # for a live rival: so only while no claim is between creating and locking its name lock.
    # Busy, gone, or a filesystem that cannot lock a folder: dead name locks wait for a later claim
    with contextlib.suppress(OSError):
        with _staging_guard(staging, exclusive=True) as dir_fd:
            for name in os.listdir(dir_fd):
                if name.endswith(".lock") and (os.getpid(), staging / name) not in _held:
                    with contextlib.suppress(OSError):
                        _try_remove_lock(name, dir_fd)


# ---------------------------------------------------------------------------- locks


def _new_work(staging: Path, name: str) -> Path:
    """A fresh folder in `staging` whose `lock` this process holds until `_remove_work` (or death)."""
    work = Path(tempfile.mkdtemp(prefix=f"{name[:64]}.", suffix=".work", dir=staging))
    # locked before it appears under its name: another process's clean_stale that found `lock`
    # created but not yet locked would take this live folder for a dead one and delete it
    fd = os.open(work / "lock.new", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(work / "lock.new", work / "lock")
    _work_fds[work] = fd
    return work


_work_fds: dict[Path, int] = {}  # staging folders of this process -> their locked fd


def _is_stale(lock: Path) -> bool:
    """True if no process holds `lock` (its owner was killed), or it was never created."""
    if lock.parent in _work_fds:
        return False
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:  # killed between mkdtemp and locking, or being created right now
        with contextlib.suppress(OSError):
            return time.time() - lock.parent.stat().st_mtime > 60
        return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _remove_work(work: Path) -> None:
    fd = _work_fds.pop(work, None)
    shutil.rmtree(work, ignore_errors=True)
    if fd is not None:
        os.close(fd)


def _make_staging(staging: Path) -> None:
    """Create `staging` unless it is there. Not `mkdir(exist_ok=True)`: that re-raises "File exists"
    when another process's last claim removes the folder between the failed mkdir and its is_dir check."""
    for _ in range(100):  # each retry means another process removed it just now; a file in the way fails every time
        try:
            staging.mkdir(parents=True)
            return
        except FileExistsError:
            if staging.is_dir():
                return
    raise OutputError(f"cannot write into {staging.parent}: {staging} is a file, and vitfast stages its outputs in a "
                      f"folder of that name; remove the file or choose another output folder")


def _remove_if_empty(staging: Path) -> None:
    with contextlib.suppress(OSError):
        staging.rmdir()  # fails while another claim uses it: the last one out removes it


def _try_remove_lock(name: str, dir_fd: int) -> None:
    fd = os.open(name, os.O_RDWR | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino == os.stat(name, dir_fd=dir_fd).st_ino:
            os.unlink(name, dir_fd=dir_fd)  # unlinked while locked: a waiter on the old inode re-checks and retries
    except (BlockingIOError, FileNotFoundError):
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _staging_guard(staging: Path, *, exclusive: bool) -> Iterator[int]:
    """An flock on the staging folder itself, yielding its fd: shared (waiting) while a claim creates and
    locks its name lock, exclusive (failing at once with BlockingIOError) while a clean-up tests them.
    Everything done under it goes through the fd, so a folder removed and made again is never mixed up."""
    dir_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(dir_fd, (fcntl.LOCK_EX | fcntl.LOCK_NB) if exclusive else fcntl.LOCK_SH)
        except OSError as exc:
            # NFS emulates flock with fcntl locks, which refuse a read-only fd (EBADF): no clean-up can
            # take the exclusive guard there, so none tests name locks and a claim needs no guard
            if exclusive or isinstance(exc, BlockingIOError):
                raise
        yield dir_fd
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def _name_lock(lock: Path, path: Path) -> Iterator[None]:
    """Hold `lock` exclusively (re-entrant within this process); fail at once if another holds it."""
    key = (os.getpid(), lock)
    with _held_guard:
        if key in _held:
            _held[key] += 1
            fd = None
        else:
            fd = _acquire(lock, path)
            _held[key] = 1
    try:
        yield
    finally:
        with _held_guard:
            _held[key] -= 1
            if _held[key] == 0:
                del _held[key]
                with contextlib.suppress(OSError):
                    os.unlink(lock)
                if fd is not None:
                    os.close(fd)


def _acquire(lock: Path, path: Path) -> int:
    while True:
        try:
            with _staging_guard(lock.parent, exclusive=False) as dir_fd:
                fd = os.open(lock.name, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # under the guard: only a claim can hold it
                except BlockingIOError:
                    os.close(fd)
                    raise OutputError(f"another vitfast process is writing {path} right now; wait for it or choose another output path") from None
                with contextlib.suppress(FileNotFoundError):
                    if os.fstat(fd).st_ino == os.stat(lock.name, dir_fd=dir_fd).st_ino:
                        return fd
                os.close(fd)  # the file was removed by its previous holder after we opened it: try again
        except FileNotFoundError:  # another process just removed the empty staging folder: make it again
            _make_staging(lock.parent)
