package loadgen

import (
	"net/url"
	"testing"
)

// TestSplitURL: the URL an Endpoint sends, the key put in its place, is
// the one url.Values.Set and Encode make of it.
func TestSplitURL(t *testing.T) {
	for _, tc := range []struct{ give, param string }{
		{"http://gw/api", ""},
		{"http://gw/api?page=1#top", ""},
		{"http://gw/api", "key"},
		{"http://gw/api?page=1", "key"},
		{"http://gw/api?a=1&z=2&key=old&key=older", "key"},
		{"https://u:p@gw:8443/a%20b/?z=1&b=x+y&a=", "k y"},
		{"http://gw/api?", "key"},
		{"http://gw/api?page=1#top", "key"},
	} {
		u, err := url.Parse(tc.give)
		if err != nil {
			t.Fatal(err)
		}
		pre, post := splitURL(u, tc.param)
		for _, key := range []string{"user_1", "a b&c=d/é"} {
			c := *u
			c.Fragment, c.RawFragment = "", ""
			if tc.param != "" {
				q := c.Query()
				q.Set(tc.param, key)
				c.RawQuery = q.Encode()
			}
			want := c.String()
			got := pre + post
			if tc.param != "" {
				got = pre + url.QueryEscape(key) + post
			}
			if got != want {
				t.Errorf("%s, %q, key %q: %q, want %q", tc.give, tc.param, key, got, want)
			}
		}
	}
}
