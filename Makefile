# p2plearn: every target builds .venv on first use (torch pinned, then the project).
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0
# Plain PyPI resolves torch to its CUDA build (several GB of nvidia packages). For the CPU build:
#   make TORCH_INDEX=https://download.pytorch.org/whl/cpu demo
TORCH_INDEX ?=
export OMP_NUM_THREADS ?= 1

.PHONY: demo test test-slow bench asan clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip

# torch first and pinned, so that the project's own requirement finds it installed.
$(STAMP): $(VPY) pyproject.toml setup.py native/*.c native/*.h native/build_p2pcast.py native/build_compute.py
	$(VPY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH)
	$(VPY) -m pip install -q -e '.[train,test,experiments,tensorboard]'
	touch $@

# 4 peers train MNIST-1D over an emulated heterogeneous network (no root needed).
demo: $(STAMP)
	$(VENV)/bin/p2plearn-run -np 4 --topology topology/heterogeneous-4.json --emulate \
	  -- $(VPY) -m p2plearn.examples.mnist1d --sync bsp
	@echo
	@echo "Try SSP:     $(VENV)/bin/p2plearn-run -np 4 --topology topology/heterogeneous-4.json --emulate -- $(VPY) -m p2plearn.examples.mnist1d --sync ssp --staleness 2"
	@echo "Transfers:   $(VPY) -m p2plearn.examples.transfer_demo   (the engine alone, under injected loss)"

# Everything but the tests marked slow: minutes, for every change.
test: $(STAMP)
	$(VPY) -m pytest -q -ra -m "not slow" tests

# The tests marked slow: end-to-end training, fault injection, testbed rounds, the README's launchers.
# CI runs both targets.
test-slow: $(STAMP)
	$(VPY) -m pytest -q -ra -m slow tests

bench: $(STAMP)
	$(VPY) -m p2plearn.bench selection
	$(VPY) -m p2plearn.bench rounds
	$(VPY) -m p2plearn.bench average
	$(VPY) -m p2plearn.bench transport

# AddressSanitizer + UBSan: the engine alone with leak detection (tests/native/engine_leaks.c: no
# Python, so each leak reported is the engine's; it is linked with every native/*.c, the planner and
# the merge included), then the transport, selection and merge tests on sanitized builds of both
# modules, _p2pcast and _p2pcompute (leak detection off there: the interpreter keeps its own memory
# until exit). Undefined behaviour is fatal (NO_RECOVER): the first finding stops the run. The
# modules get it through CFLAGS, which replaces Python's default flags there: without -fwrapv and
# -DNDEBUG, signed overflow is checked too and assert()s run.
ENGINE_C := $(wildcard native/*.c)
NO_RECOVER := -fno-sanitize-recover=undefined
asan: $(STAMP)
	mkdir -p build
	gcc -O1 -g -std=gnu11 -Wall -Wextra -pthread -fno-omit-frame-pointer -fsanitize=address,undefined $(NO_RECOVER) \
	  -Inative $(ENGINE_C) tests/native/engine_leaks.c -lcrypto -lm -o build/engine_leaks
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 build/engine_leaks
	CFLAGS="$(NO_RECOVER)" P2PCAST_SANITIZE=1 $(VPY) -m pip install -q --no-build-isolation --no-deps -e .
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  $(VPY) -m pytest -q -x --capture=sys -p no:cacheprovider tests/transport tests/selection tests/sync/test_merge.py tests/sync/test_compress.py \
	  tests/sync/test_robust.py tests/sync/test_change.py tests/sync/test_quantize.py tests/distributed/test_hadamard.py; rc=$$?; \
	$(VPY) -m pip install -q --no-build-isolation --no-deps -e .; exit $$rc

clean:
	rm -rf $(VENV) build *.egg-info p2plearn/_p2pcast*.so p2plearn/_p2pcast.c p2plearn/_p2pcompute*.so p2plearn/_p2pcompute.c

# Experiments (experiments/*.py, one claim each; results in experiments/results/, each .md starting
# with its Measured: line). `experiments` re-runs every stored result with the command
# experiments/registry.py gives it (hours on 2 cores; testbed ones need root: they say so and skip,
# or fall back, otherwise; gpu_charlm needs CUDA) and lists the commands that failed;
# `experiments-stale` lists the results whose measured code changed since the commit they name;
# `experiments-quick` runs each script once in --quick mode (a smoke test, results in /tmp).
EXPERIMENTS := time_to_accuracy charlm_time_to_loss selmcast_vs_random multicast_16 rate_classes loss_tolerance_vs_tcp \
               layerwise_bounds phase_aware value_filter faults ddp_vs_gloo scale sim_budget sim_tolerance \
               sim_value_filter sim_train_validation sim_scale sim_slow_close attacks_transformer

.PHONY: experiments experiments-quick experiments-stale
experiments: $(STAMP)
	$(VPY) experiments/stale.py --all --commands | sed 's|^sudo ||; s|python |$(VPY) |' | \
	{ failed=""; while IFS= read -r cmd; do echo "== $$cmd"; PY=$(VPY) sh -c "$$cmd" || failed="$$failed  $$cmd\n"; done; \
	  if [ -n "$$failed" ]; then printf "failed:\n$$failed"; exit 1; fi; }

experiments-quick: $(STAMP)
	for e in $(EXPERIMENTS); do $(VPY) experiments/$$e.py --quick --out /tmp/p2plearn-quick || exit 1; done

experiments-stale: $(STAMP)
	$(VPY) experiments/stale.py
