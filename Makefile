# hotkey — build, test and benchmark.
SHELL := /bin/bash
GO ?= go
# QUICK=1 shortens make bench-report (one round, short benchmark times and
# scenario runs) so that it completes in a few minutes.
QUICK ?=
BENCHTIME ?= $(if $(QUICK),200ms,1s)
BENCH ?= .
BENCHOUT ?= bench.out
BENCHROUNDS ?= $(if $(QUICK),1,3)

.PHONY: test vet redis nginx caddy bench bench-against bench-report chaos fuzz

# make test: what CI runs. Installs redis-server, nginx and caddy when
# missing (the tests start their own servers on loopback; nginx and caddy run
# the forward-auth snippets of docs/gateways.md), then vets and runs every
# test with -race.
test: redis nginx caddy vet
	$(GO) test -race -count=1 -timeout 15m ./...
	cd deploy/rulescheck && $(GO) test -count=1 ./...

# make chaos: the fault tests (TestChaos*, chaos_test.go) with their
# figures (-v): redis-server killed and restarted, made slow, a NATS
# partition, a flood of distinct keys, a hot attacker against the deny
# cache. First all of them under the race detector, where the flood is cut to
# 500k keys; then the flood alone at its full 10M keys without it, since the
# race detector would make that run take minutes. make test runs them too.
chaos: redis
	$(GO) test -race -count=1 -timeout 15m -run 'TestChaos' -v .
	$(GO) test -count=1 -timeout 15m -run 'TestChaosFlood' -v .

# make fuzz: every fuzz target of the module (func FuzzX in a _test.go
# file), FUZZTIME each (default 60s), one after the other.
FUZZTIME ?= 60s
fuzz:
	@set -euo pipefail; \
	targets=$$(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' . | \
		sed -E 's|^(.*)/[^/]+_test\.go:[0-9]+:func (Fuzz[A-Za-z0-9_]*)\(.*|\1 \2|' | sort -u); \
	test -n "$$targets" || { echo "no fuzz targets found"; exit 1; }; \
	while read -r dir name; do \
		echo "== $$name in $$dir for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) "$$dir"; \
	done <<< "$$targets"

vet:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	cd bench/report && $(GO) vet ./...
	cd deploy/rulescheck && $(GO) vet ./...

redis:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	}
	@redis-server --version

# nginx: TestForwardAuthNginx runs its own, as an ordinary process on a
# loopback port; the package's service is not needed.
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || { \
		echo "installing nginx"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; \
	}
	@PATH="$$PATH:/usr/sbin" nginx -v

# caddy: TestForwardAuthCaddy runs its own, as an ordinary process on a
# loopback port; the package's service is not needed.
caddy:
	@command -v caddy >/dev/null 2>&1 || test -x /usr/sbin/caddy || { \
		echo "installing caddy"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq caddy >/dev/null; \
	}
	@PATH="$$PATH:/usr/sbin" caddy version

# make bench: the benchmarks that compare the engine with its baselines
# (BENCH narrows them by regexp), in BENCHROUNDS rounds so that a benchmark
# and its baseline alternate on a noisy machine. The output is kept in
# $(BENCHOUT).
bench: redis
	set -o pipefail; for round in $$(seq $(BENCHROUNDS)); do \
		$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -timeout 60m \
			./bench/ ./counter/ ./shard/ ./detector/ || exit 1; \
	done | tee $(BENCHOUT)

# make bench-against BASE=<commit>: the benchmarks of make bench from the
# tree at BASE and from this one, built once each and run alternated in
# BENCHROUNDS rounds; prints this tree's figures ÷ BASE's (bench/against.sh).
# BENCH narrows them, as for make bench.
bench-against: redis
	@test -n "$(BASE)" || { echo "usage: make bench-against BASE=<commit> [BENCH=regexp]"; exit 1; }
	BENCH='$(BENCH)' BENCHTIME=$(BENCHTIME) BENCHROUNDS=$(BENCHROUNDS) GO=$(GO) bench/against.sh $(BASE)

# make bench-report: make bench, then docs/benchmarks.md from its output
# (written aside and moved in, so a failed report leaves the old one),
# then the scenarios (bench/report, a module of its own for its plotting
# dependencies), which add their sections and write their plots to
# docs/bench/, then the comparison with gubernator (bench/peers, a module of
# its own for gubernator's dependencies).
bench-report: bench
	$(GO) run ./bench/benchreport < $(BENCHOUT) > docs/benchmarks.md.new
	mv docs/benchmarks.md.new docs/benchmarks.md
	cd bench/report && $(GO) run . $(if $(QUICK),-quick) -md ../../docs/benchmarks.md -plots ../../docs/bench
	cd bench/peers && $(GO) run . $(if $(QUICK),-quick) -md ../../docs/benchmarks.md
