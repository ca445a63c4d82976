package auth

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// CLIUsage is the help of `deployer keys`.
const CLIUsage = `Usage:
  deployer keys create --name NAME --scopes SCOPE[,SCOPE...] (--project ID [--project ID...] | --fleet-wide) [--rate N] [--json]
  deployer keys list [--json]
  deployer keys set-projects ID|NAME (--project ID [--project ID...] | --fleet-wide)
  deployer keys revoke ID|NAME

Scopes: deployments:read, deployments:write, jobs:read, jobs:write, credentials:read, credentials:write, templates:read, templates:write, templates:launch, servers:read, servers:write, admin
(a write scope includes its read scope; admin includes every scope).
Projects: a key with deployments scopes submits and sees the deployments of
its projects only (--project, repeated or comma-separated project ids);
--fleet-wide makes an operator's key that sees every project. Admin keys and
keys with servers scopes act on the whole fleet: they are fleet-wide.
--rate N gives the key its own limit of N requests per second (burst 2N);
without it the key follows API_RATE_LIMIT and API_RATE_BURST.
--json prints keys as the API shows them (GET /api/v1/keys): snake_case,
rate_limit, rate_burst and default_rate, null last_used_at and revoked_at
for a key never used or revoked.
The key is printed once, when it is created: only its hash is stored.
`

// projectList is a repeatable, comma-separated --project flag.
type projectList []string

func (p *projectList) String() string { return strings.Join(*p, ",") }

func (p *projectList) Set(v string) error {
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*p = append(*p, s)
		}
	}
	return nil
}

// describeBinding says which projects a key acts for, as lists show it.
func describeBinding(k *Key) string {
	switch {
	case k.Legacy:
		return "* (fleet-wide, legacy)"
	case k.FleetWide:
		return "* (fleet-wide)"
	}
	return strings.Join(k.Projects, ",")
}

// CLI runs the `deployer keys` subcommands against store. webhookSecret
// derives a key's webhook secret (nil when webhooks are disabled); rates
// are the deployer's default rate limit, shown for keys without their
// own. --json prints keys as the API shows them (KeyView).
func CLI(ctx context.Context, args []string, store *Store, webhookSecret func(string) string, rates RateDefaults, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, CLIUsage)
		if len(args) == 0 {
			return errors.New("keys: a subcommand is required (create, list, set-projects, revoke)")
		}
		return nil
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print JSON")
	switch args[0] {
	case "create":
		name := fs.String("name", "", "name of the key")
		scopes := fs.String("scopes", "", "comma-separated scopes")
		rate := fs.Int("rate", 0, "requests per second (omitted: the default)")
		var projects projectList
		fs.Var(&projects, "project", "a project the key acts for (repeatable)")
		fleetWide := fs.Bool("fleet-wide", false, "the key sees every project")
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("keys create: %w\n%s", err, CLIUsage)
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("keys create: unexpected argument (see --help)")
		}
		if flagSet(fs, "rate") && (*rate < 1 || *rate > MaxRate) {
			return fmt.Errorf("keys create: --rate must be between 1 and %d requests per second; "+
				"omit --rate for the deployer's default (API_RATE_LIMIT, now %d/s)", MaxRate, rates.Rate)
		}
		sc, err := ParseScopes([]string{*scopes})
		if err != nil {
			return fmt.Errorf("keys create: --scopes: %w", err)
		}
		if !ValidName(*name) {
			return fmt.Errorf("keys create: --name must match %s", NamePattern)
		}
		if _, _, err := Binding(sc, projects, *fleetWide); err != nil {
			return fmt.Errorf("keys create: %w", err)
		}
		k, secret, err := store.Create(ctx, NewKey{Name: *name, Scopes: sc, RateLimit: *rate, Projects: projects, FleetWide: *fleetWide})
		if err != nil {
			return fmt.Errorf("keys create: %w", err)
		}
		var whsec string
		if webhookSecret != nil {
			whsec = webhookSecret(k.ID)
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(CreatedKey{KeyView: View(k, rates), Key: secret, WebhookSecret: whsec})
		}
		fmt.Fprintf(stdout, "API key %q created (id %s, scopes %s, projects %s)\n\n  %s\n\n", k.Name, k.ID,
			joinScopes(k.Scopes), describeBinding(k), secret)
		if whsec != "" {
			fmt.Fprintf(stdout, "Webhook secret (verifies the Autoprov-Signature of this key's webhooks):\n\n  %s\n\n", whsec)
		}
		fmt.Fprintln(stdout, "Store them now: they are not shown again. Use the key as: Authorization: Bearer <key>")
		return nil
	case "list":
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("keys list: %w", err)
		}
		keys, err := store.List(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			out := KeyList{Items: make([]KeyView, len(keys))}
			for i, k := range keys {
				out.Items[i] = View(k, rates)
			}
			return json.NewEncoder(stdout).Encode(out)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tPREFIX\tSCOPES\tPROJECTS\tRATE\tCREATED\tLAST USED\tREVOKED")
		var legacy []string
		for _, k := range keys {
			v := View(k, rates)
			rate := fmt.Sprintf("%d/s", v.RateLimit)
			if v.DefaultRate {
				rate += " (default)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s…\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Prefix, joinScopes(k.Scopes),
				describeBinding(k), rate, when(k.CreatedAt), when(k.LastUsedAt), when(k.RevokedAt))
			if k.Legacy && k.RevokedAt.IsZero() && k.Has(ScopeDeploymentsRead) && !k.Has(ScopeAdmin) {
				legacy = append(legacy, k.Name)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(legacy) > 0 {
			fmt.Fprintf(stdout, "\nWARNING: %d live key(s) predate project binding and act for every project: %s.\n"+
				"Narrow each with `deployer keys set-projects NAME --project ID` (or --fleet-wide to keep it so knowingly),\n"+
				"or revoke it and create a new one with --project (docs/deployer.md, \"API keys belong to projects\").\n", len(legacy), strings.Join(legacy, ", "))
		}
		return nil
	case "set-projects":
		var projects projectList
		fs.Var(&projects, "project", "a project the key acts for (repeatable)")
		fleetWide := fs.Bool("fleet-wide", false, "the key sees every project")
		// The key may come before the flags or after them.
		rest, target := args[1:], ""
		if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			target, rest = rest[0], rest[1:]
		}
		if err := fs.Parse(rest); err != nil {
			return fmt.Errorf("keys set-projects: %w\n%s", err, CLIUsage)
		}
		if target == "" && fs.NArg() == 1 {
			target = fs.Arg(0)
		} else if fs.NArg() > 0 || target == "" {
			return fmt.Errorf("keys set-projects: give the id or name of one key")
		}
		if len(projects) == 0 && !*fleetWide {
			return fmt.Errorf("keys set-projects: give --project ID (repeatable) or --fleet-wide")
		}
		k, err := store.SetProjects(ctx, target, projects, *fleetWide)
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("keys set-projects: no live key has this id or name")
		}
		if err != nil {
			return fmt.Errorf("keys set-projects: %w", err)
		}
		fmt.Fprintf(stdout, "API key %q (id %s) now acts for: %s\n", k.Name, k.ID, describeBinding(k))
		return nil
	case "revoke":
		if err := fs.Parse(args[1:]); err != nil {
			return fmt.Errorf("keys revoke: %w", err)
		}
		if fs.NArg() != 1 {
			return fmt.Errorf("keys revoke: give the id or name of one key")
		}
		k, err := store.Revoke(ctx, fs.Arg(0))
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("keys revoke: no live key has this id or name")
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "API key %q (id %s) revoked\n", k.Name, k.ID)
		return nil
	}
	return fmt.Errorf("keys: unknown subcommand %q (create, list, set-projects, revoke)", truncate(strings.TrimSpace(args[0]), 20))
}

// flagSet reports whether the flag name was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}
