package shard

import (
	"strconv"
	"strings"
)

// Counter names. The unsplit counter of key is named key itself, and
// subcounter i of key at level n is named key|n|i, or key|n|i|c where the
// store's node map asked for another name (Names). The names of different
// (key, level, index) never meet, because two kinds of key, rare in use, are
// written escaped:
//
//   - in its unsplit counter's name, a key that ends like a subcounter's
//     name (|n|d or |n|d|d, n a level above 1 and d digits) or holds a NUL;
//   - in its subcounters' names, a key that ends in |n (n a level above 1),
//     whose |i|c could otherwise be read as another key's |n|i, or holds a
//     NUL.
//
// Escaped, a key has each NUL doubled and one more NUL after it: an
// escaped name holds a NUL where a plain one holds none, and reads back
// (undoubled) up to its final NUL. So an unsplit name ends in a digit only
// when it is plain and then not like a subcounter's, and a subcounter's key
// part ends in a digit only when it is plain and then not in |n.
//
// A subcounter's name starts with "{}" when the key has a Redis Cluster hash
// tag or itself starts with "{}", so that the names carry no shared tag and
// a "{}" in front is always the one Names put there.

// escape is the byte that marks an escaped key in a counter name.
const escape = '\x00'

// Name returns the name of key's unsplit counter: key itself, unless key
// must be escaped (see above). It allocates only then.
func Name(key string) string {
	if strings.IndexByte(key, escape) < 0 && !endsLikeSub(key) {
		return key
	}
	return string(appendEscaped(make([]byte, 0, len(key)+2), key))
}

// Names returns the names of the n subcounters of key. Subcounter i goes to
// node (hash+i) mod nodes, so no node holds more than ceil(n/nodes); with p
// nil or a single node, names are chosen without probing. The names carry no
// shared Redis Cluster hash tag. The result is deterministic in (key, hash,
// n, p), so every instance with the same node map picks the same names, and
// no name is another (key, level, index)'s under any node map. For n == 1
// the name is Name(key).
func Names(key string, hash uint64, n Level, p Placement) []string {
	if n == Level1 {
		return []string{Name(key)}
	}
	base := make([]byte, 0, len(key)+16)
	if _, tagged := HashTag(key); tagged || strings.HasPrefix(key, "{}") {
		base = append(base, "{}"...)
	}
	if strings.IndexByte(key, escape) >= 0 || levelAt(key, len(key)) > 0 {
		base = appendEscaped(base, key)
	} else {
		base = append(base, key...)
	}
	base = append(base, '|')
	base = strconv.AppendInt(base, int64(n), 10)
	base = append(base, '|')
	nodes := 1
	if p != nil {
		nodes = p.Nodes()
	}
	names := make([]string, n)
	buf := make([]byte, 0, len(base)+12)
	for i := range names {
		buf = strconv.AppendInt(append(buf[:0], base...), int64(i), 10)
		if nodes <= 1 {
			names[i] = string(buf)
			continue
		}
		target := int((hash + uint64(i)) % uint64(nodes))
		stem := len(buf)
		for c := 0; ; c++ {
			if c > 0 {
				buf = strconv.AppendInt(append(buf[:stem], '|'), int64(c), 10)
			}
			if name := string(buf); p.Node(name) == target || c == maxProbe*nodes {
				names[i] = name
				break
			}
		}
	}
	return names
}

// appendEscaped appends key to b with each escape doubled, and an escape.
func appendEscaped(b []byte, key string) []byte {
	for i := 0; i < len(key); i++ {
		if key[i] == escape {
			b = append(b, escape)
		}
		b = append(b, key[i])
	}
	return append(b, escape)
}

// endsLikeSub reports whether key ends like a subcounter's name: |n|d or
// |n|d|d, n a level above 1 and d digits.
func endsLikeSub(key string) bool {
	g1 := groupAt(key, len(key))
	if g1 < 0 {
		return false
	}
	g2 := groupAt(key, g1)
	if g2 < 0 {
		return false
	}
	return levelAt(key, g1) > 0 || levelAt(key, g2) > 0
}

// groupAt returns the index of the '|' that starts a group of one or more
// digits ending at end in s, or -1 if s[:end] does not end in such a group.
func groupAt(s string, end int) int {
	i := end
	for i > 0 && '0' <= s[i-1] && s[i-1] <= '9' {
		i--
	}
	if i == end || i == 0 || s[i-1] != '|' {
		return -1
	}
	return i - 1
}

// levelAt returns the level above 1 that s[:end] ends in as |4, |16 or
// |64, or 0.
func levelAt(s string, end int) Level {
	g := groupAt(s, end)
	if g < 0 {
		return 0
	}
	switch s[g+1 : end] {
	case "4":
		return Level4
	case "16":
		return Level16
	case "64":
		return Level64
	}
	return 0
}

// HashTag returns the part of key Redis Cluster hashes to pick a slot: the
// text between the first '{' and the next '}' when that is not empty, and
// ok false (the whole key is hashed) otherwise. go-redis's Ring shards by
// the same rule.
func HashTag(key string) (tag string, ok bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					return key[i+1 : j], j > i+1
				}
			}
			return "", false
		}
	}
	return "", false
}
