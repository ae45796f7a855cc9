package rlswire

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// TestNext: Next reads a varint, a length-delimited field and the rest of
// the data after each, skips fixed-width fields and groups, and refuses
// malformed data with ErrMalformed.
func TestNext(t *testing.T) {
	b := protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 1<<40)
	b = protowire.AppendString(protowire.AppendTag(b, 2, protowire.BytesType), "edge")
	b = protowire.AppendFixed32(protowire.AppendTag(b, 9, protowire.Fixed32Type), 5)
	b = protowire.AppendTag(b, 7, protowire.StartGroupType)
	b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.VarintType), 1)
	b = protowire.AppendTag(b, 7, protowire.EndGroupType)
	want := []Field{
		{Num: 3, Typ: protowire.VarintType, X: 1 << 40},
		{Num: 2, Typ: protowire.BytesType, V: []byte("edge")},
		{Num: 9, Typ: protowire.Fixed32Type},
		{Num: 7, Typ: protowire.StartGroupType},
	}
	for i := 0; len(b) > 0; i++ {
		f, rest, err := Next(b)
		if err != nil || i >= len(want) || f.Num != want[i].Num || f.Typ != want[i].Typ || f.X != want[i].X || !bytes.Equal(f.V, want[i].V) {
			t.Fatalf("field %d: %+v, %v", i, f, err)
		}
		b = rest
	}
	for _, give := range [][]byte{
		{0x0a, 0x05, 'e'}, // a string longer than the data
		{0xff},            // a tag cut short
		{0x08, 0xff},      // a varint cut short
		{0x00},            // field number 0
		{0x3c},            // an end group without its start
		{0x85, 0x80, 0x80, 0x80, 0x10, 0, 0, 0, 0}, // field number 2^29, over the maximum
	} {
		if _, _, err := Next(give); !errors.Is(err, ErrMalformed) {
			t.Errorf("%x: %v, want ErrMalformed", give, err)
		}
	}
}

// TestFields: Fields yields the fields Next reads, in order; malformed data
// ends it with Next's error after the fields before it; a loop that stops
// early stops it; each range over it starts again at the first field.
func TestFields(t *testing.T) {
	b := protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 7)
	b = protowire.AppendString(protowire.AppendTag(b, 2, protowire.BytesType), "edge")
	for range 2 {
		var got []Field
		for f, err := range Fields(b) {
			if err != nil {
				t.Fatalf("after %d fields: %v", len(got), err)
			}
			got = append(got, f)
		}
		if len(got) != 2 || got[0].Num != 3 || got[0].X != 7 || got[1].Num != 2 || string(got[1].V) != "edge" {
			t.Fatalf("fields %+v, want 3=7 and 2=edge", got)
		}
	}
	n, errs := 0, 0
	for f, err := range Fields(append(b[:len(b):len(b)], 0xff)) { // a tag cut short after two fields
		if err != nil {
			errs++
			if !errors.Is(err, ErrMalformed) || f.Num != 0 {
				t.Errorf("field %d: %+v, %v, want a zero Field and ErrMalformed", n, f, err)
			}
			continue
		}
		n++
	}
	if n != 2 || errs != 1 {
		t.Errorf("malformed after two fields: %d fields and %d errors, want 2 and 1", n, errs)
	}
	n = 0
	for range Fields(b) {
		n++
		break
	}
	if n != 1 {
		t.Errorf("a loop that stops at the first field ran %d times", n)
	}
}
