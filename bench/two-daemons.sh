#!/usr/bin/env bash
# bench/two-daemons.sh: one hot key over its limit, as a user meets it: two
# hotkeyd daemons (one embedding NATS, the other joining it) on one
# redis-server, hotkeyd loadgen against each at RATE requests/s for
# DURATION, every request for one key under one policy (ALGORITHM, LIMIT
# per 1 s, a token bucket's burst LIMIT too) in sync mode SYNC. Prints the
# store calls (the scripts the redis-server ran, from INFO commandstats),
# the decisions, and for a token bucket the admitted ÷ the ideal (burst +
# rate × the run's time; the report's overlimit scenario measures every
# algorithm against an exact limiter on the same requests).
#
#   SYNC=reserve ALGORITHM=token_bucket RATE=1500 LIMIT=2000 DURATION=6s bench/two-daemons.sh
#
# It listens on loopback only, on PORT to PORT+7 (default 16300), and
# stops everything it started on exit.
set -euo pipefail
sync=${SYNC:-reserve}
alg=${ALGORITHM:-token_bucket}
rate=${RATE:-1500}
limit=${LIMIT:-2000}
duration=${DURATION:-6s}
port=${PORT:-16300}
root=$(git rev-parse --show-toplevel)
dir=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

(cd "$root" && go build -o "$dir/hotkeyd" ./cmd/hotkeyd)
burst=""
[[ $alg == token_bucket ]] && burst="    burst: $limit"
cat > "$dir/policies.yaml" <<EOF
policies:
  default:
    algorithm: $alg
    limit: $limit
    period: 1s
$burst
    sync: $sync
EOF
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/secret"

redis-server --port $port --bind 127.0.0.1 --save '' --appendonly no > "$dir/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p $port ping > /dev/null 2>&1 && break; sleep 0.1; done

daemon() { # daemon N NATS-FLAGS...: the daemon on PORT+1+4N..
	local base=$((port + 1 + 4 * $1))
	shift
	"$dir/hotkeyd" --policies "$dir/policies.yaml" --redis "redis://127.0.0.1:$port" \
		--listen 127.0.0.1:$base --grpc-listen 127.0.0.1:$((base + 1)) --admin-listen 127.0.0.1:$((base + 2)) \
		--nats-secret-file "$dir/secret" "$@" > "$dir/daemon$base.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 100); do curl -fs "127.0.0.1:$((base + 2))/readyz" > /dev/null 2>&1 && return; sleep 0.1; done
	echo "a daemon did not turn ready: $(cat "$dir/daemon$base.log")" >&2
	exit 1
}
daemon 0 --nats-listen 127.0.0.1:$((port + 4))
daemon 1 --nats nats://127.0.0.1:$((port + 4))
sleep 1 # the daemons find each other (live instances)

calls() { redis-cli -p $port info commandstats | sed -n 's/^cmdstat_\(evalsha\|eval\|evalsha_ro\|eval_ro\):calls=\([0-9]*\).*/\2/p' | paste -sd+ - | bc; }
c0=$(calls)
for i in 0 1; do
	base=$((port + 1 + 4 * i))
	"$dir/hotkeyd" loadgen --target http://127.0.0.1:$base --workload key --key hot --rate "$rate" \
		--duration "$duration" --limit "$limit" --json > "$dir/load$i.json" 2> "$dir/load$i.err" &
	pids+=($!)
	lg[$i]=$!
done
wait "${lg[0]}" "${lg[1]}"
sleep 0.5 # the sweepers give the last blocks back
c1=$(calls)
python3 - "$dir/load0.json" "$dir/load1.json" "$((c1 - c0))" "$alg" "$limit" <<'EOF'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
calls, alg, limit = int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
dec = sum(r["allowed"] + r["denied"] for r in (a, b))
adm = sum(r["allowed"] for r in (a, b))
secs = max(r["elapsed_s"] for r in (a, b))
p99 = max(r["latency_ms"]["p99"] for r in (a, b))
line = f"decisions {dec}, admitted {adm}, store calls {calls}: {calls / dec:.4f} per decision; "
if alg == "token_bucket":
    ideal = limit + limit * secs
    line += f"admitted ÷ ideal {adm / ideal:.3f} ({adm} of {ideal:.0f}); "
print(line + f"p99 {p99:.2f} ms (the worse loadgen's)")
EOF
