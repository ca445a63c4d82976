package auth

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Errors of the key store.
var (
	ErrNotFound  = errors.New("api key not found")
	ErrRevoked   = errors.New("api key revoked")
	ErrNameTaken = errors.New("a live api key already has this name")
)

// Store keeps API keys in Postgres (table api_keys).
type Store struct {
	db *pgxpool.Pool
}

// NewStore returns a Store on db.
func NewStore(db *pgxpool.Pool) *Store { return &Store{db: db} }

// NewKey describes a key to create.
type NewKey struct {
	Name      string
	Scopes    []Scope
	RateLimit int // 0: the default
	// Projects and FleetWide bind the key (see Binding).
	Projects  []string
	FleetWide bool
}

// Create makes a key and returns it with its secret, which is not stored
// and cannot be shown again.
func (s *Store) Create(ctx context.Context, nk NewKey) (*Key, string, error) {
	if !ValidName(nk.Name) {
		return nil, "", fmt.Errorf("name must match %s", NamePattern)
	}
	if len(nk.Scopes) == 0 {
		return nil, "", errors.New("at least one scope is required")
	}
	if nk.RateLimit < 0 {
		return nil, "", errors.New("rate limit must not be negative")
	}
	projects, fleetWide, err := Binding(nk.Scopes, nk.Projects, nk.FleetWide)
	if err != nil {
		return nil, "", err
	}
	id, err := uuid.NewV7FromReader(rand.Reader)
	if err != nil {
		return nil, "", fmt.Errorf("new key id: %w", err)
	}
	secret := NewSecret()
	k := &Key{ID: id.String(), Name: nk.Name, Prefix: DisplayPrefix(secret), Scopes: nk.Scopes, RateLimit: nk.RateLimit,
		Projects: projects, FleetWide: fleetWide}
	var rate *int
	if nk.RateLimit > 0 {
		rate = &nk.RateLimit
	}
	err = s.db.QueryRow(ctx, `
		INSERT INTO api_keys (id, name, prefix, hash, scopes, rate_limit, projects, fleet_wide)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		RETURNING created_at`, k.ID, k.Name, k.Prefix, Hash(secret), scopeStrings(k.Scopes), rate,
		nonNil(projects), fleetWide).Scan(&k.CreatedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return nil, "", ErrNameTaken
	}
	if err != nil {
		return nil, "", fmt.Errorf("create api key: %w", err)
	}
	return k, secret, nil
}

const keyColumns = `id::text, name, prefix, scopes, COALESCE(rate_limit, 0), projects, fleet_wide, legacy,
	created_at, last_used_at, revoked_at`

func scanKey(row pgx.Row) (*Key, error) {
	var k Key
	var scopes []string
	var lastUsed, revoked *time.Time
	if err := row.Scan(&k.ID, &k.Name, &k.Prefix, &scopes, &k.RateLimit, &k.Projects, &k.FleetWide, &k.Legacy,
		&k.CreatedAt, &lastUsed, &revoked); err != nil {
		return nil, err
	}
	for _, s := range scopes {
		k.Scopes = append(k.Scopes, Scope(s))
	}
	if lastUsed != nil {
		k.LastUsedAt = *lastUsed
	}
	if revoked != nil {
		k.RevokedAt = *revoked
	}
	return &k, nil
}

// List returns every key, live ones first, newest first.
func (s *Store) List(ctx context.Context) ([]*Key, error) {
	rows, err := s.db.Query(ctx, `SELECT `+keyColumns+` FROM api_keys ORDER BY revoked_at IS NOT NULL, created_at DESC`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Key, error) { return scanKey(r) })
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return keys, nil
}

// Get returns the key with id.
func (s *Store) Get(ctx context.Context, id string) (*Key, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, ErrNotFound
	}
	k, err := scanKey(s.db.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read api key: %w", err)
	}
	return k, nil
}

// Revoke revokes the live key whose id or name is idOrName and returns it.
// Revoking is final.
func (s *Store) Revoke(ctx context.Context, idOrName string) (*Key, error) {
	var k *Key
	var err error
	if _, perr := uuid.Parse(idOrName); perr == nil {
		k, err = scanKey(s.db.QueryRow(ctx, `UPDATE api_keys SET revoked_at = now()
			WHERE id = $1 AND revoked_at IS NULL RETURNING `+keyColumns, idOrName))
	} else {
		k, err = scanKey(s.db.QueryRow(ctx, `UPDATE api_keys SET revoked_at = now()
			WHERE name = $1 AND revoked_at IS NULL RETURNING `+keyColumns, idOrName))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("revoke api key: %w", err)
	}
	return k, nil
}

// Use looks a key up by its secret's hash, records that it was used, and
// returns it: ErrNotFound for an unknown key, ErrRevoked for a revoked one.
func (s *Store) Use(ctx context.Context, hash []byte) (*Key, error) {
	k, err := scanKey(s.db.QueryRow(ctx, `UPDATE api_keys SET last_used_at = now()
		WHERE hash = $1 AND revoked_at IS NULL RETURNING `+keyColumns, hash))
	if err == nil {
		return k, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	var revoked bool
	err = s.db.QueryRow(ctx, `SELECT true FROM api_keys WHERE hash = $1`, hash).Scan(&revoked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	return nil, ErrRevoked
}

// SetProjects binds the live key whose id or name is idOrName to projects,
// or makes it fleet-wide, by the rules of Binding, and returns it. It is
// how a key is narrowed without handing out a new secret (a legacy key
// loses its mark). Other replicas see the change within their key cache's
// TTL.
func (s *Store) SetProjects(ctx context.Context, idOrName string, projects []string, fleetWide bool) (*Key, error) {
	var k *Key
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		where := "name = $1"
		if _, perr := uuid.Parse(idOrName); perr == nil {
			where = "id = $1"
		}
		cur, err := scanKey(tx.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys
			WHERE `+where+` AND revoked_at IS NULL FOR UPDATE`, idOrName))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("read api key: %w", err)
		}
		bound, fw, err := Binding(cur.Scopes, projects, fleetWide)
		if err != nil {
			return err
		}
		k, err = scanKey(tx.QueryRow(ctx, `UPDATE api_keys SET projects = $2, fleet_wide = $3, legacy = false
			WHERE id = $1 RETURNING `+keyColumns, cur.ID, nonNil(bound), fw))
		if err != nil {
			return fmt.Errorf("bind api key: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// nonNil makes a nil list an empty one (the column is NOT NULL).
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func scopeStrings(scopes []Scope) []string {
	out := make([]string, len(scopes))
	for i, s := range scopes {
		out[i] = string(s)
	}
	return out
}
