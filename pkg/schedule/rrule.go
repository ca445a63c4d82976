package schedule

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/teambition/rrule-go"
)

// MaxCount bounds an RRULE's COUNT: its occurrences are listed from
// DTSTART at each parse (a longer run is an UNTIL).
const MaxCount = 10000

// ruleSchedule is an RFC 5545 recurrence rule from a DTSTART in a time
// zone. rrule-go walks a rule from its DTSTART, so a rule that began long
// ago would cost a walk through all of its past at each Next: a rule
// without COUNT is walked instead from a start moved on by whole
// intervals to just before t (what comes after t does not depend on what
// came before, only on the interval's phase, which the move keeps, and
// on the fields DTSTART implies, which opt holds explicitly). A rule
// with COUNT depends on its whole past: its occurrences (at most
// MaxCount) are listed once.
type ruleSchedule struct {
	opt rrule.ROption // Dtstart in the zone, the fields it implies explicit
	loc *time.Location

	once sync.Once
	all  []time.Time // a COUNT rule's occurrences
}

func parseRule(text string, dtstart time.Time, loc *time.Location) (*ruleSchedule, error) {
	text = strings.TrimSpace(text)
	if text == "" || len(text) > 500 {
		return nil, fieldError("rrule", "must be an RRULE value of at most 500 characters (such as FREQ=WEEKLY;BYDAY=MO,WE;BYHOUR=9;BYMINUTE=30)")
	}
	upper := strings.ToUpper(text)
	if strings.ContainsAny(text, "\r\n") || strings.Contains(upper, "DTSTART") || strings.Contains(upper, "TZID") {
		return nil, fieldError("rrule", "give the rule alone: its start in dtstart and its time zone in timezone")
	}
	if dtstart.IsZero() {
		return nil, fieldError("dtstart", "an RRULE schedule needs its start")
	}
	opt, err := rrule.StrToROptionInLocation(upper, loc)
	if err != nil {
		return nil, fieldError("rrule", "not an RRULE: "+err.Error())
	}
	switch {
	case opt.Freq == rrule.SECONDLY:
		return nil, fieldError("rrule", "FREQ=SECONDLY is not supported: the most frequent is FREQ=MINUTELY (BYSECOND may list seconds)")
	case opt.Count > MaxCount:
		return nil, fieldError("rrule", fmt.Sprintf("COUNT must be at most %d (use UNTIL for a longer run)", MaxCount))
	case opt.Interval > 1000:
		return nil, fieldError("rrule", "INTERVAL must be at most 1000")
	}
	opt.Dtstart = dtstart.In(loc).Truncate(time.Second)
	implied(opt)
	if _, err := rrule.NewRRule(*opt); err != nil {
		return nil, fieldError("rrule", "not an RRULE: "+err.Error())
	}
	r := &ruleSchedule{opt: *opt, loc: loc}
	if r.first().IsZero() {
		return nil, fieldError("rrule", "the rule has no occurrence")
	}
	return r, nil
}

// implied makes explicit the fields a rule takes from its DTSTART (as
// rrule-go and RFC 5545 do), so that a moved start keeps them.
func implied(o *rrule.ROption) {
	d := o.Dtstart
	if len(o.Byweekno) == 0 && len(o.Byyearday) == 0 && len(o.Bymonthday) == 0 && len(o.Byweekday) == 0 && len(o.Byeaster) == 0 {
		switch o.Freq {
		case rrule.YEARLY:
			if len(o.Bymonth) == 0 {
				o.Bymonth = []int{int(d.Month())}
			}
			o.Bymonthday = []int{d.Day()}
		case rrule.MONTHLY:
			o.Bymonthday = []int{d.Day()}
		case rrule.WEEKLY:
			o.Byweekday = []rrule.Weekday{weekdays[d.Weekday()]}
		}
	}
	if len(o.Byhour) == 0 && o.Freq < rrule.HOURLY {
		o.Byhour = []int{d.Hour()}
	}
	if len(o.Byminute) == 0 && o.Freq < rrule.MINUTELY {
		o.Byminute = []int{d.Minute()}
	}
	if len(o.Bysecond) == 0 && o.Freq < rrule.SECONDLY {
		o.Bysecond = []int{d.Second()}
	}
}

var weekdays = [7]rrule.Weekday{rrule.SU, rrule.MO, rrule.TU, rrule.WE, rrule.TH, rrule.FR, rrule.SA}

// first is the rule's first occurrence (zero: none).
func (r *ruleSchedule) first() time.Time {
	rr, err := rrule.NewRRule(r.opt)
	if err != nil {
		return time.Time{}
	}
	return rr.After(r.opt.Dtstart, true)
}

// Next returns the first occurrence after t, or zero when the rule is
// done (COUNT, UNTIL).
func (r *ruleSchedule) Next(t time.Time) time.Time {
	if r.opt.Count > 0 {
		r.once.Do(func() {
			if rr, err := rrule.NewRRule(r.opt); err == nil {
				r.all = rr.All()
			}
		})
		i := sort.Search(len(r.all), func(i int) bool { return r.all[i].After(t) })
		if i == len(r.all) {
			return time.Time{}
		}
		return r.all[i]
	}
	o := r.opt
	o.Dtstart = r.rebase(t)
	rr, err := rrule.NewRRule(o)
	if err != nil {
		return time.Time{}
	}
	return rr.After(t, false)
}

// rebase returns a start for walking the rule to its first occurrence
// after t: DTSTART moved on by a whole number of intervals to a wall
// clock comfortably before t's (a day or two, three hours for HOURLY and
// MINUTELY: more than any change of offset), at the start of its period.
// A wall clock that does not exist in the zone (a daylight saving gap)
// is moved back one interval more; DTSTART itself when t is near it.
func (r *ruleSchedule) rebase(t time.Time) time.Time {
	start := r.opt.Dtstart
	c0, ct := civil(start), civil(t.In(r.loc))
	n := max(r.opt.Interval, 1)
	var at func(k int) time.Time
	var k int
	switch r.opt.Freq {
	case rrule.YEARLY:
		k = (ct.Year() - c0.Year() - 1) / n
		at = func(k int) time.Time { return time.Date(c0.Year()+k*n, 1, 1, 0, 0, 0, 0, time.UTC) }
	case rrule.MONTHLY:
		k = ((ct.Year()-c0.Year())*12 + int(ct.Month()) - int(c0.Month()) - 1) / n
		at = func(k int) time.Time {
			return time.Date(c0.Year(), c0.Month()+time.Month(k*n), 1, 0, 0, 0, 0, time.UTC)
		}
	case rrule.WEEKLY, rrule.DAILY:
		days := int(ct.Sub(c0).Hours()/24) - 2
		unit := 1
		if r.opt.Freq == rrule.WEEKLY {
			unit = 7
		}
		k = days / (unit * n)
		at = func(k int) time.Time {
			return time.Date(c0.Year(), c0.Month(), c0.Day()+k*n*unit, 0, 0, 0, 0, time.UTC)
		}
	case rrule.HOURLY:
		k = (int(ct.Sub(c0).Hours()) - 3) / n
		h := c0.Truncate(time.Hour)
		at = func(k int) time.Time { return h.Add(time.Duration(k*n) * time.Hour) }
	case rrule.MINUTELY:
		k = (int(ct.Sub(c0).Minutes()) - 180) / n
		m := c0.Truncate(time.Minute)
		at = func(k int) time.Time { return m.Add(time.Duration(k*n) * time.Minute) }
	default:
		return start
	}
	for ; k > 0; k-- {
		c := at(k)
		if d := inZone(c, r.loc); civil(d).Equal(c) {
			return d
		}
	}
	return start
}

// civil is t's wall clock as a time in UTC (for arithmetic on wall
// clocks: rrule-go counts hours and days on the wall clock).
func civil(t time.Time) time.Time {
	y, m, d := t.Date()
	h, mi, s := t.Clock()
	return time.Date(y, m, d, h, mi, s, 0, time.UTC)
}

func inZone(c time.Time, loc *time.Location) time.Time {
	y, m, d := c.Date()
	h, mi, s := c.Clock()
	return time.Date(y, m, d, h, mi, s, 0, loc)
}

// FieldError is a Spec refused, naming its field (cron, rrule, timezone,
// dtstart).
type FieldError struct {
	Field, Message string
}

func (e *FieldError) Error() string { return e.Message }

func fieldError(field, msg string) error { return &FieldError{Field: field, Message: msg} }

// ErrField returns the field err names ("" for none).
func ErrField(err error) string {
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe.Field
	}
	return ""
}
