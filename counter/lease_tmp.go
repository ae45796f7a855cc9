package counter

import "context"

type Lease struct {
	Granted int64
	Result  Result
	Token   int64
}

type Leaser interface {
	Store
	Lease(ctx context.Context, key string, hash uint64, lim Limit, n int64) (Lease, error)
	Return(ctx context.Context, key string, hash uint64, lim Limit, n, token int64) (int64, error)
}
