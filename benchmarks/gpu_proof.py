"""The GPU proof: everything a lent GPU must show, one part per device call, results into one folder.

    python3 benchmarks/gpu_proof.py --out DIR [--part tests|kernels|e2e|all] [--budget SECONDS] [--dry-run]

- tests: the kernel and optimize() test files on the GPU (pytest, VITFAST_TEST_DEVICE=cuda; junit
  XML kept), then torch.compile over optimize() and CUDA graphs on a 2-block ViT-B/16 (fp16, batch 8:
  Inductor compiles it in seconds), then optimize() parity against the float64 model with the 2x rule for ViT-S/B/L,
  DeiT-distilled, hybrid, LayerScale + registers and register + avg-pool models in fp16 and
  bf16 at batch 64, then at batch 1 (both MLP paths; every model at fp16 batch 64 first), and on ViT-B/16
  approximate_gelu, attention=sdpa, torch.compile over an optimized model and CUDA graphs.
- kernels: copy bandwidth and matmul ceilings; where a small-batch forward's host time goes, eager vs
  optimize() without CUDA graphs (benchmarks/gpu_host.py); fused attention vs SDPA flash / efficient / cuDNN;
  add+LayerNorm and bias+GELU / SwiGLU vs PyTorch and vs the copy bandwidth; the GEMMs with
  epilogues vs cuBLAS + separate kernels (on Hopper the TMA kernels, the pointer ones beside them);
  the 2-D RoPE in both layouts (rotate-half: DINOv3 S/B/L at 256 px; interleaved: EVA-02 B/L at
  448 px; checked against float64 first); a per-kernel profile of one ViT-B/16 forward (eager vs
  optimize(); benchmarks/gpu_kernels.py), and from these the MLP and attention dispatch tables,
  written as DIR/mlp_dispatch.json and DIR/attention_dispatch.json (the committed kernels/ tables
  merged with this GPU's entries: copy them there to commit them).
- e2e: ViT-B/16, S/16, L/16 at 224 px, fp16 then bf16, batch 1/8/64/256: eager (SDPA),
  torch.compile default and max-autotune (at the largest batch only, unless --autotune-batches),
  optimize(), optimize() + CUDA graphs, optimize() + torch.compile, optimize(approximate_gelu=True),
  through the `vitfast bench` harness (img/s, p50/p99, peak memory, % of the measured matmul peak,
  GPU, driver, versions, git sha), most important first.

On Hopper the call's first part also checks the TMA GEMMs (forced, vs fp32) in a process of its own
before anything relies on them, and every part runs with VITFAST_TMA=0 (the pointer kernels) when that
check fails (`TmaCheck`, DIR/tma-check.json).

Each part writes DIR/proof-<part>.json, .md and (kernels, e2e) .png; at most 8 files per call.
A part is time-boxed (`--budget`, default 540 s for one part, split by BUDGET_SHARE across
`--part all`): rows it could not start in time are recorded as not reached, and a watchdog
interrupts whatever runs past the box by 30 s, so the files are always written. Offline, no
TensorRT needed. `--dry-run` runs the same code on CPU with tiny shapes and the Triton
interpreter (part of `make test`, so the script cannot rot between GPU sessions); its figures
time the interpreter and mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))  # gpu_kernels.py beside this file (imported lazily, after TRITON_INTERPRET is set)
PARTS = ("tests", "kernels", "e2e")
BUDGET_S = 540.0
BUDGET_SHARE = {"tests": 0.3, "kernels": 0.3, "e2e": 0.4}  # of --budget under --part all
GRACE_S = 30.0  # the watchdog fires this long after a part's time box
INTERRUPT_GRACE_S = 20.0  # a pytest run past its box gets SIGINT, then this long to write its JUnit XML
# optimize() and the GEMM epilogues first: the H100 run of 2026-11-26 reached 261 of test_kernels.py's
# 352 tests in its box and none of the other two files (xdist hands tests out in this order); the one GPU test of
# test_torch_engine.py (CUDA graphs per batch size, as `vitfast serve --optimize --cuda-graphs` captures them) rides along.
TEST_FILES = ("tests/test_optimize.py", "tests/test_torch_engine.py::test_gpu_engine_graphs_per_batch_size_match_the_engine_without",
              "tests/test_linear_layernorm.py", "tests/test_kernels.py")
# Before them, in a pytest of their own (one process, at most FIRST_TESTS_S): seconds-long tests of what only a GPU
# runs, the erfc GELU of 16-bit outputs (PTX rcp / ex2.approx.ftz). First in TEST_FILES' list, the H100 run of
# 2026-11-27 left it unreported: its 65 s pytest ended while 16 xdist workers were still starting
FIRST_TESTS = ("tests/test_kernels.py::test_fast_erf_gelu_is_as_accurate_as_fp32_erf_and_keeps_its_negative_tail",)
FIRST_TESTS_S = 45.0
ATOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}  # DESIGN.md's 2x rule
TMA_CHECK = "tma-check.json"  # the TMA GEMMs' verdict in DIR: the first part of a call writes it, every part obeys it
TMA_CHECK_S = 150.0  # its process's limit: compiling ~40 kernel configs beside pytest's workers, then 9 checks


class TimeBox(BaseException):
    """Raised by the watchdog; a BaseException so no `except Exception` on the way swallows it."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="folder for the result files (created)")
    p.add_argument("--part", default="all", choices=(*PARTS, "all"))
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for this call (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreter: checks the script, measures nothing")
    p.add_argument("--models", help="e2e: comma-separated models (default ViT-B/16, S/16, L/16 at 224)")
    p.add_argument("--precisions", help="e2e, and the tests part's optimize() parity rows: comma-separated of fp16,bf16,fp32 "
                   "(default fp16,bf16)")  # fmt: skip
    p.add_argument("--pytest-share", type=float, default=0.5, help="tests: the share of the part's box the GPU pytest gets, "
                   "the parity rows the rest (default %(default)s; 0: no pytest)")  # fmt: skip
    p.add_argument("--backends", help=f"e2e: comma-separated of {','.join(E2E_BACKENDS)},compile-max-autotune (default all)")
    p.add_argument("--batches", help="e2e: comma-separated batch sizes (default 1,8,64,256)")
    p.add_argument("--autotune-batches", help="e2e: the batch sizes of compile-max-autotune, minutes of tuning each "
                   "(default: the largest of --batches, where the issue's goal compares)")  # fmt: skip
    args = p.parse_args(argv)
    choices = {"backends": (*E2E_BACKENDS, "compile-max-autotune"), "precisions": ("fp16", "bf16", "fp32")}
    for flag, allowed in choices.items():
        unknown = set((getattr(args, flag) or "").split(",")) - {"", *allowed}
        if unknown:
            p.error(f"--{flag}: unknown {', '.join(sorted(unknown))}; choose from {','.join(allowed)}")
    if not 0 <= args.pytest_share <= 1:
        p.error(f"--pytest-share is a fraction of the tests part's box, 0 to 1, got {args.pytest_share}")
    for flag in ("batches", "autotune_batches"):
        value = getattr(args, flag)
        if value and not all(b.isdigit() and int(b) > 0 for b in value.split(",")):
            p.error(f"--{flag.replace('_', '-')} takes positive integers separated by commas, got {value!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_proof.py needs a CUDA GPU (--dry-run checks the script on CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    parts = PARTS if args.part == "all" else (args.part,)
    failed = False
    for part in parts:
        budget = args.budget * (BUDGET_SHARE[part] if len(parts) > 1 else 1.0)
        failed |= run_part(part, args, budget)
    return 1 if failed else 0


def run_part(part: str, args: argparse.Namespace, budget: float) -> bool:
    """Run one part under its time box and write its files; True when a check failed."""
    from vitfast.bench.measure import environment

    result = {"part": part, "dry_run": args.dry_run, "budget_s": budget,
              "environment": environment(" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), None)}  # fmt: skip
    started = time.monotonic()
    deadline = started + budget
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, budget + GRACE_S)
    tma = TmaCheck(args)
    try:
        {"tests": part_tests, "kernels": part_kernels, "e2e": part_e2e}[part](result, args, deadline, tma)
        result["time_box_hit"] = False
    except TimeBox:
        result["time_box_hit"] = True  # what was measured so far is in `result`
    except Exception as exc:  # a failure outside any section: what was measured so far is still written
        result["time_box_hit"] = False
        result.setdefault("errors", {})["part"] = "".join(traceback.format_exception(exc)[-3:])[-1500:]
        result["failed"] = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        tma.stop()
    result["elapsed_s"] = time.monotonic() - started
    result["environment"]["cpu"]["loadavg_end"] = list(os.getloadavg())  # as a sweep records it: the load while it ran
    write_outputs(part, result, args.out)
    print(f"{part}: {result['elapsed_s']:.0f} s, files in {args.out}", flush=True)
    return bool(result.get("failed"))


def _alarm(signum, frame):
    raise TimeBox()


class TmaCheck:
    """The TMA GEMMs' check (gpu_kernels.tma_check) before anything of a call relies on them: the
    Hopper kernels optimize() picks there had never run on hardware when this was written, and a
    kernel that faults poisons its process's CUDA context, one that computes wrong ruins every figure
    after it. The check runs in a process of its own, started with the call's first part (beside
    the tests part's pytest); `settle` waits for it, writes the verdict to DIR/tma-check.json and,
    when a row failed or the process died or hung, sets VITFAST_TMA=0 (optimize() on the pointer
    kernels) for this part and, through the file, every later part of the call. A verdict holds for
    the kernels' sources, Triton and the GPU it was reached on (`tma_fingerprint`): one left in a
    reused --out folder by another tree is checked again. Below compute capability 9.0 nothing runs:
    no TMA kernel is ever picked there."""

    def __init__(self, args: argparse.Namespace):
        import torch

        self.path, self.proc, self.fingerprint = args.out / TMA_CHECK, None, tma_fingerprint(args.dry_run)
        earlier = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.verdict = earlier if earlier.get("fingerprint") == self.fingerprint else None
        if self.verdict or not args.dry_run and torch.cuda.get_device_capability()[0] < 9:
            return
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import gpu_kernels as gk; "
                "print(json.dumps(gk.tma_check(gk.DRY_RUN if sys.argv[2] == 'dry' else gk.GPU), default=str))")  # fmt: skip
        cmd = [sys.executable, "-c", code, str(ROOT / "benchmarks"), "dry" if args.dry_run else "gpu"]
        self.started = time.monotonic()
        env = os.environ | {"VITFAST_TUNE_CACHE": "0"}  # it tunes beside pytest's workers: its picks must not be cached
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def settle(self, result: dict, deadline: float) -> None:
        """Wait for the check (started by this part) or read an earlier part's verdict; obey it. The wait ends by
        the part's `deadline` (time.monotonic()) at the latest, with a verdict written either way: a watchdog
        firing mid-wait would leave none, and the next part would start the check again."""
        if self.proc is not None:
            limit = min(TMA_CHECK_S - (time.monotonic() - self.started), deadline - time.monotonic())
            try:
                out, err = self.proc.communicate(timeout=max(limit, 1.0))
                verdict = tma_verdict(self.proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                self.stop()
                waited = time.monotonic() - self.started
                verdict = {"passed": False, "reason": f"no answer in {waited:.0f} s: a TMA kernel that hangs, or compiling that slow "
                           "(pointer kernels for the rest of the call)"}  # fmt: skip
            self.verdict = verdict | {"seconds": time.monotonic() - self.started, "fingerprint": self.fingerprint}
            self.proc = None
            _atomic_write(self.path, json.dumps(self.verdict, indent=1))
        if self.verdict is None:
            result["tma_check"] = {"passed": None, "reason": "not run: below compute capability 9.0 no TMA kernel is picked"}
            return
        result["tma_check"] = verdict = self.verdict
        if not verdict["passed"]:
            os.environ["VITFAST_TMA"] = "0"  # read per launch by kernels.linear_epilogue.takes_tma, inherited by subprocesses

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def tma_fingerprint(dry_run: bool) -> str:
    """What a TMA verdict holds for: the TMA kernels' sources, Triton's version and the GPU."""
    import hashlib

    import torch
    import triton

    digest = hashlib.sha256()
    for name in ("_common.py", "linear_epilogue.py", "linear_layernorm.py"):
        digest.update((ROOT / "kernels" / name).read_bytes())
    return f"{digest.hexdigest()[:16]} triton {triton.__version__} {'cpu (dry run)' if dry_run else torch.cuda.get_device_name()}"


def tma_verdict(returncode: int, stdout: str, stderr: str) -> dict:
    """The check process's output as a verdict: passed only when it printed its rows and every one passed."""
    lines = stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"passed": False, "reason": f"the check's process exited with code {returncode} before its result (a fault on the device?)",
                "stderr_tail": stderr[-1500:]}  # fmt: skip
    rows = found["rows"]
    failed = [f"{r['op']} M{r['M']} K{r['K']} N{r['N']}: {r.get('reason') or 'outside the 2x rule'}" for r in rows if not r["passes_2x_rule"]]
    return {"passed": bool(rows) and not failed, "failed": failed, "rows": rows, "precompile": found["precompile"]}


# ---------------------------------------------------------------------------- tests
def part_tests(result: dict, args: argparse.Namespace, deadline: float, tma: TmaCheck) -> None:
    if args.pytest_share > 0:
        result["pytest"] = run_pytest(args, time.monotonic() + args.pytest_share * (deadline - time.monotonic()))
    else:
        result["pytest"] = {"not_run": "--pytest-share 0"}
    tma.settle(result, deadline)  # before the parity rows run optimize() in this process
    result["model_parity"], result["precompile"] = rows, warm = [], []
    model_parity(rows, warm, args.dry_run, deadline, args.precisions)
    result["failed"] = (result["pytest"].get("failed", 0) > 0 or any(r.get("passes") is False for r in rows)
                        or result["tma_check"]["passed"] is False)


def run_pytest(args: argparse.Namespace, deadline: float) -> dict:
    """FIRST_TESTS in one process (at most FIRST_TESTS_S), then TEST_FILES across xdist workers, each pytest in a
    subprocess within `deadline`; counts and failures from their junit XML, summed (`runs`: each one's own).
    Under --dry-run only the gpu-marked tests are selected (they skip on CPU: the plumbing runs)."""
    first = _pytest(args, FIRST_TESTS, args.out / "tests-first-junit.xml", min(deadline, time.monotonic() + FIRST_TESTS_S), xdist=False)
    rest = _pytest(args, (*TEST_FILES, *(f"--deselect={t}" for t in FIRST_TESTS)), args.out / "tests-junit.xml", deadline, xdist=True)
    runs = [first, rest]
    merged = {"command": " ; ".join(r["command"] for r in runs), "timed_out": any(r.get("timed_out") for r in runs),
              "failed_tests": [f for r in runs for f in r.get("failed_tests", [])], "runs": runs}
    for key in ("tests", "passed", "failed", "skipped"):
        if any(key in r for r in runs):
            merged[key] = sum(r.get(key, 0) for r in runs)
    return merged


def _pytest(args: argparse.Namespace, files: tuple[str, ...], junit: Path, deadline: float, xdist: bool) -> dict:
    """One pytest of `files` (and pytest flags) in a subprocess, stopped at `deadline` (its JUnit XML still written):
    its summary."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *files]
    # its workers tune kernels while sharing the GPU: their picks stay out of Triton's disk cache, so the
    # kernels and e2e parts tune (and time) their own on an idle GPU; compiled kernels are still shared. They
    # check results, not speed: two configs per kernel (the first and last) instead of every one, each of each
    # new shape a compile (16-33 s per test on the H200 of 2026-11-27, 20 tests in 65 s)
    env = os.environ | {"VITFAST_TUNE_CACHE": "0", "VITFAST_TUNE_CONFIGS": os.environ.get("VITFAST_TUNE_CONFIGS", "2")}
    if xdist and importlib.util.find_spec("xdist"):  # pytest-xdist: Triton compiles the test shapes' kernels in parallel processes
        cmd += ["-n", str(min(16, os.cpu_count() or 1))]
    if args.dry_run:
        cmd += ["-m", "gpu"]
    else:
        env["VITFAST_TEST_DEVICE"] = "cuda"
        env.pop("TRITON_INTERPRET", None)
    timeout = max(deadline - time.monotonic(), 10.0)
    summary = {"command": f"VITFAST_TUNE_CONFIGS={env['VITFAST_TUNE_CONFIGS']} " + " ".join(cmd[1:]), "timeout_s": round(timeout)}
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGINT, not SIGKILL: pytest (and xdist's controller) stop the run and still write the
            # JUnit XML of the tests that finished, so a time box keeps their results
            proc.send_signal(signal.SIGINT)
            try:
                out, _ = proc.communicate(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            summary["timed_out"] = True
    summary |= {"returncode": proc.returncode, "tail": (out or "")[-2000:]}
    if junit.exists():
        summary |= junit_counts(junit)
    else:  # a pytest that died before its report: its tests count as failed, not as absent
        summary |= {"failed": 1, "failed_tests": [f"{' '.join(files)}: no JUnit XML (pytest exit status {proc.returncode})"]}
    return summary


def describe_exception(exc: BaseException) -> str:
    """vitfast.errors.describe_exception, imported when first needed: vitfast is imported only
    after --dry-run has set TRITON_INTERPRET."""
    from vitfast.errors import describe_exception as describe

    return describe(exc)


def _failure_line(bad: ET.Element) -> str:
    """The first line of a JUnit <failure>/<error>: its message, else its text (pytest leaves one empty at times)."""
    lines = ((bad.get("message") or "").strip() or (bad.text or "").strip()).splitlines()
    return lines[0][:200] if lines else "(no message)"


def junit_counts(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    failures = []
    for case in suite.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            failures.append(f"{case.get('classname')}::{case.get('name')}: {_failure_line(bad)}")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return counts | {"passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
                     "failed": counts["failures"] + counts["errors"], "failed_tests": failures[:40]}  # fmt: skip


def parity_models(dry_run: bool):
    """(label, config): the GPU's real shapes, or tiny ones of the same families for --dry-run."""
    import vitfast

    families = [
        ("ViT-S/16", "vit_small_patch16_224", {}), ("ViT-B/16", "vit_base_patch16_224", {}),
        ("ViT-L/16", "vit_large_patch16_224", {}), ("DeiT-B distilled", "deit_base_distilled_patch16_224", {}),
        ("hybrid R26+ViT-S/32", "vit_small_r26_s32_224", {}),
        ("DeiT-III-S LayerScale 0.1 + 4 registers", "deit3_small_patch16_224", {"init_values": 0.1, "reg_tokens": 4}),
        ("ViT-B/16 registers, avg pool", "vit_base_patch16_reg4_gap_256", {}),
    ]  # fmt: skip
    tiny = {"img_size": 32, "depth": 2, "embed_dim": 64, "num_heads": 2, "num_classes": 10}
    for label, name, extra in families:
        overrides = extra | (tiny | ({} if "r26" in name else {"patch_size": 8}) if dry_run else {})
        yield label, vitfast.get_config(name, **overrides)


def model_parity(rows: list, warm: list, dry_run: bool, deadline: float, precisions: str | None = None) -> None:
    """optimize() vs the float64 model, next to the eager model in the same dtype (the 2x rule). First
    torch.compile over the optimized model and CUDA graphs on a 2-block ViT-B/16 (Inductor compiles it in
    seconds; neither H100 run reached the full-depth check, which waited for every family's row); then every
    family; then, on the full ViT-B/16, approximate_gelu, attention=sdpa, torch.compile and CUDA graphs. Each
    model's kernels are compiled ahead for its dtypes' batches and MLP paths (counts appended to `warm`).
    `precisions` ("fp16,bf16" when None; fp32 only under the interpreter) picks the dtypes, in that order.
    Rows are appended as each check ends: a time box keeps them."""
    import gpu_kernels as gk
    import torch

    import vitfast
    from vitfast.precision import TORCH_DTYPES

    device = "cpu" if dry_run else "cuda"
    dtypes = (torch.float32,) if dry_run else tuple(TORCH_DTYPES[p] for p in (precisions or "fp16,bf16").split(","))  # the interpreter: fp32 only
    batches = (2,) if dry_run else (64, 1)
    models, warmed = list(parity_models(dry_run)), set()
    extras_for = "ViT-S/16" if dry_run else "ViT-B/16"
    compile_by = deadline - (0.0 if dry_run else COMPILE_NEEDS_S)

    def check(label: str, cfg, dtype: torch.dtype, batch: int, extras: str | None, compile_by: float) -> None:
        base = dict(model=label, dtype=gk.dtype_name(dtype), batch=batch)
        if time.monotonic() > deadline:
            rows.append(base | {"status": "not reached"})
            return
        torch.manual_seed(0)
        model = vitfast.create_model(cfg).to(device).eval()
        x = torch.randn(batch, cfg.in_chans, *cfg.img_hw, device=device)
        with torch.no_grad():
            exact = model.double()(x.double())
            model.to(dtype)
            checks = {"eager": lambda: model(x.to(dtype))}
            if extras is None:
                for mlp in ("auto", "epilogue"):
                    checks[f"optimize mlp={mlp}"] = lambda mlp=mlp: vitfast.optimize(model, mlp=mlp)(x.to(dtype))
            if extras == "all":
                if not dry_run:  # the opt-in tanh GELU vs the float64 erf model (in fp32 its error is the approximation's)
                    checks["optimize approximate_gelu"] = lambda: vitfast.optimize(model, approximate_gelu=True)(x.to(dtype))
                checks["optimize attention=sdpa"] = lambda: vitfast.optimize(model, attention="sdpa")(x.to(dtype))
            if extras is not None:
                checks |= compiled_and_graphed(model, x.to(dtype), dry_run)
            parity_rows(rows, base, checks, exact, compile_by)

    shallow = dataclasses.replace(dict(models)[extras_for], depth=2)
    if time.monotonic() < deadline:
        warm.append(dict(model=f"{extras_for}, 2 blocks", dtype=gk.dtype_name(dtypes[0])) | gk.warm_model(shallow, dtypes[0], device, (8,), ("auto",)))
    check(f"{extras_for}, 2 blocks", shallow, dtypes[0], 8, "compile", deadline - (0.0 if dry_run else COMPILE_SHALLOW_S))
    # every family once (fp16, batch 64) before any second row of one, and ViT-B's extra checks after that
    # round: a time box then cuts the extra dtypes and batches, not the families (the H100's first run
    # reached ViT-S/B only); bf16 at batch 64 next, before batch 1 (three runs reached no bf16 row)
    for i, (dtype, batch) in enumerate((d, b) for b in batches for d in dtypes):
        todo = [(label, cfg, None) for label, cfg in models] + ([(extras_for, dict(models)[extras_for], "all")] if i == 0 else [])
        for label, cfg, extras in todo:
            if (label, gk.dtype_name(dtype)) not in warmed and time.monotonic() < deadline:
                warmed.add((label, gk.dtype_name(dtype)))
                warm.append(dict(model=label, dtype=gk.dtype_name(dtype)) | gk.warm_model(cfg, dtype, device, batches))
            check(label, cfg, dtype, batch, extras, compile_by)


def compiled_and_graphed(model, x, dry_run: bool) -> dict:
    """torch.compile(optimize(model)) (aot_eager under --dry-run: no C++ build) and CUDA graphs."""
    import torch

    import vitfast

    backend = "aot_eager" if dry_run else "inductor"
    def compiled():
        torch._dynamo.reset()  # a fresh, static-shape compile: Dynamo keys its cache by the forward's code, shared
        return torch.compile(vitfast.optimize(model, mlp="auto"), fullgraph=True, backend=backend)(x)  # by every ViT

    checks = {f"optimize + torch.compile({backend}, fullgraph)": compiled}
    if not dry_run:
        def graphed():
            vitfast.optimize(model, cuda_graphs=True)
            model(x)  # captures
            return model(x * 1.0)  # replays with another buffer's data
        checks["optimize + CUDA graphs"] = graphed
    return checks


COMPILE_NEEDS_S = 60.0  # the least time left for the torch.compile check to start: Inductor's cold compile of ViT-B
COMPILE_SHALLOW_S = 20.0  # the same for the 2-block ViT-B checked first


def parity_rows(rows: list, base: dict, checks: dict, exact, compile_by: float) -> None:
    """Append one row per check as it ends: max |err| vs the float64 model; passes when <= 2x eager's + atol.
    A torch.compile check not started by `compile_by` (time.monotonic()) is recorded as not reached."""
    eager_err = None
    for name, run in checks.items():
        row = base | {"check": name}
        if "torch.compile" in name and time.monotonic() > compile_by:
            rows.append(row | {"status": "not reached", "reason": "too little of the time box was left for Inductor's compile"})
            continue
        try:
            err = (run().double() - exact).abs().max().item()
        except Exception as exc:  # a failing path is a row with its error, the other checks still run
            rows.append(row | {"status": "error", "reason": describe_exception(exc), "passes": False})
            continue
        eager_err = err if name == "eager" else eager_err
        passes = None if name == "eager" else err <= 2 * eager_err + ATOL[base["dtype"]]
        rows.append(row | {"status": "ok", "max_abs_err": err, "eager_max_abs_err": eager_err, "passes": passes})


# ---------------------------------------------------------------------------- kernels
def part_kernels(result: dict, args: argparse.Namespace, deadline: float, tma: TmaCheck) -> None:
    import gpu_host as gh
    import gpu_kernels as gk

    import vitfast

    tma.settle(result, deadline)
    s = gk.DRY_RUN if args.dry_run else gk.GPU
    left = lambda share: deadline - share * (deadline - time.monotonic())  # noqa: E731  a section's start-by time
    section(result, "ceilings", lambda: gk.ceilings(s))
    copy_GBps = result.get("ceilings", {}).get("copy_GBps", float("nan"))
    warm = result["precompile"] = [{"section": "attention"} | gk.warm_attention(s)]
    # first after the ceilings, in a box of its own: the open question of the last run (gpu_host.py's docstring)
    name, overrides, _ = s.profile
    host_by = min(deadline, time.monotonic() + s.host_s)  # compiling ahead included
    warm.append({"section": "host"} | gk.warm_model(vitfast.get_config(name, **overrides), s.dtypes[0], s.device, s.host_batches, ("auto",)))
    section(result, "host", lambda: gh.host_profile(name, overrides, s.dtypes[0], s.device, s.host_batches, host_by,
                                                     repeats=min(gh.REPEATS, s.iters)))
    section(result, "attention", lambda: gk.attention_speed(s, left(0.6), result.setdefault("attention", [])))
    section(result, "add_layernorm", lambda: gk.layernorm_speed(s, copy_GBps, left(0.7), result.setdefault("add_layernorm", [])))
    section(result, "activations", lambda: gk.activation_speed(s, copy_GBps, left(0.7), result.setdefault("activations", [])))
    # the GEMM rows before RoPE and the profile: the MLP dispatch table is written from them
    warm.append({"section": "mlp"} | gk.warm_mlp(s))
    rows = result["mlp"] = []
    section(result, "mlp", lambda: gk.mlp_gemms(s, left(0.3), rows))
    write_dispatch_tables(result, args.out, rows)  # now: a time box in what follows must not lose them
    warm.append({"section": "rope"} | gk.warm_rope(s))
    section(result, "rope", lambda: gk.rope_speed(s, copy_GBps, left(0.5), result.setdefault("rope", [])))
    name, overrides, batch = s.profile
    warm.append({"section": "profile"} | gk.warm_model(vitfast.get_config(name, **overrides), s.dtypes[0], s.device, (batch,)))
    section(result, "profile", lambda: gk.forward_profile(s, deadline))
    result["failed"] = bool(result.get("errors")) or any(r.get("passes_2x_rule") is False for r in rows + result.get("rope", []))


def write_dispatch_tables(result: dict, out: Path, mlp_rows: list[dict]) -> None:
    """DIR/mlp_dispatch.json and DIR/attention_dispatch.json: the committed kernels/ tables with this GPU's
    entries from the measured rows merged in."""
    import gpu_kernels as gk

    env = result["environment"]
    gpu = env["gpu"]
    table = out / "mlp_dispatch.json"
    shutil.copyfile(gk.DISPATCH_TABLE, table)
    dispatch_env = {"compute_capability": gpu.get("compute_capability") or "cpu (dry run)", "gpu": gpu.get("name") or "cpu (dry run)",
                    "git_sha": env["git"]["sha"], "command": env["command"]}  # fmt: skip
    result["mlp_dispatch"] = gk.write_dispatch(mlp_rows, dispatch_env, table)
    attention_table = out / "attention_dispatch.json"
    shutil.copyfile(gk.ATTENTION_TABLE, attention_table)
    result["attention_dispatch"] = gk.write_attention_dispatch(result.get("attention", []), dispatch_env, attention_table)


def section(result: dict, key: str, run) -> None:
    """result[key] = run(); an exception (a kernel failing on the GPU, say) is recorded under
    result["errors"][key] instead, so the sections after it still run and the files are written.
    Row lists that `run` appends to keep the rows measured before it failed."""
    try:
        result[key] = run()
    except Exception as exc:
        result.setdefault("errors", {})[key] = describe_exception(exc)


# ---------------------------------------------------------------------------- end to end
E2E_MODELS = ("vit_base_patch16_224", "vit_small_patch16_224", "vit_large_patch16_224")
E2E_BATCHES = (1, 8, 64, 256)
MAX_AUTOTUNE_S = 60.0  # the least time left in the box for a max-autotune job to start: Inductor tunes each GEMM shape
# vitfast-every-token: optimize() without head_only, so a reader sees what the last block's pruning adds
E2E_BACKENDS = ("eager", "vitfast", "vitfast-every-token", "vitfast-approx-gelu", "vitfast-graphs", "compile", "vitfast-compile")  # torch.compile's last


def e2e_jobs(args: argparse.Namespace):
    """(config, precision, backends, compile mode, batches) in priority order: ViT-B fp16 first."""
    import vitfast

    if args.dry_run:
        cfg = vitfast.get_config("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2)
        yield cfg, "fp32", E2E_BACKENDS, "default", (1, 2)
        return
    models = args.models.split(",") if args.models else E2E_MODELS
    wanted = args.backends.split(",") if args.backends else [*E2E_BACKENDS, "compile-max-autotune"]
    batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else E2E_BATCHES
    autotune_batches = tuple(int(b) for b in args.autotune_batches.split(",")) if args.autotune_batches else (max(batches),)
    for precision in args.precisions.split(",") if args.precisions else ("fp16", "bf16"):
        for name in models:
            cfg = vitfast.get_config(name)
            default = tuple(b for b in E2E_BACKENDS if b in wanted)
            if default:
                yield cfg, precision, default, "default", batches
            if "compile-max-autotune" in wanted:
                yield cfg, precision, ("compile",), "max-autotune", autotune_batches


def part_e2e(result: dict, args: argparse.Namespace, deadline: float, tma: TmaCheck) -> None:
    """Each job is one `vitfast bench` sweep (vitfast.bench.run_sweep); rows of all jobs go into
    one result in the harness's schema, so its markdown table, plot, --compare and --report apply
    (proof-e2e.json can go into benchmarks/results/ as it is)."""
    import gpu_kernels as gk

    from vitfast.bench import measure
    from vitfast.bench.backends import BackendOptions
    from vitfast.bench.stats import backend_label
    from vitfast.bench.sweep import SCHEMA, Settings, base_row, run_sweep
    from vitfast.precision import TORCH_DTYPES

    tma.settle(result, deadline)

    if args.dry_run:
        measure.CPU_MATMUL = (256, measure.CPU_MATMUL[1])  # a quick ceiling: the dry run measures nothing
    result |= {"schema": SCHEMA, "settings": merged_settings([]), "rows": [], "peak": None, "sweeps": [], "precompile": []}
    jobs = []
    for cfg, precision, backends, mode, batches in e2e_jobs(args):
        skipped = [b for b in backends if args.dry_run and "compile" in b]  # no Inductor C++ build in the dry run
        run = [b for b in backends if b not in skipped]
        label = lambda b: backend_label(b, mode)  # noqa: E731  (as the sweep labels the rows it measures)
        reason = "--dry-run does not build Inductor's C++ (a minute of CPU)" if skipped else None
        result["rows"] += [base_row(cfg, label(b), precision, n) | {"status": "skipped", "reason": reason} for b in skipped for n in batches]
        needs = MAX_AUTOTUNE_S if mode == "max-autotune" else 20.0  # a job started with less would be cut mid-compile
        if time.monotonic() > deadline - needs:
            reason = f"not reached: under {needs:.0f} s of the part's time box were left"
            result["rows"] += [base_row(cfg, label(b), precision, n) | {"status": "skipped", "reason": reason} for b in run for n in batches]
            continue
        if any(b.startswith("vitfast") for b in run):
            warm = gk.warm_model(cfg, TORCH_DTYPES[precision], "cpu" if args.dry_run else "cuda", batches, mlps=("auto",))
            result["precompile"].append(dict(model=cfg.name, precision=precision) | warm)
        settings = Settings(models=[cfg], backends=run, batches=list(batches), precisions=[precision],
                            repeats=5 if args.dry_run else 20, warmup=2 if args.dry_run else 5, max_seconds=2.0,
                            options=BackendOptions(compile_mode=mode))  # fmt: skip
        jobs.append(settings.to_dict() | {"options": {"compile_mode": mode}})
        result["settings"] = merged_settings(jobs)  # each time: a time box keeps the jobs started
        sweep = run_sweep(settings, on_row=lambda row: _take_row(row, result["rows"]))
        result["peak"] = result["peak"] or sweep["peak"]
        result["sweeps"].append({"command": sweep["environment"]["command"], "peak_tflops": sweep["peak"]["tflops"],
                                 "elapsed_s": sweep["elapsed_s"]})  # fmt: skip


def merged_settings(jobs: list[dict]) -> dict:
    """The sweeps' settings as one `vitfast bench` settings dict (models, backends, batches and
    precisions in the order first met; the rest from the first job), each job kept under "jobs":
    what `vitfast bench --report` and `--compare` read."""
    merged = dict(jobs[0]) if jobs else {}
    for key in ("models", "backends", "batches", "precisions"):
        seen = []
        for job in jobs:
            seen += [v for v in job[key] if v not in seen]
        merged[key] = seen
    return merged | {"jobs": jobs}


def _take_row(row: dict, rows: list) -> None:
    """As each row comes (so a time box keeps it): into the result, one line out.
    The sweep fills in % of peak on the same dict when it ends."""
    rows.append(row)
    print(_row_line(row), flush=True)


def _row_line(row: dict) -> str:
    what = f"{row['model']} {row['backend']} {row['precision']} batch {row['batch']}"
    if row["status"] != "ok":
        return f"  {what}: {row['status']} ({row['reason']})"
    return f"  {what}: {row['images_per_s']:.1f} img/s, p50 {row['p50_ms']:.3f} ms, p99 {row['p99_ms']:.3f} ms"


# ---------------------------------------------------------------------------- outputs
def write_outputs(part: str, result: dict, out: Path) -> None:
    """DIR/proof-<part>.json, .md and .png (kernels, e2e), each written to a temporary name and renamed."""
    base = out / f"proof-{part}"
    _atomic_write(base.with_suffix(".json"), json.dumps(result, indent=1, default=str))
    try:
        png = save_png(part, result, base.with_suffix(".png.tmp"))
        if png:
            os.replace(png, base.with_suffix(".png"))
    except Exception as exc:  # no matplotlib, nothing measured: the markdown says so
        result["png"] = f"no plot: {describe_exception(exc)}"
    _atomic_write(base.with_suffix(".md"), markdown(part, result))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def md_table(rows: list[dict], columns: list[str]) -> list[str]:
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]


def markdown(part: str, result: dict) -> str:
    env = result["environment"]
    gpu = env["gpu"]
    lines = [f"# GPU proof: {part}{' (DRY RUN on CPU: figures time the interpreter, not a GPU)' if result['dry_run'] else ''}", "",
             f"GPU {gpu.get('name', 'none')} (compute capability {gpu.get('compute_capability', '-')}, driver {gpu.get('driver', '-')}), "
             f"torch {env['versions'].get('torch')}, triton {env['versions'].get('triton')}, python {env.get('python')}, git {env['git']['sha']}"
             f"{' (+ local changes)' if env['git']['dirty'] else ''}; `{env['command']}`; {result['elapsed_s']:.0f} s of a "
             f"{result['budget_s']:.0f} s time box{' (hit: later rows not reached)' if result.get('time_box_hit') else ''}.", ""]  # fmt: skip
    lines += [f"**ERROR** in {key}: `{msg}`" for key, msg in result.get("errors", {}).items()]
    lines += [precompile_line(result.get("precompile")), ""] + tma_markdown(result.get("tma_check"))
    if part == "tests":
        p = result.get("pytest", {})
        if p.get("not_run"):
            lines += [f"pytest: not run ({p['not_run']})", ""]
        else:
            lines += [f"pytest `{p.get('command')}`: {p.get('passed', '?')} passed, {p.get('failed', '?')} failed, {p.get('skipped', '?')} skipped"
                      f"{' (TIMED OUT)' if p.get('timed_out') else ''}", ""] + [f"- {f}" for f in p.get("failed_tests", [])]  # fmt: skip
        lines += ["", "optimize() parity vs the float64 model (max |err| of the logits; passes: <= 2x eager's + atol):", ""]
        lines += md_table(result.get("model_parity", []), ["model", "dtype", "batch", "check", "status", "max_abs_err", "eager_max_abs_err", "passes", "reason"])
    elif part == "kernels":
        lines += [f"Ceilings: {json.dumps(result.get('ceilings', {}))}", "",
                  "Kernel timings are device time: each call queued behind a spin kernel, so launch overhead stays out "
                  "(gpu_kernels.median_ms); the per-forward profile is torch.profiler's kernel time.", "", "## Attention", ""]  # fmt: skip
        att_cols = ["B", "N", "H", "D", "dtype", "status", "vitfast_TFLOPs", "sdpa_flash_TFLOPs", "sdpa_efficient_TFLOPs",
                    "sdpa_cudnn_TFLOPs", "sdpa_default_TFLOPs", "speedup_vs_best_sdpa", "speedup_vs_sdpa_default"]  # fmt: skip
        att_rows = [r | {"picked": (r.get("tuning") or {}).get("picked")} for r in result.get("attention", [])]  # TAIL=16: tail tiles won
        lines += md_table(att_rows, [*att_cols, "picked"]) + ["", "## add + LayerNorm", ""]
        lines += md_table(result.get("add_layernorm", []), ["rows", "C", "dtype", "status", "vitfast_GBps", "torch_GBps", "fraction_of_copy"])
        lines += ["", "## bias + activation after a bias-free fc1", ""]
        lines += md_table(result.get("activations", []), ["op", "rows", "H", "dtype", "status", "vitfast_GBps", "torch_GBps", "speedup",
                                                          "fraction_of_copy"])  # fmt: skip
        lines += ["", "## 2-D RoPE on the packed qkv vs eager apply_rope, rotate-half (DINOv3) and interleaved (EVA-02) "
                  "(GB/s: qkv read + written, tables once)", ""]  # fmt: skip
        lines += md_table(result.get("rope", []), ["model", "layout", "B", "N", "H", "D", "dtype", "status", "vitfast_GBps", "torch_GBps",
                                                   "speedup", "fraction_of_copy", "passes_2x_rule"])  # fmt: skip
        lines += profile_markdown(result.get("profile"))
        from gpu_host import host_markdown

        lines += host_markdown(result.get("host"), md_table)
        lines += ["", "## GEMMs with epilogues vs cuBLAS + separate kernels", ""]
        lines += ["speedup: cuBLAS path / Triton epilogue GEMM (epilogue_kernel: the persistent TMA kernel on Hopper, else "
                  "the pointer one; pointer_TFLOPs: the pointer kernel beside the TMA one); bias_gelu: fc1's third path, cuBLAS "
                  "without the bias, then vitfast's bias+GELU kernel (erfc form); cublaslt_tanh: fc1 with GELU's tanh "
                  "form in cuBLASLt's epilogue (optimize(approximate_gelu=True)), its speedup over the cuBLAS path and its error "
                  "vs the erf GELU (2x rule); residual_in_cublas (fc2, proj): the cuBLAS GEMM adding the residual as its C, "
                  "then a LayerNorm reading one tensor, over the cuBLAS path: timed only (no bias: the data movement of "
                  "carrying biases to the next norm, benchmarks/NOTES.md).", ""]  # fmt: skip
        lines += md_table(result.get("mlp", []), ["op", "model", "dtype", "batch", "status", "epilogue_kernel", "cublas_TFLOPs",
                                                  "epilogue_TFLOPs", "pointer_TFLOPs", "speedup", "faster", "passes_2x_rule",
                                                  "bias_gelu_speedup", "bias_gelu_passes_2x_rule",
                                                  "cublaslt_tanh_speedup", "cublaslt_tanh_passes_2x_rule", "residual_in_cublas_speedup"])  # fmt: skip
        lines += ["", f"Dispatch entries written to mlp_dispatch.json: {len(result.get('mlp_dispatch') or [])}, to attention_dispatch.json: "
                  f"{len(result.get('attention_dispatch') or [])} (SDPA where it was faster: "
                  f"{sum(e['path'] == 'sdpa' for e in result.get('attention_dispatch') or [])})"]  # fmt: skip
    else:
        from vitfast.bench.report import to_markdown

        lines += [to_markdown(result)] if result.get("peak") else ["Nothing was measured."]
    if result.get("png"):
        lines += ["", result["png"]]
    return "\n".join(lines) + "\n"


def tma_markdown(check: dict | None) -> list[str]:
    """The TMA check's verdict, what it meant for the part, and its rows."""
    if not check:
        return []
    if check["passed"] is None:
        return [f"TMA GEMM check: {check['reason']}.", ""]
    head = (f"TMA GEMM check (forced TMA launches vs fp32, 2x rule, {check.get('seconds', 0):.0f} s): passed; optimize() "
            "picks the TMA kernels on this GPU." if check["passed"] else
            f"**TMA GEMM check FAILED** ({'; '.join(check.get('failed') or []) or check.get('reason')}): VITFAST_TMA=0 for this part, so "
            "optimize() and the GEMM rows ran the pointer kernels.")  # fmt: skip
    rows = check.get("rows") or []
    return [head, ""] + (md_table(rows, ["op", "M", "K", "N", "dtype", "status", "tma_rel_err", "torch_rel_err", "passes_2x_rule",
                                         "reason"]) + [""] if rows else [])  # fmt: skip


def precompile_line(runs: list | None) -> str:
    """One line summing the part's compiling ahead (kernels/precompile.py), one dict per run."""
    runs = runs or []
    reasons = sorted({r["reason"] for r in runs if r.get("reason")})
    compiled, seconds = sum(r.get("compiled", 0) for r in runs), sum(r.get("seconds", 0) for r in runs)
    return (f"Compiled ahead (kernels x autotune configs, in parallel): {compiled} in {seconds:.0f} s over {len(runs)} runs"
            + (f"; {'; '.join(reasons)}" if reasons else "") + ".")


def profile_markdown(profile: dict | None) -> list[str]:
    """The forward profile: per backend, time and launches per forward by kernel category, then
    each backend's slowest kernels."""
    if not profile:
        return []
    lines = ["", f"## Where one forward's time goes ({profile['model']}, batch {profile['batch']}, {profile['dtype']}, "
             f"mean of {profile['iters']} forwards, torch.profiler)", ""]  # fmt: skip
    backends = {k: v for k, v in profile["backends"].items() if v.get("status") == "ok"}
    categories = sorted({c for b in backends.values() for c in b["us_by_category"]})
    rows = [{"backend": k, "us_per_forward": b["us_per_forward"], "launches": b["launches_per_forward"],
             **{f"{c}_us": b["us_by_category"].get(c) for c in categories}} for k, b in backends.items()]  # fmt: skip
    lines += md_table(rows, ["backend", "us_per_forward", "launches", *(f"{c}_us" for c in categories)])
    for k, b in backends.items():
        lines += ["", f"{k}: slowest kernels", ""] + md_table(b["kernels"][:8], ["kernel", "category", "launches", "us", "share"])
    return lines + [f"- {k}: {v['status']} ({v['reason']})" for k, v in profile["backends"].items() if v.get("status") != "ok"]


def save_png(part: str, result: dict, path: Path) -> Path | None:
    if part == "tests":
        return None
    if part == "e2e":
        from vitfast.bench.report import save_plot

        save_plot(result, path)
        return path
    from matplotlib.figure import Figure

    fig = Figure(figsize=(20, 4.5), layout="constrained")
    ax_att, ax_ln, ax_rope, ax_mlp = fig.subplots(1, 4)
    att = [r for r in result.get("attention", []) if r.get("speedup_vs_best_sdpa")]
    ax_att.bar([f"N{r['N']} D{r['D']}{' fp32' if r['dtype'] == 'float32' else ''}" for r in att], [r["speedup_vs_best_sdpa"] for r in att])
    ax_att.set(title="attention: speedup vs best SDPA backend", ylabel="x")
    ln = [r for r in result.get("add_layernorm", []) if r.get("status") == "ok"]
    ax_ln.bar([f"C{r['C']}" for r in ln], [100 * r["fraction_of_copy"] for r in ln])
    ax_ln.set(title="add+LayerNorm: % of copy bandwidth", ylabel="%")
    rope = [r for r in result.get("rope", []) if r.get("status") == "ok"]
    copy_GBps = result.get("ceilings", {}).get("copy_GBps", float("nan"))
    at = range(len(rope))
    ax_rope.bar([i - 0.2 for i in at], [100 * r["vitfast_GBps"] / copy_GBps for r in rope], 0.4, label="vitfast")
    ax_rope.bar([i + 0.2 for i in at], [100 * r["torch_GBps"] / copy_GBps for r in rope], 0.4, label="eager apply_rope")
    ax_rope.set_xticks(list(at), [f"{r['model'].split('_patch')[0]} {r['layout']} {r['dtype'][:4]} b{r['B']}" for r in rope])
    ax_rope.set(title="RoPE: % of copy bandwidth", ylabel="%")
    ax_rope.legend(fontsize=7)
    mlp = [r for r in result.get("mlp", []) if r.get("status") == "ok"]
    ax_mlp.bar([f"{r['op'].split('+')[0]} {r['model']} {r['dtype'][:4]} b{r['batch']}" for r in mlp], [r["speedup"] for r in mlp])
    ax_mlp.set(title="epilogue GEMM: speedup vs cuBLAS + kernels", ylabel="x")
    for ax in (ax_att, ax_ln, ax_rope, ax_mlp):
        ax.tick_params(axis="x", labelrotation=90, labelsize=6)
        ax.grid(True, axis="y", alpha=0.3)
    fig.savefig(path, format="png", dpi=100)
    return path


if __name__ == "__main__":
    sys.exit(main())
