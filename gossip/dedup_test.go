package gossip

import (
	"fmt"
	"testing"
	"time"
)

func hdr(sender string, start int64, round uint64, part int) Header {
	return Header{Sender: sender, Start: start, Round: round, Part: part}
}

// TestDedup: each (sender, start, round, part) is accepted once, in any
// order within the remembered rounds; replays, older lives and rounds too
// old to tell are refused and counted; a restart counts rounds anew.
func TestDedup(t *testing.T) {
	d := NewDedup(Config{Rounds: 4})
	for _, step := range []struct {
		name string
		give Header
		want bool
	}{
		{"first", hdr("a", 100, 10, 0), true},
		{"duplicate", hdr("a", 100, 10, 0), false},
		{"next part", hdr("a", 100, 10, 1), true},
		{"next part again", hdr("a", 100, 10, 1), false},
		{"later round first", hdr("a", 100, 12, 1), true},
		{"reordered round", hdr("a", 100, 11, 0), true},
		{"reordered part", hdr("a", 100, 10, 2), true},
		{"reordered duplicate", hdr("a", 100, 11, 0), false},
		{"other sender same figures", hdr("b", 100, 10, 0), true},
		{"jump", hdr("a", 100, 14, 0), true},
		{"too old to tell", hdr("a", 100, 10, 3), false},
		{"within the last 4", hdr("a", 100, 11, 5), true},
		{"replay of the newest", hdr("a", 100, 14, 0), false},
		{"restart", hdr("a", 200, 0, 0), true},
		{"restart's next", hdr("a", 200, 1, 0), true},
		{"previous life replayed", hdr("a", 100, 15, 0), false},
		{"previous life's new round", hdr("a", 100, 99, 0), false},
		{"restart duplicate", hdr("a", 200, 0, 0), false},
		{"part out of range", hdr("a", 200, 2, MaxParts), false},
		{"negative part", hdr("a", 200, 2, -1), false},
		{"round at the top", hdr("c", 1, 1<<64-1, 0), true},
		{"round at the top again", hdr("c", 1, 1<<64-1, 0), false},
	} {
		if got := d.Accept(step.give); got != step.want {
			t.Errorf("%s: Accept(%+v) = %v, want %v", step.name, step.give, got, step.want)
		}
	}
	want := DedupStats{Duplicate: 6, Stale: 2, TooOld: 1}
	if got := d.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

// TestDedupRounds: a sender's rounds, each sent twice in full and the
// copies mixed with the next round's, are applied exactly once each.
func TestDedupRounds(t *testing.T) {
	d := NewDedup(Config{})
	applied := map[Header]int{}
	const rounds, parts = 200, 5
	for r := range uint64(rounds) {
		for c := range 2 {
			for p := range parts {
				for _, h := range []Header{hdr("a", 1, r, p), hdr("a", 1, r-min(r, uint64(c)), parts-1-p)} {
					if d.Accept(h) {
						applied[h]++
					}
				}
			}
		}
	}
	if len(applied) != rounds*parts {
		t.Errorf("applied %d distinct parts, want %d", len(applied), rounds*parts)
	}
	for h, n := range applied {
		if n != 1 {
			t.Errorf("%+v applied %d times", h, n)
		}
	}
}

// TestDedupSenders: at most MaxSenders are remembered; a new one evicts
// the one heard from least recently, and is counted.
func TestDedupSenders(t *testing.T) {
	d := NewDedup(Config{MaxSenders: 3})
	for i := range 3 {
		d.Accept(hdr(fmt.Sprint(i), 1, 1, 0))
	}
	d.Accept(hdr("0", 1, 2, 0)) // "1" is now the least recent
	if !d.Accept(hdr("new", 1, 1, 0)) {
		t.Fatal("new sender refused")
	}
	if got := d.Senders(); got != 3 {
		t.Errorf("remembers %d senders, want 3", got)
	}
	if d.Accept(hdr("0", 1, 2, 0)) || d.Accept(hdr("2", 1, 1, 0)) {
		t.Error("a remembered sender's part accepted twice")
	}
	if !d.Accept(hdr("1", 1, 1, 0)) {
		t.Error("the evicted sender's part refused: it was the least recent")
	}
	if got := d.Stats().Evicted; got != 2 {
		t.Errorf("Evicted = %d, want 2", got)
	}
}

// TestDedupCheck: Check tells a duplicate from a part too late to tell,
// remembers parts past the 64th per round (and forgets them with the
// round), and gives the time since the sender's previous accepted message.
func TestDedupCheck(t *testing.T) {
	d := NewDedup(Config{Rounds: 4})
	t0 := time.Unix(1000, 0)
	for _, step := range []struct {
		name  string
		give  Header
		at    time.Duration // after t0
		want  Verdict
		since time.Duration
	}{
		{"first", hdr("a", 100, 10, 0), 0, Accepted, 0},
		{"high part", hdr("a", 100, 10, 700), time.Second, Accepted, time.Second},
		{"high part again", hdr("a", 100, 10, 700), 2 * time.Second, Duplicate, 0},
		{"another high part", hdr("a", 100, 10, 701), 3 * time.Second, Accepted, 2 * time.Second},
		{"3 rounds late", hdr("a", 100, 13, 0), 3 * time.Second, Accepted, 0},
		{"round 10 still remembered", hdr("a", 100, 10, 700), 4 * time.Second, Duplicate, 0},
		{"4 rounds on", hdr("a", 100, 14, 700), 5 * time.Second, Accepted, 2 * time.Second},
		{"round 10 too late to tell", hdr("a", 100, 10, 700), 5 * time.Second, Late, 0},
		{"round 10's new part too late", hdr("a", 100, 10, 5), 5 * time.Second, Late, 0},
		{"slot of round 10 reused, its high parts forgotten", hdr("a", 100, 14, 701), 5 * time.Second, Accepted, 0},
		{"previous life", hdr("a", 99, 20, 0), 5 * time.Second, Late, 0},
		{"restart: its first message", hdr("a", 200, 0, 0), 6 * time.Second, Accepted, 0},
		{"part out of range", hdr("a", 200, 1, MaxParts), 6 * time.Second, OutOfRange, 0},
	} {
		v, since := d.Check(step.give, t0.Add(step.at))
		if v != step.want || since != step.since {
			t.Errorf("%s: Check(%+v) = %v, %v; want %v, %v", step.name, step.give, v, since, step.want, step.since)
		}
	}
	want := DedupStats{Duplicate: 2, Stale: 1, TooOld: 2}
	if got := d.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}
