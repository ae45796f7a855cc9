// Package h2rules holds the rules of HTTP/2 (RFC 9113) that hotkeyd's
// gRPC server (internal/grpcserve) and loadgen's gRPC client both apply to
// what their peer sends, so that each is written once: what a SETTINGS
// frame may carry and sets, and which header field names and values are
// well formed.
package h2rules

import "golang.org/x/net/http2"

// MaxSettings is the most parameters a SETTINGS frame may carry, as on
// net/http's server: a frame has no need of more than one of each, and a
// peer that sends more has each of its frames cost what it chose.
const MaxSettings = 100

// Settings is what a SETTINGS frame sets: of each parameter x/net/http2
// knows, the last value the frame gives, since a frame's values are
// processed in order (RFC 9113 6.5.3). The zero value sets nothing.
type Settings struct {
	set  uint16 // bit id: parameter id is set
	vals [maxID + 1]uint32
}

// maxID is the highest parameter ID Settings keeps.
const maxID = 15

// ReadSettings returns what f, a SETTINGS frame not an ACK, sets. A frame
// of over MaxSettings parameters is a connection error of type
// PROTOCOL_ERROR; each value is checked as RFC 9113 6.5.2 says, those a
// later one replaces too. Parameters of unknown IDs are ignored.
func ReadSettings(f *http2.SettingsFrame) (Settings, error) {
	var s Settings
	n := f.NumSettings()
	if n > MaxSettings {
		return Settings{}, http2.ConnectionError(http2.ErrCodeProtocol)
	}
	for i := range n {
		p := f.Setting(i)
		if err := p.Valid(); err != nil {
			return Settings{}, err
		}
		if p.ID <= maxID {
			s.set |= 1 << p.ID
			s.vals[p.ID] = p.Val
		}
	}
	return s, nil
}

// Value returns the value s gives parameter id, and whether it gives one.
func (s Settings) Value(id http2.SettingID) (uint32, bool) {
	if id > maxID || s.set&(1<<id) == 0 {
		return 0, false
	}
	return s.vals[id], true
}
