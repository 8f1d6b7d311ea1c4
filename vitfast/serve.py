"""`vitfast serve ARTIFACT`: any artifact `load_engine` accepts, behind NVIDIA Triton Inference Server.

PyTriton (`pip install 'vitfast[serve]'`) starts a real `tritonserver` (HTTP and gRPC with the
KServe v2 protocol, Prometheus metrics) and binds two models to this process:

    <name>        input `images` FP32 [B, C, H, W], already normalised
    <name>_uint8  input `images` UINT8 [B, H, W, C], any H and W, preprocessed here (`vitfast.preprocess`)

Both answer `logits` FP32 [B, classes], `topk_indices` INT64 [B, k] and `topk_scores` FP32 [B, k]
(best first; scored as transformers' pipeline scores the model: softmax probabilities, a sigmoid per class for a
multi-label classifier or a single output, the logits for regression; `--scores` to choose), and `topk_labels` BYTES
[B, k] (UTF-8 class names) when the model has labels (HF id2label, timm label_names, or `--labels FILE`). Triton's
dynamic batcher groups requests up to the engine's maximum batch. The repository `vitfast export --format triton-repo`
writes has the same two model names, input `images` and output `logits`, but no `topk_*` outputs (Triton's `class_count`
classification on `logits` instead, with labels), so a client that asks for `logits` alone works with both.

Bad requests get an error response of one line each, and the server goes on serving:
- Triton checks dtype, shape, batch size and byte count against the model config before any
  vitfast code runs, in its own words, e.g. "inference request batch-size must be <= 8 for 'vit'".
  An empty batch (B = 0) is caught there too, as "input byte size mismatch for input 'images' for
  model 'vit'. Expected 12288, got 0" (the bytes of one image expected, none sent): Triton offers
  no hook before that check, so vitfast cannot word it differently.
- `serve_guard.py` then checks each request on its own inside Triton's python backend: images
  with no pixels (H or W = 0), NaN/infinite float inputs, and for a dynamic_img_size model float
  images that are not whole patches, are refused with the expected shape (HTTP 400 / gRPC
  INVALID_ARGUMENT), and the requests batched with them are answered as usual.
- NaN or infinite float inputs are refused rather than passed through: the logits would be NaN
  and the top-k classes arbitrary, which a client could mistake for an answer.
- Garbage on the wire gets Triton's protocol errors: HTTP 500 "failed to parse the request JSON
  buffer: ..." (Triton's status for a body it cannot parse), gRPC INTERNAL "Unable to parse
  request"; bytes that are not HTTP/2 at all make the gRPC server close that one connection.

The command line is `vitfast.cli.serve`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from vitfast.export.triton_repo import check_model_name, check_native_size

from .describe import output_meaning
from .errors import BackendUnavailable, InputError, VitfastError, first_line
from .pytriton_adapter import rewrite_model_files
from .runtime import Engine, load_engine
from .scores import SCORES, default_scores, top_classes

DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
DEFAULT_MAX_BATCH = 32  # for artifacts without a batch profile (checkpoints)
DEFAULT_QUEUE_DELAY_US = 100
DEFAULT_TOP_K = 5
EXIT_TIMEOUT_S = 10  # how long tritonserver waits for in-flight requests on shutdown
INSTALL_HINT = "pip install 'vitfast[serve]' (nvidia-pytriton: Linux x86_64 or aarch64 with glibc >= 2.35)"


class ServeError(VitfastError, RuntimeError):
    """The server could not start or stopped unexpectedly; the message says why."""


def require_pytriton() -> None:
    try:
        import pytriton.triton  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(f"serving needs PyTriton ({exc}): {INSTALL_HINT}") from None


# ---------------------------------------------------------------------------- inference


class Predictor:
    """PyTriton inference callable: a list of requests -> a list of responses, in the same order.

    Requests whose images have the same shape run as one engine batch (the dynamic batcher only
    groups same-shape requests, so normally the whole list); each request gets its own rows back.
    The engine is shared by both models and called under a lock: TensorRT execution contexts are
    not thread-safe. Preprocessing happens outside the lock. With `k=0` (no classifier over pooled features)
    the responses hold the logits alone.
    """

    def __init__(self, engine, k: int, lock: threading.Lock, labels: tuple[str, ...] | None = None, scores: str | None = None):
        self.engine = engine
        self.k = k
        self.scores = scores or default_scores(engine.config.num_classes, engine.config.problem_type)[0]
        self.lock = lock
        self.labels = np.array([label.encode() for label in labels], dtype=np.bytes_) if labels else None

    def __call__(self, requests: list) -> list[dict[str, np.ndarray]]:
        images = [request["images"] for request in requests]
        if any(len(x) == 0 for x in images):  # Triton and serve_guard refuse batch 0 first; kept for direct callers
            raise InputError("empty batch: send at least one image, shape [B>=1, ...]")
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, x in enumerate(images):
            groups[(x.dtype.str, x.shape[1:])].append(i)
        responses: list[dict[str, np.ndarray]] = [{} for _ in requests]
        for members in groups.values():
            logits = self.logits(np.concatenate([images[i] for i in members]))
            start = 0
            for i in members:
                rows = logits[start : start + len(images[i])]
                responses[i] = {"logits": rows}
                if self.k:
                    indices, scores = top_classes(rows, self.k, self.scores)
                    responses[i] |= {"topk_indices": indices, "topk_scores": scores}
                    if self.labels is not None:
                        responses[i]["topk_labels"] = self.labels[indices]
                start += len(images[i])
        return responses

    def logits(self, images: np.ndarray) -> np.ndarray:
        """float32 [B, C, H, W] or uint8 [B, H, W, C] -> float32 logits [B, classes] ([B, tokens, ...] unpooled)."""
        profile = self.engine.batch
        pad = profile[0] - len(images) if profile and len(images) < profile[0] else 0
        if pad:  # an engine whose profile starts above 1: fill with copies, drop their rows after
            images = np.concatenate([images, np.repeat(images[:1], pad, axis=0)])
        x = self.engine.prepare(images)  # preprocessing for uint8; shape checks for both
        with self.lock:
            logits = self.engine(x).cpu().numpy()
        return np.ascontiguousarray(logits[: len(logits) - pad], dtype=np.float32)


# ---------------------------------------------------------------------------- server


@contextlib.contextmanager
def interpreter_library_path() -> Iterator[None]:
    """Put this interpreter's own libpython first on the library path of the server started inside.

    Triton's python-backend stub links `libpython3.X.so` by name. Without this, the dynamic loader
    can pick another build of the same minor version (e.g. the system's 3.11.2 under a pyenv 3.11.7),
    whose C structures differ from the standard library the stub then imports; PyTriton's proxy dies
    with "'_thread.RLock' object has no attribute '_recursion_count'". The server process copies
    this process's environment when it starts, so the change is only needed while it starts.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    shared = sysconfig.get_config_var("Py_ENABLE_SHARED")
    previous = os.environ.get("LD_LIBRARY_PATH")
    if shared and libdir:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, previous) if p)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = previous


def check_port_free(host: str, port: int, what: str) -> None:
    """Fail fast with the fix, instead of a server that dies while PyTriton waits minutes for it."""
    flag = "--port" if what == "http" else f"--{what}-port"
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror as exc:  # the host, not the port, is the problem
            raise ServeError(f"cannot bind to host {host!r} ({exc.strerror}); pass --host with an address of this machine, "
                             "e.g. 127.0.0.1 or 0.0.0.0") from None  # fmt: skip
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ServeError(f"{host} is not an address of this machine; pass --host 127.0.0.1 or 0.0.0.0") from None
            raise ServeError(f"cannot use {what} port {port} on {host} ({exc.strerror}); pass another {flag}") from None


class Server:
    """A running Triton server with this process's engine bound as `<name>` and `<name>_uint8`.

    Use as a context manager, or call `stop()`; both are safe to repeat. Stopping shuts the
    `tritonserver` process (and its python-backend stubs) down and removes the workspace.
    """

    def __init__(self, triton, engine, *, name: str, host: str, ports: dict[str, int], max_batch: int, log_dir: Path):
        self.triton = triton
        self.engine = engine
        self.name = name
        self.uint8_name = f"{name}_uint8"
        self.max_batch = max_batch
        self.http_url = f"http://{host}:{ports['http']}"
        self.grpc_url = f"{host}:{ports['grpc']}"
        self.metrics_url = f"http://{host}:{ports['metrics']}/metrics"
        self.log_dir = log_dir

    def is_alive(self) -> bool:
        return self.triton.is_alive()

    def log_tail(self) -> str:
        return _log_tail(self.log_dir)

    def stop(self) -> None:
        self.triton.stop()
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *_) -> None:
        self.stop()


def start(
    artifact,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORTS["http"],
    grpc_port: int = DEFAULT_PORTS["grpc"],
    metrics_port: int = DEFAULT_PORTS["metrics"],
    max_batch_size: int | None = None,
    max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    top_k: int = DEFAULT_TOP_K,
    name: str = "vit",
    labels: list[str] | tuple[str, ...] | None = None,
    scores: str | None = None,
    verbose: bool = False,
    allow_nonfinite: bool = False,
    backend: str = "auto",
) -> Server:
    """Load `artifact` (a path, or an `Engine`), start Triton and bind both models; returns when they are ready.
    `labels` (one per class) replace the artifact's own class names in `topk_labels`; `scores` ("softmax", "sigmoid" or
    "logits") replaces the artifact's own rule for `topk_scores` (`vitfast.scores.default_scores`)."""
    require_pytriton()
    check_model_name(name)
    engine = artifact if isinstance(artifact, Engine) else load_engine(artifact, backend=backend)
    if not engine.config.classifies and (labels is not None or scores is not None):  # they name and score top-k classes
        raise InputError(f"{engine.path or engine!r}: its output is {output_meaning(engine.config)}, not one set of class scores "
                         "per image, so serving returns it as `logits` without topk_*; drop --labels / --scores")  # fmt: skip
    labels = tuple(labels) if labels is not None else engine.config.labels
    if labels is not None and len(labels) != engine.config.num_classes:
        raise InputError(f"{len(labels)} labels for a model with {engine.config.num_classes} classes; give one name per class")
    check_native_size(engine.image_sizes, engine.config.img_hw, engine.path or repr(engine), f"the {name}_uint8 model resizes every image to")
    engine.allow_nonfinite = allow_nonfinite or engine.allow_nonfinite
    max_batch = _max_batch(engine, max_batch_size)
    if top_k < 1 or max_queue_delay_us < 0:
        raise InputError("--top-k must be >= 1 and --max-queue-delay-us >= 0")
    if scores is not None and scores not in SCORES:
        raise InputError(f"--scores must be one of {', '.join(SCORES)}, got {scores!r}")
    ports = {"http": port, "grpc": grpc_port, "metrics": metrics_port}
    if len(set(ports.values())) != 3:
        raise ServeError(f"the HTTP, gRPC and metrics ports must differ, got {ports}")
    for what, number in ports.items():
        check_port_free(host, number, what)
    if getattr(engine, "optimized", False):  # vitfast's kernels: compiled and tuned (or captured) for every batch size now
        started = time.monotonic()
        sizes = engine.warm_up(max_batch)
        print(f"vitfast: warmed {engine!r} up for batches of 1..{max_batch} ({len(sizes)} sizes"
              f"{', CUDA graphs captured' if engine.graphed is not None else ''}) in {time.monotonic() - started:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    log_dir = Path(tempfile.mkdtemp(prefix="vitfast-serve-"))
    triton = _triton(host, ports, log_dir, verbose)
    try:
        _bind(triton, engine, name, max_batch, max_queue_delay_us, top_k, labels, scores)
        with interpreter_library_path():
            triton.run()
        server = Server(triton, engine, name=name, host=host, ports=ports, max_batch=max_batch, log_dir=log_dir)
    except Exception as exc:
        tail = _log_tail(log_dir)
        triton.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
        raise ServeError(f"Triton did not start: {first_line(exc)}"
                         + (f"; server log: {tail}" if tail else "")) from exc  # fmt: skip
    if not server.is_alive():
        tail = server.log_tail()
        server.stop()
        raise ServeError(f"Triton stopped right after starting; server log: {tail}")
    return server


def _log_tail(log_dir: Path, lines: int = 3) -> str:
    """The last lines of the server log, joined into one line for an error message."""
    log = log_dir / "tritonserver.log"
    return " | ".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def _max_batch(engine, requested: int | None) -> int:
    profile_max = engine.batch[2] if engine.batch else None
    max_batch = requested if requested is not None else profile_max or DEFAULT_MAX_BATCH
    if max_batch < 1:
        raise InputError(f"--max-batch must be >= 1, got {max_batch}")
    if profile_max and max_batch > profile_max:
        raise InputError(f"--max-batch {max_batch} exceeds this artifact's batch profile maximum {profile_max}")
    return max_batch


def _triton(host: str, ports: dict[str, int], log_dir: Path, verbose: bool):
    from pytriton.triton import Triton, TritonConfig

    config = TritonConfig(
        http_address=host, http_port=ports["http"], grpc_address=host, grpc_port=ports["grpc"],
        metrics_address=host, metrics_port=ports["metrics"], allow_metrics=True, allow_cpu_metrics=True,
        allow_gpu_metrics=torch.cuda.is_available(),  # without a GPU, NVML setup only prints an error
        exit_timeout_secs=EXIT_TIMEOUT_S, log_verbose=1 if verbose else 0,
        log_file=None if verbose else log_dir / "tritonserver.log",  # verbose: the server's log on stdout
    )  # fmt: skip
    if not verbose:
        logging.getLogger("pytriton").setLevel(logging.ERROR)  # its INFO/WARNING chatter repeats the server log
    return Triton(config=config)


def _bind(triton, engine, name: str, max_batch: int, delay_us: int, k: int, labels: tuple[str, ...] | None, scores: str | None = None) -> None:
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    cfg = engine.config
    h, w = cfg.img_hw
    k = min(k, cfg.num_classes) if cfg.classifies else 0  # top-k of classes, not of features, tokens or an image embedding
    outputs = [Tensor(name="logits", dtype=np.float32, shape=tuple(-1 if d is None else d for d in cfg.output_shape))]
    if k:
        outputs += [Tensor(name="topk_indices", dtype=np.int64, shape=(k,)), Tensor(name="topk_scores", dtype=np.float32, shape=(k,))]
    if k and labels:
        outputs.append(Tensor(name="topk_labels", dtype=np.bytes_, shape=(k,)))
    model_config = ModelConfig(max_batch_size=max_batch, batcher=DynamicBatcher(max_queue_delay_microseconds=delay_us))
    lock = threading.Lock()
    inputs = {
        name: Tensor(name="images", dtype=np.float32, shape=(cfg.in_chans, *((-1, -1) if cfg.dynamic_img_size else (h, w)))),
        f"{name}_uint8": Tensor(name="images", dtype=np.uint8, shape=(-1, -1, cfg.in_chans)),
    }
    for model, tensor in inputs.items():
        triton.bind(model_name=model, infer_func=Predictor(engine, k, lock, labels, scores), inputs=[tensor], outputs=outputs, config=model_config)
    _install_guard(triton, set(inputs), allow_nonfinite=engine.allow_nonfinite, patch_size=cfg.patch_size if cfg.dynamic_img_size else None,
                   image_sizes=engine.image_sizes)  # fmt: skip


GUARD_SOURCE = Path(__file__).with_name("serve_guard.py")


def _install_guard(triton, models: set[str], allow_nonfinite: bool = False, patch_size: int | None = None,
                   image_sizes: tuple | None = None) -> None:  # fmt: skip
    """Ship `serve_guard.py` as the python-backend `model.py` of each bound model, PyTriton's proxy model as
    `pytriton_model.py` beside it: each request is then checked on its own and errors reach the client as one
    line (see `vitfast.serve_guard`). The files are swapped through `vitfast.pytriton_adapter` (PyTriton has
    no public hook); on a PyTriton it was not tested with, serving still works, with PyTriton's own error
    texts, and a warning says so. `patch_size`: a dynamic_img_size model's, for the guard's whole-patch check;
    `image_sizes`: a dynamic-size TensorRT engine's (min, opt, max), for its range check."""
    guard = GUARD_SOURCE.read_bytes()
    if allow_nonfinite:  # the same opt-out as engine.allow_nonfinite in the Python API
        guard = guard.replace(b"\nALLOW_NONFINITE = False", b"\nALLOW_NONFINITE = True", 1)
    if patch_size:
        guard = guard.replace(b"\nPATCH_SIZE = None", f"\nPATCH_SIZE = {int(patch_size)}".encode(), 1)
    if image_sizes:
        ends = tuple(tuple(int(d) for d in image_sizes[i]) for i in (0, 2))
        guard = guard.replace(b"\nSIZE_RANGE = None", f"\nSIZE_RANGE = {ends!r}".encode(), 1)

    def swap(files: dict[str, bytes], version: int) -> dict[str, bytes]:
        if f"file:{version}/model.py" in files:
            files[f"file:{version}/pytriton_model.py"] = files.pop(f"file:{version}/model.py")
            files[f"file:{version}/model.py"] = guard
        return files

    problem = rewrite_model_files(triton, models, swap)
    if problem:
        print(f"vitfast: warning: {problem}; bad requests get PyTriton's own error texts (tracebacks) instead of "
              "one-line messages", file=sys.stderr, flush=True)  # fmt: skip


def serve(artifact, **options: Any) -> None:
    """Start the server (see `start`) and block until SIGINT or SIGTERM, then shut it down cleanly."""
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with start(artifact, **options) as server:
            print(f"vitfast: serving {server.engine!r} as {server.name!r} (float [B, C, H, W]) and {server.uint8_name!r} "
                  f"(uint8 [B, H, W, C]), max batch {server.max_batch}: HTTP {server.http_url}, gRPC {server.grpc_url}, "
                  f"metrics {server.metrics_url}; Ctrl+C or SIGTERM stops it", file=sys.stderr, flush=True)  # fmt: skip
            while not stop.wait(1.0):
                if not server.is_alive():
                    raise ServeError(f"the Triton server stopped unexpectedly; server log: {server.log_tail()}")
            print("vitfast: shutting down", file=sys.stderr, flush=True)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
