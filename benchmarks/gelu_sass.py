"""SASS instructions per element of the GELU forms in kernels/bias_gelu.py, compiled for a GPU on a
machine without one (the ptxas and cuobjdump shipped in the triton wheel).

    python benchmarks/gelu_sass.py [--arch 90] [--json FILE]

Each form is compiled inside the same 1-D elementwise kernel (fp16 in, fp16 out, 16-byte aligned,
no mask), once as a 16-bit output takes it (`fast`: erf through erfc, the reciprocal as rcp.approx.ftz)
and once as fp32 outputs take it (libdevice's erf, Triton's div.full.f32 division): the difference is
the GELU's own cost. Why it matters: a GPU issues ~128 thread-instructions per clock per SM, and reads + writes
4 bytes per fp16 element, so a GELU over fc1's output is issue-bound once instructions per element
exceed 128 x 4 / (bytes per clock per SM): ~40 on an H100 (3.35 TB/s), ~28 on an H200 (4.8 TB/s),
both 132 SMs at 1.98 GHz. Must run without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
import triton.language as tl

from vitfast.kernels.aot import specialised_source
from vitfast.kernels.bias_gelu import GELU_FORMS, gelu

BLOCK, NUM_WARPS = 2048, 4
# a SASS line: "/*0a30*/  [@!P0] OPCODE.MODIFIERS operands ;"
APPROX_PTX = ("rcp.approx.ftz.f32", "ex2.approx.ftz.f32")  # bias_gelu's FAST path writes both; libdevice's erf uses the ex2 too
SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)[.\s;]")


@triton.jit
def _gelu_1d(X, Y, FORM: tl.constexpr, FAST: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs).to(tl.float32)
    tl.store(Y + offs, gelu(x, FORM, FAST).to(Y.dtype.element_ty))


def sass_opcodes(cubin: bytes) -> collections.Counter:
    """Opcode -> count in a cubin's SASS (cuobjdump from the triton wheel), NOPs left out."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    ops = (m.group(1) for m in map(SASS_LINE.match, sass.splitlines()) if m)
    return collections.Counter(op for op in ops if op != "NOP")


def count(form: str, fast: bool, arch: int) -> dict:
    x = torch.empty(BLOCK, dtype=torch.float16)
    src, target, _, options = specialised_source(
        _gelu_1d, (x, torch.empty_like(x)), dict(FORM=GELU_FORMS[form], FAST=fast, BLOCK=BLOCK, num_warps=NUM_WARPS), arch)
    compiled = triton.compile(src, target=target, options=options.__dict__)
    ops = sass_opcodes(compiled.asm["cubin"])
    per_thread = BLOCK // (32 * NUM_WARPS)
    return dict(form=form, fast=fast, arch=f"sm_{arch}", instructions=sum(ops.values()),
                per_element=round(sum(ops.values()) / per_thread, 2), mufu=ops["MUFU"],
                approx_ptx=sorted(i for i in APPROX_PTX if i in compiled.asm["ptx"]), top=dict(ops.most_common(6)))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 89, 90 (default 90: sm_90a)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("gelu_sass.py compiles for a GPU: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    rows = [count(form, fast, args.arch) for form in GELU_FORMS for fast in (False, True)]
    print(f"| form | 16-bit output (fast) | SASS per fp16 element | MUFU per thread | triton {triton.__version__}, sm_{args.arch} |")
    print("|---|---|---:|---:|---|")
    for r in rows:
        print(f"| {r['form']} | {r['fast']} | {r['per_element']} | {r['mufu']} | {r['top']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
