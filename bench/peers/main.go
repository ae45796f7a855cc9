// Command peers runs the report's comparison of hotkeyd with gubernator
// (docs/benchmarks.md), after bench/report's scenarios. It is a module of
// its own so that gubernator's dependencies stay out of the library's, and
// out of the report's.
//
//	go run . -md ../../docs/benchmarks.md   # appends the section
//	go run . -quick                         # short runs, to stdout
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/hotkeyd/hotkey/bench/internal/scenario"
	"github.com/hotkeyd/hotkey/internal/redistest"
)

func main() {
	quick := flag.Bool("quick", false, "short runs")
	md := flag.String("md", "", "append the section to this file (default: stdout)")
	flag.Parse()
	if err := run(*quick, *md); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func run(quick bool, md string) error {
	env, err := redistest.StartEnv(0)
	if err != nil {
		return err
	}
	defer env.Close()
	fmt.Fprintln(os.Stderr, "scenario peers...")
	start := time.Now()
	sec, err := runPeers(context.Background(), env.Server.Addr, quick)
	if err != nil {
		return err
	}
	sec.Title = "The daemon against gubernator, over HTTP"
	return scenario.Append(md, sec.Markdown(time.Since(start).Seconds()))
}
