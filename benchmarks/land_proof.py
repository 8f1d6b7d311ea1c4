"""Land what a lent GPU returned from the proof's device calls into the repository, and judge the issue's goals.

    python benchmarks/land_proof.py CALL_DIR [CALL_DIR ...]      # each: proof.tgz + log.txt, as a call returned them

For the calls of one session (same GPU, same commit), in call order:
- every call's files go under benchmarks/results/gpu-proof-<gpu>-<sha7>/ (call 1's as they are, call N's
  prefixed `callN-`, each call's log as `callN-log.txt`), next to a generated goals.md;
- each call's end-to-end result (a `vitfast bench` file) goes to benchmarks/results/gpu-<gpu>-<sha7>[-callN].json
  with its plot, where `vitfast bench --report` reads it;
- the dispatch tables the last kernels part measured replace kernels/mlp_dispatch.json and
  kernels/attention_dispatch.json;
- benchmarks/README.md is regenerated from benchmarks/results/*.json.
goals.md (also printed) holds the issue's goals computed from the rows, met or missed (at what share of the goal),
and what was not measured; beside them the tests' summary, the TMA check's verdict and the fc1 GEMM rates.
Refused, with nothing written: a dry run's files (they time the interpreter), calls from different
GPUs or commits, a commit this repository does not have (`--commit SHA` files them under the one they
ran, the recorded sha kept as `sha_recorded`), a destination folder that exists already.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from gpu_proof import PARTS, ROOT  # beside this file

from vitfast.atomic import atomic_write, atomic_write_text, claim_output


class LandError(Exception):
    """What is wrong with the calls' files, and what to do."""


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': the model number, else the name made file-safe."""
    found = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return (found.group(1) if found else re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")).lower()


def read_call(call_dir: Path, into: Path, commit: str | None = None) -> dict[str, dict]:
    """Unpack a call's proof.tgz into `into`; its part results by part name. `commit`: the commit the call
    really ran, written over the recorded one (kept as `sha_recorded`) in each part's JSON before anything is filed."""
    archive = call_dir / "proof.tgz"
    if not archive.is_file():
        raise LandError(f"{call_dir} has no proof.tgz: pass the folder a device call returned (its files_at)")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    parts = {}
    for part in PARTS:
        path = into / f"proof-{part}.json"
        if path.exists():
            parts[part] = json.loads(path.read_text())
            if parts[part].get("dry_run"):
                raise LandError(f"{call_dir}: proof-{part}.json is a --dry-run on CPU (it times the interpreter): nothing to land")
            git = parts[part]["environment"]["git"]
            if commit and git.get("sha") != commit:
                git["sha_recorded"], git["sha"] = git.get("sha"), commit
                path.write_text(json.dumps(parts[part], indent=1))
    if not parts:
        raise LandError(f"{call_dir}: proof.tgz holds no proof-<part>.json (the call failed before any part ended: see its log.txt)")
    return parts


def identity(parts: dict[str, dict]) -> tuple[str, str]:
    """(gpu slug, sha) of one call, the same in each of its parts."""
    found = {(gpu_slug(p["environment"]["gpu"].get("name") or "none"), p["environment"]["git"]["sha"] or "unknown") for p in parts.values()}
    if len(found) != 1:
        raise LandError(f"one call's parts disagree on GPU or commit: {sorted(found)}")
    return found.pop()


def check_commit(sha: str, root: Path) -> None:
    """The calls' commit must be one `root`'s repository has: VITFAST_GIT_SHA is passed to the device by hand
    (its .git is older), and the H200 run of 2026-11-27 recorded a mistyped one. Not a git checkout: nothing to check."""
    def git(*args: str) -> int:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True).returncode

    if git("rev-parse", "--git-dir") == 0 and git("cat-file", "-e", f"{sha}^{{commit}}") != 0:
        raise LandError(f"the calls record commit {sha}, which this repository does not have (a mistyped VITFAST_GIT_SHA?); "
                        "if you know the commit they ran, land them with --commit SHA (the recorded one is kept as sha_recorded)")


def land(call_dirs: list[Path], root: Path = ROOT, commit: str | None = None) -> tuple[Path, str]:
    """Land the calls under `root`; returns the results folder and goals.md's text. `commit`: see read_call."""
    results = root / "benchmarks" / "results"
    with tempfile.TemporaryDirectory() as scratch:
        calls = []
        for i, call_dir in enumerate(call_dirs, 1):
            unpacked = Path(scratch) / f"call{i}"
            calls.append((call_dir, unpacked, read_call(call_dir, unpacked, commit)))
        ids = {identity(parts) for _, _, parts in calls}
        if len(ids) != 1:
            raise LandError(f"the calls come from different GPUs or commits: {sorted(ids)}; land each session's calls on their own")
        gpu, full_sha = ids.pop()
        check_commit(full_sha, root)
        sha = full_sha[:7]
        dest = results / f"gpu-proof-{gpu}-{sha}"
        if dest.exists():
            raise LandError(f"{dest} exists already: these calls were landed, or remove it first")
        e2e_files = []  # (source, target): each call's `vitfast bench` result and plot, beside the other results
        for i, (_, unpacked, parts) in enumerate(calls, 1):
            if parts.get("e2e", {}).get("rows"):
                stem = f"gpu-{gpu}-{sha}" + ("" if i == 1 else f"-call{i}")
                e2e_files += [(unpacked / f"proof-e2e{ext}", results / (stem + ext)) for ext in (".json", ".png")
                              if (unpacked / f"proof-e2e{ext}").exists()]  # fmt: skip
        clash = [str(target) for _, target in e2e_files if target.exists()]
        if clash:
            raise LandError(f"{', '.join(clash)} exist already: these calls were landed, or remove them first")
        cut = [cut_parts(call_dir, parts) for call_dir, _, parts in calls]
        goals, moved = goals_markdown([parts for _, _, parts in calls], cut), {src for src, _ in e2e_files}
        with claim_output(dest, directory=True) as out:
            out.tmp.mkdir()
            for i, (call_dir, unpacked, _) in enumerate(calls, 1):
                prefix = "" if i == 1 else f"call{i}-"
                for path in sorted(set(unpacked.iterdir()) - moved):
                    shutil.copy2(path, out.tmp / (prefix + path.name))
                if (call_dir / "log.txt").exists():
                    shutil.copy2(call_dir / "log.txt", out.tmp / f"call{i}-log.txt")
            (out.tmp / "goals.md").write_text(goals)
        for src, target in e2e_files:
            atomic_write(target, lambda tmp, src=src: shutil.copy2(src, tmp), force=False)
        for table in (unpacked / name for _, unpacked, parts in calls if "kernels" in parts  # the last kernels part's wins
                      for name in ("mlp_dispatch.json", "attention_dispatch.json")):
            if table.exists():
                atomic_write(root / "kernels" / table.name, lambda tmp, src=table: shutil.copy2(src, tmp))
    regenerate_readme(root)
    return dest, goals


def cut_parts(call_dir: Path, parts: dict[str, dict]) -> list[str]:
    """The parts the call's log.txt shows started ("=== NAME (") that returned no result: cut by the device's limit."""
    log = call_dir / "log.txt"
    started = re.findall(r"^=== (\w+) \(", log.read_text(errors="replace"), flags=re.M) if log.exists() else []
    return [part for part in started if part in PARTS and part not in parts]


def regenerate_readme(root: Path) -> None:
    """benchmarks/README.md from every result file, as `make bench` writes it."""
    files = sorted(str(p) for p in (root / "benchmarks" / "results").glob("*.json"))
    if not files:  # no `vitfast bench` result anywhere (a call that returned no e2e part, into a bare tree)
        return
    done = subprocess.run([sys.executable, "-m", "vitfast.cli", "bench", "--report", *files], capture_output=True, text=True)
    if done.returncode != 0:
        raise LandError(f"regenerating benchmarks/README.md failed: {done.stderr.strip()[-500:]}")
    atomic_write_text(root / "benchmarks" / "README.md", done.stdout)


# ---------------------------------------------------------------------------- the goals
def first(rows, **match) -> dict | None:
    """The first row with status ok whose fields equal `match`."""
    return next((r for r in rows if r.get("status") == "ok" and all(r.get(k) == v for k, v in match.items())), None)


def goal(name: str, value: float | None, target: float, better: str, shown: str) -> dict:
    """One goal's row: met, missed (at what share of the goal), or not measured. `better`: 'higher' or 'lower'."""
    if value is None:
        return {"goal": name, "measured": "not measured in these calls", "verdict": "open"}
    share = value / target if better == "higher" else target / value
    return {"goal": name, "measured": shown, "verdict": "met" if share >= 1 else f"missed: {100 * share:.0f}% of the goal"}


def e2e_ratio(rows: list[dict], backend: str, over: str, **match) -> tuple[float | None, str]:
    """images/s of `backend` over `over` at the same model, precision and batch."""
    a, b = first(rows, backend=backend, **match), first(rows, backend=over, **match)
    if not (a and b):
        return None, ""
    ratio = a["images_per_s"] / b["images_per_s"]
    return ratio, f"{ratio:.2f}x ({a['p50_ms']:.2f} vs {b['p50_ms']:.2f} ms p50)"


def goals_table(calls: list[dict[str, dict]]) -> list[dict]:
    """The issue's goals (fp16 on the GPU of the run), from the newest call that measured each."""
    kernels = next((c["kernels"] for c in reversed(calls) if "kernels" in c), {})
    e2e = [r for c in reversed(calls) if "e2e" in c for r in c["e2e"].get("rows", [])]
    att = first(kernels.get("attention", []), N=197, D=64, B=256, dtype="float16")
    ln = first(kernels.get("add_layernorm", []), C=768, dtype="float16")
    vitb = dict(model="vit_base_patch16_224", precision="fp16", batch=256)
    eager_ratio, eager_shown = e2e_ratio(e2e, "vitfast", "eager", **vitb)
    # like for like: max-autotune captures CUDA graphs (Inductor's "triton.cudagraphs"), so vitfast with its graphs
    autotune_ratio, autotune_shown = e2e_ratio(e2e, "vitfast-graphs", "compile-max-autotune", **vitb)
    graphs = first(e2e, backend="vitfast-graphs", model="vit_base_patch16_224", precision="fp16", batch=1)
    return [
        goal("fused attention >= 1.2x SDPA's best backend, N=197, D=64, fp16, batch 256", att and att["speedup_vs_best_sdpa"], 1.2, "higher",
             att and f"{att['speedup_vs_best_sdpa']:.2f}x ({att['vitfast_TFLOPs']:.0f} TFLOP/s)"),
        goal("add+LayerNorm >= 85% of copy bandwidth at D=768 (fp16)", ln and ln["fraction_of_copy"], 0.85, "higher",
             ln and f"{100 * ln['fraction_of_copy']:.0f}% ({ln['vitfast_GBps']:.0f} GB/s)"),
        goal("ViT-B/16 fp16 batch 256: optimize() >= 1.3x eager (SDPA)", eager_ratio, 1.3, "higher", eager_shown),
        goal("ViT-B/16 fp16 batch 256: optimize() >= 1.1x torch.compile max-autotune (both with CUDA graphs)", autotune_ratio, 1.1, "higher",
             autotune_shown),
        goal("ViT-B/16 fp16 batch 1 with CUDA graphs <= 0.7 ms", graphs and graphs["p50_ms"], 0.7, "lower", graphs and f"{graphs['p50_ms']:.3f} ms p50"),
    ]  # fmt: skip


def goals_markdown(calls: list[dict[str, dict]], cut: list[list[str]]) -> str:
    """goals.md: the goals' table, then what else a reader of the run needs first. `cut`: per call, the parts that
    started and returned nothing (`cut_parts`): their goals read "not measured" for that reason."""
    env = next(iter(calls[0].values()))["environment"]
    gpu, git = env["gpu"], env["git"]
    lines = [f"# GPU proof: goals ({gpu.get('name')}, commit {(git['sha'] or '?')[:7]}{' + local changes' if git.get('dirty') else ''})", "",
             "Generated by benchmarks/land_proof.py from the calls' JSON; do not edit by hand.", "",
             "| goal | measured | verdict |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {g['goal']} | {g['measured']} | {g['verdict']} |" for g in goals_table(calls)]
    lines += ["", "## Beside the goals", ""]
    for i, (parts, cut_parts_of_call) in enumerate(zip(calls, cut), 1):
        for part in cut_parts_of_call:
            lines.append(f"- call {i} {part}: **started but returned no result** (log.txt): the call was cut before the part "
                         "wrote its files; what it measured is only in the log")  # fmt: skip
        tests = parts.get("tests")
        if tests:
            p = tests.get("pytest", {})
            parity = tests.get("model_parity", [])
            bad = [f"{r['model']} {r['dtype']} b{r['batch']} {r['check']}" for r in parity if r.get("passes") is False]
            ran = (f"pytest not run ({p['not_run']})" if p.get("not_run") else
                   f"pytest {p.get('passed', '?')} passed, {p.get('failed', '?')} failed, {p.get('skipped', '?')} skipped"
                   f"{' (time box hit)' if p.get('timed_out') else ''}")  # fmt: skip
            lines.append(f"- call {i} tests: {ran}; optimize() parity rows {sum(r.get('status') == 'ok' for r in parity)} "
                         f"ran, failing: {', '.join(bad) or 'none'}")  # fmt: skip
        check = next((r["tma_check"] for r in parts.values() if r.get("tma_check")), None)  # the same verdict in each part
        if check and check["passed"]:
            lines.append(f"- call {i} TMA check: passed ({len(check['rows'])} forced launches within the 2x rule)")
        elif check and check["passed"] is False:
            why = "; ".join(check.get("failed") or []) or check.get("reason", "")
            lines.append(f"- call {i} TMA check: **FAILED** ({why}); the rest of the call ran with VITFAST_TMA=0 (pointer kernels)")
        for r in parts.get("kernels", {}).get("mlp", []):
            if r.get("status") == "ok" and r["op"].startswith("fc1") and r.get("model") == "vit_base" and r.get("batch") == 256:
                pointer = f", pointer kernel {r['pointer_TFLOPs']:.0f}" if r.get("pointer_TFLOPs") else ""
                bias_gelu = f", cuBLAS + vitfast's bias+GELU {r['bias_gelu_TFLOPs']:.0f}" if r.get("bias_gelu_TFLOPs") else ""
                lines.append(f"- call {i} fc1 + bias + GELU, ViT-B/16 batch 256 {r['dtype']}: {r.get('epilogue_kernel', 'pointer')} kernel "
                             f"{r['epilogue_TFLOPs']:.0f} TFLOP/s{pointer}, cuBLAS + PyTorch's GELU {r['cublas_TFLOPs']:.0f} "
                             f"(speedup {r['speedup']:.2f}x){bias_gelu}")  # fmt: skip
        for r in parts.get("kernels", {}).get("activations", []):
            if r.get("status") == "ok" and r["op"] == "bias+gelu":  # fp16/bf16: the erfc form
                lines.append(f"- call {i} bias + GELU kernel, {r['rows']} x {r['H']} {r['dtype']}: {r['vitfast_GBps']:.0f} GB/s, "
                             f"{r['fraction_of_copy']:.0%} of copy (PyTorch's F.gelu(x + b): {r['torch_GBps']:.0f} GB/s)")  # fmt: skip
        ratio, shown = e2e_ratio(parts.get("e2e", {}).get("rows", []), "vitfast-every-token", "eager",
                                 model="vit_base_patch16_224", precision="fp16", batch=256)  # fmt: skip
        if ratio is not None:  # the goal's optimize() computes the last block on the class token only (head_only)
            lines.append(f"- call {i} ViT-B/16 fp16 batch 256, optimize() with the last block over every token (vitfast-every-token): "
                         f"{shown} over eager")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("calls", nargs="+", type=Path, help="the folders the device calls returned, in call order")
    p.add_argument("--commit", help="the full sha the calls ran, where they recorded a wrong one (kept as sha_recorded)")
    args = p.parse_args(argv)
    try:
        dest, goals = land(args.calls, commit=args.commit)
    except LandError as exc:
        print(f"land_proof.py: {exc}", file=sys.stderr)
        return 2
    print(goals)
    print(f"landed in {dest.relative_to(ROOT)}; kernels/ dispatch tables and benchmarks/README.md updated: review, then commit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
