# The front door: `make` lists the targets. Tools are pinned in tools/go.mod.

# Used by `make test` when a Postgres with trust auth answers on 127.0.0.1:5432
# and DATABASE_URL is not already set; otherwise internal/pgtest starts a
# throwaway cluster per test binary. internal/pgtest also starts one when the
# server in DATABASE_URL has fewer free connections than a test binary may
# use (serverConnsMin), as a server shared with other clients may.
LOCAL_DATABASE_URL := postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
BUF := go tool -modfile=tools/go.mod buf

.DEFAULT_GOAL := help
.PHONY: help run test lint generate checkgenerate dashboard image overload soak-faults bench bench-turns bench-ab bench-audit bench-rebalance bench-statements bench-idle bench-pgsettings bench-cold soak soak-crash bench-changestream bench-cart bench-drop

help: ## list the targets with a one-line description each
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z0-9_-]+:.*## / { printf "  %-14s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# The stack runs as make's own child (the shell execs it): make passes
# SIGTERM on to it and a terminal's Ctrl-C reaches it, and it stops its
# children. `go run` would die of SIGTERM without passing it on, and leave
# the stack running.
run: ## build cmd/shardstock-dev into bin/ and run the local development stack (flags: RUN_ARGS='-allocator-shard')
	go build -o bin/shardstock-dev ./cmd/shardstock-dev
	exec bin/shardstock-dev $(RUN_ARGS)

# The items that either lane of `make test` takes, in this order, once it
# has run its own, longest first (docs/bench-log/2026-12-05-testtime3.md
# has their times), so that the last item to start is a short one:
# internal/e2e's TEST_E2E_SECOND (e2e-second) and TEST_E2E_BESIDE
# (e2e-beside), the second lane's longest packages, bench/'s module, and
# deploy/'s. Whichever lane is the longer on the machine at hand (e2e's on
# a quiet one, where its tests wait; the other on a loaded one, where its
# tests compute), the other takes the larger share of these.
TEST_SHARED_TAIL := internal/allocator e2e-second bench internal/cmd/allocatorcmd internal/postgres e2e-beside internal/shard internal/ledger internal/cmd/stockctlcmd internal/dbset deploy/alerts deploy/k8s

# internal/e2e's tests that run apart from the package's first run, as
# items of TEST_SHARED_TAIL, so that neither lane waits for all of
# internal/e2e (docs/testing.md). TEST_E2E_SECOND: tests that run alone
# (one after another in their run) and assert no tight time bound: a fault
# or takeover whose waits are generous deadlines, not claims. TEST_E2E_BESIDE:
# the tests that run beside one another (besideOthers). The first run keeps
# the alone tests that do assert a time bound. Whichever lane takes an
# item, another test binary runs beside it, as beside every e2e test in
# make test. Every run starts the commands that make test builds once, as
# internal/e2e's TestMain would (SHARDSTOCK_E2E_BIN).
TEST_E2E_SECOND := TestE2E_MakeRun|TestE2E_MakeRunStop|TestE2E_TwoDatabases|TestE2E_Breaker|TestE2E_AllocatorShard|TestE2E_SetShardsUnderTraffic|TestE2E_MoverKilledAtEachStep
TEST_E2E_BESIDE := TestE2E_Shared|TestE2E_ErrorReasons|TestE2E_HaltAndResume|TestE2E_MutualTLS|TestE2E_READMECurl|TestE2E_WebClients|TestE2E_Dashboard

# e2e's lane links the commands its tests start as go test links a test
# binary: without the symbol table and DWARF (-s -w; tracebacks use the
# line table, which stays), about half of their links' CPU
# (docs/bench-log/2026-12-06-testcpu.md).
TEST_E2E_LDFLAGS := -s -w

# How long an item of e2e's in TEST_SHARED_TAIL waits for e2e's lane to
# build the commands it starts: as long as a test binary may run.
TEST_E2E_BUILD_WAIT_SECONDS_MAX := 900

# Two test runs at once, so that the longest package does not wait for the
# others: internal/e2e's first run on a throwaway Postgres cluster of its
# own (pgtest, DATABASE_URL unset), and beside it every other package, one
# test binary at a time, on DATABASE_URL's server. Each server sees one
# test binary at a time, so that the packages that start whole stacks do
# not together exhaust a default Postgres's 100 connections: that lane
# builds two packages at once (-p 2) but runs their binaries through
# flock(1) on one lock file, so the next package's test binary is compiled
# and linked while the current one runs (a package's elapsed time then
# includes its wait for the lock). Then each lane takes the items of
# TEST_SHARED_TAIL that the other has not (mkdir is the lock), so that the
# two lanes end about together, whichever is the longer on the machine.
# e2e's lane's output is printed when it ends.
#
# Nothing is built before the lanes: go test compiles every package (those
# without tests too), e2e's lane links the three commands its tests start
# (with the failpoints) and TestE2E_MakeRun links cmd/shardstock-dev, so a
# `go build ./...` first would only hold both lanes back while it linked
# commands that nothing runs. npm ci (web/node_modules, for e2e's browser
# and Node tests) runs while e2e's lane builds.
test: ## run all tests, bench/'s too, in two lanes (docs/testing.md) (Postgres on 127.0.0.1:5432 if it answers and has room)
	@if [ -z "$${DATABASE_URL:-}" ] && command -v pg_isready >/dev/null 2>&1 \
		&& pg_isready -q -h 127.0.0.1 -p 5432; then \
		export DATABASE_URL='$(LOCAL_DATABASE_URL)'; \
	fi; \
	echo "DATABASE_URL=$${DATABASE_URL:-<unset: throwaway clusters>}"; \
	e2e_log="$$(mktemp)"; lock="$$(mktemp -d)"; trap 'rm -rf "$$e2e_log" "$$lock"' EXIT; \
	export SHARDSTOCK_E2E_BIN="$$lock/e2e-bin"; \
	e2e_built() { \
		for i in $$(seq $(TEST_E2E_BUILD_WAIT_SECONDS_MAX)); do \
			[ -f "$$lock/e2e-built" ] && break; sleep 1; \
		done; \
		[ "$$(cat "$$lock/e2e-built" 2>/dev/null)" = 0 ] || { echo "make test: e2e's commands were not built"; return 1; }; \
	}; \
	take_tail() { \
		tail_rc=0; \
		for dir in $(TEST_SHARED_TAIL); do \
			mkdir "$$lock/$$(echo "$$dir" | tr / _)" 2>/dev/null || continue; \
			if [ "$$dir" = e2e-second ]; then \
				e2e_built || { tail_rc=1; continue; }; \
				echo "go test -count=1 -timeout 15m -run '^($(TEST_E2E_SECOND))$$' ./internal/e2e"; \
				go test -count=1 -timeout 15m -run '^($(TEST_E2E_SECOND))$$' ./internal/e2e || tail_rc=1; \
			elif [ "$$dir" = e2e-beside ]; then \
				e2e_built || { tail_rc=1; continue; }; \
				echo "go test -count=1 -timeout 15m -run '^($(TEST_E2E_BESIDE))$$' ./internal/e2e"; \
				go test -count=1 -timeout 15m -run '^($(TEST_E2E_BESIDE))$$' ./internal/e2e || tail_rc=1; \
			elif [ -f "$$dir/go.mod" ]; then \
				echo "(cd $$dir && go test -count=1 -p 1 -timeout 15m ./...)"; \
				(cd "$$dir" && go test -count=1 -p 1 -timeout 15m ./...) || tail_rc=1; \
			else \
				echo "go test -count=1 -timeout 15m ./$$dir"; \
				go test -count=1 -timeout 15m "./$$dir" || tail_rc=1; \
			fi; \
		done; \
		return $$tail_rc; \
	}; \
	echo "$(MAKE) web/node_modules & go build -ldflags='$(TEST_E2E_LDFLAGS)' -tags shardstock_failpoints -o \$$SHARDSTOCK_E2E_BIN/ ./cmd/shard ./cmd/allocator ./cmd/stockctl (e2e's lane)"; \
	echo "DATABASE_URL= go test -count=1 -timeout 15m -skip '^($(TEST_E2E_SECOND)|$(TEST_E2E_BESIDE))$$' ./internal/e2e (beside the rest)"; \
	( \
		$(MAKE) --no-print-directory web/node_modules & npm=$$!; \
		go build -ldflags='$(TEST_E2E_LDFLAGS)' -tags shardstock_failpoints -o "$$SHARDSTOCK_E2E_BIN/" ./cmd/shard ./cmd/allocator ./cmd/stockctl; rc=$$?; \
		wait $$npm || rc=1; \
		echo $$rc >"$$lock/e2e-built.tmp" && mv "$$lock/e2e-built.tmp" "$$lock/e2e-built"; \
		if [ $$rc -ne 0 ]; then echo "make test: e2e's commands or web/node_modules failed to build"; take_tail; exit 1; fi; \
		export DATABASE_URL=; \
		go test -count=1 -timeout 15m -skip '^($(TEST_E2E_SECOND)|$(TEST_E2E_BESIDE))$$' ./internal/e2e; rc=$$?; \
		take_tail || rc=1; exit $$rc \
	) >"$$e2e_log" 2>&1 & e2e=$$!; \
	skip="$$(for dir in internal/e2e $(TEST_SHARED_TAIL); do printf -- '-e /%s$$ ' "$$dir"; done)"; \
	echo go test -count=1 -p 2 -exec "flock -o $$lock/run" -timeout 15m '$$(go list ./... | grep -v' "$$skip)"; \
	go test -count=1 -p 2 -exec "flock -o $$lock/run" -timeout 15m $$(go list ./... | grep -v $$skip); rest=$$?; \
	take_tail || rest=1; \
	wait $$e2e; e2e_rc=$$?; cat "$$e2e_log"; \
	[ $$rest -eq 0 ] && [ $$e2e_rc -eq 0 ]

lint: ## check gofmt, go vet and buf lint
	@unformatted="$$(gofmt -l .)"; if [ -n "$$unformatted" ]; then \
		echo "gofmt -l: these files need gofmt -w:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	cd bench && go vet ./...
	cd deploy/alerts && go vet ./...
	cd deploy/k8s && go vet ./...
	$(BUF) lint

generate: web/node_modules ## regenerate gen/ (Go) and web/gen/ (Connect-ES) from proto/ with buf
	$(BUF) generate

# The npm packages of web/ (the Connect-ES plugin and runtime), as locked.
web/node_modules: web/package.json web/package-lock.json
	npm ci --prefix web --no-audit --no-fund
	@touch $@

IMAGE ?= ghcr.io/shardstock/shardstock:0.1.0

image: ## build the container image (IMAGE=ghcr.io/shardstock/shardstock:0.1.0) with a working docker, podman or buildah; with none, say so and what to run
	@builder=""; for b in docker podman buildah; do \
		if command -v $$b >/dev/null 2>&1 && { [ $$b = buildah ] || $$b info >/dev/null 2>&1; }; then builder=$$b; break; fi; \
	done; \
	if [ -z "$$builder" ]; then \
		echo "make image: no working container builder here (docker or podman with a running engine, or buildah): nothing built."; \
		echo "On a machine with one: docker build -t $(IMAGE) .   (the Dockerfile needs only the repository)"; \
		exit 0; \
	fi; \
	if [ "$$builder" = buildah ]; then buildah bud -t $(IMAGE) .; else $$builder build -t $(IMAGE) .; fi

dashboard: web/node_modules ## rebuild the dashboard (web/dashboard) into internal/api/dashboard, which is committed
	npm run --prefix web build:dashboard

checkgenerate: generate dashboard ## fail if gen/, web/gen/ or the built dashboard differs from what is committed
	git diff --exit-code -- gen web/gen internal/api/dashboard
	@untracked="$$(git ls-files --others --exclude-standard -- gen web/gen internal/api/dashboard)"; if [ -n "$$untracked" ]; then \
		echo "untracked files under gen/:"; echo "$$untracked"; exit 1; fi

bench: ## load-test shardstock, the in-memory ceiling, the five baselines and the Connect-fronted Redis on model C and the source case, print the table with CPU per request; then model C in turns (make bench-turns); then the cart model against single-SKU deducts (make bench-cart) (about 5.5 min)
	scripts/bench/run.sh
	$(MAKE) --no-print-directory bench-turns
	scripts/bench/cart.sh

bench-turns: ## model C, shardstock and the Connect-fronted Redis taking turns: 8 rounds of 2 s each, the order reversed every other round (loadgen -interleave), for a ratio of server CPU per request that the machine's drift falls on alike (about 75 s)
	BENCH_TARGETS=shardstock,redis-api BENCH_MODELS=C BENCH_DURATION=16s BENCH_INTERLEAVE=8 scripts/bench/run.sh

bench-rebalance: ## the rebalancer off and on, model skew and model C: loadgen's tables and the sweeps, consolidations and reroutes routing needed (about 2 min)
	scripts/bench/rebalance.sh

bench-ab: ## the working tree against BASE=<git revision>, ROUNDS (default 3) alternated rounds of hot deducts, reserve+commit and model C, each beside the ceiling and the Connect-fronted Redis; prints the medians of the ratios and of head/base per round; BENCH_AB_RATE=N paces every target (about 3 min a round)
	scripts/bench/ab.sh "$(BASE)" $(or $(ROUNDS),3)

bench-audit: ## what the audit line costs a deduct: paced hot deducts on the dev stack with -audit-log off, async and sync, ROUNDS (default 3) rounds in turned order; each round's ratio of server CPU per deduct against off, and their medians (about 2.5 min a round here at load 40)
	scripts/bench/audit.sh $(or $(ROUNDS),3)

bench-statements: ## where Postgres's share of a deduct goes: pg_stat_statements over a hot-SKU load on a private Postgres, per call and per request, with its WAL bytes (about 1 min)
	scripts/bench/statements.sh

bench-idle: ## the stack's fixed CPU cost: the dev stack (as make bench starts it) on a private Postgres with no traffic; CPU a second of each stack process and of Postgres, and the statements a second (about 1 min)
	scripts/bench/idle.sh

bench-pgsettings: ## what Postgres's own settings are worth to a durable deduct: a private Postgres restarted with each set (BENCH_PG_SETS; fsync, synchronous_commit and full_page_writes always on), alternated over ROUNDS (default 3), paced; CPU per request against the defaults (about 3 min a round)
	scripts/bench/pgsettings.sh $(or $(ROUNDS),3)

bench-cold: ## a shard server's start-up time, memory and the etcd keys with 1,000,000 cold SKUs, against none (about 2 min)
	scripts/bench/cold-skus.sh

soak-faults: ## the recorded-history fault tests (kill -9, SIGSTOP past the lease, Postgres crash, links cut, etcd leader lost, kernel network faults between namespaces, a failover to the synchronous standby, admission's tokens under faults) five times each, every history checked (about 14 min; the namespace one needs root and iptables, else skips)
	go test -count=5 -timeout 30m -run 'TestE2E_(LinearizableUnderFaults|LinkFaultsUnderLoad|EtcdLeaderLost|NetnsFaults|SyncStandbyFailover|TokensUnderFaults)$$' -v ./internal/e2e

overload: ## a 30 s burst at ten times the peak rate against a real stack: shed with RATE_LIMITED, memory bounded, back at the peak after it (make test runs a 5 s one)
	SHARDSTOCK_OVERLOAD_SECONDS=30 go test -count=1 -run 'TestE2E_Overload$$' -v ./internal/e2e

soak: ## 4 minutes of load (7 in all) of shardstock under every flow, duplicates and abandoned requests; non-zero exit unless correctness is all zero
	BENCH_DURATION=2m BENCH_TIMEOUT=10m BENCH_TARGETS=shardstock BENCH_MODELS=B,C \
	BENCH_EXTRA="-mix deduct=40,commit=30,release=30 -qty 1..3 -dup-rate 0.1 -abandon-rate 0.1" \
	BENCH_STACK_ARGS="-shard-servers 2 -allocator-shard" BENCH_STACK_LOG=tmp/soak-stack.log scripts/bench/run.sh

soak-crash: ## make soak's load (60 s per model) while its private Postgres is crash-restarted every 5 s, 8 times per model; non-zero exit unless correctness is all zero and every crash happened
	BENCH_DURATION=60s BENCH_TIMEOUT=8m BENCH_TARGETS=shardstock BENCH_MODELS=B,C BENCH_PG_CRASH="5s 8" \
	BENCH_EXTRA="-mix deduct=40,commit=30,release=30 -qty 1..3 -dup-rate 0.1 -abandon-rate 0.1" \
	BENCH_STACK_ARGS="-shard-servers 2 -allocator-shard" BENCH_STACK_LOG=tmp/soak-crash-stack.log scripts/bench/run.sh

bench-cart: ## the cart model (orders of 2 to 5 lines, 10% refunded) and single-SKU deducts on one stack: orders and order lines per second, server CPU per order line against per deduct (about 1 min)
	scripts/bench/cart.sh

bench-drop: ## model drop (issue 31): a SKU of 1,000 units under admission, DROP_REQUESTS (3,000) RequestTokens at DROP_RATE (1,000/s) open-loop, against a plain Reserve phase and, once sold out, DROP_AFTER (10,000) refusals against the in-memory ceiling's, in 10 turns each; ROUNDS (default 3) alternated rounds (1.5 to 3.5 min a round)
	scripts/bench/drop.sh $(or $(ROUNDS),3)

bench-changestream: ## what WatchLedger consumers cost the writers: one stack, the same deduct load with 0, 1 and 4 consumers attached in 3 interleaved rounds, unpaced and paced at one rate; server CPU per deduct, the consumers' own CPU per entry and their lag p99 (about 20 min)
	scripts/bench/changestream.sh

.PHONY: test-long-ledger
test-long-ledger: ## internal/ledger's TestCheckpoint_LongLedger on ledgers of 100,000 and 1,000,000 entries (make test runs 10,000 and 100,000; about 2 min)
	SHARDSTOCK_LONG_LEDGER=1 go test -count=1 -run 'TestCheckpoint_LongLedger$$' -v ./internal/ledger
