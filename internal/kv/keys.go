package kv

import "bytes"

// Keys drains it and returns copies of its keys: for a caller that writes
// to the range while going through what it read.
func Keys(it RangeIterator) ([][]byte, error) {
	var keys [][]byte
	for it.Next() {
		keys = append(keys, bytes.Clone(it.KeyValue().Key))
	}
	return keys, it.Err()
}
