package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoSession: the session token is unknown, expired or signed out.
var ErrNoSession = errors.New("console: no such session")

// Sessions keeps the console's sessions in Postgres (console_sessions):
// the SHA-256 of each session's random token, its key and its expiry.
type Sessions struct {
	db  *pgxpool.Pool
	now func() time.Time
}

// NewSessions returns the session store on db.
func NewSessions(db *pgxpool.Pool) *Sessions { return &Sessions{db: db, now: time.Now} }

// Session is a signed-in session.
type Session struct {
	KeyID     string
	ExpiresAt time.Time
	// CSRF is the session's CSRF token: every form of the session carries
	// it, every POST must send it back.
	CSRF string
}

// newToken returns 256 random bits, URL-safe.
func newToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on Linux
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func tokenHash(token string) []byte {
	sum := sha256.Sum256([]byte("session:" + token))
	return sum[:]
}

// csrfFor derives a session's CSRF token from its session token: it is
// per session, needs no storage, and cannot be computed from the stored
// hash.
func csrfFor(token string) string {
	sum := sha256.Sum256([]byte("csrf:" + token))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// Create starts a session for keyID lasting ttl and returns its token
// (for the cookie; only its hash is stored).
func (s *Sessions) Create(ctx context.Context, keyID string, ttl time.Duration) (string, *Session, error) {
	token := newToken()
	exp := s.now().Add(ttl)
	if _, err := s.db.Exec(ctx, `INSERT INTO console_sessions (token_hash, key_id, expires_at) VALUES ($1, $2, $3)`,
		tokenHash(token), keyID, exp); err != nil {
		return "", nil, fmt.Errorf("create session: %w", err)
	}
	// Expired sessions of any key are removed now and then.
	if _, err := s.db.Exec(ctx, `DELETE FROM console_sessions WHERE expires_at < $1`, s.now()); err != nil {
		return "", nil, fmt.Errorf("remove expired sessions: %w", err)
	}
	return token, &Session{KeyID: keyID, ExpiresAt: exp, CSRF: csrfFor(token)}, nil
}

// Get returns the live session of token: ErrNoSession when there is none.
func (s *Sessions) Get(ctx context.Context, token string) (*Session, error) {
	if token == "" || len(token) > 100 {
		return nil, ErrNoSession
	}
	ses := &Session{CSRF: csrfFor(token)}
	err := s.db.QueryRow(ctx, `SELECT key_id::text, expires_at FROM console_sessions
		WHERE token_hash = $1 AND expires_at > $2`, tokenHash(token), s.now()).Scan(&ses.KeyID, &ses.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNoSession
	}
	if err != nil {
		return nil, fmt.Errorf("read session: %w", err)
	}
	return ses, nil
}

// Delete ends the session of token (sign-out).
func (s *Sessions) Delete(ctx context.Context, token string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM console_sessions WHERE token_hash = $1`, tokenHash(token)); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}

// DeleteForKey ends every session of a key (it was revoked).
func (s *Sessions) DeleteForKey(ctx context.Context, keyID string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM console_sessions WHERE key_id = $1`, keyID); err != nil {
		return fmt.Errorf("delete sessions of key: %w", err)
	}
	return nil
}

// sameToken compares two tokens in constant time.
func sameToken(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
