"""`vitfast serve`: a real Triton Inference Server (started by PyTriton) on loopback ports.

Without a server: the request batching/ordering logic, top-k, the library-path fix, port checks,
the request guard run in the python backend (with a stand-in for Triton's utilities), and the
one-line error when nvidia-pytriton is missing. With one (skipped with the reason when nvidia-pytriton or tritonclient is missing): results equal
to the in-process engine over HTTP and gRPC, 8 concurrent clients x 200 requests of varying batch
sizes (set VITFAST_SKIP_LOAD_TEST=1 to skip that one), bad requests (each answered with one line,
bad ones batched with good ones included), metrics, and shutdown on
SIGTERM / SIGINT / `Server.stop()` leaving no child process behind. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

import vitfast
from serve_helpers import SHUTDOWN_TIMEOUT_S, descendants, free_ports, require_triton, wait_ready, wait_until_gone
from vitfast.config import ViTConfig
from vitfast.errors import InputError
from vitfast.runtime import Engine
from vitfast.serve import GUARD_SOURCE, Predictor, ServeError, _install_guard, check_port_free, interpreter_library_path
from vitfast.scores import top_classes
from vitfast.serve_guard import find_problem, one_line

CLIENTS, REQUESTS_PER_CLIENT, MAX_BATCH = 8, 200, 8
REQUEST_TIMEOUT_S = 60


# ---------------------------------------------------------------------------- no server needed
class RecordingEngine(Engine):
    """Logits = the mean of each image plus the class index; records every batch size it runs."""

    def __init__(self, batch=None):
        super().__init__(ViTConfig(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=1, num_classes=4), batch=batch)
        self.calls: list[int] = []

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(len(x))
        return x.mean(dim=(1, 2, 3))[:, None] + torch.arange(4.0)


def test_predictor_batches_same_shapes_together_and_answers_in_order():
    engine = RecordingEngine()
    predictor = Predictor(engine, 2, threading.Lock())
    rng = np.random.default_rng(0)
    requests = [{"images": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)} for n in (2, 1, 3)]
    requests.insert(1, {"images": rng.integers(0, 256, (2, 12, 10, 3), dtype=np.uint8)})
    responses = predictor(requests)
    assert sorted(engine.calls) == [2, 6]  # one engine call per input shape
    for request, response in zip(requests, responses):
        expected = engine(request["images"]).numpy()
        np.testing.assert_allclose(response["logits"], expected, rtol=1e-6)
        assert response["topk_indices"].tolist() == [[3, 2]] * len(expected)
        assert response["topk_indices"].dtype == np.int64 and response["topk_scores"].dtype == np.float32


def test_predictor_names_the_top_k_classes():
    engine = RecordingEngine()
    predictor = Predictor(engine, 3, threading.Lock(), labels=("cat", "dög", "emu", "fox"))
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    (response,) = predictor([{"images": x}])
    assert response["topk_labels"].tolist() == [[b"fox", b"emu", "dög".encode()]] * 2  # logits rise with the class index
    assert "topk_labels" not in Predictor(engine, 3, threading.Lock())([{"images": x}])[0]


def test_predictor_pads_up_to_the_profile_minimum_and_refuses_empty_batches():
    engine = RecordingEngine(batch=(4, 4, 8))
    predictor = Predictor(engine, 1, threading.Lock())
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (response,) = predictor([{"images": x}])
    assert engine.calls == [4] and response["logits"].shape == (1, 4)
    np.testing.assert_allclose(response["logits"], x.mean() + np.arange(4.0)[None], rtol=1e-5)
    with pytest.raises(InputError, match=r"empty batch: send at least one image, shape \[B>=1, ...\]"):
        predictor([{"images": x}, {"images": x[:0]}])


def test_predictor_scores_the_top_k_by_the_problem_type_or_as_told():
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    engine = RecordingEngine()
    logits = torch.from_numpy(engine(x).numpy()).double()
    expected = {"softmax": logits.softmax(-1), "sigmoid": logits.sigmoid(), "logits": logits}
    engine.config = engine.config.replace(problem_type="multi_label_classification")
    for scores, want in (("sigmoid", None), ("sigmoid", "sigmoid"), ("softmax", "softmax"), ("logits", "logits")):
        (response,) = Predictor(engine, 2, threading.Lock(), scores=want)([{"images": x}])
        np.testing.assert_allclose(response["topk_scores"], expected[scores][:, [3, 2]].numpy(), rtol=1e-6)
    engine.config = engine.config.replace(problem_type="regression")
    (response,) = Predictor(engine, 2, threading.Lock())([{"images": x}])
    np.testing.assert_allclose(response["topk_scores"], logits[:, [3, 2]].numpy(), rtol=1e-6)


def test_guard_names_the_problem_and_the_expected_shape():
    uint8_dims, float_dims = [-1, -1, 3], [3, 32, 32]
    ok = np.zeros((2, 5, 7, 3), np.uint8)
    assert find_problem("vit_uint8", "images", ok, uint8_dims) is None
    assert find_problem("vit_uint8", "images", np.zeros((1, 0, 0, 3), np.uint8), uint8_dims) == (
        "empty image: input 'images' of model 'vit_uint8' has shape [1, 0, 0, 3], which holds no pixels; "
        "send uint8 images [B, H, W, 3] with H, W >= 1")  # fmt: skip
    assert find_problem("vit", "images", np.zeros((0, 3, 32, 32), np.float32), float_dims) == (
        "empty batch: input 'images' of model 'vit' has shape [0, 3, 32, 32]; send at least one image, "
        "float32 images [B, 3, 32, 32] with B >= 1")  # fmt: skip
    x = np.zeros((2, 3, 32, 32), np.float32)
    assert find_problem("vit", "images", x, float_dims) is None
    x[1, 0, :2, 0] = [np.nan, -np.inf]
    assert find_problem("vit", "images", x, float_dims) == (
        "non-finite values: input 'images' of model 'vit' has 2 NaN or infinite values out of 6144; "
        "send finite float32 images [B, 3, 32, 32], already normalised")  # fmt: skip
    wrapped = ("Model execute error: Traceback (most recent call last):\n  File \"model.py\", line 3, in execute\n    raise e\n"
               "c_python_backend_utils.TritonModelException: Traceback (most recent call last):\n  File \"x.py\", line 1\n"
               "vitfast.errors.InputError: empty batch: send at least one image\n\n\nAt:\n  /tmp/1/model.py(501): execute\n")  # fmt: skip
    assert one_line(wrapped) == "InputError: empty batch: send at least one image"
    assert one_line("no exception line\n here") == "no exception line here"


def test_guard_refuses_float_images_that_are_not_whole_patches_of_a_dynamic_size_model():
    dims = [3, -1, -1]
    for shape in [(1, 3, 32, 32), (2, 3, 4, 60)]:
        assert find_problem("dyn", "images", np.zeros(shape, np.float32), dims, patch=4) is None
    assert find_problem("dyn", "images", np.zeros((1, 3, 33, 32), np.float32), dims, patch=4) == (
        "images of 33x32 are not whole 4x4 patches: input 'images' of model 'dyn' has shape [1, 3, 33, 32]; "
        "this model takes any size in whole patches: crop or resize to e.g. 32x32")  # fmt: skip
    assert "resize to e.g. 4x8" in find_problem("dyn", "images", np.zeros((1, 3, 2, 9), np.float32), dims, patch=4)
    assert find_problem("dyn_uint8", "images", np.zeros((1, 33, 7, 3), np.uint8), [-1, -1, 3], patch=4) is None  # resized on the server
    assert find_problem("dyn", "images", np.zeros((1, 3, 33, 32), np.float32), dims) is None  # no patch: a fixed-size model
    sizes = ((8, 16), (48, 96))  # a TensorRT engine's profile ends
    assert find_problem("dyn", "images", np.zeros((1, 3, 48, 16), np.float32), dims, patch=4, sizes=sizes) is None
    assert find_problem("dyn", "images", np.zeros((1, 3, 52, 16), np.float32), dims, patch=4, sizes=sizes) == (
        "images of 52x16 are outside the sizes model 'dyn' was built for, 8x16 to 48x96 (its TensorRT profile): "
        "input 'images' has shape [1, 3, 52, 16]; resize them into that range")  # fmt: skip
    assert "outside the sizes" in find_problem("dyn", "images", np.zeros((1, 3, 8, 8), np.float32), dims, patch=4, sizes=sizes)


def test_guard_names_each_free_dimension_by_its_position():
    """A dynamic-size model's float input is [3, -1, -1] in its config: its -1s are H and W, the channels stay 3."""
    x = np.zeros((1, 3, 32, 32), np.float32)
    x[0, 0, 0, 0] = np.nan
    assert find_problem("dyn", "images", x, [3, -1, -1], patch=4).endswith("send finite float32 images [B, 3, H, W], already normalised")
    assert find_problem("dyn", "images", np.zeros((1, 3, 0, 32), np.float32), [3, -1, -1], patch=4).endswith(
        "send float32 images [B, 3, H, W] with every dimension >= 1")  # fmt: skip
    assert find_problem("any", "images", np.zeros((0, 4, 4, 1), np.uint8), [-1, -1, -1]).endswith("uint8 images [B, H, W, C] with B >= 1")


class FakeTensor:
    def __init__(self, array):
        self.array = array

    def as_numpy(self):
        return self.array


def fake_backend_utils() -> types.ModuleType:
    """The parts of Triton's `triton_python_backend_utils` that serve_guard uses."""
    pb = types.ModuleType("triton_python_backend_utils")

    class TritonError:
        INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

        def __init__(self, message, code=None):
            self.message, self.code = message, code

    class InferenceResponse:
        def __init__(self, output_tensors=None, error=None):
            self.output_tensors, self.error = output_tensors, error

    pb.TritonError, pb.InferenceResponse = TritonError, InferenceResponse
    pb.get_input_tensor_by_name = lambda request, name: FakeTensor(request[name]) if name in request else None
    pb.Logger = types.SimpleNamespace(logged=[], log_error=lambda message: pb.Logger.logged.append(message))
    return pb


def test_guard_answers_bad_requests_itself_and_passes_the_rest_on_in_order(tmp_path, monkeypatch):
    """serve_guard.py as the stub loads it (`model.py` beside PyTriton's proxy, here a fake that echoes
    the batch it gets): in a batch with bad requests, only the good ones reach PyTriton, and each
    response lands at its own request; a failure in PyTriton becomes one line per request."""
    package = tmp_path / "stubmodel"
    package.mkdir()
    (package / "model.py").write_bytes(GUARD_SOURCE.read_bytes())
    (package / "pytriton_model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n        self.batches = []\n"
        "    def execute(self, requests):\n"
        "        self.batches.append(len(requests))\n"
        "        if self.fail:\n            raise RuntimeError('Model execute error: Traceback (most recent call last):\\nValueError: engine broke')\n"
        "        return [('served', float(r['images'].sum())) for r in requests]\n"
    )  # fmt: skip
    pb = fake_backend_utils()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.syspath_prepend(str(tmp_path))
    guard = importlib.import_module("stubmodel.model").TritonPythonModel()
    config = {"input": [{"name": "images", "data_type": "TYPE_FP32", "dims": [3, 2, 2]}]}
    guard.initialize({"model_config": json.dumps(config), "model_name": "vit"})
    guard.fail = False
    good = [{"images": np.full((1, 3, 2, 2), v, np.float32)} for v in (1.0, 2.0, 3.0)]
    nan = {"images": np.full((1, 3, 2, 2), np.nan, np.float32)}
    responses = guard.execute([good[0], nan, good[1], good[2], nan])
    assert guard.batches == [3]
    assert responses[0] == ("served", 12.0) and responses[2] == ("served", 24.0) and responses[3] == ("served", 36.0)
    for bad in (responses[1], responses[4]):
        assert bad.error.code == "INVALID_ARG" and bad.error.message.startswith("non-finite values: input 'images' of model 'vit'")
    assert [r.error.code for r in guard.execute([nan])] == ["INVALID_ARG"] and guard.batches == [3]  # nothing left to pass on
    guard.fail = True
    failed = guard.execute([good[0], nan])
    assert failed[0].error.code == "INTERNAL" and failed[1].error.code == "INVALID_ARG"
    assert failed[0].error.message == ("model 'vit' failed on this request: ValueError: engine broke "
                                       "(the server log has the details; vitfast serve --verbose shows it)")  # fmt: skip
    assert "engine broke" in pb.Logger.logged[0]


def test_install_guard_ships_it_as_model_py_and_warns_when_pytriton_moved(capsys):
    class FakeModel:
        model_name, model_version = "vit", 1

        def get_proxy_model_files(self):
            return {"file:1/model.py": b"proxy", "file:1/data.py": b"data"}

    model = FakeModel()
    _install_guard(types.SimpleNamespace(_model_manager=types.SimpleNamespace(models=[model])), {"vit"})
    assert model.get_proxy_model_files() == {"file:1/pytriton_model.py": b"proxy", "file:1/data.py": b"data",
                                             "file:1/model.py": GUARD_SOURCE.read_bytes()}  # fmt: skip
    assert capsys.readouterr().err == ""
    model.get_proxy_model_files = FakeModel().get_proxy_model_files
    _install_guard(types.SimpleNamespace(_model_manager=types.SimpleNamespace(models=[model])), {"vit"}, patch_size=14)
    shipped = model.get_proxy_model_files()["file:1/model.py"].decode()
    assert "\nPATCH_SIZE = 14  #" in shipped and shipped.replace("PATCH_SIZE = 14", "PATCH_SIZE = None") == GUARD_SOURCE.read_text()
    model.get_proxy_model_files = FakeModel().get_proxy_model_files
    _install_guard(types.SimpleNamespace(_model_manager=types.SimpleNamespace(models=[model])), {"vit"}, patch_size=14,
                   image_sizes=((14, 28), (224, 224), (448, 896)))  # fmt: skip
    shipped = model.get_proxy_model_files()["file:1/model.py"].decode()
    namespace = {}
    exec(shipped.split("\ntry:  # inside Triton's python backend")[0], namespace)  # the module's constants and checks, run as shipped
    assert (namespace["PATCH_SIZE"], namespace["SIZE_RANGE"]) == (14, ((14, 28), (448, 896)))
    _install_guard(types.SimpleNamespace(), {"vit"})
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning" in err and "one-line messages" in err


def test_top_k_is_softmax_top_k():
    logits = np.random.default_rng(2).standard_normal((5, 10)).astype(np.float32)
    indices, scores = top_classes(logits, 3)
    expected = torch.softmax(torch.from_numpy(logits).double(), dim=1).topk(3)
    assert indices.tolist() == expected.indices.tolist()
    np.testing.assert_allclose(scores, expected.values.numpy(), rtol=1e-6)


def test_interpreter_library_path_is_set_only_while_starting(monkeypatch):
    import sysconfig

    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/other")
    with interpreter_library_path():
        first = os.environ["LD_LIBRARY_PATH"].split(os.pathsep)[0]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        assert first == sysconfig.get_config_var("LIBDIR")
    assert os.environ["LD_LIBRARY_PATH"] == "/opt/other"


def test_a_busy_port_is_reported_with_the_fix():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ServeError, match=f"cannot use grpc port {busy.getsockname()[1]} on 127.0.0.1.*--grpc-port"):
            check_port_free("127.0.0.1", busy.getsockname()[1], "grpc")


# ---------------------------------------------------------------------------- server fixtures
@pytest.fixture(scope="module")
def onnx_artifact(tmp_path_factory) -> Path:
    pytest.importorskip("onnxruntime", reason="the served artifact is an ONNX export: pip install 'vitfast[onnx]'")
    from vitfast.export import to_onnx

    torch.manual_seed(0)
    return to_onnx(vitfast.create_model("vit_cifar_patch4_32"), tmp_path_factory.mktemp("serve") / "cifar.onnx", batch=(1, 4, MAX_BATCH))


def start_cli(artifact: Path, *extra: str, name: str = "vit") -> tuple[subprocess.Popen, str, str]:
    """`vitfast serve ARTIFACT --name NAME ...` on free loopback ports; returns (process, HTTP host:port,
    gRPC host:port) once both models are ready."""
    http, grpc, metrics = free_ports()
    process = subprocess.Popen(
        [sys.executable, "-m", "vitfast.cli", "serve", str(artifact), "--host", "127.0.0.1", "--port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--name", name, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_ready(f"127.0.0.1:{http}", [name, f"{name}_uint8"], process)
    except BaseException:
        terminate(process)
        raise
    process.metrics_port = metrics
    return process, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"


def terminate(process: subprocess.Popen) -> None:
    """SIGTERM (so the server cleans its workspace up), SIGKILL if it does not exit in time."""
    process.terminate()
    try:
        process.wait(SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(SHUTDOWN_TIMEOUT_S)


def stop_and_check(process: subprocess.Popen, sig: int) -> str:
    """Send `sig`; the server must exit 0 in time and leave none of its processes or temporary files
    behind. Returns its stderr."""
    tree = descendants(process.pid)
    server_cmd = next((cmd.split() for cmd in tree.values() if "bin/tritonserver" in cmd), None)
    assert server_cmd and any("triton_python_backend_stub" in cmd for cmd in tree.values()), tree
    workspace = Path(server_cmd[0]).parents[2]  # PyTriton's copy of the server: WORKSPACE/tritonserver/bin/tritonserver
    log_dir = Path(server_cmd[server_cmd.index("--log-file") + 1]).parent
    process.send_signal(sig)
    try:
        process.wait(SHUTDOWN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(SHUTDOWN_TIMEOUT_S)
    stderr = process.stderr.read()
    assert process.returncode == 0, stderr[-2000:]
    assert "shutting down" in stderr and "Traceback" not in stderr
    left = wait_until_gone(tree)
    assert not left, {pid: tree[pid] for pid in left}
    assert not workspace.exists() and not log_dir.exists(), "the server's temporary files were left behind"
    return stderr


@pytest.fixture(scope="module")
def server(onnx_artifact):
    """The CLI server for this module; `test_zz_sigterm_shuts_down_cleanly` stops it, this is the fallback."""
    require_triton()
    process, http, grpc = start_cli(onnx_artifact, "--max-queue-delay-us", "500", "--top-k", "3")
    yield process, http, grpc
    if process.poll() is None:
        terminate(process)


@pytest.fixture(scope="module")
def reference(onnx_artifact):
    return vitfast.load_engine(onnx_artifact)


def infer(client, module, model: str, images: np.ndarray, outputs=("logits", "topk_indices", "topk_scores")) -> dict:
    """One request through a tritonclient http or grpc client."""
    dtype = {np.float32: "FP32", np.uint8: "UINT8", np.float64: "FP64", np.int32: "INT32"}[images.dtype.type]
    tensor = module.InferInput("images", list(images.shape), dtype)
    tensor.set_data_from_numpy(images)
    kwargs = {"client_timeout": REQUEST_TIMEOUT_S} if module.__name__.endswith("grpc") else {}
    result = client.infer(model, [tensor], outputs=[module.InferRequestedOutput(o) for o in outputs], **kwargs)
    return {o: result.as_numpy(o) for o in outputs}


def clients(http: str, grpc: str):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    return [(httpclient.InferenceServerClient(http, network_timeout=REQUEST_TIMEOUT_S), httpclient),
            (grpcclient.InferenceServerClient(grpc), grpcclient)]  # fmt: skip


def assert_matches(response: dict, expected_logits: np.ndarray, k: int = 3) -> None:
    """Same logits as the in-process engine; the dynamic batcher changes the batch a request runs
    in, which can move the last bits of ONNX Runtime's sums, hence the small tolerance (inputs are
    random per request, so a mixed-up response would be off by orders of magnitude more)."""
    np.testing.assert_allclose(response["logits"], expected_logits, rtol=1e-5, atol=1e-5)
    indices, scores = top_classes(expected_logits, k)
    np.testing.assert_array_equal(response["topk_indices"], indices)
    np.testing.assert_allclose(response["topk_scores"], scores, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- server tests
def test_float_and_uint8_requests_equal_the_engine_over_http_and_grpc(server, reference):
    _, http, grpc = server
    rng = np.random.default_rng(0)
    for client, module in clients(http, grpc):
        with client:
            for n in (1, 3, MAX_BATCH):
                x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
                assert_matches(infer(client, module, "vit", x), reference(x).numpy())
            for shape in [(2, 32, 32, 3), (3, 57, 41, 3), (1, 300, 20, 3)]:  # resized and cropped on the server
                u = rng.integers(0, 256, shape, dtype=np.uint8)
                assert_matches(infer(client, module, "vit_uint8", u), reference(u).numpy())
            config = client.get_model_config("vit", **({"as_json": True} if "grpc" in module.__name__ else {}))
            config = config.get("config", config)  # gRPC wraps it
            assert config["max_batch_size"] == MAX_BATCH
            assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 500


@pytest.mark.skipif(os.environ.get("VITFAST_SKIP_LOAD_TEST") == "1", reason="VITFAST_SKIP_LOAD_TEST=1")
def test_load_8_clients_x_200_requests_every_response_is_its_own(server, reference):
    """8 concurrent clients (4 HTTP, 4 gRPC) x 200 requests, batch sizes 1..8, float and uint8
    models interleaved: every response equals the in-process engine on that request's input."""
    _, http, grpc = server
    results: dict[tuple[int, int], tuple[float, dict]] = {}
    errors: list[BaseException] = []

    def request(c: int, i: int) -> np.ndarray:
        rng = np.random.default_rng(c * 100_003 + i)
        n = 1 + (c + i) % MAX_BATCH
        if i % 2:
            h, w = ((32, 32), (48, 40))[i // 2 % 2]
            return rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
        return rng.standard_normal((n, 3, 32, 32)).astype(np.float32)

    def run_client(c: int) -> None:
        client, module = clients(http, grpc)[c % 2]
        try:
            with client:
                for i in range(REQUESTS_PER_CLIENT):
                    images = request(c, i)
                    start = time.perf_counter()
                    response = infer(client, module, "vit_uint8" if images.dtype == np.uint8 else "vit", images)
                    results[(c, i)] = (time.perf_counter() - start, response)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run_client, args=(c,)) for c in range(CLIENTS)]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.perf_counter() - wall
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in threads), "a client did not finish within 600 s"
    assert sorted(results) == [(c, i) for c in range(CLIENTS) for i in range(REQUESTS_PER_CLIENT)]
    images_total, max_abs_diff = 0, 0.0
    for (c, i), (_, response) in results.items():
        images = request(c, i)
        expected = reference(images).numpy()
        images_total += len(images)
        assert response["logits"].shape == (len(images), 10)
        assert_matches(response, expected)
        max_abs_diff = max(max_abs_diff, float(np.abs(response["logits"] - expected).max()))
    latencies = np.array([latency for latency, _ in results.values()]) * 1000
    report = {
        "requests": len(results), "images": images_total, "clients": CLIENTS, "wall_s": round(wall, 2),
        "requests_per_s": round(len(results) / wall, 1), "images_per_s": round(images_total / wall, 1),
        "latency_ms_p50": round(float(np.percentile(latencies, 50)), 2),
        "latency_ms_p99": round(float(np.percentile(latencies, 99)), 2), "max_abs_diff_vs_engine": max_abs_diff,
    }  # fmt: skip
    print(f"\nvitfast serve load test (vit_cifar_patch4_32 ONNX, CPU, max batch {MAX_BATCH}, queue delay 500 us): {json.dumps(report)}")


def test_bad_requests_get_clear_errors_and_the_server_keeps_answering(server, reference):
    """Every bad request gets an error response of one line (HTTP 400 / gRPC INVALID_ARGUMENT for
    the tensors), no Python traceback, and the next good request is answered exactly as before."""
    from tritonclient.utils import InferenceServerException

    _, http, grpc = server
    rng = np.random.default_rng(3)
    good = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    good_uint8 = rng.integers(0, 256, (2, 20, 24, 3), dtype=np.uint8)
    nan = good[:1].copy()
    nan[0, 1, 2, 3] = np.nan
    shape_hint = ("NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
                  "to be prepended to each input shape")  # fmt: skip
    bad_tensors = [
        # Refused by Triton against the model config before any vitfast code runs, in Triton's words.
        ("vit", np.zeros((1, 3, 16, 32), np.float32), "unexpected shape for input 'images' for model 'vit'. Expected [-1,3,32,32], got [1,3,16,32]"),
        ("vit", np.zeros((3, 32, 32), np.float32), f"Expected [-1,3,32,32], got [3,32,32]. {shape_hint}"),  # no batch axis
        ("vit_uint8", np.zeros((1, 32, 32, 4), np.uint8), "unexpected shape for input 'images' for model 'vit_uint8'. Expected [-1,-1,-1,3], got [1,32,32,4]"),
        ("vit_uint8", np.zeros((4, 4, 3), np.uint8), f"Expected [-1,-1,-1,3], got [4,4,3]. {shape_hint}"),  # one image, no batch axis
        ("vit", np.zeros((1, 3, 32, 32), np.float64), "inference input 'images' data-type is 'FP64', but model 'vit' expects 'FP32'"),
        ("vit", np.zeros((1, 3, 32, 32), np.int32), "inference input 'images' data-type is 'INT32', but model 'vit' expects 'FP32'"),
        ("vit_uint8", np.zeros((1, 32, 32, 3), np.int32), "inference input 'images' data-type is 'INT32', but model 'vit_uint8' expects 'UINT8'"),
        ("vit", np.zeros((MAX_BATCH + 1, 3, 32, 32), np.float32), f"inference request batch-size must be <= {MAX_BATCH} for 'vit'"),
        ("vit_uint8", np.zeros((MAX_BATCH + 1, 8, 8, 3), np.uint8), f"inference request batch-size must be <= {MAX_BATCH} for 'vit_uint8'"),
        # An empty batch (B = 0) is refused by Triton's byte-count check: it expects the bytes of one
        # image and got none. Triton has no hook before that check, so this is the text clients get
        # (serve_guard and Predictor would say "empty batch" if one ever got through).
        ("vit", np.zeros((0, 3, 32, 32), np.float32), "input byte size mismatch for input 'images' for model 'vit'. Expected 12288, got 0"),
        ("vit_uint8", np.zeros((0, 32, 32, 3), np.uint8), "input byte size mismatch for input 'images' for model 'vit_uint8'. Expected 3072, got 0"),
        # Refused by vitfast's guard in the python backend (vitfast/serve_guard.py), request by request.
        ("vit_uint8", np.zeros((1, 0, 0, 3), np.uint8), "empty image: input 'images' of model 'vit_uint8' has shape [1, 0, 0, 3], "
                                                        "which holds no pixels; send uint8 images [B, H, W, 3] with H, W >= 1"),
        ("vit_uint8", np.zeros((2, 7, 0, 3), np.uint8), "empty image: input 'images' of model 'vit_uint8' has shape [2, 7, 0, 3]"),
        ("vit", nan, "non-finite values: input 'images' of model 'vit' has 1 NaN or infinite values out of 3072; "
                     "send finite float32 images [B, 3, 32, 32], already normalised"),
        ("vit", np.full((2, 3, 32, 32), np.inf, np.float32), "has 6144 NaN or infinite values out of 6144"),
    ]  # fmt: skip
    for client, module in clients(http, grpc):
        with client:
            for model, images, message in bad_tensors:
                with pytest.raises(InferenceServerException) as info:
                    infer(client, module, model, images)
                text = str(info.value)
                assert message in text and "Traceback" not in text and "\n" not in text, text
                assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), (info.value.status(), text)
                assert_matches(infer(client, module, "vit", good), reference(good).numpy())
            assert_matches(infer(client, module, "vit_uint8", good_uint8), reference(good_uint8).numpy())
    assert_bad_requests_do_not_fail_their_batch(server, reference)

    binary = json.dumps({"inputs": [{"name": "images", "shape": [1, 3, 32, 32], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 12288}}]}).encode()  # fmt: skip
    # Triton's HTTP front end answers a body it cannot parse with 500 (its choice, not vitfast's).
    garbage = [
        (b"\x00\xff not json at all", {}, 500, "failed to parse the request JSON buffer: The document is empty. at 0"),
        (b"{garbage", {}, 500, "failed to parse the request JSON buffer"),
        (binary + b"\x01" * 100, {"Inference-Header-Content-Length": str(len(binary))}, 400,
         "unexpected size for input 'images', expecting 12188 additional bytes for model 'vit'"),
        (b'{"inputs": [{"name": "images", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [1, 2, 3]}]}', {}, 500,
         "Unable to parse 'data': Shape does not match true shape of 'data' field"),
        (b'{"inputs": [{"name": "images", "shape": [0, 3, 32, 32], "datatype": "FP32", "data": []}]}', {}, 400,
         "input byte size mismatch for input 'images' for model 'vit'. Expected 12288, got 0"),
    ]  # fmt: skip
    for body, headers, code, message in garbage:
        request = urllib.request.Request(f"http://{http}/v2/models/vit/infer", data=body, method="POST",
                                         headers={"Content-Type": "application/octet-stream", **headers})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S)
        text = info.value.read().decode(errors="replace")
        assert info.value.code == code and message in json.loads(text)["error"] and "Traceback" not in text, (info.value.code, text)

    import grpc as grpcio

    with grpcio.insecure_channel(grpc) as channel:  # gRPC framing, but the body is no ModelInferRequest
        model_infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for body in (b"\xff\xfe garbage" * 10, os.urandom(5000)):
            with pytest.raises(grpcio.RpcError) as info:
                model_infer(body, timeout=REQUEST_TIMEOUT_S)
            assert (info.value.code(), info.value.details()) == (grpcio.StatusCode.INTERNAL, "Unable to parse request")
    # Bytes that are not HTTP/2 at all: there is no gRPC call to answer, so the gRPC server sends its
    # connection preface and closes the connection (a transport-level error for such a client). Only
    # that connection ends: the checks below show the server still answers on both protocols.
    host, port = grpc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"garbage" + os.urandom(4089))
        read_until_closed(raw)  # a TimeoutError here (connection left open) fails the test
    for client, module in clients(http, grpc):
        with client:
            assert client.is_server_live() and client.is_model_ready("vit") and client.is_model_ready("vit_uint8")
            assert_matches(infer(client, module, "vit", good), reference(good).numpy())
            assert_matches(infer(client, module, "vit_uint8", good_uint8), reference(good_uint8).numpy())


def inference_executions(metrics_port: int, model: str) -> int:
    """Triton's count of model executions (one per batch the dynamic batcher formed)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=REQUEST_TIMEOUT_S).read().decode()
    return int(float(next(line.split()[-1] for line in text.splitlines() if line.startswith(f'nv_inference_exec_count{{model="{model}",'))))


def assert_bad_requests_do_not_fail_their_batch(server, reference, burst: int = 8, attempts: int = 3) -> None:
    """Bursts of NaN and good requests sent at once: the NaN ones get their error, the good ones their
    answers. The dynamic batcher must have grouped a burst (fewer executions than requests) at least
    once in `attempts`; a very busy machine can space the requests out past the queue delay."""
    import tritonclient.grpc as grpcclient

    process, _, grpc = server
    rng = np.random.default_rng(7)
    executions = []
    with grpcclient.InferenceServerClient(grpc) as client:
        while len(executions) < attempts and (not executions or executions[-1] == burst):
            images = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(burst)]
            for x in images[1::2]:
                x[0, 0, 0, 0] = np.nan
            results: list = [None] * burst
            done = threading.Semaphore(0)

            def store(i, result, error):
                results[i] = (result, error)
                done.release()

            before = inference_executions(process.metrics_port, "vit")
            for i, x in enumerate(images):
                tensor = grpcclient.InferInput("images", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                client.async_infer("vit", [tensor], lambda result, error, i=i: store(i, result, error), client_timeout=REQUEST_TIMEOUT_S)
            assert all(done.acquire(timeout=REQUEST_TIMEOUT_S) for _ in range(burst)), "a response did not come back"
            executions.append(inference_executions(process.metrics_port, "vit") - before)
            for i, (result, error) in enumerate(results):
                if i % 2:
                    assert result is None and "non-finite values: input 'images' of model 'vit' has 1 NaN" in str(error), error
                else:
                    assert error is None, error
                    outputs = {o: result.as_numpy(o) for o in ("logits", "topk_indices", "topk_scores")}
                    assert_matches(outputs, reference(images[i]).numpy())
    assert executions[-1] < burst, f"bursts of {burst} requests ran as {executions} batches: never batched"


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes the connection (or resets it)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_prometheus_metrics_count_the_requests(server):
    process, _, _ = server
    text = urllib.request.urlopen(f"http://127.0.0.1:{process.metrics_port}/metrics", timeout=REQUEST_TIMEOUT_S).read().decode()
    assert 'nv_inference_request_success{model="vit",version="1"}' in text
    assert 'nv_inference_request_failure{model="vit",reason=' in text or "nv_inference_request_failure" in text
    assert "nv_inference_queue_duration_us" in text


def test_zz_sigterm_shuts_down_cleanly(server):
    """Runs last in this module (file order): the fixture's server ends here."""
    process, _, _ = server
    stop_and_check(process, signal.SIGTERM)


def test_sigint_shuts_a_checkpoint_server_down_cleanly(tmp_path):
    """A vitfast checkpoint (the PyTorch engine) through the CLI, stopped with SIGINT (Ctrl+C)."""
    require_triton()
    torch.manual_seed(0)
    model = vitfast.create_model("vit_cifar_patch4_32")
    vitfast.save_checkpoint(model, tmp_path / "cifar.safetensors")
    process, http, grpc = start_cli(tmp_path / "cifar.safetensors", "--max-batch", "4", name="cifar")
    try:
        import tritonclient.http as httpclient

        with httpclient.InferenceServerClient(http, network_timeout=REQUEST_TIMEOUT_S) as client:
            u = np.random.default_rng(4).integers(0, 256, (4, 36, 36, 3), dtype=np.uint8)
            expected = vitfast.load_engine(tmp_path / "cifar.safetensors")(u).numpy()
            assert_matches(infer(client, httpclient, "cifar_uint8", u), expected, k=5)
            assert client.get_model_config("cifar")["max_batch_size"] == 4
    finally:
        stderr = stop_and_check(process, signal.SIGINT)
    assert "'cifar' (float [B, C, H, W]) and 'cifar_uint8' (uint8 [B, H, W, C]), max batch 4" in stderr


def test_dynamic_size_model_serves_its_tokens_at_every_whole_patch_size(tmp_path):
    """A --dynamic-img-size ONNX export of every token (global_pool none): the float model takes any size in whole
    patches and answers as many tokens as the size has patches; uint8 images are resized to img_size on the
    server; a float image that is not whole patches is refused by the guard in one line, the server answering on."""
    require_triton()
    pytest.importorskip("onnxruntime", reason="the served artifact is an ONNX export: pip install 'vitfast[onnx]'")
    from tritonclient.utils import InferenceServerException

    from vitfast.export import to_onnx

    torch.manual_seed(0)
    model = vitfast.create_model("vit_cifar_patch4_32", dynamic_img_size=True, global_pool="", num_classes=0)
    artifact = to_onnx(model, tmp_path / "tokens.onnx", batch=(1, 4, MAX_BATCH))
    reference, dim = vitfast.load_engine(artifact), model.config.embed_dim
    process, http, grpc = start_cli(artifact, name="dyn")
    try:
        rng = np.random.default_rng(6)
        for client, module in clients(http, grpc):
            with client:
                config = client.get_model_config("dyn", **({"as_json": True} if "grpc" in module.__name__ else {}))
                config = config.get("config", config)
                assert [int(d) for d in config["input"][0]["dims"]] == [3, -1, -1]
                assert [int(d) for d in config["output"][0]["dims"]] == [-1, dim]
                for shape in [(2, 3, 32, 32), (1, 3, 16, 48), (3, 3, 40, 24), (1, 3, 4, 4)]:
                    x = rng.standard_normal(shape).astype(np.float32)
                    got = infer(client, module, "dyn", x, outputs=("logits",))["logits"]
                    assert got.shape == (shape[0], 1 + shape[2] * shape[3] // 16, dim)
                    np.testing.assert_allclose(got, reference(x).numpy(), rtol=1e-5, atol=1e-5)
                u = rng.integers(0, 256, (2, 57, 41, 3), dtype=np.uint8)
                got = infer(client, module, "dyn_uint8", u, outputs=("logits",))["logits"]
                assert got.shape == (2, 65, dim)
                np.testing.assert_allclose(got, reference(u).numpy(), rtol=1e-5, atol=1e-5)
                with pytest.raises(InferenceServerException) as info:
                    infer(client, module, "dyn", np.zeros((1, 3, 33, 32), np.float32), outputs=("logits",))
                text = str(info.value)
                assert "images of 33x32 are not whole 4x4 patches" in text and "e.g. 32x32" in text and "\n" not in text, text
                assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), (info.value.status(), text)
                x = rng.standard_normal((1, 3, 8, 12)).astype(np.float32)
                np.testing.assert_allclose(infer(client, module, "dyn", x, outputs=("logits",))["logits"], reference(x).numpy(),
                                           rtol=1e-5, atol=1e-5)  # fmt: skip
    finally:
        stop_and_check(process, signal.SIGTERM)


def test_python_api_start_and_stop_leave_no_server_process(onnx_artifact, reference):
    """`vitfast.serve.start` in this process with an Engine object; `stop()` ends tritonserver and its stubs.
    (Python's multiprocessing resource tracker, started by PyTriton's shared memory, stays until exit.)"""
    require_triton()
    import tritonclient.grpc as grpcclient

    from vitfast.serve import start

    http, grpc, metrics = free_ports()
    labels = [f"class {i}" for i in range(10)]
    with start(reference, port=http, grpc_port=grpc, metrics_port=metrics, top_k=3, labels=labels) as server:
        tree = descendants(os.getpid())
        assert server.grpc_url == f"127.0.0.1:{grpc}" and server.max_batch == MAX_BATCH
        assert any("tritonserver" in cmd for cmd in tree.values()), tree
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            x = np.random.default_rng(5).standard_normal((3, 3, 32, 32)).astype(np.float32)
            response = infer(client, grpcclient, "vit", x, outputs=("logits", "topk_indices", "topk_scores", "topk_labels"))
            assert_matches(response, reference(x).numpy())
            assert response["topk_labels"].tolist() == [[labels[i].encode() for i in row] for row in response["topk_indices"]]
    server_processes = [pid for pid, cmd in tree.items() if "tritonserver" in cmd or "triton_python_backend_stub" in cmd]
    assert server_processes and not wait_until_gone(server_processes)
    assert not server.log_dir.exists()
    server.stop()  # a second stop is harmless
    with pytest.raises(InputError, match="exceeds this artifact's batch profile maximum 8"):
        start(reference, port=http, grpc_port=grpc, metrics_port=metrics, max_batch_size=16)
    with pytest.raises(InputError, match="2 labels for a model with 10 classes"):
        start(reference, port=http, grpc_port=grpc, metrics_port=metrics, labels=["a", "b"])
    with pytest.raises(InputError, match="--scores must be one of softmax, sigmoid, logits"):
        start(reference, port=http, grpc_port=grpc, metrics_port=metrics, scores="probit")


@pytest.mark.parametrize("overrides, output", [
    ({"features_only": True, "out_indices": 2}, r"feature maps \(NCHW, patch tokens\) of blocks \[2, 3\]"),
    ({"global_pool": ""}, "every token's logits"),
    ({"num_classes": 0}, r"pooled features \(token\)"),
    ({"embedding_head": True}, r"image embedding \(CLIP's image_embeds"),
])  # fmt: skip
def test_labels_and_scores_are_refused_for_a_model_that_does_not_classify(overrides, output):
    """topk_labels / topk_scores exist only for one set of class scores per image: anything else is served as `logits`
    alone, so --labels and --scores would be silently ignored."""
    require_triton()
    from vitfast.serve import start

    engine = vitfast.runtime.TorchEngine(vitfast.create_model("vit_cifar_patch4_32", **overrides))
    assert not engine.config.classifies
    http, grpc, metrics = free_ports()
    for given in ({"labels": [f"l{i}" for i in range(10)]}, {"scores": "sigmoid"}):
        with pytest.raises(InputError, match=f"its output is {output}.*, not one set of class scores per image, so serving returns it "
                                             "as `logits` without topk_\\*; drop --labels / --scores$"):  # fmt: skip
            start(engine, port=http, grpc_port=grpc, metrics_port=metrics, **given).stop()  # stopped should it start


def test_cli_errors_are_one_line(tmp_path, onnx_artifact):
    require_triton()
    vitfast_bin = Path(sys.executable).parent / "vitfast"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cases = [
            (["serve", tmp_path / "missing.onnx"], "no such artifact"),
            (["serve", onnx_artifact, "--port", port], f"cannot use http port {port} on 127.0.0.1"),
            (["serve", onnx_artifact, "--name", "a b"], "not valid for Triton"),
            (["serve", onnx_artifact, "--max-batch", "64"], "exceeds this artifact's batch profile maximum 8"),
        ]
        for args, message in cases:
            out = subprocess.run([str(vitfast_bin), *map(str, args)], capture_output=True, text=True, timeout=120)
            assert out.returncode == 2 and message in out.stderr, out.stderr
            assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr


def test_cli_without_pytriton_is_one_line_with_the_install_hint(tmp_path):
    """No server: a `pytriton` package that fails to import shadows the real one (or stands in for it)."""
    (tmp_path / "pytriton").mkdir()
    (tmp_path / "pytriton" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'pytriton'\", name='pytriton')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "vitfast.cli", "serve", str(tmp_path / "model.onnx")],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr == ("vitfast: error: serving needs PyTriton (No module named 'pytriton'): pip install 'vitfast[serve]' "
                          "(nvidia-pytriton: Linux x86_64 or aarch64 with glibc >= 2.35)\n")  # fmt: skip
