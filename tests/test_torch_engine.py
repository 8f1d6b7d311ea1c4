"""A checkpoint run the way it is deployed: `TorchEngine` / `load_engine(ckpt, dtype=..., optimized=..., cuda_graphs=...)`
and the `--precision / --optimize / --cuda-graphs` flags of predict, eval, check and serve; CUDA graphs per batch size
(`vitfast.batch_buckets`, one shared memory pool, zero-padded batches). References: the fp32 reference model, run
apart. The graph capture itself needs a GPU (the last tests); on CPU a stand-in replays the forward eagerly, so the
padding, slicing and size choice around it are what is checked."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitfast
from vitfast.errors import InputError, VitfastError
from vitfast.optimize import CudaGraphForward, static_input
from vitfast.pipeline import check_artifact
from vitfast.runtime import TorchEngine

from conftest import randomize, tiny_config
from test_foreign_onnx import run


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(11)
    path = tmp_path_factory.mktemp("engine") / "tiny.safetensors"
    vitfast.save_checkpoint(randomize(vitfast.create_model(tiny_config(num_classes=2, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)))), path)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Two class folders of random RGB images (eval reads DIR/<class>/*, one per class of the checkpoint)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(4)
    for label in ("a", "b"):
        (root / label).mkdir()
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(root / label / f"{i}.png")
    return root


# ---------------------------------------------------------------------------- batch sizes
@pytest.mark.parametrize("max_batch", [1, 2, 3, 5, 7, 8, 31, 64, 100, 256, 1000])
def test_batch_buckets_hold_every_batch_with_little_padding(max_batch):
    sizes = vitfast.batch_buckets(max_batch)
    assert sizes[0] == 1 and sizes[-1] == max_batch and list(sizes) == sorted(set(sizes))
    assert len(sizes) <= 2 * math.log2(max_batch) + 2
    for n in range(1, max_batch + 1):
        size = next(s for s in sizes if s >= n)
        assert size - n < size / 3, (n, size)  # padding: under a third of the captured batch


@pytest.mark.parametrize("tokens", [12 * 50, 197, 577, 12 * 197, 1025])
def test_warming_the_batch_buckets_tunes_every_kernel_size_bucket(tokens):
    """The kernels' autotuners key on next_pow2 of the rows (batch x tokens, or batch x heads): warming the sizes of
    batch_buckets(max) meets every key that any batch of 1..max would."""
    from vitfast.kernels._common import next_pow2

    for max_batch in (7, 64, 256):
        sizes = vitfast.batch_buckets(max_batch)
        assert {next_pow2(n * tokens) for n in range(1, max_batch + 1)} == {next_pow2(s * tokens) for s in sizes}


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "8"])
def test_batch_buckets_refuse_what_is_not_a_batch_size(bad):
    with pytest.raises(VitfastError, match="max_batch must be a positive int"):
        vitfast.batch_buckets(bad)


@pytest.mark.parametrize("bad", ["yes", [], [0, 4], [2, 2.5], 8])
def test_optimize_refuses_graph_sizes_that_are_not_batch_sizes(bad):
    with pytest.raises(VitfastError, match="cuda_graphs takes True, False or the batch sizes"):
        vitfast.optimize(vitfast.create_model(tiny_config()), cuda_graphs=bad)


def test_graph_sizes_need_a_gpu_model_too():
    with pytest.raises(VitfastError, match="cuda_graphs needs the model on a CUDA GPU"):
        vitfast.optimize(vitfast.create_model(tiny_config()), cuda_graphs=vitfast.batch_buckets(8))


class EagerGraphs(CudaGraphForward):
    """CudaGraphForward with the capture replaced by an eager stand-in (CPU): `replay` runs the forward on the
    static input into the static output, as a replayed graph would; records the sizes captured and the inputs run."""

    def __init__(self, forward, batch_sizes=None):
        self.captured, self.seen = [], []

        def recorded(x):
            self.seen.append(x.clone())
            return forward(x)

        super().__init__(recorded, batch_sizes)

    def _capture(self, shape, dtype, device):
        self.captured.append(shape[0])
        static_in = static_input(shape, dtype, device)
        static_out = self.forward(static_in)

        def replay():  # a real replay writes the output's memory past autograd's inference-tensor checks
            with torch.inference_mode():
                static_out.copy_(self.forward(static_in))

        return replay, static_in, static_out


@pytest.fixture
def model():
    return randomize(vitfast.create_model(tiny_config())).eval()


def test_a_batch_runs_zero_padded_in_the_next_size_and_comes_back_unpadded(model):
    graphs = EagerGraphs(model.forward, (1, 2, 4))
    x4, x, x2 = torch.randn(4, 3, 32, 32), torch.randn(3, 3, 32, 32), torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ref4, ref, ref2 = model(x4), model(x), model(x2)
        first = graphs(x4)
        out = graphs(x)  # after a full batch: the 4th row must not run the last batch's image again
        assert graphs.captured == [4] and out.shape == (3, 7)
        assert torch.equal(graphs.seen[-1][:3], x) and not graphs.seen[-1][3].any()
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(graphs(x2), ref2, atol=1e-5, rtol=1e-5)  # replayed on new data, no new capture
        assert graphs.captured == [4]
        torch.testing.assert_close(first, ref4, atol=1e-5, rtol=1e-5)  # outputs are the caller's: later replays leave them
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(graphs(x[:1]), ref[:1], atol=1e-5, rtol=1e-5)
        assert graphs.captured == [4, 1]


def test_a_batch_above_the_largest_size_runs_without_a_graph(model):
    graphs = EagerGraphs(model.forward, (1, 2))
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(graphs(x), model(x), atol=1e-5, rtol=1e-5)
    assert graphs.captured == [] and graphs.seen[-1].shape[0] == 5


def test_without_sizes_each_batch_size_gets_its_own_graph_unpadded(model):
    graphs = EagerGraphs(model.forward)
    with torch.no_grad():
        for n in (3, 5, 3):
            x = torch.randn(n, 3, 32, 32)
            torch.testing.assert_close(graphs(x), model(x), atol=1e-5, rtol=1e-5)
            assert graphs.seen[-1].shape[0] == n
    assert graphs.captured == [3, 5]
    with pytest.raises(VitfastError, match="capture\\(\\) needs the batch sizes"):
        graphs.capture((3, 32, 32), torch.float32, "cpu")


def test_capture_takes_every_size_up_front_largest_first(model):
    graphs = EagerGraphs(model.forward, vitfast.batch_buckets(6))
    with torch.no_grad():
        graphs(torch.randn(2, 3, 32, 32))
        graphs.capture((3, 32, 32), torch.float32, "cpu")
        assert graphs.captured == [2, 6, 4, 3, 1]  # 2 was there already
        x = torch.randn(5, 3, 32, 32)
        torch.testing.assert_close(graphs(x), model(x), atol=1e-5, rtol=1e-5)
    assert graphs.captured == [2, 6, 4, 3, 1]


def test_capture_on_cuda_keys_the_graphs_by_the_device_index_tensors_report(model, monkeypatch):
    """An engine on "cuda" captures at start-up; requests arrive as tensors on cuda:N. Keyed by "cuda", every size
    would be captured a second time on its first request."""
    graphs = EagerGraphs(model.forward, (1, 2))
    graphs._capture = lambda shape, dtype, device: (None, None, None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    graphs.capture((3, 32, 32), torch.float16, "cuda")
    assert set(graphs.graphs) == {((n, 3, 32, 32), torch.float16, torch.device("cuda", 0)) for n in (1, 2)}


def test_after_capture_other_image_sizes_run_without_a_graph():
    """A dynamic-size model served with graphs: only the captured image size is graphed, so a client sending new
    sizes cannot make the server capture (and keep) a graph for each."""
    model = randomize(vitfast.create_model(tiny_config(), dynamic_img_size=True)).eval()
    graphs = EagerGraphs(model.forward, (1, 2))
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        graphs.capture((3, 32, 32), torch.float32, "cpu")
        torch.testing.assert_close(graphs(x), model(x), atol=1e-5, rtol=1e-5)
        assert graphs.seen[-1].shape == x.shape
        graphs(torch.randn(1, 3, 32, 32))
    assert graphs.captured == [2, 1] and {key[0] for key in graphs.graphs} == {(1, 3, 32, 32), (2, 3, 32, 32)}


def test_graphs_captured_in_inference_mode_still_run_under_no_grad(model):
    """TorchEngine captures under inference_mode; the same model called under no_grad copies into the graph's input."""
    graphs = EagerGraphs(model.forward, (2,))
    x = torch.randn(1, 3, 32, 32)
    with torch.inference_mode():
        graphs(torch.randn(2, 3, 32, 32))
    with torch.no_grad():
        torch.testing.assert_close(graphs(x), model(x), atol=1e-5, rtol=1e-5)


def test_changing_the_kernel_paths_drops_the_graphs_and_their_pool(model):
    """optimize() again with another attention path: the graphs captured with the old one go, and so do their pool
    and stream (torch refuses a capture into a pool whose graphs are all gone while it still caches blocks)."""
    vitfast.optimize(model)
    graphs = EagerGraphs(model.forward, (1, 2))
    model.forward = graphs
    setattr(model, "_vitfast_cuda_graphs", graphs)
    with torch.no_grad():
        graphs(torch.randn(2, 3, 32, 32))
    graphs.pool, graphs.stream = object(), object()  # as a GPU capture leaves them
    vitfast.optimize(model, attention="sdpa")
    assert graphs.graphs == {} and graphs.pool is None and graphs.stream is None


# ---------------------------------------------------------------------------- TorchEngine
def test_engine_in_bf16_passes_the_bf16_parity_check(checkpoint):
    engine = vitfast.load_engine(checkpoint, dtype=torch.bfloat16)
    assert engine.precision == "bf16" and next(engine.model.parameters()).dtype == torch.bfloat16
    x = torch.randn(4, 3, 32, 32)
    out = engine(x)
    assert out.dtype == torch.float32
    with torch.no_grad():
        ref = vitfast.load_checkpoint(checkpoint).eval()(x)
    assert 0 < (out - ref).abs().max() <= 5e-2 * ref.abs().max()  # bf16's rounding is there, within its limit
    result = check_artifact(engine, checkpoint)
    assert result["passed"] and result["precision"] == "bf16"


def test_optimized_engine_runs_the_kernels_and_matches_the_reference(checkpoint):
    """Under the Triton interpreter (CPU) the optimized engine runs vitfast's kernels in fp32."""
    engine = vitfast.load_engine(checkpoint, optimized=True)
    assert any(type(b).__name__ == "FusedBlock" for b in engine.model.blocks)
    assert "optimized" in repr(engine)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ref = vitfast.load_checkpoint(checkpoint).eval()(x)
    torch.testing.assert_close(engine(x), ref, atol=1e-4, rtol=1e-4)


def test_graphs_without_the_optimized_model_are_refused(checkpoint):
    with pytest.raises(InputError, match="add optimized=True"):
        vitfast.load_engine(checkpoint, cuda_graphs=True)
    with pytest.raises(InputError, match="warm_up readies vitfast's kernels: make the engine with optimized=True"):
        vitfast.load_engine(checkpoint).warm_up(8)


def test_warm_up_without_graphs_runs_every_batch_size_once_largest_first(checkpoint):
    """Without CUDA graphs, warm_up runs the optimized model once per size of batch_buckets (Triton compiles and tunes
    each size bucket then, not at a request)."""
    engine = vitfast.load_engine(checkpoint, optimized=True)
    seen = []
    engine.model.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    assert engine.warm_up(5) == (1, 2, 3, 4, 5)
    assert seen == [5, 4, 3, 2, 1]


@pytest.mark.parametrize("optimized", [True, False])
def test_serve_warms_an_optimized_engine_up_before_starting(checkpoint, tmp_path, monkeypatch, capsys, optimized):
    """An optimized engine is warmed up (with CUDA graphs: captured) for the dynamic batcher's sizes before the server
    binds it; a plain one is served as it is."""
    pytest.importorskip("pytriton", reason="vitfast serve needs PyTriton")
    from vitfast import serve

    warmed = []
    monkeypatch.setattr(TorchEngine, "warm_up", lambda self, max_batch: warmed.append(max_batch) or vitfast.batch_buckets(max_batch))
    monkeypatch.setattr(serve.tempfile, "mkdtemp", lambda prefix: str(tmp_path))

    def stop_here(*_):
        raise RuntimeError("the server would start here")

    monkeypatch.setattr(serve, "_triton", stop_here)
    monkeypatch.setattr(serve, "check_port_free", lambda *_: None)
    with pytest.raises(RuntimeError, match="would start here"):
        serve.start(vitfast.load_engine(checkpoint, optimized=optimized), max_batch_size=12)
    assert warmed == ([12] if optimized else [])
    said = capsys.readouterr().err
    assert ("warmed TorchEngine(" in said and "optimized) up for batches of 1..12 (7 sizes)" in said) == optimized, said


# ---------------------------------------------------------------------------- CLI
def test_check_of_a_checkpoint_at_bf16_compares_with_the_fp32_reference(checkpoint):
    done = run("check", checkpoint, "--precision", "bf16", "--samples", 4, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["passed"] and result["precision"] == "bf16" and result["backend"] == "pytorch"
    assert 0 < result["max_abs_err"] <= result["tolerance"]["limit_abs_err"]


def test_predict_and_eval_with_the_kernels_give_the_reference_answers(checkpoint, images):
    plain = run("predict", checkpoint, images, "--top-k", 2, "--json")
    fused = run("predict", checkpoint, images, "--top-k", 2, "--json", "--optimize")
    assert plain.returncode == 0 and fused.returncode == 0, (plain.stderr, fused.stderr)
    rows, fused_rows = json.loads(plain.stdout)["predictions"], json.loads(fused.stdout)["predictions"]
    assert [r["file"] for r in rows] == [r["file"] for r in fused_rows] and len(rows) == 6
    for a, b in zip(rows, fused_rows):
        assert [c["index"] for c in a["top_k"]] == [c["index"] for c in b["top_k"]]
        assert [c["score"] for c in a["top_k"]] == pytest.approx([c["score"] for c in b["top_k"]], abs=1e-4)
    done = run("eval", checkpoint, "--data", images, "--precision", "bf16", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n"] == 6 and json.loads(done.stdout)["precision"] == "bf16"


@pytest.mark.parametrize("flags, message", [
    (["--cuda-graphs"], "--cuda-graphs replays the optimized model's forward: add --optimize"),
    (["--precision", "fp16"], "set how PyTorch runs a checkpoint; .*model.onnx is an exported artifact"),
])  # fmt: skip
def test_torch_flags_that_cannot_apply_are_refused(checkpoint, images, tmp_path, flags, message):
    onnx_path = tmp_path / "model.onnx"
    if "--precision" in flags:
        pytest.importorskip("onnx", reason="exports an ONNX file")
        assert run("export", "--checkpoint", checkpoint, "--format", "onnx", "--out", onnx_path).returncode == 0
    done = run("predict", onnx_path if "--precision" in flags else checkpoint, images, *flags)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and __import__("re").search(message, done.stderr), done.stderr


# ---------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
def test_gpu_engine_graphs_per_batch_size_match_the_engine_without(checkpoint, device):
    """fp16, optimized: warm_up(8) captures (1, 2, 3, 4, 6, 8) in one pool; batches of 1, 3, 5, 8 replay padded
    graphs, a batch of 11 runs without one; every output matches the same engine without graphs."""
    if device != "cuda":
        pytest.skip("needs a CUDA GPU (run with VITFAST_TEST_DEVICE=cuda)")
    plain = vitfast.load_engine(checkpoint, dtype=torch.float16, optimized=True)
    graphed = vitfast.load_engine(checkpoint, dtype=torch.float16, optimized=True, cuda_graphs=True)
    assert graphed.warm_up(8) == (1, 2, 3, 4, 6, 8)
    assert len(graphed.graphed.graphs) == 6 and graphed.graphed.pool is not None
    for n in (1, 3, 5, 8, 11):
        x = torch.randn(n, 3, 32, 32)
        torch.testing.assert_close(graphed(x), plain(x), atol=2e-3, rtol=2e-3)
    assert len(graphed.graphed.graphs) == 6
