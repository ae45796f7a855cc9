package hotkey_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/hotkeyd/hotkey"
	"github.com/hotkeyd/hotkey/counter"
)

func Example() {
	store := counter.NewMemoryStore(counter.MemoryConfig{})
	engine, err := hotkey.New(store)
	if err != nil {
		panic(err)
	}
	defer engine.Close()

	// 10 a minute, 3 at once; FallbackLocal (the zero value) if the store
	// cannot answer.
	p := &hotkey.Policy{Name: "api", Limit: hotkey.Limit{Rate: 10, Period: time.Minute, Burst: 3}}
	for range 4 {
		res, err := engine.Allow(context.Background(), "client:42", p)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Allowed, res.Remaining)
	}
	// Output:
	// true 2
	// true 1
	// true 0
	// false 0
}

// A policy in shadow mode is decided and charged as usual, but admits
// every request: those it would deny say ShadowDenied.
func ExamplePolicy_shadow() {
	store := counter.NewMemoryStore(counter.MemoryConfig{})
	engine, err := hotkey.New(store)
	if err != nil {
		panic(err)
	}
	defer engine.Close()

	p := &hotkey.Policy{Name: "trial", Limit: hotkey.Limit{Rate: 10, Period: time.Minute, Burst: 2}, Shadow: true}
	for range 3 {
		res, err := engine.Allow(context.Background(), "client:42", p)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Allowed, res.ShadowDenied, res.Remaining)
	}
	// Output:
	// true false 1
	// true false 0
	// true true 0
}

func ExampleWithSplitKeys() {
	api := &hotkey.Policy{Name: "api", Limit: hotkey.PerSecond(1600)}
	store := counter.NewMemoryStore(counter.MemoryConfig{})
	engine, err := hotkey.New(store, hotkey.WithSplitKeys(16, api, "tenant:acme"))
	if err != nil {
		panic(err)
	}
	defer engine.Close()

	res, _ := engine.Allow(context.Background(), "tenant:acme", api)
	fmt.Println(res.Allowed, res.Shards, res.Limit)
	res, _ = engine.Allow(context.Background(), "tenant:other", api)
	fmt.Println(res.Allowed, res.Shards)
	// Another policy's counter for the same key is not split.
	login := &hotkey.Policy{Name: "login", Limit: hotkey.PerSecond(1600)}
	res, _ = engine.Allow(context.Background(), "tenant:acme", login)
	fmt.Println(res.Allowed, res.Shards)
	// Output:
	// true 16 1600
	// true 1
	// true 1
}

func ExampleEngine_AllowN_badInput() {
	engine, _ := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{}))
	defer engine.Close()
	_, err := engine.AllowN(context.Background(), "k", &hotkey.Policy{Limit: hotkey.PerSecond(5)}, 6)
	fmt.Println(err)
	// Output:
	// cost exceeds burst: 6 > 5
}

// A gateway limits each API key to 100 requests per second, and keeps
// limiting in-process if Redis goes away.
func ExampleEngine_Middleware() {
	engine, err := hotkey.New(counter.NewMemoryStore(counter.MemoryConfig{}))
	if err != nil {
		panic(err)
	}
	defer engine.Close()
	limit := engine.Middleware(hotkey.MiddlewareConfig{
		Policy: &hotkey.Policy{Name: "api", Limit: hotkey.PerSecond(100), OnStoreFailure: hotkey.FallbackLocal},
		Key:    func(r *http.Request) string { return r.Header.Get("X-Api-Key") },
	})
	handler := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("X-Api-Key", "k1")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("X-RateLimit-Remaining"), rec.Body.String())
	// Output: 200 99 hello
}

// An engine named for its region reports it; a name that is not one NATS
// subject token is refused. The region changes no decision: each region
// enforces the whole limit on its own store.
func ExampleWithRegion() {
	store := counter.NewMemoryStore(counter.MemoryConfig{})
	engine, err := hotkey.New(store, hotkey.WithRegion("eu-west"))
	if err != nil {
		panic(err)
	}
	defer engine.Close()
	fmt.Println(engine.Stats().Region)
	_, err = hotkey.New(store, hotkey.WithRegion("eu.west"))
	fmt.Println(errors.Is(err, hotkey.ErrInvalidConfig))
	// Output:
	// eu-west
	// true
}
