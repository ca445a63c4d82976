package templates

import (
	"context"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
)

// LaunchKey returns the API key keyID that owner (a workflow run, say)
// launches project's templates as; or why it may not, for good (deleted,
// revoked, its scopes or projects changed); or an error that passes. It is
// the check schedules and triggers make at each launch.
func LaunchKey(ctx context.Context, keys Keys, keyID, project, owner string) (*auth.Key, string, error) {
	return launchKey(ctx, keys, nil, keyID, project, owner)
}

// LaunchRefusal sorts the error of a launch made for no one waiting: why
// it is refused for good (invalid, the template gone), or an error that
// passes.
func LaunchRefusal(err error) (string, error) { return launchRefusal(err) }

// CheckStoredLaunch checks l, a launch stored to run later for no one
// waiting (owner: "schedule", "workflow", ...), against t: each problem
// goes to add by field ("launch.<field>"), and a secret answer is refused
// (it would be stored); the error is one that passes.
func CheckStoredLaunch(t *Template, l Launch, owner string, add func(field, msg string)) error {
	return checkStoredLaunch(t, l, owner, add)
}
