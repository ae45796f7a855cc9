package gossip

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/hotkeyd/hotkey/counter"
)

// EncodeLimit returns lim as an Entry's Limit: its algorithm as one byte,
// then its rate, period (ns) and burst as uvarints; at most 31 bytes. A
// receiver decodes it (ParseLimit) to charge the same limit's counter. lim
// is not validated: negative figures encode as huge ones, which
// ParseLimit refuses.
func EncodeLimit(lim counter.Limit) string {
	var b [1 + 3*maxVarint]byte
	buf := append(b[:0], byte(lim.Algorithm))
	buf = binary.AppendUvarint(buf, uint64(lim.Rate))
	buf = binary.AppendUvarint(buf, uint64(lim.Period))
	buf = binary.AppendUvarint(buf, uint64(lim.Burst))
	return string(buf)
}

// ParseLimit returns the limit EncodeLimit encoded as s, or an error
// wrapping ErrInvalid for bytes it did not write or a limit that does not
// Validate.
func ParseLimit(s string) (counter.Limit, error) {
	d := decoder{s: s}
	alg := d.byte()
	rate := d.uvarint("rate", counter.MaxCount)
	period := d.uvarint("period", 1<<63-1)
	burst := d.uvarint("burst", counter.MaxCount)
	if d.err == nil && d.off != len(s) {
		d.fail("limit", fmt.Sprintf("%d bytes after the burst", len(s)-d.off))
	}
	if d.err != nil {
		return counter.Limit{}, fmt.Errorf("%w: limit: %w", ErrInvalid, d.err)
	}
	lim := counter.Limit{Algorithm: counter.Algorithm(alg), Rate: int64(rate), Period: time.Duration(period), Burst: int64(burst)}
	if err := lim.Validate(); err != nil {
		return counter.Limit{}, fmt.Errorf("%w: limit: %w", ErrInvalid, err)
	}
	return lim, nil
}
