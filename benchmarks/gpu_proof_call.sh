#!/usr/bin/env bash
# One device call of the GPU proof for a short lease (15 device minutes, one call of <= 10 minutes):
# install, then the three parts back to back under their own time boxes (tests, kernels, e2e: the
# dispatch tables the kernels part measured are copied into kernels/ first, so the e2e part times
# optimize() as it runs once they are committed), results packed into two files under $OUT (the
# device returns at most 8): proof.tgz (every part's JSON, markdown, PNG, JUnit XML and the two
# dispatch tables; packed again after each part, so a call the device cuts at its limit still returns
# the parts that ended) and log.txt. Budgets in seconds: TESTS_S, KERNELS_S, E2E_S (cut to what is left of
# CALL_S, default 585, for the whole call); the e2e part
# takes E2E_ARGS (default: ViT-B/16 fp16, optimize() with and without head_only (vitfast-every-token); torch.compile
# default left to other calls; max-autotune last, at batch 256 only, measured if the box has a minute left for its
# tuning). PROOF_FLAGS go to
# every part: PROOF_FLAGS=--dry-run checks this script on CPU (tests/test_gpu_proof.py). Set VITFAST_GIT_SHA to the
# commit sent (the device gets the working tree beside an older .git, whose HEAD would be recorded):
#   run: VITFAST_GIT_SHA=<git rev-parse HEAD here> bash benchmarks/gpu_proof_call.sh
# carrying .whl/ with a setuptools wheel in it when the image's setuptools may be older than 77 (the
# device's 2026-11-26 run carried setuptools 80.9.0). INSTALL=0 skips the editable install (tests).
# PARTS picks parts (default "tests kernels e2e"); a second call on the same machine can time what the
# first leaves out, e.g. torch.compile max-autotune at more batch sizes (minutes of tuning each):
#   PARTS=e2e E2E_S=420 E2E_ARGS="--models vit_base_patch16_224 --precisions fp16 --backends compile-max-autotune --autotune-batches 1,256"
# or the bf16 parity rows no call's tests part has reached (TESTS_ARGS go to the tests part only):
#   PARTS=tests TESTS_S=200 TESTS_ARGS="--precisions bf16 --pytest-share 0"
set -uo pipefail
OUT=${OUT:-gpu-proof-out}
CALL_S=${CALL_S:-585}
DIR=$(mktemp -d)
LOG=$OUT/log.txt
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
  if ls .whl/setuptools-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/setuptools-*.whl && export PYTHONPATH=/tmp/site
  fi
  if [ "${INSTALL:-1}" = 1 ]; then
    python3 -m pip install -q --no-deps --no-build-isolation -e . || { echo "install failed"; exit 2; }
  fi
  python3 -c "import torch, triton, vitfast.kernels; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
  pack() { tar -C "$DIR" -czf "$OUT/proof.tgz.part" . && mv "$OUT/proof.tgz.part" "$OUT/proof.tgz"; }
  # shellcheck disable=SC2086  # PROOF_FLAGS is a list of flags
  part() {  # part NAME BUDGET [ARGS...]: the watchdog fires at BUDGET + 30 s; `timeout` is the last resort
    local name=$1 budget=$2; shift 2
    echo "=== $name ($budget s) $(date -u +%T)"
    timeout -k 5 $((budget + 40)) python3 benchmarks/gpu_proof.py --out "$DIR" --part "$name" --budget "$budget" "$@" ${PROOF_FLAGS:-}
    echo "=== $name exit $? $(date -u +%T)"
    pack  # after each part: a call cut at the device's 10-minute limit still returns the parts that ended
  }
  parts=" ${PARTS:-tests kernels e2e} "
  # shellcheck disable=SC2086  # TESTS_ARGS is a list of flags
  [[ $parts == *" tests "* ]] && part tests "${TESTS_S:-130}" ${TESTS_ARGS:-}
  [[ $parts == *" kernels "* ]] && part kernels "${KERNELS_S:-170}"
  case " ${PROOF_FLAGS:-} " in
    *" --dry-run "*) echo "dry run: the committed dispatch tables stay as they are" ;;  # CPU figures must not reach kernels/
    *) for table in mlp_dispatch.json attention_dispatch.json; do
         if [ -s "$DIR/$table" ]; then cp "$DIR/$table" kernels/ && echo "measured $table copied into kernels/ for the e2e part"; fi
       done ;;
  esac
  # the last part gets what is left of the call (CALL_S: the device's 600 s less the packing and the return), less
  # the 40 s that its watchdog and `timeout` may run past its box: a call killed mid-part returns nothing of that part
  e2e_s=$(( CALL_S - SECONDS - 40 ))
  (( e2e_s > ${E2E_S:-200} )) && e2e_s=${E2E_S:-200}
  (( e2e_s < 30 )) && e2e_s=30
  # shellcheck disable=SC2086  # E2E_ARGS is a list of flags
  [[ $parts == *" e2e "* ]] && part e2e "$e2e_s" ${E2E_ARGS:---models vit_base_patch16_224 --precisions fp16 --backends eager,vitfast,vitfast-every-token,vitfast-graphs,vitfast-approx-gelu,compile-max-autotune}
  for f in "$DIR"/*.md; do echo "----- $f"; cat "$f"; done
} >"$LOG" 2>&1
tail -c 11000 "$LOG"
