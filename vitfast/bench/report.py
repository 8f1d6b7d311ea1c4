"""Presenting results: terminal tables, CSV, markdown, plots, comparisons and benchmarks/README.md."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from rich.markup import escape

from vitfast.atomic import atomic_write
from vitfast.errors import BackendUnavailable, InputError

from .stats import PERCENTILES, backend_label

CSV_FIELDS = ("model", "img_size", "backend", "precision", "batch", "status", "reason", "runs_on", "n", "median_ms",
              "p50_ms", "p95_ms", "p99_ms", "mean_ms", "std_ms", "min_ms", "max_ms", "spread", "images_per_s",
              "tflops", "pct_of_peak", "gflops_per_image", "peak_memory_mib", "prepare_s", "load_s", "first_call_s", "timer")  # fmt: skip


NOISY = 0.10  # repeats further apart than this are flagged: the machine was busy, rerun before trusting the row


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def peak_label(result: dict[str, Any]) -> str:
    p = result["peak"]
    return f"{p['dtype']} matmul {p['size']}^3 on {p['device']}: {p['tflops'] * 1e3:.1f} GFLOP/s"


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    """The measured rows as display strings, in the column order of `TABLE_COLUMNS`."""
    out = []
    for r in result["rows"]:
        if r["status"] != "ok":
            continue
        out.append([
            r["model"], str(r["img_size"]), r["backend"], r["precision"], str(r["batch"]), str(r["n"]),
            _f(r["median_ms"], ".2f"), _f(r["p95_ms"], ".2f"), _f(r["p99_ms"], ".2f"), _f(r["images_per_s"], ".1f"),
            _f(r["tflops"] * 1e3 if r["tflops"] is not None else None, ".1f"), _f(r["pct_of_peak"], ".0f"), _f(r["peak_memory_mib"], ".0f"),
            _f(100 * r["spread"] if r["spread"] is not None else None, ".1f") + (" !" if (r["spread"] or 0) > NOISY else ""),
        ])  # fmt: skip
    return out


TABLE_COLUMNS = ("model", "img", "backend", "prec", "batch", "n", "median ms", "p95 ms", "p99 ms", "img/s",
                 "GFLOP/s", "% peak", "peak MiB", "spread %")  # fmt: skip


def not_measured(result: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Skipped / failed rows folded over batch sizes: (model@img, backend, precision, batches, reason)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for r in result["rows"]:
        if r["status"] != "ok":
            groups[(f"{r['model']}@{r['img_size']}", r["backend"], r["precision"], f"{r['status']}: {r['reason']}")].append(r["batch"])
    return [(m, b, p, ",".join(map(str, batches)), reason) for (m, b, p, reason), batches in groups.items()]


# the 80-column view: header -> column of TABLE_COLUMNS (n, p95 and GFLOP/s are in --markdown / --csv / --out)
COMPACT_COLUMNS = {"backend": "backend", "prec": "prec", "batch": "batch", "median": "median ms", "p99": "p99 ms", "img/s": "img/s",
                   "%peak": "% peak", "MiB": "peak MiB", "spread": "spread %"}  # fmt: skip


def rich_tables(result: dict[str, Any], compact: bool = False) -> list:
    """The terminal view: the measured table, then what was skipped and why; `compact`: one table per
    model and image size with `COMPACT_COLUMNS`, and the skipped rows as wrapped lines (fits 80 columns)."""
    from rich.table import Table

    env = result["environment"]
    title = f"vitfast bench on {device_label(result)} (torch {env['versions']['torch']}, git {(env['git']['sha'] or '?')[:10]})"
    if compact:
        return _compact_tables(result, title)
    table = Table(title=title, caption=f"% peak: of the measured {peak_label(result)}; spread: gap between two repeats' medians")
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="left" if col in ("model", "backend", "prec") else "right", no_wrap=col == "model")
    for row in table_rows(result):
        table.add_row(*map(escape, row))
    out = [table]
    skipped = not_measured(result)
    if skipped:
        skip = Table(title="not measured", show_lines=False)
        for col in ("model", "backend", "prec", "batches", "reason"):
            skip.add_column(col, overflow="fold")
        for row in skipped:
            skip.add_row(*map(escape, row))  # a reason's "pip install 'vitfast[onnx]'" is not rich markup
        out.append(skip)
    return out


def _compact_tables(result: dict[str, Any], title: str) -> list:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    picks = [TABLE_COLUMNS.index(c) for c in COMPACT_COLUMNS.values()]
    by_model: dict[str, list[list[str]]] = defaultdict(list)
    for row in table_rows(result):
        by_model[f"{row[0]} at {row[1]} px"].append([row[i] for i in picks])
    out: list = [Text(title, style="bold")]
    for name, rows in by_model.items():
        table = Table(title=escape(f"{name}, latency in ms"), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
        for col in COMPACT_COLUMNS:
            table.add_column(col, justify="left" if col in ("backend", "prec") else "right", no_wrap=True)
        for row in rows:
            table.add_row(*map(escape, row))
        out.append(table)
    out.append(Text(f"%peak: of the measured {peak_label(result)}; spread: % gap between two repeats' medians", style="dim"))
    skipped = not_measured(result)
    if skipped:
        out.append(Text("not measured:", style="bold"))
        out += [Text(f"- {b} {p} ({m}, batch {bs}): {reason}") for m, b, p, bs, reason in skipped]
    return out


def device_label(result: dict[str, Any]) -> str:
    env = result["environment"]
    gpu = env["gpu"]
    if gpu.get("available"):
        return gpu["name"]
    cpu = env["cpu"]
    return f"{cpu['model']} ({cpu['cpus_usable']} CPUs, {cpu['torch_threads']} torch threads)"


def to_csv(result: dict[str, Any]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in result["rows"]:
        writer.writerow({k: row.get(k) for k in CSV_FIELDS})
    return buf.getvalue()


def to_markdown(result: dict[str, Any]) -> str:
    """A GitHub markdown table of the measured rows, then the skipped ones with their reasons."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * 3 + "---:|" * (len(TABLE_COLUMNS) - 3)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(result)]
    methods = sorted({r["memory_method"] for r in result["rows"] if r["status"] == "ok" and r["memory_method"]})
    lines += ["", f"n: timed calls (two repeats). % peak: of the {peak_label(result)} measured in the same run "
              "(before and after the sweep). spread %: gap between the medians of two back-to-back repeats of the "
              f"same row; differences smaller than it are noise, and `!` marks a spread over {NOISY:.0%} (the machine "
              f"was busy: rerun before trusting the row). peak MiB: {'; '.join(methods) or 'not measured'}."]  # fmt: skip
    skipped = not_measured(result)
    if skipped:
        lines += ["", "Not measured:", ""]
        lines += [f"- {b} {p} ({m}, batch {bs}): {reason}" for m, b, p, bs, reason in skipped]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- plot
def series(result: dict[str, Any]) -> dict[tuple[str, int], dict[str, list[dict]]]:
    """OK rows grouped by (model, img size) then by 'backend precision', sorted by batch."""
    out: dict[tuple[str, int], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in result["rows"]:
        if r["status"] == "ok":
            out[(r["model"], r["img_size"])][f"{r['backend']} {r['precision']}"].append(r)
    for by_name in out.values():
        for rows in by_name.values():
            rows.sort(key=lambda r: r["batch"])
    return out


def require_matplotlib() -> None:
    """Fail early, in one line, when --plot cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BackendUnavailable("--plot needs matplotlib: pip install 'vitfast[plot]'") from None


def build_figure(result: dict[str, Any]):
    """Matplotlib figure: per model, throughput vs batch (top) and p50/p95/p99 latency vs batch (bottom)."""
    require_matplotlib()
    from matplotlib.figure import Figure  # a bare Figure draws on Agg: no window, no global backend switch
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator

    groups = series(result)
    if not groups:
        raise InputError("nothing to plot: every row was skipped or failed")
    fig = Figure(figsize=(6.5 * len(groups), 9), layout="constrained")
    axes = fig.subplots(2, len(groups), squeeze=False)
    styles = {50: "-", 95: "--", 99: ":"}
    for col, ((model, img), by_name) in enumerate(groups.items()):
        top, bottom = axes[0][col], axes[1][col]
        for i, (name, rows) in enumerate(by_name.items()):
            color = f"C{i % 10}"
            batches = [r["batch"] for r in rows]
            top.plot(batches, [r["images_per_s"] for r in rows], "o-", color=color, label=name)
            for q in PERCENTILES:
                bottom.plot(batches, [r[f"p{q}_ms"] for r in rows], styles[q], marker="o", color=color, label=f"{name} p{q}")
        top.set(title=f"{model} @ {img}px: throughput", ylabel="images / s")
        bottom.set(title=f"{model} @ {img}px: latency per batch", ylabel="ms")
        all_batches = sorted({r["batch"] for rows in by_name.values() for r in rows})
        for ax in (top, bottom):
            ax.set(xlabel="batch", xscale="log", yscale="log")
            ax.set_xticks(all_batches, [str(b) for b in all_batches])
            ax.xaxis.set_minor_locator(NullLocator())  # the batch sizes are the only x ticks
            ax.grid(True, alpha=0.3)
        top.legend(fontsize="small")
        # one entry per series (its p50 line) plus one per line style, instead of 3 x series entries
        p50 = [line for line in bottom.get_lines() if line.get_label().endswith(" p50")]
        styled = [Line2D([], [], color="gray", linestyle=styles[q], label=f"p{q}") for q in PERCENTILES]
        bottom.legend(handles=p50 + styled, labels=[h.get_label().removesuffix(" p50") for h in p50] + [f"p{q}" for q in PERCENTILES],
                      fontsize="small")  # fmt: skip
    fig.suptitle(f"vitfast bench on {device_label(result)}")
    return fig


def save_plot(result: dict[str, Any], path, *, force: bool = True) -> Path:
    """The plot as a PNG at `path`, written like every other output (`vitfast.atomic`: whole or not at all,
    the umask's mode like the JSON beside it); `force`: replace an existing file."""
    figure = build_figure(result)
    return atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100), force=force)


# ---------------------------------------------------------------------------- compare
def compare_tables(rows: list[dict[str, Any]], base_name: str, new_name: str, compact: bool = False) -> list:
    """Rich tables of `stats.compare_rows` output: new / base per row with its verdict; `compact`: one
    table per model and image size, short headers and no img/s ratio (1 / latency x), for 80 columns."""
    from rich import box
    from rich.text import Text

    colors = {"win": "green", "regression": "red", "same": "dim"}
    both_skipped = [r for r in rows if r["status"] == "base skipped, new skipped"]
    caption = "ratios are new / base; noise: larger repeat spread of the two"
    if both_skipped:
        caption += f"; {len(both_skipped)} rows skipped in both files not shown"
    shown = [r for r in rows if r not in both_skipped]
    if not compact:
        table = _compare_table(f"{new_name} vs {base_name}", ("model", "img", "backend", "prec", "batch", "base ms", "new ms",
                               "latency x", "img/s x", "p99 x", "noise %", "verdict"), caption=caption)  # fmt: skip
        for r in shown:
            table.add_row(escape(r["model"]), str(r["img_size"]), *_compare_cells(r, colors, throughput=True))
        return [table]
    groups: dict[str, list] = defaultdict(list)
    for r in shown:
        groups[f"{r['model']} at {r['img_size']} px"].append(r)
    out: list = [Text(f"{new_name} vs {base_name}", style="bold")]
    for name, group in groups.items():
        table = _compare_table(f"{name}, median ms", ("backend", "prec", "batch", "base", "new", "lat x", "p99 x", "noise%", "verdict"),
                               title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)  # fmt: skip
        for r in group:
            table.add_row(*_compare_cells(r, colors, throughput=False))
        out.append(table)
    out.append(Text(caption, style="dim"))
    return out


def _compare_table(title: str, columns: tuple[str, ...], **options):
    from rich.table import Table

    table = Table(title=title, **options)
    for col in columns:
        table.add_column(col, justify="left" if col in ("model", "backend", "prec", "verdict") else "right", no_wrap=col != "verdict")
    return table


def _compare_cells(r: dict[str, Any], colors: dict[str, str], throughput: bool) -> list[str]:
    """backend .. verdict of one compared row."""
    head = [escape(r["backend"]), r["precision"], str(r["batch"]), _f(r["base_ms"], ".2f"), _f(r["new_ms"], ".2f")]
    if r["status"] != "ok":
        return [*head, *["-"] * (3 + throughput), f"[yellow]{r['status']}[/yellow]"]
    v = r["verdict"]
    ratios = [r["latency_ratio"], *([r["throughput_ratio"]] if throughput else []), r["p99_ratio"]]
    return [*head, *(f"{x:.3f}" for x in ratios), f"{100 * r['noise']:.1f}", f"[{colors[v]}]{v}[/{colors[v]}]"]


# ---------------------------------------------------------------------------- README
GPU_SWEEP = """\
vitfast export --model vit_small_patch16_224 --format trt --precision fp16 --batch 1:64:256 --out /tmp/vit_s.engine
vitfast export --model vit_base_patch16_224  --format trt --precision fp16 --batch 1:64:256 --out /tmp/vit_b.engine
vitfast export --model vit_large_patch16_224 --format trt --precision fp16 --batch 1:64:256 --out /tmp/vit_l.engine
vitfast bench --model vit_small_patch16_224,vit_base_patch16_224,vit_large_patch16_224 \\
    --backends eager,eager-math,compile,vitfast,vitfast-graphs,onnxruntime,tensorrt \\
    --batch 1,8,64,256 --precision fp16 --compile-mode max-autotune --repeats 100 \\
    --engine /tmp/vit_s.engine --engine /tmp/vit_b.engine --engine /tmp/vit_l.engine \\
    --out benchmarks/results/gpu-$(nvidia-smi --query-gpu=name --format=csv,noheader | tr ' ' '_')-$(git rev-parse --short HEAD).json \\
    --plot benchmarks/results/gpu-$(git rev-parse --short HEAD).png"""

README_HEAD = """\
# Benchmarks

<!-- Generated by `make bench` (`vitfast bench --report benchmarks/results/*.json`); do not edit by hand. -->

Every figure below comes from a JSON file in `results/` written by `vitfast bench --out`; the file
holds every raw timing, the command that produced it and the environment (CPU/GPU, driver, CUDA,
torch/triton/onnxruntime/OpenVINO/TensorRT versions, git sha, threads, load average). Models have random
weights (`torch.manual_seed(0)`); speed does not depend on the weight values.

**Method.** Warm-up (compilation, autotuning, engine load, export) stays outside the timings, and
so do an engine's input checks (once per input batch; each row's `details.timed` says what a call
includes); inputs rotate among 4 random batches; CUDA events on a GPU, `perf_counter_ns` on the CPU; two
back-to-back repeats per row. Latency percentiles are over both repeats' calls; *spread* is the
gap between the two repeats' medians, the noise floor of that row: a difference between rows
smaller than their spreads is not a result. *% peak* is the row's GFLOP/s (2 x `count_macs`
per image) over a dense matmul measured on the same device in the same run (fp32 on CPU, fp16
on GPU), so int8 rows can exceed 100%.
"""

README_GPU = """\
## GPU sweep ({status})

On a CUDA machine with TensorRT (engines must be built on the GPU that runs them), take the
sweep below (ViT-S/16, B/16, L/16 at batch 1, 8, 64, 256 in fp16 through every GPU backend),
commit the JSON and regenerate this file with
`vitfast bench --report benchmarks/results/*.json > benchmarks/README.md`.

```bash
{command}
```

### The GPU proof: one script, one device call

`benchmarks/gpu_proof.py` is everything a lent GPU must show (GPU tests and optimize() parity;
kernels vs SDPA backends, PyTorch, copy bandwidth and cuBLAS: attention, add+LayerNorm,
bias+GELU / SwiGLU, the 2-D RoPE on the packed qkv in both layouts (rotate-half: DINOv3
S/B/L at 256 px; interleaved: EVA-02 B/L at 448 px; vs eager `apply_rope`), the epilogue GEMMs,
and the MLP dispatch table from that measurement, with each autotuned kernel's timings per config and a per-kernel profile of one
ViT-B/16 forward, eager vs optimize(); end to end ViT-S/B/L fp16 + bf16 at batch 1-256 across eager, torch.compile default
and max-autotune, optimize, optimize + CUDA graphs, optimize + torch.compile), written as JSON +
markdown + PNG into one folder. Offline, no TensorRT; each part is time-boxed and always writes its
files. Each part first compiles the kernels x autotune configs it will need in parallel threads
(`vitfast.kernels.precompile`), and the GPU tests run under pytest-xdist.

A session is lent 15 device minutes, machine start included, and a machine idle for 30 s goes back:
`benchmarks/gpu_proof_call.sh` runs the three parts in one call (tests 130 s, kernels 170 s, e2e
200 s by default; the first part also checks the Hopper TMA GEMMs and turns them off for the rest of
the call if they fail) and packs the results into the two files the device returns. On the device
(repository root, files come back from `$OUT`), carrying a setuptools wheel in `.whl/`:

```bash
VITFAST_GIT_SHA=<the commit sent> bash benchmarks/gpu_proof_call.sh
# then, on the same warm machine, within 30 s: what the first call leaves out, e.g. max-autotune at batch 1 too
PARTS=e2e E2E_S=420 E2E_ARGS="--models vit_base_patch16_224 --precisions fp16 --backends compile-max-autotune --autotune-batches 1,256" \
  VITFAST_GIT_SHA=<the commit sent> bash benchmarks/gpu_proof_call.sh
# or the bf16 parity rows, the whole tests box to them (no pytest)
PARTS=tests TESTS_S=200 TESTS_ARGS="--precisions bf16 --pytest-share 0" VITFAST_GIT_SHA=<the commit sent> bash benchmarks/gpu_proof_call.sh
```

`VITFAST_GIT_SHA` names the commit in the results: the device gets the working tree beside an older
`.git`. Then `python benchmarks/land_proof.py CALL1_DIR [CALL2_DIR ...]` (the folders the calls
returned) files everything: the proof under `results/gpu-proof-<gpu>-<sha>/` with a generated
`goals.md` (the issue's goals, met or missed and at what share, from the rows), each e2e result in
`results/`, the measured dispatch tables in `kernels/`, and this file regenerated.
`make gpu-proof` runs all three parts on a CUDA machine; `--dry-run` (CPU, tiny shapes, Triton
interpreter) of the call script is in `make test`. Before spending device time, `make
test-device-stack` runs the whole suite on CPU with the device's own versions (torch 2.11, triton
3.6, onnxruntime 1.30, transformers 5.17). The first GPU run's findings are in
`results/gpu-proof-h100-18ef7c3/README.md`.
"""

README_TAIL = """\
## pytest-benchmark suites

```bash
pytest benchmarks/ --benchmark-only                              # CPU: tiny shapes, kernels in the Triton interpreter
VITFAST_TEST_DEVICE=cuda pytest benchmarks/ --benchmark-only     # GPU: ViT-B/16 fp16 end to end, kernel TFLOP/s and GB/s
```
`make test` runs them once with `--benchmark-disable`, so they cannot rot unnoticed.

Compare two result files (two commits, two machines): `vitfast bench --compare A.json B.json`.
Its verdicts weigh each ratio against the rows' own repeat spread, which only sees noise within
a run; between runs on a shared machine the load drifts, so raise `--noise-floor` there.
"""


def _latest(results: Iterable[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The newest result per series, newest first: a later sweep supersedes one that measured the same rows
    (device, models, backends, precisions, batches, image sizes, artifacts), not an fp32 sweep an int8 one, nor a
    default-mode torch.compile sweep a max-autotune one (their rows are labelled apart: `stats.backend_label`)."""
    best: dict[tuple, tuple[str, dict[str, Any]]] = {}
    for name, result in results:
        s = result["settings"]
        backends = [backend_label(b, s["options"].get("compile_mode", "default")) for b in s["backends"]]
        measured = (s["models"], backends, s["precisions"], s["batches"], s["img_sizes"], s.get("artifacts", []))  # older files: no artifacts
        key = (device_label(result), *(tuple(map(str, items)) for items in measured))
        if key not in best or result["environment"]["time_utc"] > best[key][1]["environment"]["time_utc"]:
            best[key] = (name, result)
    return sorted(best.values(), key=lambda item: item[1]["environment"]["time_utc"], reverse=True)


def _load(cpu: dict[str, Any]) -> str:
    """The load average at the start and, where it was recorded (not in the GPU proof's older files), at the end."""
    end = cpu.get("loadavg_end")
    return f"{cpu['loadavg_start'][0]:.1f} at start" + (f", {end[0]:.1f} at end" if end else "")


def _changes(git: dict[str, Any]) -> str:
    if not git.get("dirty"):
        return ""
    files = git.get("changed_files") or []
    return f", with uncommitted changes in {', '.join(files)}" if files else ", with uncommitted changes"


def read_other(path) -> dict[str, Any] | None:
    """Another script's result (benchmarks/cpu_int8.py, gpu_proof.py): JSON with `environment` and
    a list of flat `rows`, else None (then it is only named)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return None
    return data


def _other_machine(env: dict[str, Any]) -> str:
    """The CPU, load average and runtime versions another script recorded, as one line ('' if none):
    figures from two machines must not be read as one series."""
    parts = []
    if isinstance(env.get("cpu"), str):
        cpus = env.get("logical_cpus")
        parts.append(f"CPU {env['cpu']}" + (f" ({cpus} logical)" if cpus else ""))
    start, end = env.get("loadavg_start"), env.get("loadavg_end")
    if isinstance(start, list) and isinstance(end, list) and start and end:
        parts.append(f"load average {start[0]:.1f} at start, {end[0]:.1f} at end")
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else {}
    parts += [f"{k} {versions[k]}" for k in ("torch", "onnxruntime", "openvino", "nncf") if versions.get(k)]
    return "; ".join(parts)


def other_markdown(name: str, data: dict[str, Any]) -> str:
    """One section for another script's rows: its command, git sha and threads, then every scalar column."""
    env = data.get("environment", {})
    columns = [k for k in data["rows"][0] if all(not isinstance(r.get(k), (dict, list)) for r in data["rows"])]

    def cell(value: Any) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    facts = [f"git `{str(env.get('git_sha', 'unknown'))[:10]}`", f"threads {env.get('threads', '?')}"]
    facts += [f"{k} {v}" for k, v in data.items() if isinstance(v, (str, int, float))]
    lines = [
        f"### `{name}`\n",
        f"```bash\n{env.get('command', '(command not recorded)')}\n```\n",
        ", ".join(facts) + "\n",
        *([machine + "\n"] if (machine := _other_machine(env)) else []),
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    lines += ["| " + " | ".join(cell(r.get(k, "")) for k in columns) + " |" for r in data["rows"]]
    return "\n".join(lines) + "\n"


def render_readme(results: Iterable[tuple[str, dict[str, Any]]], others: Iterable[tuple[str, dict[str, Any] | None]] = ()) -> str:
    """benchmarks/README.md from (file name, result) pairs: the latest result of each series.
    `others`: (file name, data) of other scripts' results in results/, shown as their own rows
    when `read_other` could read them, else named."""
    results = list(results)
    latest = _latest(results)
    parts = [README_HEAD]
    for name, result in latest:
        env, cpu = result["environment"], result["environment"]["cpu"]
        v = env["versions"]
        sha = env["git"]["sha"] or "unknown"
        parts += [
            f"## {device_label(result)}, {env['time_utc'][:10]}\n",
            f"`{name}` (git `{sha[:10]}`{_changes(env['git'])}), produced by:\n",
            f"```bash\n{env['command']}\n```\n",
            f"torch {v['torch']}, onnxruntime {v['onnxruntime']}, triton {v['triton']}, TensorRT {v['tensorrt'] or 'not installed'}"
            # OpenVINO: only where recorded (older files did not record it, which is not "not installed")
            f"{', OpenVINO ' + (v['openvino'] or 'not installed') if 'openvino' in v else ''}; Python {env['python']}; "
            f"load average {_load(cpu)} on {cpu['cpus_usable']} usable CPUs. Sweep time {result.get('elapsed_s', 0) / 60:.1f} min.\n",
            to_markdown(result),
        ]  # fmt: skip
    older = sorted({name for name, _ in results} - {name for name, _ in latest})
    if older:
        parts.append(f"Older results in `results/`, superseded by the runs above: {', '.join(f'`{n}`' for n in older)}.\n")
    others = sorted(others, key=lambda item: item[0])
    if others:
        parts.append("## Other scripts' results\n")
        parts += [other_markdown(name, data) for name, data in others if data is not None]
        unread = [name for name, data in others if data is None]
        if unread:
            parts.append(f"Also in `results/` (see each file's command): {', '.join(f'`{n}`' for n in unread)}.\n")
    measured = any(r["environment"]["gpu"].get("available") for _, r in results)
    parts += [README_GPU.format(status="how to repeat it" if measured else "not measured yet", command=GPU_SWEEP), README_TAIL]
    return "\n".join(parts)
