"""`vitfast bench`: statistics on synthetic timings, skip reasons, the JSON schema, the plot, the
CLI (sweep, outputs, --compare, --report) and the FLOPs a row carries. Timings themselves are
never asserted (DESIGN.md 5): only that they are there and consistent."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch

from conftest import tiny_config
from vitfast.bench import backends, measure, report
from vitfast.bench.backends import BackendOptions, Platform, skip_reason
from vitfast.bench.stats import MIN_NOISE, compare_rows, percentile, relative_spread, summarize, verdict
from vitfast.bench.sweep import ROW_FIELDS, Settings, base_row, run_sweep, validate_result
from vitfast.cli import main
from vitfast.errors import ArtifactError, InputError


@pytest.fixture(autouse=True)
def small_matmul_peak(monkeypatch):
    """A 256^3 matmul for the ceiling: the real 2048^3 one takes seconds on a CI CPU."""
    monkeypatch.setattr(measure, "CPU_MATMUL", (256, torch.float32))


# ---------------------------------------------------------------------------- statistics
def test_percentiles_interpolate_linearly():
    samples = list(range(100, 0, -1))  # 1..100 ms, unsorted
    assert percentile(samples, 50) == pytest.approx(50.5)
    assert percentile(samples, 95) == pytest.approx(95.05)
    assert percentile(samples, 99) == pytest.approx(99.01)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_of_two_repeats():
    first, second = [10.0] * 10, [11.0] * 9 + [100.0]  # one outlier in the second repeat
    s = summarize([first, second], batch=8, gflops_per_image=2.0)
    assert s["n"] == 20
    assert s["median_ms"] == pytest.approx(10.5) and s["p50_ms"] == s["median_ms"]
    assert s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"] <= s["max_ms"] == 100.0
    assert s["repeat_medians_ms"] == [10.0, 11.0]
    assert s["spread"] == pytest.approx(0.1)  # medians 10 and 11: the outlier does not move it
    assert s["images_per_s"] == pytest.approx(8 / 10.5e-3)
    assert s["tflops"] == pytest.approx(16 / 10.5)  # 16 GFLOP in 10.5 ms = 1.52 TFLOP/s


def test_verdict_respects_the_noise():
    assert relative_spread([10.0, 12.0, 11.0]) == pytest.approx(0.2)
    assert verdict(1.5, 0.1) == "win"
    assert verdict(1 / 1.5, 0.1) == "regression"
    assert verdict(1.08, 0.1) == "same"  # inside the rows' own spread
    assert verdict(1 + MIN_NOISE / 2, 0.0) == "same"  # never closer than the floor


def _row(backend: str, batch: int, ms: list[float], status: str = "ok") -> dict:
    row = base_row(tiny_config(), backend, "fp32", batch)
    if status != "ok":
        return row | {"status": status, "reason": "not here"}
    return row | {"status": "ok", "samples_ms": [ms, ms]} | summarize([ms, [t * 1.01 for t in ms]], batch, row["gflops_per_image"])


def test_compare_rows_ratios_and_verdicts():
    base = [_row("eager", 1, [10.0] * 5), _row("eager", 8, [40.0] * 5), _row("compile", 1, [8.0] * 5), _row("onnxruntime", 1, [], "skipped")]
    new = [_row("eager", 1, [5.0] * 5), _row("eager", 8, [80.0] * 5), _row("compile", 1, [8.05] * 5), _row("onnxruntime", 1, [3.0] * 5),
           _row("eager-math", 1, [9.0] * 5)]  # fmt: skip
    out = {(r["backend"], r["batch"]): r for r in compare_rows(base, new)}
    assert out[("eager", 1)]["throughput_ratio"] == pytest.approx(2.0) and out[("eager", 1)]["verdict"] == "win"
    assert out[("eager", 1)]["latency_ratio"] == pytest.approx(0.5)
    assert out[("eager", 8)]["verdict"] == "regression"
    assert out[("compile", 1)]["verdict"] == "same"
    assert out[("compile", 1)]["noise"] == pytest.approx(0.01)
    assert out[("onnxruntime", 1)]["status"] == "base skipped, new ok"
    assert out[("eager-math", 1)]["status"] == "only in new"
    loose = {(r["backend"], r["batch"]): r for r in compare_rows(base, new, floor=1.5)}
    assert loose[("eager", 1)]["verdict"] == "same"  # a 2x change inside a 150% noise floor


# ---------------------------------------------------------------------------- skip logic
def _platform(**kw) -> Platform:
    fields = dict(cuda=False, triton_interpret=False, triton=True, cxx="/usr/bin/g++", onnxruntime=None,
                  ort_providers=("CPUExecutionProvider",), tensorrt="TensorRT is not installed: pip install tensorrt")  # fmt: skip
    return Platform(**(fields | kw))


def test_skip_reasons_name_the_cause():
    cfg, opts = tiny_config(), BackendOptions()
    cpu, gpu = _platform(), _platform(cuda=True, tensorrt=None, ort_providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    assert skip_reason("eager", "fp32", cpu, opts, cfg) is None
    assert skip_reason("onnxruntime", "int8", cpu, opts, cfg) is None
    assert "int8" in skip_reason("eager", "int8", cpu, opts, cfg)
    assert "CUDA GPU" in skip_reason("vitfast", "fp16", cpu, opts, cfg)
    assert "interpreter" in skip_reason("vitfast-graphs", "fp16", _platform(triton_interpret=True), opts, cfg)
    assert skip_reason("vitfast", "fp16", gpu, opts, cfg) is None
    assert "C++ compiler" in skip_reason("compile", "fp32", _platform(cxx=None), opts, cfg)
    assert "CUDA GPU" in skip_reason("vitfast-compile", "fp16", cpu, opts, cfg)  # optimize() first, then compile
    assert skip_reason("vitfast-compile", "fp16", gpu, opts, cfg) is None
    assert "bf16" in skip_reason("onnxruntime", "bf16", cpu, opts, cfg)
    assert "no int8 kernels" in skip_reason("onnxruntime", "int8", gpu, opts, cfg)
    assert "not installed" in skip_reason("onnxruntime", "fp32", _platform(onnxruntime="onnxruntime is not installed"), opts, cfg)
    assert "CUDAExecutionProvider" in skip_reason("onnxruntime", "fp32", cpu, BackendOptions(ort_provider="cuda"), cfg)
    assert "NVIDIA GPU" in skip_reason("tensorrt", "fp16", cpu, opts, cfg)
    assert "not installed" in skip_reason("tensorrt", "fp16", _platform(cuda=True), opts, cfg)
    assert "--engine" in skip_reason("tensorrt", "fp16", gpu, opts, cfg)
    assert skip_reason("openvino", "int8", _platform(openvino=None), opts, cfg) is None
    assert "bf16" in skip_reason("openvino", "bf16", _platform(openvino=None), opts, cfg)
    assert "vitfast[openvino]" in skip_reason("openvino", "fp32", _platform(openvino="OpenVINO is not installed: pip install 'vitfast[openvino]'"), opts, cfg)


def test_tensorrt_engine_is_matched_by_config_and_precision(tmp_path):
    cfg = tiny_config(name="tiny")
    engine = tmp_path / "tiny.engine"
    engine.write_bytes(b"not read by the skip logic")
    (tmp_path / "tiny.engine.json").write_text(json.dumps({"precision": "fp16", "config": cfg.to_dict()}))
    gpu = _platform(cuda=True, tensorrt=None)
    opts = BackendOptions(engines=[str(engine)])
    assert skip_reason("tensorrt", "fp16", gpu, opts, cfg) is None
    assert "tiny.engine: tiny fp16" in skip_reason("tensorrt", "int8", gpu, opts, cfg)
    assert "no --engine" in skip_reason("tensorrt", "fp16", gpu, opts, tiny_config(depth=3))
    older = {k: v for k, v in cfg.to_dict().items() if k != "dist_head"}  # a sidecar from before a config field existed
    (tmp_path / "tiny.engine.json").write_text(json.dumps({"precision": "fp16", "config": older}))
    assert skip_reason("tensorrt", "fp16", gpu, opts, cfg) is None


# ---------------------------------------------------------------------------- sweep + schema
@pytest.fixture(scope="module")
def sweep() -> dict:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(measure, "CPU_MATMUL", (256, torch.float32))
        settings = Settings(models=[tiny_config(name="tiny")], backends=["eager", "eager-math", "vitfast", "tensorrt"],
                            batches=[1, 3], precisions=["fp32", "int8"], repeats=6, warmup=1, buffers=2)  # fmt: skip
        return run_sweep(settings, command="test sweep")


def test_sweep_result_schema(sweep):
    result = validate_result(json.loads(json.dumps(sweep)))  # survives a JSON round trip
    assert len(result["rows"]) == 4 * 2 * 2
    for row in result["rows"]:
        assert set(ROW_FIELDS) <= set(row)
    env = result["environment"]
    assert env["command"] == "test sweep" and env["versions"]["torch"] == torch.__version__
    assert env["cpu"]["model"] and env["cpu"]["torch_threads"] >= 1 and "loadavg_end" in env["cpu"]
    assert "sha" in env["git"] and "gpu" in env
    assert result["peak"]["tflops"] > 0 and result["peak"]["dtype"] == "float32"
    assert len(result["peak"]["measurements"]) == 2  # before and after the sweep


def test_sweep_rows_measured_or_skipped_with_reason(sweep):
    rows = {(r["backend"], r["precision"], r["batch"]): r for r in sweep["rows"]}
    for batch in (1, 3):
        ok = rows[("eager", "fp32", batch)]
        assert ok["status"] == "ok" and ok["reason"] is None
        assert len(ok["samples_ms"]) == 2 and all(len(rep) == 6 for rep in ok["samples_ms"])
        assert ok["p50_ms"] <= ok["p95_ms"] <= ok["p99_ms"]
        assert ok["images_per_s"] == pytest.approx(batch * 1e3 / ok["median_ms"])
        assert ok["pct_of_peak"] == pytest.approx(100 * ok["tflops"] / sweep["peak"]["tflops"])
        assert ok["peak_memory_mib"] is not None or "cannot" in ok["memory_method"]
        assert ok["timer"] == "perf_counter_ns" and ok["runs_on"] == "cpu"
        assert rows[("eager-math", "fp32", batch)]["details"]["attention"].startswith("explicit")
    assert "int8" in rows[("eager", "int8", 1)]["reason"]
    assert rows[("vitfast", "fp32", 1)]["status"] == "skipped"
    assert "interpreter" in rows[("vitfast", "fp32", 1)]["reason"]  # tests run under TRITON_INTERPRET=1
    assert "GPU" in rows[("tensorrt", "fp32", 3)]["reason"]


def test_printed_tables_keep_brackets_that_rich_would_read_as_markup(sweep):
    """A skip reason's fix "pip install 'vitfast[onnx]'" printed as "pip install 'vitfast'" (rich took [onnx] for a tag)."""
    from rich.console import Console

    result = json.loads(json.dumps(sweep))
    skipped = next(r for r in result["rows"] if r["status"] != "ok")
    skipped["reason"] = "onnxruntime is not installed: pip install 'vitfast[onnx]'"
    result["rows"][0]["model"] = "tiny[v2]"
    for compact in (False, True):
        console = Console(record=True, width=400)
        for table in report.rich_tables(result, compact=compact):
            console.print(table)
        text = console.export_text()
        assert "pip install 'vitfast[onnx]'" in text and "tiny[v2]" in text, compact


def test_every_compiled_row_is_compiled_past_dynamos_recompile_limit(monkeypatch):
    """2 models x 9 batch sizes: 18 compiled entries of one forward code object, past Dynamo's limit of 8, after
    which it runs the forward eagerly without an error (the H100 run of 18ef7c3 timed eager as "compile" so)."""
    graphs, real_compile = [], torch.compile

    def counting_backend(gm, example_inputs):  # Dynamo without Inductor: no C++ build in a test
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda model, mode=None, dynamic=None: real_compile(model, backend=counting_backend, dynamic=dynamic))
    monkeypatch.setattr(backends, "_compile_reason", lambda platform: None)
    monkeypatch.setattr(measure, "CPU_MATMUL", (64, torch.float32))
    models = [tiny_config(name="a", depth=1), tiny_config(name="b", depth=1, num_heads=2)]
    result = run_sweep(Settings(models=models, backends=["compile"], batches=list(range(1, 10)), precisions=["fp32"],
                                repeats=1, warmup=0, max_seconds=0.1))  # fmt: skip
    assert [r["status"] for r in result["rows"]] == ["ok"] * 18
    assert len(graphs) == 18


def test_flops_of_vit_base_through_the_bench_row():
    result = run_sweep(Settings(models=["vit_base_patch16_224"], backends=["tensorrt"], batches=[1], precisions=["fp16"]))
    (row,) = result["rows"]
    assert row["status"] == "skipped"
    assert 17.5 <= row["gmacs_per_image"] <= 17.6
    assert row["gflops_per_image"] == pytest.approx(2 * row["gmacs_per_image"])


def test_validate_result_rejects_foreign_and_broken_files(sweep):
    with pytest.raises(ArtifactError, match="schema"):
        validate_result({"rows": []}, "x.json")
    broken = json.loads(json.dumps(sweep))
    del broken["rows"][0]["p99_ms"]
    with pytest.raises(ArtifactError, match="p99_ms"):
        validate_result(broken)
    broken = json.loads(json.dumps(sweep))
    broken["rows"][-1]["reason"] = None  # a skipped row must say why
    with pytest.raises(ArtifactError, match="without a reason"):
        validate_result(broken)


# ---------------------------------------------------------------------------- presentation
def test_plot_has_the_expected_series_and_is_a_png(sweep, tmp_path):
    from PIL import Image

    fig = report.build_figure(sweep)
    top, bottom = fig.axes[0], fig.axes[1]
    assert [line.get_label() for line in top.get_lines()] == ["eager fp32", "eager-math fp32"]
    eager = next(r for r in sweep["rows"] if r["backend"] == "eager" and r["precision"] == "fp32" and r["batch"] == 3)
    assert list(top.get_lines()[0].get_xdata()) == [1, 3]
    assert top.get_lines()[0].get_ydata()[1] == pytest.approx(eager["images_per_s"])
    labels = [line.get_label() for line in bottom.get_lines()]
    assert labels == [f"{s} p{q}" for s in ("eager fp32", "eager-math fp32") for q in (50, 95, 99)]
    assert bottom.get_lines()[2].get_ydata()[1] == pytest.approx(eager["p99_ms"])
    assert [t.get_text() for t in bottom.get_legend().get_texts()] == ["eager fp32", "eager-math fp32", "p50", "p95", "p99"]
    assert top.get_ylabel() == "images / s" and top.get_xlabel() == "batch"
    path = tmp_path / "plot.png"
    report.save_plot(sweep, path)
    with Image.open(path) as img:
        assert img.format == "PNG" and img.width > 300 and img.height > 300
    with pytest.raises(InputError, match="nothing to plot"):
        report.build_figure(sweep | {"rows": [r for r in sweep["rows"] if r["status"] != "ok"]})


def test_markdown_and_csv(sweep):
    md = report.to_markdown(sweep)
    assert md.startswith("| model | img | backend |")
    assert "| tiny | 32 | eager | fp32 | 3 |" in md
    assert "vitfast fp32 (tiny@32, batch 1,3): skipped: TRITON_INTERPRET=1" in md
    rows = list(csv.DictReader(io.StringIO(report.to_csv(sweep))))
    assert len(rows) == 16 and {r["status"] for r in rows} == {"ok", "skipped"}


# ---------------------------------------------------------------------------- CLI
def test_cli_sweep_outputs_compare_and_report(tmp_path, capsys):
    out, csv_path, plot, md = (tmp_path / n for n in ("r.json", "r.csv", "r.png", "r.md"))
    argv = ["bench", "--model", "vit_tiny_patch16_224", "--img-size", "32", "--backends", "eager,vitfast", "--batch", "1,2",
            "--repeats", "5", "--warmup", "1", "--out", str(out), "--csv", str(csv_path), "--plot", str(plot), "--markdown", str(md)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "vitfast bench on" in printed.out and "not measured" in printed.out
    result = json.loads(out.read_text())
    validate_result(result)
    assert result["environment"]["command"].startswith("vitfast bench --model vit_tiny_patch16_224 --backends eager,vitfast --batch 1,2")
    assert f"--out {out}" in result["environment"]["command"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "| eager |" in md.read_text() and csv_path.exists()

    assert main(argv) == 2  # outputs exist: refused before measuring anything
    assert "already exists" in capsys.readouterr().err

    assert main(["bench", "--compare", str(out), str(out), "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    ok = [r for r in compared["rows"] if r["status"] == "ok"]
    assert len(ok) == 2 and all(r["verdict"] == "same" and r["throughput_ratio"] == 1.0 for r in ok)
    assert main(["bench", "--compare", str(out), str(out)]) == 0
    assert "verdict" in capsys.readouterr().out

    assert main(["bench", "--report", str(out)]) == 0
    readme = capsys.readouterr().out
    assert "# Benchmarks" in readme and result["environment"]["command"] in readme
    assert "| vit_tiny_patch16_224 | 32 | eager | fp32 | 1 |" in readme
    assert "GPU sweep (not measured yet)" in readme and "--batch 1,8,64,256 --precision fp16" in readme
    kernels = tmp_path / "kernels-abc.json"  # another script's output without flat rows: named only
    kernels.write_text(json.dumps({"environment": {}, "attention": []}))
    int8 = tmp_path / "cpu-int8-abc.json"  # another script's flat rows: shown as a table with its command
    int8.write_text(json.dumps({"model": "vit_small_patch16_224", "batch": 8,
                                "environment": {"command": "python benchmarks/cpu_int8.py --threads 1", "git_sha": "abc123", "threads": 1},
                                "rows": [{"backend": "onnxruntime fp32", "median_ms": 820.54, "nested": {"x": 1}},
                                         {"backend": "onnxruntime int8", "median_ms": 353.5, "nested": {"x": 2}}]}))  # fmt: skip
    assert main(["bench", "--report", str(out), str(kernels), str(int8)]) == 0
    readme = capsys.readouterr().out
    assert "Also in `results/` (see each file's command): `kernels-abc.json`" in readme
    assert "### `cpu-int8-abc.json`" in readme and "python benchmarks/cpu_int8.py --threads 1" in readme
    assert "git `abc123`, threads 1, model vit_small_patch16_224, batch 8\n" in readme
    assert "CPU" not in readme.split("### `cpu-int8-abc.json`")[1].split("| backend")[0]  # no machine recorded, none printed
    assert "| backend | median_ms |\n|---|---|\n| onnxruntime fp32 | 821 |\n| onnxruntime int8 | 354 |" in readme  # nested column dropped
    assert main(["bench", "--report", str(kernels)]) == 2



def test_report_names_the_machine_of_another_scripts_rows():
    """Two CPU-runtime files from different machines: each section says which CPU, load and runtimes."""
    rows = [{"runtime": "onnxruntime fp32", "images_per_s": 24.1}]
    others = []
    for name, cpu, load in (("cpu-runtimes-a.json", "AMD EPYC", 0.8), ("cpu-runtimes-b.json", "Intel(R) Xeon(R) Processor", 0.5)):
        env = {"command": f"python benchmarks/cpu_runtimes.py --out {name}", "git_sha": "abc123", "threads": 2, "cpu": cpu,
               "logical_cpus": 2, "loadavg_start": [load, 0, 0], "loadavg_end": [1.9, 0, 0],
               "versions": {"torch": "2.13.0+cpu", "onnxruntime": "1.32.0", "openvino": "2026.4.1", "nncf": None, "tensorrt": None}}
        others.append((name, {"environment": env, "rows": rows}))
    readme = report.render_readme([], others)
    a, b = readme.split("### `cpu-runtimes-a.json`")[1].split("### `cpu-runtimes-b.json`")
    assert "CPU AMD EPYC (2 logical); load average 0.8 at start, 1.9 at end; torch 2.13.0+cpu; onnxruntime 1.32.0; openvino 2026.4.1\n" in a
    assert "CPU Intel(R) Xeon(R) Processor (2 logical); load average 0.5 at start" in b
    assert "nncf" not in a and "tensorrt" not in a.split("| runtime")[0].lower()  # absent libraries are not named


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["bench", "--model", "vit_tiny_patch16_224", "--backends", "eager,warp-drive"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "warp-drive" in err and "eager-math" in err
    assert main(["bench", "--model", "vit_tiny_patch16_224", "--batch", "1,x"]) == 2
    assert "positive integers" in capsys.readouterr().err
    assert main(["bench"]) == 2
    assert "--model" in capsys.readouterr().err
    foreign = tmp_path / "other.json"
    foreign.write_text("{}")
    assert main(["bench", "--compare", str(foreign), str(foreign)]) == 2
    assert "not a `vitfast bench --out` file" in capsys.readouterr().err


def test_compare_and_report_refuse_the_sweeps_flags_they_would_ignore(sweep, tmp_path, capsys):
    """--compare and --report measure and write nothing: --out, --csv, --model ... were silently dropped (rc 0, no file)."""
    result = tmp_path / "r.json"
    result.write_text(json.dumps(sweep))
    for argv, refused in [(["--compare", str(result), str(result), "--out", str(tmp_path / "c.json"), "--csv", str(tmp_path / "c.csv"),
                            "--model", "vit_base_patch16_224"], "--model, --out, --csv do not apply to --compare"),
                          (["--report", str(result), "--markdown", str(tmp_path / "r.md")], "--markdown does not apply to --report"),
                          (["--report", str(result), "--plot", str(tmp_path / "r.png"), "--json", "--noise-floor", "0.1"],
                           "--plot, --json, --noise-floor do not apply to --report"),
                          (["--model", "vit_tiny_patch16_224", "--noise-floor", "0.1"], "--noise-floor sets what --compare calls a change")]:  # fmt: skip
        assert main(["bench", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"vitfast: error: {refused}") and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # nothing written
    with pytest.raises(SystemExit):
        main(["bench", "--compare", str(result), str(result), "--report", str(result)])
    assert "argument --report: not allowed with argument --compare" in capsys.readouterr().err
    for bad in ("nan", "-1"):
        with pytest.raises(SystemExit):
            main(["bench", "--compare", str(result), str(result), "--noise-floor", bad])
        assert f"must be a finite number >= 0, got '{bad}'" in capsys.readouterr().err
    assert main(["bench", "--compare", str(result), str(result), "--noise-floor", "0.1", "--json"]) == 0
    compared = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"bare {name} in --json"))
    assert compared["noise_floor"] == 0.1 and any(r["status"] != "ok" for r in compared["rows"])
    odd = json.loads(json.dumps(sweep))
    next(r for r in odd["rows"] if r["status"] == "ok")["p99_ms"] = float("nan")  # a hand-edited file (Python's json reads NaN)
    (tmp_path / "odd.json").write_text(json.dumps(odd))
    assert main(["bench", "--compare", str(result), str(tmp_path / "odd.json"), "--json"]) == 0
    compared = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"bare {name} in --json"))
    assert None in [r.get("p99_ratio", 0) for r in compared["rows"]]  # strict JSON: null


def test_a_sweep_whose_every_row_failed_exits_2(sweep, monkeypatch, capsys):
    """`--work-dir` on a read-only disk: every row was `error`, and the exit code 0."""
    from vitfast.cli import bench as cli_bench

    failed = json.loads(json.dumps(sweep))
    for row in failed["rows"]:
        row |= {"status": "error", "reason": "OutputError: cannot write /ro/x.onnx: read-only filesystem"}
    monkeypatch.setattr(cli_bench, "run_sweep", lambda settings, **kwargs: failed)
    for json_flag in ([], ["--json"]):
        assert main(["bench", "--model", "vit_tiny_patch16_224", *json_flag]) == 2
        err = capsys.readouterr().err.splitlines()
        assert err[-1] == (f"vitfast: error: every row failed (the first: {failed['rows'][0]['backend']}: OutputError: cannot "
                           "write /ro/x.onnx: read-only filesystem)")  # fmt: skip
    failed["rows"][0]["status"] = "skipped"  # a backend this machine lacks: reported, not a failure of the run
    assert main(["bench", "--model", "vit_tiny_patch16_224"]) == 0


def test_two_outputs_naming_one_file_are_refused_before_measuring(tmp_path, monkeypatch, capsys):
    """--out r.json --csv r.json used to measure everything, write r.json and then refuse the CSV (or, with
    --force, overwrite the JSON with it)."""
    from vitfast.cli import bench as bench_cli

    monkeypatch.setattr(bench_cli, "run_sweep", lambda *a, **k: pytest.fail("measured before refusing"))
    monkeypatch.chdir(tmp_path)
    sweep = ["bench", "--model", "vit_tiny_patch16_224", "--backends", "eager", "--batch", "1"]
    for outputs in (["--out", "r.json", "--csv", "r.json"], ["--out", "r.json", "--markdown", str(tmp_path / "r.json"), "--force"],
                    ["--csv", "r.csv", "--markdown", "./sub/../r.csv"]):  # fmt: skip
        assert main(sweep + outputs) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "both name" in err and "its own file" in err
    assert list(tmp_path.iterdir()) == []


def test_an_output_naming_an_input_is_refused_before_measuring(tmp_path, monkeypatch, capsys):
    """--out model.onnx --artifact model.onnx --force would replace the measured model with the results."""
    from vitfast.cli import bench as bench_cli

    monkeypatch.setattr(bench_cli, "run_sweep", lambda *a, **k: pytest.fail("measured before refusing"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"graph")
    assert main(["bench", "--artifact", "model.onnx", "--out", "./model.onnx", "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is the input --artifact model.onnx" in err
    assert (tmp_path / "model.onnx").read_bytes() == b"graph"
    assert main(["bench", "--model", "vit_tiny_patch16_224", "--batch", "1,01", "--backends", "eager"]) == 2
    assert "more than once" in capsys.readouterr().err


class _TensorRTHere(Platform):
    """CUDA with TensorRT as far as the skip logic can tell, while tensors stay on this machine's CPU."""

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")


def test_an_unusable_engine_is_a_skipped_row_and_keeps_the_measured_ones(tmp_path, monkeypatch, capsys):
    """An --engine without its sidecar (built by trtexec) used to crash the sweep after every other backend was
    measured; a missing one is refused up front."""
    from vitfast.bench import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "detect_platform", lambda names: _TensorRTHere(**vars(_platform(cuda=True, tensorrt=None))))
    trtexec = tmp_path / "trtexec.engine"
    trtexec.write_bytes(b"serialized by trtexec: no vitfast sidecar")
    settings = Settings(models=[tiny_config(name="tiny")], backends=["eager", "tensorrt"], batches=[1], precisions=["fp32"],
                        repeats=2, warmup=0, options=BackendOptions(engines=[str(trtexec)]))  # fmt: skip
    eager, tensorrt = run_sweep(settings)["rows"]
    assert eager["status"] == "ok"
    assert tensorrt["status"] == "skipped" and "trtexec.engine.json" in tensorrt["reason"]
    assert f"--artifact {trtexec}" in tensorrt["reason"]

    def broken(backend, *args):  # whatever else goes wrong in a backend's checks fails its rows only
        if backend == "tensorrt":
            raise RuntimeError("unexpected")
        return None

    monkeypatch.setattr(sweep_module, "skip_reason", broken)
    eager, tensorrt = run_sweep(settings)["rows"]
    assert eager["status"] == "ok" and (tensorrt["status"], tensorrt["reason"]) == ("error", "RuntimeError: unexpected")

    assert main(["bench", "--model", "vit_tiny_patch16_224", "--backends", "tensorrt", "--engine", str(tmp_path / "gone.engine")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--engine" in err and "gone.engine: no such file" in err


def test_artifacts_with_one_file_name_get_their_own_rows_and_compare_refuses_a_merge(tmp_path, monkeypatch, capsys):
    """a/model.onnx and b/model.onnx (Optimum and Hub exports) were both labelled model.onnx, and --compare
    silently kept one of them."""
    import vitfast
    from vitfast.bench.sweep import artifact_labels

    assert artifact_labels(["dir/model.onnx"]) == ["model.onnx"]
    assert artifact_labels(["x/a/model.onnx", "y/a/model.onnx", "b.onnx"]) == ["x/a/model.onnx", "y/a/model.onnx", "b.onnx"]
    assert artifact_labels(["model.onnx", "v2/model.onnx", "/abs/v2/model.onnx"]) == ["model.onnx", "v2/model.onnx", "abs/v2/model.onnx"]
    for folder in ("a", "b"):
        vitfast.save_checkpoint(vitfast.create_model(tiny_config(name="tiny")), tmp_path / folder / "model.safetensors")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="more than once"):
        Settings(models=[], backends=["eager"], batches=[1], precisions=["fp32"],
                 artifacts=["a/model.safetensors", f"{tmp_path}/a/model.safetensors"])  # fmt: skip
    result = run_sweep(Settings(models=[], backends=["eager"], batches=[1], precisions=["fp32"], repeats=2, warmup=0,
                                artifacts=["a/model.safetensors", "b/model.safetensors"]))  # fmt: skip
    assert [(r["model"], r["status"]) for r in result["rows"]] == [("a/model.safetensors", "ok"), ("b/model.safetensors", "ok")]
    assert [r["status"] for r in compare_rows(result["rows"], result["rows"])] == ["ok", "ok"]
    merged = [r | {"model": "model.safetensors"} for r in result["rows"]]  # as labelled before
    with pytest.raises(ArtifactError, match="the new result has two rows for model.safetensors at 32px"):
        compare_rows(result["rows"], merged)
    assert main(["bench", "--model", "vit_tiny_patch16_224", "--batch", "1,8,1"]) == 2
    assert "--batch lists 1 more than once" in capsys.readouterr().err


def test_report_supersedes_only_a_sweep_of_the_same_rows(sweep):
    """An fp32 sweep and a later int8 one (same device, models, backends) used to hide each other."""

    def result(time_utc: str, **settings) -> dict:
        copy = json.loads(json.dumps(sweep))
        copy["settings"] |= settings
        copy["environment"]["time_utc"] = time_utc
        return copy

    runs = [("fp32.json", result("2026-01-01T00:00:00", precisions=["fp32"])), ("int8.json", result("2026-01-02T00:00:00", precisions=["int8"])),
            ("batch64.json", result("2026-01-03T00:00:00", precisions=["int8"], batches=[64])),
            ("img64.json", result("2026-01-04T00:00:00", precisions=["int8"], img_sizes=[64])),
            ("artifact.json", result("2026-01-05T00:00:00", precisions=["int8"], artifacts=["a/model.onnx"])),
            ("fp32-again.json", result("2026-01-06T00:00:00", precisions=["fp32"]))]  # fmt: skip
    readme = report.render_readme(runs)
    shown = [name for name, _ in runs if f"`{name}` (git" in readme]
    assert shown == ["int8.json", "batch64.json", "img64.json", "artifact.json", "fp32-again.json"]
    assert "superseded by the runs above: `fp32.json`." in readme


def test_recorded_command_parses_back_to_the_same_settings(tmp_path, monkeypatch):
    """The command a result records repeats the sweep: --ov-hint (it changes OpenVINO's figures) and a --work-dir
    other than the user's cache were missing, and paths were not quoted for a shell."""
    import shlex

    from PIL import Image

    from vitfast.cli.bench import settings_from_args
    from vitfast.cli.main import build_parser

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calib, engine, artifact = tmp_path / "calib dir", tmp_path / "vit s.engine", tmp_path / "a b" / "model.onnx"
    calib.mkdir()
    Image.new("RGB", (8, 8)).save(calib / "0.png")
    artifact.parent.mkdir()
    for path in (engine, artifact):
        path.write_bytes(b"")
    argv = ["bench", "--model", "vit_tiny_patch16_224,vit_small_patch16_224", "--artifact", str(artifact), "--backends", "eager,openvino",
            "--batch", "1,8", "--precision", "fp32,int8", "--img-size", "64,96", "--repeats", "7", "--warmup", "2", "--max-seconds", "2.5",
            "--buffers", "3", "--compile-mode", "max-autotune", "--engine", str(engine), "--ort-provider", "cpu", "--threads", "2",
            "--ov-hint", "throughput", "--work-dir", str(tmp_path / "my work"), "--calib-samples", "4", "--calib-dir", str(calib)]  # fmt: skip
    parse = build_parser().parse_args
    commands = []
    for given in (argv, argv[:-10] + argv[-4:], ["bench", "--model", "vit_tiny_patch16_224"]):  # every option; some; none
        settings = settings_from_args(parse(given))
        commands.append(settings.command())
        assert commands[-1].startswith("vitfast bench ")
        assert settings_from_args(parse(shlex.split(commands[-1])[1:])) == settings, commands[-1]
    assert "--ov-hint throughput" in commands[0] and f"--work-dir '{tmp_path}/my work'" in commands[0]
    assert "--ov-hint" not in commands[1] and "--work-dir" not in commands[1]  # OpenVINO's default; the user's cache


def test_a_cached_export_is_not_reused_by_other_sources_or_tool_versions(tmp_path, monkeypatch):
    """The cache is shared by every checkout and the version is 0.1.0 throughout development: keyed by the version
    alone, a commit whose exporter changed measured the graph an earlier commit had exported."""
    assert {p.name for p in backends.export_sources()} >= {"onnx_export.py", "quantize.py", "model.py", "layers.py", "config.py"}
    source = tmp_path / "onnx_export.py"
    source.write_text("opset = 17\n")
    monkeypatch.setattr(backends, "export_sources", lambda: [source])
    cfg, opts = tiny_config(name="tiny"), BackendOptions(work_dir=tmp_path / "cache")
    first = backends._artifact_path(cfg, "fp32", opts, "cpu")
    assert backends._artifact_path(cfg, "fp32", opts, "cpu") == first  # the same tree reuses its file
    source.write_text("opset = 18\n")
    changed = backends._artifact_path(cfg, "fp32", opts, "cpu")
    assert changed != first
    real = backends.library_version
    monkeypatch.setattr(backends, "library_version", lambda name: "9.9.9" if name == "onnxruntime" else real(name))
    assert backends._artifact_path(cfg, "fp32", opts, "cpu") != changed


def test_git_state_names_vitfasts_checkout_never_the_repository_around_an_installed_copy(tmp_path, monkeypatch):
    """An installed vitfast lives in site-packages, often in a venv inside the user's own repository: git run there
    recorded the user's project's commit as the one measured."""
    import subprocess

    def repo(path, files):
        path.mkdir(parents=True)
        for name, text in files.items():
            (path / name).write_text(text)
        git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    monkeypatch.delenv("VITFAST_GIT_SHA", raising=False)
    repo(tmp_path / "project", {"pyproject.toml": '[project]\nname = "my-app"\n'})
    site = tmp_path / "project" / ".venv" / "lib" / "site-packages"
    (site / "vitfast" / "bench").mkdir(parents=True)
    monkeypatch.setattr(measure, "__file__", str(site / "vitfast" / "bench" / "measure.py"))
    assert measure.git_state() == {"sha": None, "dirty": None, "changed_files": [], "source": "installed package"}
    sha = repo(tmp_path / "vitfast-src", {"pyproject.toml": '[project]\nname = "vitfast"\n'})
    (tmp_path / "vitfast-src" / "vitfast" / "bench").mkdir(parents=True)
    monkeypatch.setattr(measure, "__file__", str(tmp_path / "vitfast-src" / "vitfast" / "bench" / "measure.py"))
    assert measure.git_state() == {"sha": sha, "dirty": False, "changed_files": [], "source": "git checkout"}


def test_an_engine_row_times_the_backends_run_not_its_input_checks(tmp_path, monkeypatch):
    """ONNX Runtime / OpenVINO / TensorRT rows timed `Engine.__call__`: its input checks (a full isfinite scan, a
    blocking sync on a GPU) ran in every timed call, which the PyTorch rows' forward does not pay."""
    pytest.importorskip("onnxruntime")
    from vitfast.runtime.onnx_engine import OnnxEngine

    calls = {"prepare": 0, "run": 0}
    prepare, run = OnnxEngine.prepare, OnnxEngine._run

    def counted(name, method):
        def wrapper(self, x):
            calls[name] += 1
            return method(self, x)

        return wrapper

    monkeypatch.setattr(OnnxEngine, "prepare", counted("prepare", prepare))
    monkeypatch.setattr(OnnxEngine, "_run", counted("run", run))
    settings = Settings(models=[tiny_config(name="tiny")], backends=["onnxruntime"], batches=[2], precisions=["fp32"], repeats=5,
                        warmup=2, buffers=3, options=BackendOptions(work_dir=tmp_path / "cache"))  # fmt: skip
    (row,) = run_sweep(settings)["rows"]
    assert row["status"] == "ok", row["reason"]
    timed = 1 + settings.warmup + sum(len(rep) for rep in row["samples_ms"])  # the first call, warm-up, both repeats
    assert calls["run"] >= timed  # (exporting runs the graph too)
    assert calls["prepare"] == settings.buffers  # once per input buffer, before any timed call
    assert "the session's run" in row["details"]["timed"]
    # an engine taking another dtype (a TensorRT engine's fp16, a checkpoint's bf16) gets its inputs cast before timing too
    from vitfast.runtime import TorchEngine

    engine = TorchEngine(backends.seeded_model(tiny_config(name="tiny")), device="cpu", dtype=torch.bfloat16)
    parts = backends._engine_call(engine, engine.dtype)
    assert parts["prepare"](torch.randn(2, 3, 32, 32)).dtype == torch.bfloat16 and parts["call"] == engine._run


def test_the_first_backend_is_not_charged_the_processs_one_time_allocations(monkeypatch):
    """A process's first forward allocates for good (thread pools, kernels' scratch): with the baseline taken before
    the first backend was built, its peak held them (ViT-S, 64 px, batch 4 on a CPU: 104 MiB measured first, 89 second).
    A throwaway forward now runs before any baseline."""
    model_class = type(backends.seeded_model(tiny_config()))
    events, forward, baseline = [], model_class.forward, measure.MemoryProbe.baseline

    def logged(name, method):
        def wrapper(self, *args, **kwargs):
            events.append(name)
            return method(self, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(model_class, "forward", logged("forward", forward))
    monkeypatch.setattr(measure.MemoryProbe, "baseline", logged("baseline", baseline))
    result = run_sweep(Settings(models=[tiny_config(name="tiny")], backends=["eager", "eager-math"], batches=[2], precisions=["fp32"],
                                repeats=2, warmup=0))  # fmt: skip
    assert [r["status"] for r in result["rows"]] == ["ok", "ok"]
    assert events.index("forward") < events.index("baseline")


def test_the_openvino_fp16_row_computes_in_fp16_or_is_skipped(tmp_path):
    """The engine sets INFERENCE_PRECISION_HINT f32, so the "openvino fp16" row timed fp32 compute."""
    cfg, opts = tiny_config(name="tiny"), BackendOptions(work_dir=tmp_path / "cache")
    without = _platform(openvino=None, openvino_capabilities=("FP32", "INT8"))
    assert "no fp16 compute on this CPU (OPTIMIZATION_CAPABILITIES: FP32, INT8)" in skip_reason("openvino", "fp16", without, opts, cfg)
    assert skip_reason("openvino", "fp32", without, opts, cfg) is None
    pytest.importorskip("openvino")
    platform = backends.detect_platform(["openvino"])
    if "FP16" not in platform.openvino_capabilities:
        assert "no fp16 compute" in skip_reason("openvino", "fp16", platform, opts, cfg)
        pytest.skip(f"this CPU has no fp16 in OpenVINO ({platform.openvino_capabilities}): the row is skipped, as checked")
    assert skip_reason("openvino", "fp16", platform, opts, cfg) is None
    runners = {p: backends.build_runner("openvino", p, cfg, platform, opts, backends.prepare("openvino", p, cfg, opts)[0])
               for p in ("fp16", "fp32")}  # fmt: skip
    assert runners["fp16"].details["properties"]["INFERENCE_PRECISION_HINT"] == "f16"
    assert runners["fp32"].details["properties"]["INFERENCE_PRECISION_HINT"] == "f32"  # the engine's own default stays


def test_an_int8_artifact_is_refused_on_onnx_runtimes_cuda_provider_as_the_int8_rows_are(tmp_path, monkeypatch):
    """`--artifact model.int8.onnx` checked the skip rules as fp32, so ORT's CUDA provider ran it (dequantized to
    float), which `--backends onnxruntime --precision int8` refuses."""
    pytest.importorskip("onnxruntime")
    cfg, opts = tiny_config(name="tiny"), BackendOptions(work_dir=tmp_path / "cache")
    int8, _ = backends.onnx_artifact(cfg, "int8", opts)
    fp32, _ = backends.onnx_artifact(cfg, "fp32", opts)
    gpu = _platform(cuda=True, ort_providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    monkeypatch.setattr(backends, "_ort_runner", lambda path, platform, options: f"runs {path.name}")  # no CUDA here to load on
    with pytest.raises(backends.BackendUnavailable, match="no int8 kernels"):
        backends.artifact_runner(int8, gpu, opts)
    assert backends.artifact_runner(fp32, gpu, opts) == f"runs {fp32.name}"
    assert backends.artifact_runner(int8, _platform(), opts) == f"runs {int8.name}"  # on the CPU provider it runs
    assert backends.onnx_precision(int8) == "int8" and backends.onnx_precision(fp32) == "fp32"


def test_rows_of_another_compile_mode_are_labelled_apart_for_compare_and_report(monkeypatch):
    """`--compile-mode max-autotune` rows were labelled "compile" like the default's: --compare paired the two modes'
    rows as one and --report let one sweep supersede the other."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, mode=None, dynamic=None: real_compile(model, backend="eager", dynamic=dynamic))
    monkeypatch.setattr(backends, "_compile_reason", lambda platform: None)

    def sweep_in(mode: str, time_utc: str) -> dict:
        result = run_sweep(Settings(models=[tiny_config(name="tiny")], backends=["eager", "compile"], batches=[1], precisions=["fp32"],
                                    repeats=2, warmup=0, options=BackendOptions(compile_mode=mode)))  # fmt: skip
        result["environment"]["time_utc"] = time_utc
        return result

    default, autotune = sweep_in("default", "2026-01-01T00:00:00"), sweep_in("max-autotune", "2026-01-02T00:00:00")
    assert [r["backend"] for r in autotune["rows"]] == ["eager", "compile-max-autotune"]
    assert autotune["rows"][1]["details"]["compile_mode"] == "max-autotune"
    pairs = {r["backend"]: r["status"] for r in compare_rows(default["rows"], autotune["rows"])}
    assert pairs == {"eager": "ok", "compile": "only in base", "compile-max-autotune": "only in new"}
    readme = report.render_readme([("default.json", default), ("autotune.json", autotune)])
    assert "`default.json` (git" in readme and "`autotune.json` (git" in readme


def test_readme_names_openvinos_version_and_no_load_at_end_that_was_not_recorded(sweep):
    """OpenVINO's version was not recorded (openvino rows said nothing of it), and a result without loadavg_end (the
    GPU proof's) printed "nan at end"."""
    assert {"openvino", "nncf"} <= sweep["environment"]["versions"].keys()
    result = json.loads(json.dumps(sweep))
    result["environment"]["versions"]["openvino"] = "2099.1.0"
    versions = lambda: next(line for line in report.render_readme([("a.json", result)]).splitlines() if line.startswith("torch "))  # noqa: E731
    assert ", OpenVINO 2099.1.0;" in versions() and " at end on " in versions()
    del result["environment"]["cpu"]["loadavg_end"], result["environment"]["versions"]["openvino"]  # an older file
    assert "nan" not in versions() and "OpenVINO" not in versions() and "at start on " in versions()
