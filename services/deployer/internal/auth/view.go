package auth

import "time"

// KeyView is an API key as the API answers (/api/v1/keys, /api/v1/me)
// and `deployer keys list|create --json` print it: one shape, snake_case,
// never the key itself.
type KeyView struct {
	ID     string   `json:"id"`
	Name   string   `json:"name"`
	Prefix string   `json:"prefix"`
	Scopes []string `json:"scopes"`
	// RateLimit and RateBurst are the key's rate limit: requests per
	// second, and the requests a full budget holds (RateLimit-Limit).
	RateLimit int `json:"rate_limit"`
	RateBurst int `json:"rate_burst"`
	// DefaultRate: the key has no rate of its own, so it follows the
	// deployer's API_RATE_LIMIT and API_RATE_BURST (the values above are
	// theirs now).
	DefaultRate bool `json:"default_rate"`
	// Projects are the projects the key acts for; empty when FleetWide.
	Projects []string `json:"projects"`
	// FleetWide keys act for every project.
	FleetWide bool `json:"fleet_wide"`
	// LegacyFleetWide marks a key made before keys were bound to projects,
	// fleet-wide until it is narrowed.
	LegacyFleetWide bool      `json:"legacy_fleet_wide"`
	CreatedAt       time.Time `json:"created_at"`
	// LastUsedAt is null for a key never used, RevokedAt for a live key.
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

// View returns k as shown, with its rate limit from rates when it has
// none of its own.
func View(k *Key, rates RateDefaults) KeyView {
	v := KeyView{ID: k.ID, Name: k.Name, Prefix: k.Prefix, Scopes: scopeStrings(k.Scopes), DefaultRate: k.RateLimit <= 0,
		Projects: append([]string{}, k.Projects...), FleetWide: k.FleetWide, LegacyFleetWide: k.Legacy, CreatedAt: k.CreatedAt}
	v.RateLimit, v.RateBurst = rates.For(k.RateLimit)
	if !k.LastUsedAt.IsZero() {
		t := k.LastUsedAt
		v.LastUsedAt = &t
	}
	if !k.RevokedAt.IsZero() {
		t := k.RevokedAt
		v.RevokedAt = &t
	}
	return v
}

// CreatedKey is a key just made: the only time the key (and its webhook
// secret, when webhooks are enabled) are shown.
type CreatedKey struct {
	KeyView
	Key           string `json:"key"`
	WebhookSecret string `json:"webhook_secret,omitempty"`
}

// KeyList is a list of keys, as GET /api/v1/keys answers and
// `deployer keys list --json` prints it.
type KeyList struct {
	Items []KeyView `json:"items"`
}

// MaxRate bounds a key's own rate limit (requests per second).
const MaxRate = 100_000
