package messages

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// PeekString returns the string value of key at the top level of an
// encoded message, without decoding the rest: for a reader that only needs
// to recognise an entry (the deployer's observer skips its own requests by
// job id). It returns false when data is not a msgpack map within
// MaxMessageSize, when key is absent or nil, or when its first value is no
// string; anything more is Decode's to judge.
func PeekString(data []byte, key string) (string, bool) {
	if len(data) == 0 || len(data) > MaxMessageSize {
		return "", false
	}
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	n, err := dec.DecodeMapLen()
	if err != nil || n < 0 {
		return "", false
	}
	d := &decoder{dec: dec}
	for range n {
		c, err := dec.PeekCode()
		if err != nil || !msgpcode.IsString(c) {
			return "", false
		}
		k, err := dec.DecodeString()
		if err != nil {
			return "", false
		}
		if k != key {
			if d.skip(2) != nil {
				return "", false
			}
			continue
		}
		if c, err := dec.PeekCode(); err != nil || !msgpcode.IsString(c) {
			return "", false
		}
		v, err := dec.DecodeString()
		return v, err == nil
	}
	return "", false
}
