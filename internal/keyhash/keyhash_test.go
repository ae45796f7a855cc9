package keyhash

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestSum: within a process a key always has one hash and two keys two;
// unless built with hotkey_fixedhash, the hash is not xxhash64 and another
// process draws another seed, so its hash of the same key differs.
func TestSum(t *testing.T) {
	if os.Getenv("KEYHASH_PRINT") != "" {
		fmt.Println(Sum("user:1"))
		return
	}
	if Sum("user:1") != Sum("user:1") {
		t.Fatal("one key, two hashes in one process")
	}
	if Sum("user:1") == Sum("user:2") {
		t.Fatal("two keys, one hash")
	}
	if Fixed {
		if Sum("user:1") != xxhash.Sum64String("user:1") {
			t.Fatal("built with hotkey_fixedhash, Sum is not xxhash64")
		}
		return
	}
	if Sum("user:1") == xxhash.Sum64String("user:1") {
		t.Fatal("Sum is unseeded xxhash64")
	}
	other := func() uint64 {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestSum$")
		cmd.Env = append(os.Environ(), "KEYHASH_PRINT=1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		v, err := strconv.ParseUint(strings.Fields(string(out))[0], 10, 64)
		if err != nil {
			t.Fatalf("child printed %q: %v", out, err)
		}
		return v
	}
	a, b := other(), other()
	if a == b || a == Sum("user:1") {
		t.Errorf("hashes of one key in three processes: %d, %d, %d: want three seeds", Sum("user:1"), a, b)
	}
}
