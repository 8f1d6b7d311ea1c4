"""benchmarks/gpu_proof.py, the script a lent GPU runs, checked on CPU with --dry-run (same code,
tiny shapes, Triton interpreter) so it cannot rot between GPU sessions: every part writes its
files, in the schema a GPU session reads back."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")

from vitfast.bench.sweep import validate_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_proof.py"
CALL_SCRIPT = ROOT / "benchmarks" / "gpu_proof_call.sh"


def run_proof(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # --dry-run sets it itself
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> Path:
    """The device's entry point, benchmarks/gpu_proof_call.sh, with --dry-run: its three parts, packed
    into the two files the device returns; unpacked here for the tests below."""
    out, unpacked = tmp_path_factory.mktemp("device-out"), tmp_path_factory.mktemp("proof")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # --dry-run sets it itself
    env |= {"OUT": str(out), "PROOF_FLAGS": "--dry-run", "INSTALL": "0", "TESTS_S": "1000", "E2E_S": "1000", "KERNELS_S": "1000", "CALL_S": "100000",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}  # its python3: this one  # fmt: skip
    done = subprocess.run(["bash", str(CALL_SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else done.stdout + done.stderr
    assert done.returncode == 0 and sorted(p.name for p in out.iterdir()) == ["log.txt", "proof.tgz"], log[-3000:]
    assert [line.split()[1] for line in log.splitlines() if line.startswith("=== ") and " exit " in line] == ["tests", "kernels", "e2e"]
    assert "dry run: the committed dispatch tables stay as they are" in log and "copied into kernels/" not in log
    assert all(line.endswith(" exit 0") or " exit 0 " in line for line in log.splitlines() if " exit " in line and line.startswith("=== "))
    subprocess.run(["tar", "-C", str(unpacked), "-xzf", str(out / "proof.tgz")], check=True)
    return unpacked


@pytest.mark.parametrize("call_s, box", [(200, (140, 160)), (60, (30, 30)), (100000, (200, 200))])
def test_the_last_part_gets_what_is_left_of_the_call(tmp_path, call_s, box):
    """The e2e part's box is cut to the call's time left (CALL_S less the time spent, less its 40 s of overrun), so
    the device's limit never kills a part before it writes its files; never under 30 s, never over E2E_S."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"OUT": str(tmp_path), "PROOF_FLAGS": "--help", "INSTALL": "0", "PARTS": "e2e", "CALL_S": str(call_s),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}  # gpu_proof.py --help: nothing runs
    done = subprocess.run(["bash", str(CALL_SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = (tmp_path / "log.txt").read_text()
    starts = [line for line in log.splitlines() if line.startswith("=== e2e (")]
    assert done.returncode == 0 and len(starts) == 1, log[-2000:]
    seconds = int(starts[0].split("(")[1].split()[0])
    assert box[0] <= seconds <= box[1], starts


def load(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def test_every_part_writes_json_markdown_and_plots(dry_run):
    names = sorted(p.name for p in dry_run.iterdir())
    assert names == ["attention_dispatch.json", "mlp_dispatch.json", "proof-e2e.json", "proof-e2e.md", "proof-e2e.png", "proof-kernels.json",
                     "proof-kernels.md", "proof-kernels.png", "proof-tests.json", "proof-tests.md", "tests-first-junit.xml", "tests-junit.xml", "tma-check.json"]  # fmt: skip
    for part in ("tests", "kernels", "e2e"):
        result = load(dry_run, f"proof-{part}.json")
        assert result["dry_run"] is True and result["time_box_hit"] is False
        assert {"command", "git", "gpu", "versions", "python"} <= result["environment"].keys()
        assert "DRY RUN" in (dry_run / f"proof-{part}.md").read_text()
        warm = result["precompile"]
        runs = list(warm.values()) if isinstance(warm, dict) else warm
        assert runs and all(r["launches"] > 0 and r["compiled"] == 0 and "TRITON_INTERPRET" in r["reason"] for r in runs)
        assert "Compiled ahead" in (dry_run / f"proof-{part}.md").read_text()
    for png in ("proof-e2e.png", "proof-kernels.png"):
        assert (dry_run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tests_part_schema(dry_run):
    result = load(dry_run, "proof-tests.json")
    pytest_run = result["pytest"]
    assert pytest_run["failed"] == 0 and pytest_run["skipped"] == pytest_run["tests"] > 0  # gpu tests skip on CPU
    rows = result["model_parity"]
    models = {r["model"] for r in rows}
    assert {"ViT-S/16", "ViT-B/16", "ViT-L/16", "DeiT-B distilled", "hybrid R26+ViT-S/32"} <= models
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
    checks = {r["check"] for r in rows}
    assert {"eager", "optimize mlp=auto", "optimize mlp=epilogue", "optimize attention=sdpa", "optimize + torch.compile(aot_eager, fullgraph)"} <= checks
    assert all(r["passes"] for r in rows if r["check"] != "eager")
    assert all(r["eager_max_abs_err"] > 0 for r in rows)  # against float64, fp32 eager errs a little
    # torch.compile over optimize() first, on a 2-block model, before the families can use up the box
    assert [(r["model"], r["check"]) for r in rows[:2]] == [("ViT-S/16, 2 blocks", "eager"),
                                                          ("ViT-S/16, 2 blocks", "optimize + torch.compile(aot_eager, fullgraph)")]


def test_the_tma_check_runs_first_and_every_part_reads_its_verdict(dry_run):
    """The tests part runs the TMA GEMMs' check (the interpreter runs the TMA kernels on CPU) and writes
    the verdict; the later parts of the call read it instead of checking again."""
    check = load(dry_run, "tma-check.json")
    assert check["passed"] is True and check["failed"] == []
    ops = {r["op"] for r in check["rows"]}
    assert ops == {"bias+gelu", "bias+layerscale+residual", "bias+layerscale+residual+layernorm"} and len(check["rows"]) == 6
    assert all(r["status"] == "ok" and 0 < r["tma_rel_err"] <= 2 * r["torch_rel_err"] + 1e-3 for r in check["rows"])
    for part in ("tests", "kernels", "e2e"):
        assert load(dry_run, f"proof-{part}.json")["tma_check"] == check
    assert "TMA GEMM check (forced TMA launches vs fp32, 2x rule" in (dry_run / "proof-tests.md").read_text()


@pytest.mark.parametrize("broken", ["writes nothing", "faults"])
def test_a_wrong_tma_kernel_fails_the_check(monkeypatch, broken):
    """A TMA kernel that leaves its output unwritten (NaN-filled: fails the 2x rule) or raises (a device
    fault) must fail its rows, and the verdict with them."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_kernels
    import gpu_proof

    from vitfast.kernels import linear_epilogue as le
    from vitfast.kernels import linear_layernorm as ll

    def fault(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(le, "_tma_launch", (lambda *a: None) if broken == "writes nothing" else fault)
    monkeypatch.setattr(ll, "ensure_tma_allocator", fault)  # the LayerNorm GEMM's TMA launch
    found = gpu_kernels.tma_check(gpu_kernels.DRY_RUN)
    assert found["rows"] and not any(r["passes_2x_rule"] for r in found["rows"])
    errors = [r for r in found["rows"] if r["status"] == "error"]
    assert all("illegal memory access" in r["reason"] for r in errors)
    assert len(errors) == (2 if broken == "writes nothing" else 6)  # the LayerNorm rows fault either way
    verdict = gpu_proof.tma_verdict(0, "compiling...\n" + json.dumps(found), "")
    assert verdict["passed"] is False and len(verdict["failed"]) == 6


def test_a_failed_or_dead_tma_check_turns_the_tma_kernels_off(tmp_path, monkeypatch):
    """A check process that died before printing its result fails the verdict; a failed verdict, read
    back by a later part, sets VITFAST_TMA=0 so optimize() runs the pointer kernels from then on."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_proof

    dead = gpu_proof.tma_verdict(-11, "", "Segmentation fault")
    assert dead["passed"] is False and "exited with code -11 before its result" in dead["reason"]
    assert dead["stderr_tail"] == "Segmentation fault"
    dead["fingerprint"] = gpu_proof.tma_fingerprint(dry_run=True)  # reached on this tree, as a first part leaves it
    (tmp_path / gpu_proof.TMA_CHECK).write_text(json.dumps(dead))
    monkeypatch.setenv("VITFAST_TMA", "1")  # restored at teardown
    check = gpu_proof.TmaCheck(gpu_proof.parse_args(["--out", str(tmp_path), "--dry-run"]))
    assert check.proc is None  # this tree's verdict exists: nothing is run again
    result: dict = {}
    check.settle(result, time.monotonic() + 600)
    assert os.environ["VITFAST_TMA"] == "0" and result["tma_check"] == dead
    assert "**TMA GEMM check FAILED** (the check's process exited" in gpu_proof.tma_markdown(result["tma_check"])[0]


def test_a_verdict_left_by_other_kernels_is_checked_again(tmp_path, monkeypatch):
    """`make gpu-proof` reuses its --out folder: a failed verdict reached on other kernel sources (or another
    GPU or Triton) must not turn the fixed kernels off; the check runs again and its verdict replaces it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_proof

    stale = {"passed": False, "reason": "an older kernel faulted", "fingerprint": "0123456789abcdef triton 3.6.0 NVIDIA H100 80GB HBM3"}
    (tmp_path / gpu_proof.TMA_CHECK).write_text(json.dumps(stale))
    monkeypatch.setenv("VITFAST_TMA", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the check's process runs the kernels in the interpreter
    check = gpu_proof.TmaCheck(gpu_proof.parse_args(["--out", str(tmp_path), "--dry-run"]))
    assert check.proc is not None
    result: dict = {}
    check.settle(result, time.monotonic() + 600)
    assert result["tma_check"]["passed"] is True and os.environ["VITFAST_TMA"] == "1"
    assert json.loads((tmp_path / gpu_proof.TMA_CHECK).read_text())["fingerprint"] == gpu_proof.tma_fingerprint(dry_run=True)


def test_a_tma_check_still_running_at_the_part_deadline_is_a_written_failure(tmp_path, monkeypatch):
    """The wait for the check ends at the part's deadline with a verdict on disk (pointer kernels from then on),
    so no watchdog cuts the wait and leaves the next part to start the check again."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_proof

    monkeypatch.setenv("VITFAST_TMA", "1")
    check = gpu_proof.TmaCheck(gpu_proof.parse_args(["--out", str(tmp_path), "--dry-run"]))
    check.proc.kill()
    check.proc.communicate()
    check.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result: dict = {}
    started = time.monotonic()
    check.settle(result, started + 1.0)
    assert time.monotonic() - started < 10 and check.proc is None
    assert result["tma_check"]["passed"] is False and "no answer in" in result["tma_check"]["reason"]
    assert json.loads((tmp_path / gpu_proof.TMA_CHECK).read_text())["passed"] is False and os.environ["VITFAST_TMA"] == "0"


def test_kernels_part_schema(dry_run):
    result = load(dry_run, "proof-kernels.json")
    assert {"copy_GBps", "matmul_float32_TFLOPs"} <= result["ceilings"].keys()
    for row in result["attention"]:
        assert row["status"] == "ok" and row["vitfast_TFLOPs"] > 0
        assert all(f"sdpa_{b}_ms" in row or f"sdpa_{b}_reason" in row for b in ("flash", "efficient", "cudnn"))
    assert all(r["status"] == "ok" and 0 < r["fraction_of_copy"] for r in result["add_layernorm"])
    assert [r["op"] for r in result["activations"]] == ["bias+gelu", "bias+swiglu"]
    assert all(r["status"] == "ok" and r["speedup"] > 0 and 0 < r["fraction_of_copy"] for r in result["activations"])
    assert "## bias + activation after a bias-free fc1" in (dry_run / "proof-kernels.md").read_text()
    # DRY_RUN's DINOv3: 48 px, 3 heads of 16: class + 4 registers + 3 x 3 patches; its EVA-02: 42 px, 2 heads of 24: class + 3 x 3 patches
    rope = result["rope"]
    assert [(r["model"], r["layout"], r["B"], r["N"], r["H"], r["D"]) for r in rope] == [
        *(("vit_small_patch16_dinov3", "rotate_half", B, 14, 3, 16) for B in (1, 2)),
        *(("eva02_tiny_patch14_224", "interleaved", B, 10, 2, 24) for B in (1, 2))]  # fmt: skip
    assert all(r["status"] == "ok" and r["passes_2x_rule"] and r["speedup"] > 0 and 0 < r["fraction_of_copy"] for r in rope)
    assert all(r["torch_rel_err"] < 1e-6 for r in rope)  # eager in the row's layout too, else the 2x rule would pass anything
    md = (dry_run / "proof-kernels.md").read_text()
    assert "## 2-D RoPE on the packed qkv" in md and "| eva02_tiny_patch14_224 | interleaved |" in md
    assert "| BLOCK_M=32,BLOCK_N=32,TAIL=16,WHOLE=False,w4,s1 |" in md  # the attention rows name the tile the autotuner picked
    ops = {r["op"].split("+")[0] for r in result["mlp"]}
    assert ops == {"fc1", "fc2", "proj"} and all(r["passes_2x_rule"] for r in result["mlp"])
    assert all(r["tuning"]["picked"] for r in result["attention"] + result["mlp"])  # one config under the interpreter
    fc1 = [r for r in result["mlp"] if r["op"].startswith("fc1")]
    # GELU's tanh form, timed and checked against erf: in fp32 its error is the approximation's, far above eager's
    assert fc1 and all(r["cublaslt_tanh_ms"] > 0 and r["cublaslt_tanh_rel_err"] > 10 * r["torch_rel_err"] for r in fc1)
    # fc2 / proj: the residual added inside cuBLAS's GEMM then a LayerNorm, timed beside the cuBLAS path
    assert all(r["residual_in_cublas_ms"] > 0 and r["residual_in_cublas_speedup"] > 0 for r in result["mlp"] if not r["op"].startswith("fc1"))
    assert "residual_in_cublas_speedup" in (dry_run / "proof-kernels.md").read_text()
    profile = result["profile"]
    assert set(profile["backends"]) == {"eager", "optimize mlp=auto", "optimize mlp=auto approximate_gelu", "optimize mlp=epilogue"}
    for backend in profile["backends"].values():
        assert backend["status"] == "ok" and backend["us_per_forward"] > 0 and backend["kernels"]
        assert abs(sum(backend["us_by_category"].values()) - backend["us_per_forward"]) < 1e-6 * backend["us_per_forward"]
    assert "Where one forward's time goes" in (dry_run / "proof-kernels.md").read_text()
    host = result["host"]  # eager vs optimize() at DRY_RUN's host batches; the GPU-only columns empty on CPU
    assert [(r["backend"], r["batch"]) for r in host["rows"]] == [(b, n) for b in ("optimize", "optimize approximate_gelu", "eager") for n in (2, 1)]
    for row in host["rows"]:
        assert row["status"] == "ok" and row["dispatcher_ops"] == 0, row  # plain tensors, no mode: launchers called straight
        assert 0 < row["enqueue_ms"] <= row["wall_ms"] and row["back_to_back_ms"] > 0 and row["forwards"] >= 3
        assert row["syncs"] is None and row["api"] == [] and row["sm_mhz_median"] is None
        assert row["python"] and all(p["own_us"] <= p["cumulative_us"] for p in row["python"])
    optimized = [p["function"] for r in host["rows"] if r["backend"] == "optimize" for p in r["python"]]
    assert any("interpreter.py" in f for f in optimized)  # optimize()'s rows ran the kernels (interpreted on CPU)
    assert "## Host time of one forward" in (dry_run / "proof-kernels.md").read_text()
    table = load(dry_run, "mlp_dispatch.json")
    dry = [e for e in table["entries"] if e["compute_capability"] == "cpu (dry run)"]
    assert len(dry) == len(result["mlp_dispatch"]) == 2  # one per measured batch bucket
    committed = json.loads((ROOT / "kernels" / "mlp_dispatch.json").read_text())["entries"]
    assert [e for e in table["entries"] if e not in dry] == committed  # other GPUs' entries are kept
    assert {"compute_capability", "dtype", "C", "hidden", "m_bucket", "fc1", "fc2"} <= table["entries"][0].keys()
    entries = load(dry_run, "attention_dispatch.json")["entries"]
    attention = [e for e in entries if e["compute_capability"] == "cpu (dry run)"]
    committed = json.loads((ROOT / "kernels" / "attention_dispatch.json").read_text())["entries"]
    assert [e for e in entries if e not in attention] == committed  # other GPUs' entries are kept
    measured = [r for r in result["attention"] if r["status"] == "ok" and "sdpa_default_ms" in r]
    assert len(attention) == len(result["attention_dispatch"]) == len(measured) > 0  # one per row SDPA's default could time
    for entry, row in zip(attention, sorted(measured, key=lambda r: (r["dtype"], r["N"], r["D"], r["B"] * r["H"]))):
        assert (entry["N"], entry["head_dim"], entry["compute_capability"]) == (row["N"], row["D"], "cpu (dry run)")
        assert entry["path"] == ("sdpa" if row["vitfast_ms"] >= 1.03 * row["sdpa_default_ms"] else "vitfast")


@pytest.mark.parametrize("broken", ["rotates nothing", "leaves v unwritten", "ignores the layout"])
def test_a_wrong_rope_kernel_fails_its_row(monkeypatch, broken):
    """The RoPE section times the kernel only next to its check against float64 in the row's layout: a
    kernel that is fast because it skips work, or rotates the wrong pairs, must come out as failing the
    2x rule, not as fast."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_kernels

    from vitfast.kernels import rope

    def wrong(qkv, cos, sin, out, interleaved=False):
        if broken == "rotates nothing":
            return out.copy_(qkv)
        if broken == "ignores the layout":  # rotate-half whatever it is asked: right for DINOv3's rows only
            return out.copy_(rope.rope_reference(qkv, cos, sin))
        out[:, :, :2] = rope.rope_reference(qkv, cos, sin, interleaved)[:, :, :2]
        return out

    monkeypatch.setattr(rope, "rope_qkv_launch", wrong)
    rows = gpu_kernels.rope_speed(gpu_kernels.DRY_RUN, 1.0, float("inf"), [])
    assert {r["layout"] for r in rows} == {"rotate_half", "interleaved"} and all(r["status"] == "ok" for r in rows)
    assert [r["passes_2x_rule"] for r in rows] == [broken == "ignores the layout" and r["layout"] == "rotate_half" for r in rows]


def test_rope_compiles_ahead_in_both_layouts(monkeypatch):
    """warm_rope records the launches the RoPE rows make: the interleaved ones are a kernel of their own."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_kernels

    from vitfast.kernels.precompile import recording

    def record(*fns):
        with recording(cpu=True) as calls:
            for fn in fns:
                fn()
        return {"interleaved": [c.kwargs["INTERLEAVED"] for c in calls]}

    monkeypatch.setattr(gpu_kernels, "precompile", record)
    rows = gpu_kernels.rope_speed(gpu_kernels.DRY_RUN, 1.0, float("-inf"), [])  # not reached: the rows' models, nothing timed
    assert gpu_kernels.warm_rope(gpu_kernels.DRY_RUN)["interleaved"] == [r["layout"] == "interleaved" for r in rows]


def test_kernel_categories():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_kernels import kernel_category

    assert kernel_category("_attention_fwd_kernel") == "attention"
    assert kernel_category("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>") == "attention"
    assert kernel_category("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1") == "gemm"
    assert kernel_category("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT") == "gemm"
    assert kernel_category("_linear_residual_layernorm_kernel") == "gemm"
    assert kernel_category("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::Half>") == "layernorm"
    assert kernel_category("_bias_gelu_kernel") == "gelu"
    assert kernel_category("void at::native::elementwise_kernel<128, 2>") == "elementwise"
    assert kernel_category("something_else") == "other"


def test_the_gpu_pytest_runs_the_first_tests_alone_then_the_rest_and_sums_them(tmp_path, monkeypatch):
    """FIRST_TESTS get a pytest of their own (one process, their own short box: the H100 run of 2026-11-27 lost the
    erfc GELU test's result to xdist's start-up), the rest theirs without them; the counts add up, a time box
    hit in either shows, each run's own summary is kept."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_proof

    seen = []

    def fake(args, files, junit, deadline, xdist):
        seen.append((files, junit.name, deadline, xdist))
        return ({"command": "first", "passed": 1, "failed": 0, "skipped": 0, "failed_tests": []} if not xdist else
                {"command": "rest", "passed": 50, "failed": 1, "skipped": 2, "failed_tests": ["t::x: boom"], "timed_out": True})

    monkeypatch.setattr(gpu_proof, "_pytest", fake)
    args = argparse.Namespace(out=tmp_path, dry_run=False)
    deadline = time.monotonic() + 600
    summary = gpu_proof.run_pytest(args, deadline)
    (first, first_junit, first_deadline, first_xdist), (rest, rest_junit, rest_deadline, rest_xdist) = seen
    assert first == gpu_proof.FIRST_TESTS and not first_xdist and first_deadline < deadline - 500
    assert rest_xdist and rest_deadline == deadline and {f"--deselect={t}" for t in gpu_proof.FIRST_TESTS} <= set(rest)
    assert set(gpu_proof.TEST_FILES) <= set(rest) and first_junit != rest_junit == "tests-junit.xml"
    assert (summary["passed"], summary["failed"], summary["skipped"], summary["timed_out"]) == (51, 1, 2, True)
    assert summary["failed_tests"] == ["t::x: boom"] and [r["command"] for r in summary["runs"]] == ["first", "rest"]


def test_a_gpu_pytest_without_its_report_counts_as_failed(tmp_path, monkeypatch):
    """A pytest that exits before writing its JUnit XML (here `--version`; on a GPU a crash) must not vanish from
    the counts: the erfc GELU test runs alone in the first one."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_proof

    args = argparse.Namespace(out=tmp_path, dry_run=True)
    summary = gpu_proof._pytest(args, ("--version",), tmp_path / "none.xml", time.monotonic() + 60, xdist=False)
    assert summary["failed"] == 1 and "no JUnit XML (pytest exit status 0)" in summary["failed_tests"][0]


def test_junit_counts_name_each_failure_even_without_a_message(tmp_path):
    """The tests part reads pytest's JUnit XML; a failure whose message is empty (a bare `assert`,
    a crashed xdist worker) must still be listed, not raise IndexError and lose the summary."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_proof import junit_counts

    (tmp_path / "j.xml").write_text(
        '<testsuites><testsuite tests="4" failures="2" errors="1" skipped="0">'
        '<testcase classname="t" name="a"><failure message="AssertionError: 2x rule&#10;more">tb</failure></testcase>'
        '<testcase classname="t" name="b"><failure message="">E  worker crashed</failure></testcase>'
        '<testcase classname="t" name="c"><error message="" /></testcase>'
        '<testcase classname="t" name="d" /></testsuite></testsuites>')
    counts = junit_counts(tmp_path / "j.xml")
    assert counts["passed"] == 1 and counts["failed"] == 3
    assert counts["failed_tests"] == ["t::a: AssertionError: 2x rule", "t::b: E  worker crashed", "t::c: (no message)"]


def test_a_failure_to_compile_ahead_is_recorded_not_raised():
    """Compiling ahead only saves time: if it breaks, the section still runs and measures."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_kernels

    result = gpu_kernels.warm_mlp(None)
    assert result["compiled"] == 0 and result["reason"].startswith("compiling ahead failed: AttributeError")


def test_a_failing_section_or_part_still_writes_its_files(tmp_path, monkeypatch):
    """A kernel failing on the GPU must not cost the rest of the call: a section's exception is
    recorded and the next section runs; an exception outside the sections still writes the files."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_proof

    result: dict = {}
    rows: list = []

    def attention():
        rows.append({"N": 197, "status": "ok"})
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    gpu_proof.section(result, "attention", attention)
    gpu_proof.section(result, "add_layernorm", lambda: [{"C": 768}])
    assert result["errors"] == {"attention": "RuntimeError: CUDA error: an illegal memory access was encountered"}
    assert rows == [{"N": 197, "status": "ok"}] and result["add_layernorm"] == [{"C": 768}]

    def broken(result, args, deadline, tma):
        result["attention"] = [{"N": 197, "status": "ok"}]
        raise KeyError("boom")

    monkeypatch.setattr(gpu_proof, "part_kernels", broken)
    args = gpu_proof.parse_args(["--out", str(tmp_path), "--dry-run", "--part", "kernels"])
    assert gpu_proof.run_part("kernels", args, 60.0) is True  # failed
    written = json.loads((tmp_path / "proof-kernels.json").read_text())
    assert written["attention"] == [{"N": 197, "status": "ok"}] and "KeyError: 'boom'" in written["errors"]["part"]
    assert "**ERROR** in part" in (tmp_path / "proof-kernels.md").read_text()


def test_sm_clock_samples_come_from_nvidia_smi_and_a_failure_says_why(tmp_path, monkeypatch):
    """The host rows' SM clock (gpu_host.sm_clock_samples), with stand-in nvidia-smi scripts: samples while the
    block runs, and a failing query stops the sampling with its reason instead of silently leaving none."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_host

    smi = tmp_path / "nvidia-smi"
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    smi.write_text("#!/bin/sh\necho 1980\n")
    smi.chmod(0o755)
    with gpu_host.sm_clock_samples(True, interval_s=0.01) as (samples, errors):
        time.sleep(0.5)
    assert len(samples) >= 2 and {m for _, m in samples} == {1980.0} and errors == []
    assert all(a < b for (a, _), (b, _) in zip(samples, samples[1:]))
    smi.write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    with gpu_host.sm_clock_samples(True, interval_s=0.01) as (samples, errors):
        time.sleep(0.3)
    assert samples == [] and errors == ["nvidia-smi exited 6: No devices were found"]
    with gpu_host.sm_clock_samples(False) as (samples, errors):  # off a GPU: no query at all
        time.sleep(0.05)
    assert samples == [] and errors == []


def test_the_host_rows_count_dispatcher_ops(monkeypatch):
    """dispatcher_ops tells launchers called straight (0) from a forward through torch.ops.vitfast (one op per
    kernel: attention and two add+LayerNorms per block), so a slow eager path can be told apart from a detour."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_host

    import vitfast
    from vitfast import fused

    cfg = vitfast.get_config("vit_tiny_patch16_224", img_size=32, patch_size=16, depth=1)
    model = vitfast.optimize(vitfast.create_model(cfg).eval(), head_only=False)  # every token: the block's kernels all run
    x = torch.randn(1, 3, 32, 32)
    with torch.inference_mode():
        _, straight = gpu_host.profiled_calls(model, x, gpu=False, forwards=1)
        monkeypatch.setattr(fused, "kernel_ops", lambda x: torch.ops.vitfast)
        _, dispatched = gpu_host.profiled_calls(model, x, gpu=False, forwards=1)
    assert straight == 0 and dispatched >= 3


def test_a_tests_call_can_skip_pytest_for_the_parity_rows(tmp_path, monkeypatch, capsys):
    """`--pytest-share 0 --precisions bf16`: the whole tests box goes to the parity rows of that dtype (no call's
    box has reached a bf16 row behind pytest); the files say pytest did not run, not that it passed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_proof

    with pytest.raises(SystemExit):
        gpu_proof.parse_args(["--out", str(tmp_path), "--pytest-share", "1.5"])
    assert "--pytest-share is a fraction" in capsys.readouterr().err
    args = gpu_proof.parse_args(["--out", str(tmp_path), "--part", "tests", "--pytest-share", "0", "--precisions", "bf16"])
    monkeypatch.setattr(gpu_proof, "run_pytest", lambda *a: pytest.fail("pytest ran with --pytest-share 0"))
    asked = {}
    monkeypatch.setattr(gpu_proof, "model_parity", lambda rows, warm, dry_run, deadline, precisions: asked.update(precisions=precisions))
    tma = types.SimpleNamespace(settle=lambda result, deadline: result.update(tma_check={"passed": True, "rows": []}))
    result = {"environment": {}}
    gpu_proof.part_tests(result, args, time.monotonic() + 60, tma)
    assert asked == {"precisions": "bf16"} and result["pytest"] == {"not_run": "--pytest-share 0"} and result["failed"] is False
    import land_proof

    result |= {"environment": {"gpu": {"name": "GPU"}, "versions": {}, "git": {"sha": "abc1234", "dirty": False}, "command": "c", "python": "3"},
               "dry_run": False, "elapsed_s": 1.0, "budget_s": 60.0}  # fmt: skip
    assert "pytest: not run (--pytest-share 0)" in gpu_proof.markdown("tests", result)
    assert "- call 1 tests: pytest not run (--pytest-share 0); optimize() parity rows 0 ran" in land_proof.goals_markdown([{"tests": result}], [[]])


def test_e2e_part_is_a_bench_result(dry_run):
    result = validate_result(load(dry_run, "proof-e2e.json"))  # the `vitfast bench` schema: --report / --compare read it
    by_backend = {r["backend"]: r for r in result["rows"]}
    assert set(by_backend) == {"eager", "vitfast", "vitfast-every-token", "vitfast-graphs", "compile", "vitfast-compile", "vitfast-approx-gelu"}
    assert by_backend["eager"]["status"] == "ok" and by_backend["eager"]["images_per_s"] > 0
    assert "Inductor" in by_backend["compile"]["reason"] and "TRITON_INTERPRET" in by_backend["vitfast"]["reason"]


def test_time_box_still_writes_results(tmp_path):
    """A part whose box has run out before it starts records its rows as not reached."""
    done = run_proof("--out", str(tmp_path), "--dry-run", "--part", "e2e", "--budget", "0.01")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = validate_result(load(tmp_path, "proof-e2e.json"))["rows"]
    assert rows and all(r["status"] == "skipped" for r in rows)
    assert any("time box" in r["reason"] for r in rows)
    assert "Nothing was measured" in (tmp_path / "proof-e2e.md").read_text()


def test_needs_a_gpu_without_dry_run(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would run for real")
    done = run_proof("--out", str(tmp_path), "--part", "kernels")
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr


def test_bad_e2e_flags_are_one_line_errors(tmp_path):
    done = run_proof("--out", str(tmp_path), "--dry-run", "--part", "e2e", "--backends", "eager,fast")
    assert done.returncode == 2 and "--backends: unknown fast; choose from" in done.stderr
    done = run_proof("--out", str(tmp_path), "--dry-run", "--part", "e2e", "--batches", "1,x")
    assert done.returncode == 2 and "--batches takes positive integers" in done.stderr
    done = run_proof("--out", str(tmp_path), "--dry-run", "--part", "e2e", "--autotune-batches", "256,")
    assert done.returncode == 2 and "--autotune-batches takes positive integers" in done.stderr


# ---------------------------------------------------------------------------- landing a session's calls
def as_if_from_a_gpu(unpacked: Path, call_dir: Path, sha: str = "abcdef0123456789") -> Path:
    """A call folder (proof.tgz + log.txt) holding the dry run's files relabelled as an H100's: the
    landing logic is what is under test, not the figures."""
    staged = call_dir / "files"
    shutil.copytree(unpacked, staged)  # (creates call_dir)
    for path in staged.glob("proof-*.json"):
        result = json.loads(path.read_text())
        result["dry_run"] = False
        result["environment"]["gpu"] = {"available": True, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
        result["environment"]["git"] |= {"sha": sha, "dirty": False}
        path.write_text(json.dumps(result))
    with tarfile.open(call_dir / "proof.tgz", "w:gz") as tar:
        for path in staged.iterdir():
            tar.add(path, arcname=path.name)
    shutil.rmtree(staged)
    (call_dir / "log.txt").write_text("=== tests exit 0\n")
    return call_dir


def fake_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "benchmarks" / "results").mkdir(parents=True)
    shutil.copytree(ROOT / "kernels", root / "kernels", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return root


def test_landing_two_calls_files_each_result_where_it_belongs(dry_run, tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import land_proof

    root = fake_repo(tmp_path)
    calls = [as_if_from_a_gpu(dry_run, tmp_path / f"call{i}") for i in (1, 2)]
    dest, goals = land_proof.land(calls, root)
    results = root / "benchmarks" / "results"
    assert dest == results / "gpu-proof-h100-abcdef0"
    names = sorted(p.name for p in dest.iterdir())
    assert {"proof-tests.json", "proof-kernels.json", "proof-e2e.md", "tma-check.json", "call1-log.txt", "goals.md",
            "call2-proof-tests.json", "call2-log.txt"} <= set(names) and "proof-e2e.json" not in names  # fmt: skip
    assert sorted(p.name for p in results.glob("gpu-*.*")) == ["gpu-h100-abcdef0-call2.json", "gpu-h100-abcdef0-call2.png",
                                                               "gpu-h100-abcdef0.json", "gpu-h100-abcdef0.png"]  # fmt: skip
    assert validate_result(json.loads((results / "gpu-h100-abcdef0.json").read_text()))
    assert (root / "kernels" / "mlp_dispatch.json").read_text() == (dry_run / "mlp_dispatch.json").read_text()
    assert "gpu-h100-abcdef0.json" in (root / "benchmarks" / "README.md").read_text()
    assert goals == (dest / "goals.md").read_text() and "| goal | measured | verdict |" in goals
    assert goals.count("not measured in these calls") == 5  # the dry run's tiny shapes are none of the goals'
    assert "- call 1 TMA check: passed (6 forced launches within the 2x rule)" in goals
    assert "- call 1 bias + GELU kernel, 10 x 96 " in goals and "of copy (PyTorch's F.gelu(x + b): " in goals
    assert "started but returned no result" not in goals
    with pytest.raises(land_proof.LandError, match="exists already"):
        land_proof.land(calls[:1], root)


def test_a_part_the_log_shows_started_without_a_result_is_reported(dry_run, tmp_path):
    """A call the device killed mid-part: the log shows the part began, proof.tgz lacks its JSON; goals.md says so
    rather than only "not measured"."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import land_proof

    call = as_if_from_a_gpu(dry_run, tmp_path / "call1")
    with tarfile.open(call / "proof.tgz") as tar:
        kept = [m for m in tar.getmembers() if m.name != "proof-e2e.json"]
        files = {m.name: tar.extractfile(m).read() for m in kept}
    with tarfile.open(call / "proof.tgz", "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (call / "log.txt").write_text("=== tests (130 s) 01:00:00\n=== tests exit 0\n=== kernels (150 s) 01:03:00\n=== kernels exit 0\n"
                                  "=== e2e (200 s) 01:06:00\n")  # fmt: skip
    _, goals = land_proof.land([call], fake_repo(tmp_path))
    assert "- call 1 e2e: **started but returned no result**" in goals and "call 1 kernels: **started" not in goals


def test_landing_refuses_a_dry_run_or_mixed_calls_and_writes_nothing(dry_run, tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import land_proof

    root = fake_repo(tmp_path)
    dry = tmp_path / "dry"
    dry.mkdir()
    with tarfile.open(dry / "proof.tgz", "w:gz") as tar:
        tar.add(dry_run / "proof-tests.json", arcname="proof-tests.json")
    with pytest.raises(land_proof.LandError, match="is a --dry-run on CPU"):
        land_proof.land([dry], root)
    mixed = [as_if_from_a_gpu(dry_run, tmp_path / "a"), as_if_from_a_gpu(dry_run, tmp_path / "b", sha="1234567abc")]
    with pytest.raises(land_proof.LandError, match="different GPUs or commits"):
        land_proof.land(mixed, root)
    with pytest.raises(land_proof.LandError, match="has no proof.tgz"):
        land_proof.land([tmp_path], root)
    assert list((root / "benchmarks" / "results").iterdir()) == []
    assert (root / "kernels" / "mlp_dispatch.json").read_text() == (ROOT / "kernels" / "mlp_dispatch.json").read_text()


def test_goals_are_judged_from_the_rows():
    """Met, missed (at what share of the goal: 1.25x of a 1.3x goal is 96%), or open when nothing measured the
    goal's row (never a guess)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import land_proof

    kernels = {"attention": [{"status": "ok", "N": 197, "D": 64, "B": 256, "dtype": "float16", "speedup_vs_best_sdpa": 1.03, "vitfast_TFLOPs": 157.0}],
               "add_layernorm": [{"status": "ok", "C": 768, "dtype": "float16", "fraction_of_copy": 0.9, "vitfast_GBps": 2700.0}]}  # fmt: skip
    vitb = {"status": "ok", "model": "vit_base_patch16_224", "precision": "fp16"}
    e2e = {"rows": [vitb | {"backend": "vitfast", "batch": 256, "images_per_s": 10000.0, "p50_ms": 25.6},
                    vitb | {"backend": "eager", "batch": 256, "images_per_s": 8000.0, "p50_ms": 32.0},
                    vitb | {"backend": "compile-max-autotune", "batch": 256, "status": "error", "images_per_s": None, "p50_ms": None},
                    vitb | {"backend": "vitfast-graphs", "batch": 1, "images_per_s": 1600.0, "p50_ms": 0.61}]}  # fmt: skip
    verdicts = [g["verdict"] for g in land_proof.goals_table([{"kernels": kernels}, {"e2e": e2e}])]
    assert verdicts == ["missed: 86% of the goal", "met", "missed: 96% of the goal", "open", "met"]
    # max-autotune captures CUDA graphs: it is compared with vitfast's graphed row, not the plain one
    e2e["rows"][2] |= {"status": "ok", "images_per_s": 10000.0, "p50_ms": 25.6}
    e2e["rows"].append(vitb | {"backend": "vitfast-graphs", "batch": 256, "images_per_s": 11500.0, "p50_ms": 22.3})
    autotune = land_proof.goals_table([{"kernels": kernels}, {"e2e": e2e}])[3]
    assert autotune["verdict"] == "met" and autotune["measured"].startswith("1.15x (22.30 vs 25.60 ms")
    # the goal's optimize() runs the last block on the class token alone: the every-token row is reported beside it
    e2e["rows"].append(vitb | {"backend": "vitfast-every-token", "batch": 256, "images_per_s": 9040.0, "p50_ms": 28.3})
    md = land_proof.goals_markdown([{"e2e": e2e | {"environment": {"gpu": {"name": "GPU"}, "git": {"sha": "abc1234", "dirty": False}}}}], [[]])
    assert ("- call 1 ViT-B/16 fp16 batch 256, optimize() with the last block over every token (vitfast-every-token): 1.13x "
            "(28.30 vs 32.00 ms p50) over eager") in md


def test_max_autotune_runs_at_the_largest_batch_unless_told():
    """Inductor's max-autotune tunes every GEMM shape again per batch size (minutes): by default the e2e
    part times it at the largest batch only, where the issue's goal compares, after the other backends."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_proof

    def jobs(*flags):
        args = gpu_proof.parse_args(["--out", "x", "--models", "vit_base_patch16_224", "--precisions", "fp16", *flags])
        return [(backends, mode, batches) for _, _, backends, mode, batches in gpu_proof.e2e_jobs(args)]

    assert jobs("--backends", "eager,compile-max-autotune", "--batches", "1,256,8") == [
        (("eager",), "default", (1, 256, 8)), (("compile",), "max-autotune", (256,))]  # fmt: skip
    assert jobs("--backends", "compile-max-autotune", "--autotune-batches", "1,256") == [(("compile",), "max-autotune", (1, 256))]


def test_tuning_reports_only_what_this_call_launched_and_tuned():
    """A call that launched another kernel (the H100 run of 2026-11-27 asked the pointer kernel's tuner where the op ran
    the TMA kernel) says so instead of a stale pick; timings left from an earlier shape are not reported as this one's."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_kernels
    import triton

    def _gemm_kernel():
        pass

    small, large = triton.Config({"BLOCK_M": 64}, num_warps=4, num_stages=2), triton.Config({"BLOCK_M": 128}, num_warps=8, num_stages=3)
    tuner = types.SimpleNamespace(base_fn=_gemm_kernel, best_config=large, configs_timings={small: [0.2], large: [0.1]})
    not_launched = gpu_kernels.tuning(tuner, lambda: None)
    assert not_launched["picked"] is None and "did not launch _gemm_kernel: the row names the wrong kernel" in not_launched["error"]

    def tunes():  # as Triton's Autotuner.run does for a new key: new timings, then the pick
        tuner.configs_timings, tuner.best_config = {small: [0.3], large: [0.2]}, large

    assert gpu_kernels.tuning(tuner, tunes) == {"picked": "BLOCK_M=128,w8,s3", "ms_by_config": {"BLOCK_M=64,w4,s2": 0.3, "BLOCK_M=128,w8,s3": 0.2}}
    cached = gpu_kernels.tuning(tuner, lambda: setattr(tuner, "best_config", small))  # a cached key: no tuning this call
    assert cached == {"picked": "BLOCK_M=64,w4,s2", "ms_by_config": None}


def test_landing_refuses_a_commit_the_repository_lacks_unless_told_the_real_one(dry_run, tmp_path):
    """VITFAST_GIT_SHA is typed by hand for the device (the H200 run of 2026-11-27 recorded a mistyped one,
    right in its first 7 characters): a git checkout refuses to file calls under a commit it does not have,
    and --commit files them under the real one, the recorded sha kept beside it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import land_proof

    root = fake_repo(tmp_path)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    typo = head[:-1] + ("1" if head.endswith("0") else "0")  # right in its first 7 characters, as the H200 run's
    call = as_if_from_a_gpu(dry_run, tmp_path / "call1", sha=typo)
    with pytest.raises(land_proof.LandError, match=f"record commit {typo}, which this repository does not have"):
        land_proof.land([call], root)
    assert list((root / "benchmarks" / "results").iterdir()) == []
    dest, _ = land_proof.land([call], root, commit=head)
    filed = json.loads((dest / "proof-tests.json").read_text())["environment"]["git"]
    assert (filed["sha"], filed["sha_recorded"], dest.name) == (head, typo, f"gpu-proof-h100-{head[:7]}")


def test_a_part_records_the_load_average_at_its_end(tmp_path, monkeypatch):
    """Results landed from the proof had no loadavg_end, so benchmarks/README.md printed "nan at end" for each."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_proof

    monkeypatch.setattr(gpu_proof, "part_kernels", lambda result, args, deadline, tma: None)
    args = gpu_proof.parse_args(["--out", str(tmp_path), "--dry-run", "--part", "kernels"])
    assert gpu_proof.run_part("kernels", args, 60.0) is False
    cpu = json.loads((tmp_path / "proof-kernels.json").read_text())["environment"]["cpu"]
    assert len(cpu["loadavg_end"]) == 3 and len(cpu["loadavg_start"]) == 3
