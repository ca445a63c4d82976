package store

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
)

// MigrationsDigest returns a hex SHA-256 over the embedded migrations' names
// and contents: two builds with the same digest produce the same schema.
// Tests name their template database by it (pkg/testenv).
func MigrationsDigest() string {
	h := sha256.New()
	// fs.WalkDir visits in lexical order, so the digest is stable.
	err := fs.WalkDir(migrations, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations, path)
		if err != nil {
			return err
		}
		h.Write([]byte(path))
		h.Write([]byte{0})
		h.Write(b)
		h.Write([]byte{0})
		return nil
	})
	if err != nil {
		panic("store: read embedded migrations: " + err.Error()) // embedded: cannot fail
	}
	return hex.EncodeToString(h.Sum(nil))
}
