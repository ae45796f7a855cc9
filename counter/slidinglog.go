package counter

// The memory store's sliding log holds (instant, units) entries, oldest
// first: a request is one entry whatever its cost, and requests at one
// instant share one. A log's memory is bounded by its entries, not by its
// Rate: once a log holds maxLogEntries/2 entries, the next instants are
// rounded up to a slot of 1/(maxLogEntries/2) of the period, and the requests
// of one slot share an entry, so a log never holds more than maxLogEntries+1
// entries, however many requests and units pass. Rounding an instant up only
// makes its units leave the window later: a busy log may deny a request up
// to one slot (0.4% of the period) before an exact log would, and never
// admits one more.

// maxLogEntries bounds the entries of a sliding log in memory (see above),
// at 16 bytes each.
const maxLogEntries = 512

// logEntry is n units admitted at instant at (Unix ns).
type logEntry struct{ at, n int64 }

// logDrop removes the entries at or before cut: they have left the window.
func (s *state) logDrop(cut int64) {
	drop := 0
	for drop < len(s.log) && s.log[drop].at <= cut {
		drop++
	}
	if drop > 0 {
		s.log = s.log[:copy(s.log, s.log[drop:])]
	}
}

// logUnits is the number of units the log holds.
func (s *state) logUnits() int64 {
	var u int64
	for _, e := range s.log {
		u += e.n
	}
	return u
}

// logOldest is the instant of the k-th oldest unit of the log (k ≥ 1), or
// of the newest if the log holds fewer.
func (s *state) logOldest(k int64) int64 {
	for _, e := range s.log {
		if k -= e.n; k <= 0 {
			return e.at
		}
	}
	return s.logNewest()
}

// logNewest is the instant of the newest entry, 0 if there is none.
func (s *state) logNewest() int64 {
	if len(s.log) == 0 {
		return 0
	}
	return s.log[len(s.log)-1].at
}

// logAdd records n units admitted at now under a period of p ns.
func (s *state) logAdd(now, n, p int64) {
	k := len(s.log)
	if k > 0 && s.log[k-1].at >= now { // this instant, or a slot not over yet
		s.log[k-1].n += n
		return
	}
	at := now
	if k >= maxLogEntries/2 {
		q := max(1, p/(maxLogEntries/2))
		at = (now + q - 1) / q * q
	}
	s.log = append(s.log, logEntry{at, n})
}
