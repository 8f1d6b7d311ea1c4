"""`vitfast bench`: an honest benchmark harness for every backend (issue #5).

    from vitfast.bench import Settings, run_sweep
    result = run_sweep(Settings(models=["vit_tiny_patch16_224"], backends=["eager", "onnxruntime"],
                                batches=[1, 8], precisions=["fp32"]))

Modules: `backends` (what runs, why one is skipped), `measure` (timers, memory, matmul peak,
environment), `stats` (percentiles, spread, comparisons), `sweep` (the loop and the JSON schema),
`report` (tables, CSV, markdown, plot, README). The subcommand is `vitfast.cli.bench`.
"""

from .backends import BACKENDS, PRECISIONS, BackendOptions, Platform, detect_platform, skip_reason
from .stats import compare_rows, percentile, summarize
from .sweep import SCHEMA, Settings, load_result, run_sweep, validate_result

__all__ = [
    "BACKENDS", "PRECISIONS", "SCHEMA", "BackendOptions", "Platform", "Settings", "compare_rows",
    "detect_platform", "load_result", "percentile", "run_sweep", "skip_reason", "summarize", "validate_result",
]  # fmt: skip
