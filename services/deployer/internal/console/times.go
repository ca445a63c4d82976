package console

import (
	"fmt"
	"html/template"
	"time"
)

// when renders a moment (time.Time or *time.Time; zero or nil: "-") as a
// <time> element: its text and title UTC, its datetime machine-readable;
// the console's script shows it in the reader's own time zone with how
// long ago it was, UTC staying on hover.
func when(t any) template.HTML {
	var v time.Time
	switch x := t.(type) {
	case time.Time:
		v = x
	case *time.Time:
		if x != nil {
			v = *x
		}
	default:
		return template.HTML(template.HTMLEscapeString(fmt.Sprint(t))) // #nosec G203: escaped
	}
	if v.IsZero() {
		return "-"
	}
	utc := v.UTC().Format("2006-01-02 15:04:05Z")
	return template.HTML(fmt.Sprintf(`<time datetime="%s" title="%s UTC">%s</time>`, // #nosec G203: fixed formats
		v.UTC().Format(time.RFC3339), utc, utc))
}

// humanMS renders milliseconds as a duration people read: 850 ms, 4.2 s,
// 3m12s, 1h4m.
func humanMS(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", ms)
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
