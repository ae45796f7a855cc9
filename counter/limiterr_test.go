package counter

import (
	"errors"
	"math"
	"testing"
	"time"
)

// TestLimitErrors: every limit Validate refuses is refused with an error that
// is ErrInvalidLimit and the error of the field at fault, in the words it
// always had.
func TestLimitErrors(t *testing.T) {
	for _, c := range []struct {
		give  Limit
		field error
		text  string
	}{
		{Limit{Period: time.Second}, ErrInvalidRate, "limit rate must be positive: 0"},
		{Limit{Rate: 1}, ErrInvalidPeriod, "limit period must be positive: 0s"},
		{Limit{Rate: 1, Period: time.Second, Burst: -1}, ErrInvalidBurst, "limit burst must not be negative: -1"},
		{Limit{Algorithm: numAlgorithms, Rate: 1, Period: time.Second}, ErrUnknownAlgorithm, "unknown algorithm: 4"},
		{Limit{Algorithm: SlidingLog, Rate: MaxLogRate + 1, Period: time.Second}, ErrLimitTooLarge, "limit too large for algorithm: sliding_log rate 100001 > 100000"},
		{Limit{Rate: 1, Period: time.Hour, Burst: MaxCount + 1}, ErrBurstTooLarge, ""},
		{Limit{Algorithm: FixedWindow, Rate: 1, Period: math.MaxInt64}, ErrPeriodTooLong, ""},
		{Limit{Rate: 1, Period: math.MaxInt64}, ErrPeriodTooLong, ""},
	} {
		err := c.give.Validate()
		if !errors.Is(err, ErrInvalidLimit) || !errors.Is(err, c.field) {
			t.Errorf("Validate(%+v) = %v: want ErrInvalidLimit and %v", c.give, err, c.field)
			continue
		}
		if c.text != "" && err.Error() != c.text {
			t.Errorf("Validate(%+v) = %q, want %q", c.give, err, c.text)
		}
	}
	for _, err := range []error{ErrInvalidCost, ErrCostExceedsBurst} {
		if errors.Is(err, ErrInvalidLimit) {
			t.Errorf("%v is ErrInvalidLimit: a cost is not a limit", err)
		}
	}
}
