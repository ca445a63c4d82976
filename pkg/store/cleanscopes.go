package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CleanScopes keeps the clean marks of targets in Postgres (table
// clean_scopes): the runner's memory of which targets' last run ended
// clean (ansible.CleanScopes). Postgres, not Redis: a mark must never come
// back after it was taken, as a restored snapshot could bring it.
type CleanScopes struct {
	DB Querier
}

// TakeClean deletes scope's mark and reports whether there was one.
func (c CleanScopes) TakeClean(ctx context.Context, scope string) (bool, error) {
	var s string
	err := c.DB.QueryRow(ctx, `DELETE FROM clean_scopes WHERE scope = $1 RETURNING scope`, scope).Scan(&s)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("take clean mark: %w", err)
	}
	return true, nil
}

// MarkClean marks scope clean.
func (c CleanScopes) MarkClean(ctx context.Context, scope string) error {
	if _, err := c.DB.Exec(ctx, `INSERT INTO clean_scopes (scope) VALUES ($1)
		ON CONFLICT (scope) DO UPDATE SET marked_at = now()`, scope); err != nil {
		return fmt.Errorf("mark clean: %w", err)
	}
	return nil
}
