package counter

import (
	"context"
	"time"
)

type TotalOp struct {
	Key     string
	Hash    uint64
	Limit   Limit
	From    string
	Total   int64
	Keep    time.Duration
	Charged int64
	Err     error
}

type TotalCharger interface {
	ChargeTotals(ctx context.Context, ops []TotalOp)
}
