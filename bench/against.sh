#!/usr/bin/env bash
# bench/against.sh BASE: the benchmarks of make bench from the tree at commit
# BASE and from this work tree, each package's test binary built once per
# tree and run alternated, round by round (BENCHROUNDS rounds; the tree that
# runs first swaps each round), so that a shared machine's load weighs on
# both alike. Prints this tree's ÷ BASE's figures per benchmark (the median
# of the rounds' ratios). BENCH narrows the benchmarks, BENCHTIME sets each
# one's time. The outputs stay in AGAINST_DIR (a temporary folder unless
# set). Run it as make bench-against BASE=<commit>.
set -euo pipefail
base=${1:?usage: bench/against.sh BASE}
bench=${BENCH:-.}
benchtime=${BENCHTIME:-1s}
rounds=${BENCHROUNDS:-3}
go=${GO:-go}
dir=${AGAINST_DIR:-$(mktemp -d)}
pkgs=(bench counter shard detector)
root=$(git rev-parse --show-toplevel)

rm -rf "$dir/base" && mkdir -p "$dir/base"
git -C "$root" archive --format=tar "$base" | tar -x -C "$dir/base"
: > "$dir/base.out"
: > "$dir/this.out"
for side in base this; do
	src=$root
	[[ $side == base ]] && src=$dir/base
	for p in "${pkgs[@]}"; do
		(cd "$src" && $go test -c -o "$dir/$side-$p.test" "./$p/")
	done
done
for round in $(seq "$rounds"); do
	order=(base this)
	((round % 2 == 0)) && order=(this base)
	for side in "${order[@]}"; do
		src=$root
		[[ $side == base ]] && src=$dir/base
		for p in "${pkgs[@]}"; do
			echo "== round $round: $side $p" >&2
			(cd "$src/$p" && "$dir/$side-$p.test" -test.run '^$' -test.bench "$bench" \
				-test.benchtime "$benchtime" -test.benchmem -test.timeout 60m) | tee -a "$dir/$side.out" >&2
		done
	done
done
(cd "$root" && $go run ./bench/benchreport -against "$dir/base.out" < "$dir/this.out")
echo "outputs: $dir/base.out $dir/this.out" >&2
