# hotkey — build, test and benchmark.
SHELL := /bin/bash
GO ?= go
BENCHTIME ?= 1s
BENCH ?= .
BENCHOUT ?= bench.out
BENCHROUNDS ?= 3

.PHONY: test vet redis bench bench-report

# make test: what CI runs. Installs redis-server when missing (the tests start
# their own servers on loopback), then vets and runs every test with -race.
test: redis vet
	$(GO) test -race -count=1 -timeout 15m ./...

vet:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...

redis:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	}
	@redis-server --version

# make bench: the benchmarks that compare the engine with its baselines
# (BENCH narrows them by regexp), in BENCHROUNDS rounds so that a benchmark
# and its baseline alternate on a noisy machine. The output is kept in
# $(BENCHOUT).
bench: redis
	set -o pipefail; for round in $$(seq $(BENCHROUNDS)); do \
		$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -timeout 60m \
			./bench/ ./counter/ ./shard/ ./detector/ || exit 1; \
	done | tee $(BENCHOUT)

# make bench-report: make bench, then docs/benchmarks.md from its output.
bench-report: bench
	$(GO) run ./bench/benchreport < $(BENCHOUT) > docs/benchmarks.md
