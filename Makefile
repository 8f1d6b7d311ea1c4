# vitfast developer commands. Everything runs inside .venv/ (created on first use, reused after).
#
# PyTorch: TORCH_SPEC pins the build installed before the package. The default, torch==2.13.0,
# resolves to a local CPU wheel on the project's dev/CI machines and to the regular PyPI build
# (CUDA on Linux x86-64) elsewhere. Override it for another build, e.g.
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-timm bench-gpu clean

$(STAMP): pyproject.toml setup.py Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=77" wheel
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

DEMO := demo-out
VF := $(VENV)/bin/vitfast

demo: $(STAMP)
	$(VF) info
	$(VF) models --filter 'vit_*_patch16_224'
	$(PY) -m vitfast.demo --out $(DEMO)
	$(VF) export --checkpoint $(DEMO)/model.safetensors --format onnx --out $(DEMO)/model.onnx --force
	$(VF) export --checkpoint $(DEMO)/model.safetensors --format onnx --precision int8 \
		--calib-dir $(DEMO)/calib --calib-samples 64 --out $(DEMO)/model.int8.onnx --force
	$(VF) check $(DEMO)/model.onnx
	$(VF) check $(DEMO)/model.int8.onnx
	$(VF) predict $(DEMO)/model.int8.onnx $(DEMO)/calib --top-k 3 --out $(DEMO)/predictions.csv --force
	@echo "--- TensorRT export: builds the engine where TensorRT is installed, else says how to get it"
	-$(VF) export --checkpoint $(DEMO)/model.safetensors --format trt --precision fp16 --out $(DEMO)/model.engine --force
	@echo "--- a short comparison of the backends this machine has (ViT-Ti/16, random weights)"
	$(VF) bench --model vit_tiny_patch16_224 --backends eager,compile,vitfast,onnxruntime --precision fp32,int8 \
		--batch 1,8 --repeats 10 --warmup 2 --max-seconds 5 --calib-samples 8

test: $(STAMP)
	$(PY) -m pytest -q tests benchmarks --benchmark-disable

# timm parity in a separate venv, so that `make test` keeps skipping it: timm needs torchvision,
# here PyPI's torchvision 0.28.0 (the release for torch 2.13) beside the same TORCH_SPEC build.
# Its C extension (detection ops, unused by timm's models and transforms) needs a CUDA torch, so
# beside the CPU wheel it does not load; tests/torchvision_cpu.py lets the import through then.
TIMM_VENV := .venv-timm
TIMM_STAMP := $(TIMM_VENV)/.installed
TORCHVISION_SPEC ?= torchvision==0.28.0

$(TIMM_STAMP): pyproject.toml setup.py Makefile
	test -x $(TIMM_VENV)/bin/python || $(PYTHON) -m venv $(TIMM_VENV)
	$(TIMM_VENV)/bin/python -m pip install --quiet --upgrade pip "setuptools>=77" wheel
	$(TIMM_VENV)/bin/python -m pip install --quiet $(TORCH_SPEC)
	$(TIMM_VENV)/bin/python -m pip install --quiet $(TORCHVISION_SPEC) -e ".[timm]" "pytest>=8"
	touch $(TIMM_STAMP)

test-timm: $(TIMM_STAMP)
	$(TIMM_VENV)/bin/python -m pytest -q tests/test_timm_parity.py

# The lent GPU's software on CPU (issue 11): the whole suite in .venv-device/ with the versions the
# device has (torch 2.11, PyPI's CUDA build, which also runs on CPU: about 6 GB with its nvidia-*
# wheels; triton 3.6; onnxruntime 1.30; onnx 1.23.1; transformers 5.17), so what differs between them
# and `make test`'s is found here, not in the device's 30 minutes.
DEVICE_VENV := .venv-device
DEVICE_STAMP := $(DEVICE_VENV)/.installed
DEVICE_STACK ?= torch==2.11.0 triton==3.6.0 onnxruntime==1.30.0 onnx==1.23.1 transformers==5.17.0

$(DEVICE_STAMP): pyproject.toml setup.py Makefile
	test -x $(DEVICE_VENV)/bin/python || $(PYTHON) -m venv $(DEVICE_VENV)
	$(DEVICE_VENV)/bin/python -m pip install --quiet --upgrade pip "setuptools>=77,<82" wheel  # torch 2.11 wants setuptools<82
	$(DEVICE_VENV)/bin/python -m pip install --quiet -e ".[test]" $(DEVICE_STACK)
	touch $(DEVICE_STAMP)

.PHONY: test-device-stack
test-device-stack: $(DEVICE_STAMP)
	$(DEVICE_VENV)/bin/python -c "import torch, triton, onnxruntime; print('torch', torch.__version__, 'triton', triton.__version__, 'onnxruntime', onnxruntime.__version__)"
	$(DEVICE_VENV)/bin/python -m pytest -q tests benchmarks --benchmark-disable

# CPU sweep (issue #5): ViT-Ti/S at batch 1 and 8 through every CPU backend into
# benchmarks/results/cpu-<sha>.json, then benchmarks/README.md regenerated from all results.
# The GPU sweep's command is in benchmarks/README.md.
.PHONY: bench
BENCH_CPU := --model vit_tiny_patch16_224,vit_small_patch16_224 --backends eager,eager-math,compile,onnxruntime \
	--precision fp32,int8 --batch 1,8 --repeats 20 --warmup 3 --max-seconds 15
bench: $(STAMP)
	mkdir -p benchmarks/results
	$(VENV)/bin/vitfast bench $(BENCH_CPU) --out benchmarks/results/cpu-$$(git rev-parse --short HEAD).json --force
	$(VENV)/bin/vitfast bench --report benchmarks/results/*.json > benchmarks/README.md.tmp
	mv benchmarks/README.md.tmp benchmarks/README.md

# The GPU proof (issue 11): GPU tests and optimize() parity, kernels vs SDPA / copy bandwidth /
# cuBLAS (+ the MLP dispatch table), end to end ViT-S/B/L fp16+bf16; three time-boxed parts of
# 9 minutes into $(GPU_PROOF_OUT). On a lent device, one part per call (benchmarks/README.md):
#   python3 -m pip install --no-deps --no-build-isolation -e . && python3 benchmarks/gpu_proof.py --out $OUT --part tests
GPU_PROOF_OUT ?= gpu-proof-out
.PHONY: gpu-proof
gpu-proof: $(STAMP)
	$(PY) benchmarks/gpu_proof.py --out $(GPU_PROOF_OUT) --budget 1620

# GPU sweep with TensorRT (issue #5); needs a CUDA machine with a CUDA torch build: ViT-S/B/L at
# batch 1-256 in fp16 through every GPU backend present (tensorrt only with
# TRT_ENGINES="--engine a.engine ..." built there).
GPU_SWEEP := --model vit_small_patch16_224,vit_base_patch16_224,vit_large_patch16_224 \
	--backends eager,eager-math,compile,vitfast,vitfast-graphs,onnxruntime,tensorrt \
	--batch 1,8,64,256 --precision fp16 --compile-mode max-autotune --repeats 100
bench-gpu: $(STAMP)
	mkdir -p benchmarks/results
	$(VENV)/bin/vitfast bench $(GPU_SWEEP) $(TRT_ENGINES) --out benchmarks/results/gpu-$$(git rev-parse --short HEAD).json \
		--plot benchmarks/results/gpu-$$(git rev-parse --short HEAD).png --force
	$(VENV)/bin/vitfast bench --report benchmarks/results/*.json > benchmarks/README.md.tmp
	mv benchmarks/README.md.tmp benchmarks/README.md

clean:
	rm -rf $(VENV) $(TIMM_VENV) $(DEVICE_VENV) build *.egg-info .pytest_cache
