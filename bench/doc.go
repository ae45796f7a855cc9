// Package bench measures the hotkey engine against baselines in one run, so
// that every figure is a ratio read from a single `make bench` output:
//
//   - BenchmarkAllowMemory vs BenchmarkAllowXTimeRate: engine on the memory
//     store against a map of golang.org/x/time/rate limiters under a mutex,
//     1M distinct keys.
//   - BenchmarkGossipDecision: the decision under sync: gossip against sync:
//     store, both on the memory store of one engine with a NATS coordinator,
//     10,000 keys.
//   - BenchmarkAllowRedis vs BenchmarkAllowRedisRate: engine on one local
//     redis-server against github.com/go-redis/redis_rate/v10 on the same
//     server, 64 goroutines, in decisions/s.
//   - BenchmarkHotKeyCluster: one key at a static split level on a 3-master
//     Redis Cluster; max/mean-node-ops is the busiest node's share of the
//     store calls against the mean, the worst of 20 keys.
//
// The benchmarks start their own redis-server processes on loopback.
package bench
