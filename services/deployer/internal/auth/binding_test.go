package auth

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/testenv"
)

const (
	projA = "9b2f4c6e-1d3a-4e5b-8c7d-0a1b2c3d4e5f"
	projB = "0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"
)

// TestBinding: which keys are bound to projects and which are fleet-wide.
func TestBinding(t *testing.T) {
	read, write := ScopeDeploymentsRead, ScopeDeploymentsWrite
	tests := []struct {
		name      string
		scopes    []Scope
		projects  []string
		fleetWide bool
		want      []string
		wantFleet bool
		wantErr   string
	}{
		{name: "deployments key with a project", scopes: []Scope{write}, projects: []string{projA}, want: []string{projA}},
		{name: "projects canonical, sorted, once", scopes: []Scope{read}, projects: []string{projA, " " + strings.ToUpper(projB), projA},
			want: []string{projB, projA}},
		{name: "deployments key made fleet-wide", scopes: []Scope{write}, fleetWide: true, wantFleet: true},
		{name: "deployments key without projects", scopes: []Scope{read}, wantErr: "--project"},
		{name: "admin is fleet-wide", scopes: []Scope{ScopeAdmin}, wantFleet: true},
		{name: "admin with deployments scopes", scopes: []Scope{ScopeAdmin, write}, wantFleet: true},
		{name: "servers key is fleet-wide", scopes: []Scope{ScopeServersRead}, wantFleet: true},
		{name: "servers and deployments need --fleet-wide", scopes: []Scope{ScopeServersWrite, write}, wantErr: "--project"},
		{name: "servers and deployments, fleet-wide", scopes: []Scope{ScopeServersWrite, write}, fleetWide: true, wantFleet: true},
		{name: "servers key bound to a project", scopes: []Scope{ScopeServersRead, read}, projects: []string{projA}, wantErr: "whole fleet"},
		{name: "admin bound to a project", scopes: []Scope{ScopeAdmin}, projects: []string{projA}, wantErr: "admin"},
		{name: "projects and fleet-wide", scopes: []Scope{read}, projects: []string{projA}, fleetWide: true, wantErr: "not both"},
		{name: "not a project id", scopes: []Scope{read}, projects: []string{projA, "acme"}, wantErr: "project 2 of 2"},
		{name: "a braced UUID is not the wire's form", scopes: []Scope{read}, projects: []string{"{" + projA + "}"}, wantErr: "not a project id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, fleet, err := Binding(tt.scopes, tt.projects, tt.fleetWide)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "acme") {
					t.Errorf("the error repeats the value: %v", err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) || fleet != tt.wantFleet {
				t.Fatalf("got %v fleet-wide %v, %v; want %v fleet-wide %v", got, fleet, err, tt.want, tt.wantFleet)
			}
			k := &Key{Projects: got, FleetWide: fleet}
			for _, p := range []string{projA, strings.ToUpper(projA), projB, "acme", ""} {
				want := fleet || (p != "" && p != "acme" && slices.Contains(got, strings.ToLower(p)))
				if k.HoldsProject(p) != want {
					t.Errorf("HoldsProject(%q) = %v", p, !want)
				}
			}
		})
	}
}

// TestStoreBinding: the store keeps the binding, refuses keys Binding
// refuses (and rows without a binding, by the table's check), and
// SetProjects narrows a legacy fleet-wide key without a new secret.
func TestStoreBinding(t *testing.T) {
	db := testenv.Pool(t)
	store := NewStore(db)
	ctx := context.Background()
	k, secret, err := store.Create(ctx, NewKey{Name: "ci", Scopes: []Scope{ScopeDeploymentsWrite}, Projects: []string{strings.ToUpper(projA)}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.Use(ctx, Hash(secret))
	if err != nil || !slices.Equal(got.Projects, []string{projA}) || got.FleetWide || got.Legacy {
		t.Fatalf("stored key %+v, %v", got, err)
	}
	if _, _, err := store.Create(ctx, NewKey{Name: "loose", Scopes: []Scope{ScopeDeploymentsRead}}); err == nil {
		t.Error("a deployments key without projects was created")
	}
	// The table refuses a row without a binding, whoever writes it.
	if _, err := db.Exec(ctx, `INSERT INTO api_keys (id, name, prefix, hash, scopes)
		VALUES (gen_random_uuid(), 'raw', 'apk_x', $1, '{deployments:read}')`, Hash(NewSecret())); err == nil {
		t.Error("the table accepted a key neither bound nor fleet-wide")
	}
	if _, err := db.Exec(ctx, `UPDATE api_keys SET projects = '{ACME}' WHERE id = $1`, k.ID); err == nil {
		t.Error("the table accepted a project that is no canonical id")
	}

	// A legacy key, as the migration leaves it.
	old, oldSecret, err := store.Create(ctx, NewKey{Name: "old", Scopes: []Scope{ScopeDeploymentsWrite}, FleetWide: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE api_keys SET legacy = true WHERE id = $1`, old.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetProjects(ctx, "old", []string{projA}, true); err == nil {
		t.Error("SetProjects took projects and fleet-wide at once")
	}
	if _, err := store.SetProjects(ctx, "nobody", []string{projA}, false); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetProjects of an unknown key: %v", err)
	}
	if _, err := store.SetProjects(ctx, old.ID, []string{projB, projA}, false); err != nil {
		t.Fatal(err)
	}
	got, err = store.Use(ctx, Hash(oldSecret))
	if err != nil || !slices.Equal(got.Projects, []string{projB, projA}) || got.FleetWide || got.Legacy {
		t.Fatalf("narrowed key %+v, %v", got, err)
	}
}
