package secrets

import "time"

// Clock is the time source of the Vault token renewal loop; tests inject a
// fake one to drive renewals without sleeping.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has elapsed.
	After(d time.Duration) <-chan time.Time
}

// systemClock is the real clock.
type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
