package h2rules

// ValidFieldName reports whether name, a field's name not a
// pseudo-header's, is well formed (RFC 9113 8.2.1): not empty, and none
// of its bytes a control, a space, an uppercase letter, a colon, DEL or
// not ASCII.
func ValidFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || 'A' <= c && c <= 'Z' || c == ':' {
			return false
		}
	}
	return true
}

// ValidFieldValue reports whether v may be a field's value: it holds none
// of NUL, LF and CR (RFC 9113 8.2.1).
func ValidFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= '\r' && (c == 0 || c == '\n' || c == '\r') {
			return false
		}
	}
	return true
}
