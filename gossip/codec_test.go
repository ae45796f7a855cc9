package gossip

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

var testHeader = Header{Sender: "i-1", Start: 1_780_000_000_000_000_000, Round: 42}

func sortEntries(es []Entry) {
	slices.SortFunc(es, func(a, b Entry) int {
		return cmp.Or(strings.Compare(a.Limit, b.Limit), strings.Compare(a.Key, b.Key), cmp.Compare(a.Units, b.Units))
	})
}

// decodeAll decodes msgs, checking each one's size and header, and
// returns their entries.
func decodeAll(t *testing.T, c *Codec, h Header, msgs [][]byte, maxBytes int) []Entry {
	t.Helper()
	var got []Entry
	for i, b := range msgs {
		if len(b) > maxBytes {
			t.Fatalf("message %d: %d bytes, at most %d", i, len(b), maxBytes)
		}
		m, err := c.Decode(b)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if want := (Header{h.Sender, h.Start, h.Round, i}); m.Header != want {
			t.Fatalf("message %d: header %+v, want %+v", i, m.Header, want)
		}
		got = append(got, m.Entries...)
	}
	return got
}

// TestCodecRoundTrip: what Encode carries, Decode gives back, entry for
// entry, whatever the limits, key lengths and units.
func TestCodecRoundTrip(t *testing.T) {
	c := NewCodec(Config{})
	give := []Entry{
		{"api", "a", 1},
		{"api", strings.Repeat("k", DefaultMaxKeyLen), math.MaxInt64},
		{strings.Repeat("l", MaxLimitLen), "b", 127},
		{"login", "ü/ß", 128},
		{"api", "c", 16384},
	}
	for _, h := range []Header{testHeader, {Sender: strings.Repeat("s", MaxSenderLen), Start: -1, Round: math.MaxUint64}} {
		msgs, err := c.Encode(h, slices.Clone(give))
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 1 {
			t.Fatalf("%d messages for 5 entries, want 1", len(msgs))
		}
		got := decodeAll(t, c, h, msgs, DefaultMaxBytes)
		want := slices.Clone(give)
		sortEntries(got)
		sortEntries(want)
		if !slices.Equal(got, want) {
			t.Errorf("decoded %v, want %v", got, want)
		}
	}
	if msgs, err := c.Encode(testHeader, nil); err != nil || len(msgs) != 0 {
		t.Errorf("Encode of no entries = %d messages, %v; want none", len(msgs), err)
	}
}

// TestCodecSplit: a round of 100,000 keys goes out in messages of at most
// MaxBytes, parts numbered from 0, and every key comes back once with its
// units; the messages are nearly full.
func TestCodecSplit(t *testing.T) {
	const keys = 100_000
	for _, maxBytes := range []int{DefaultMaxBytes, 4096} {
		c := NewCodec(Config{MaxBytes: maxBytes})
		give := make([]Entry, keys)
		for i := range give {
			give[i] = Entry{Limit: []string{"api", "login", "search"}[i%3], Key: fmt.Sprintf("user:%d", i), Units: int64(1 + i%300)}
		}
		msgs, err := c.Encode(testHeader, slices.Clone(give))
		if err != nil {
			t.Fatal(err)
		}
		got := decodeAll(t, c, testHeader, msgs, maxBytes)
		sortEntries(got)
		sortEntries(give)
		if !slices.Equal(got, give) {
			t.Fatalf("MaxBytes %d: decoded %d entries, want the %d given", maxBytes, len(got), len(give))
		}
		total := 0
		for _, b := range msgs {
			total += len(b)
		}
		if min := (len(msgs) - 1) * (maxBytes - 64); total < min {
			t.Errorf("MaxBytes %d: %d messages of %d bytes in all, want them nearly full (≥ %d)", maxBytes, len(msgs), total, min)
		}
		t.Logf("MaxBytes %d: %d keys in %d messages, %d bytes, %.2f bytes a key", maxBytes, keys, len(msgs), total, float64(total)/keys)
	}
}

// TestCodecEncodeRefuses: Encode refuses what the format cannot carry, and
// a round of more than MaxParts messages.
func TestCodecEncodeRefuses(t *testing.T) {
	c := NewCodec(Config{})
	for _, tt := range []struct {
		name string
		h    Header
		give Entry
		want error
	}{
		{"no sender", Header{}, Entry{"api", "k", 1}, ErrInvalid},
		{"long sender", Header{Sender: strings.Repeat("s", MaxSenderLen+1)}, Entry{"api", "k", 1}, ErrInvalid},
		{"no limit", testHeader, Entry{"", "k", 1}, ErrInvalid},
		{"long limit", testHeader, Entry{strings.Repeat("l", MaxLimitLen+1), "k", 1}, ErrInvalid},
		{"no key", testHeader, Entry{"api", "", 1}, ErrInvalid},
		{"long key", testHeader, Entry{"api", strings.Repeat("k", DefaultMaxKeyLen+1), 1}, ErrInvalid},
		{"no units", testHeader, Entry{"api", "k", 0}, ErrInvalid},
		{"negative units", testHeader, Entry{"api", "k", -1}, ErrInvalid},
	} {
		if _, err := c.Encode(tt.h, []Entry{tt.give}); !errors.Is(err, tt.want) {
			t.Errorf("%s: Encode error %v, want %v", tt.name, err, tt.want)
		}
	}
	small := NewCodec(Config{MaxBytes: MinBytes(DefaultMaxKeyLen)})
	big := make([]Entry, MaxParts+1)
	for i := range big {
		big[i] = Entry{"api", fmt.Sprintf("%0*d", DefaultMaxKeyLen, i), 1}
	}
	if _, err := small.Encode(testHeader, big); !errors.Is(err, ErrRoundTooBig) {
		t.Errorf("Encode of %d entries of one message each: %v, want %v", len(big), err, ErrRoundTooBig)
	}
	if err := (Config{MaxBytes: 100}).Validate(); err == nil {
		t.Error("Validate accepted MaxBytes 100 for keys of 512 bytes")
	}
}

// TestCodecDecodeRefuses: malformed messages get an error wrapping
// ErrMalformed (ErrTooLarge for size), never a panic or a partial message.
func TestCodecDecodeRefuses(t *testing.T) {
	c := NewCodec(Config{MaxBytes: 4096})
	good, err := c.Encode(testHeader, []Entry{{"api", "k", 300}})
	if err != nil {
		t.Fatal(err)
	}
	g := good[0]
	hdr := len(appendHeader(nil, testHeader))
	for _, tt := range []struct {
		name string
		give []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"version", append([]byte{2}, g[1:]...), ErrMalformed},
		{"no sender", []byte{1, 0}, ErrMalformed},
		{"sender past end", []byte{1, 10, 'a'}, ErrMalformed},
		{"sender too long", append([]byte{1, MaxSenderLen + 1}, make([]byte, MaxSenderLen+1)...), ErrMalformed},
		{"truncated header", g[:hdr-1], ErrMalformed},
		{"part too high", append(appendHeader(nil, testHeader)[:hdr-1], 0x80, MaxParts/128), ErrMalformed},
		{"truncated entry", g[:len(g)-1], ErrMalformed},
		{"trailing byte", append(slices.Clone(g), 0), ErrMalformed},
		{"count 0", append(appendString(appendHeader(nil, testHeader), "api"), 0), ErrMalformed},
		{"count past the bytes", append(appendString(appendHeader(nil, testHeader), "api"), 0x80, 0x01, 1, 'k', 1), ErrMalformed},
		{"units past int64", append(appendString(append(appendString(appendHeader(nil, testHeader), "api"), 1), "k"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), ErrMalformed},
		{"overlong varint", append(appendString(append(appendString(appendHeader(nil, testHeader), "api"), 1), "k"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), ErrMalformed},
		{"key too long", append(append(appendString(appendHeader(nil, testHeader), "api"), 1), 0x81, 0x04), ErrMalformed},
		{"too large", make([]byte, 4097), ErrTooLarge},
	} {
		m, err := c.Decode(tt.give)
		if !errors.Is(err, tt.want) || m.Entries != nil || m.Sender != "" {
			t.Errorf("%s: Decode = %+v, %v; want %v", tt.name, m, err, tt.want)
		}
	}
	zero := append(appendString(append(appendString(appendHeader(nil, testHeader), "api"), 1), "k"), 0)
	if _, err := c.Decode(zero); !errors.Is(err, ErrMalformed) {
		t.Errorf("units 0: Decode error %v, want %v", err, ErrMalformed)
	}
}

// FuzzDecode: Decode never panics; what it accepts holds at most one entry
// per 3 bytes, and encodes back to the same entries.
func FuzzDecode(f *testing.F) {
	c := NewCodec(Config{MaxBytes: 4096})
	msgs, err := c.Encode(testHeader, []Entry{{"api", "a", 1}, {"api", "bb", 300}, {"login", "a", math.MaxInt64}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(msgs[0])
	f.Add([]byte{1, 1, 'i', 0, 0, 0})
	f.Add([]byte{1, 1, 'i', 0, 0, 0, 3, 'a', 'p', 'i', 1, 1, 'k', 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := c.Decode(data)
		if err != nil {
			return
		}
		if len(m.Entries) > len(data)/minEntry {
			t.Fatalf("%d entries from %d bytes", len(m.Entries), len(data))
		}
		if len(m.Entries) == 0 {
			return
		}
		again, err := c.Encode(m.Header, slices.Clone(m.Entries))
		if err != nil {
			t.Fatalf("Encode of a decoded message: %v", err)
		}
		var got []Entry
		for _, b := range again {
			n, err := c.Decode(b)
			if err != nil {
				t.Fatalf("Decode of a re-encoded message: %v", err)
			}
			got = append(got, n.Entries...)
		}
		want := slices.Clone(m.Entries)
		sortEntries(got)
		sortEntries(want)
		if !slices.Equal(got, want) {
			t.Fatalf("re-encoded %v, decoded %v", want, got)
		}
	})
}

// TestEmpty: a message with no entries decodes to its header alone.
func TestEmpty(t *testing.T) {
	c := NewCodec(Config{})
	h := Header{Sender: "s", Start: 7, Round: 3}
	m, err := c.Empty(h)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Decode(m)
	if err != nil || got.Header != h || len(got.Entries) != 0 {
		t.Fatalf("%+v %v, want %+v and no entries", got, err, h)
	}
	if _, err := c.Empty(Header{}); err == nil {
		t.Fatal("an empty sender id accepted")
	}
}
