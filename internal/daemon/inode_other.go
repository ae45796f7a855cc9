//go:build !unix

package daemon

import "io/fs"

// inode is 0 where the system gives no inode numbers.
func inode(fs.FileInfo) uint64 { return 0 }
