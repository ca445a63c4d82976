package console

import (
	"fmt"
	"time"
)

// outcomes are the chart's series, bottom up, with their CSS classes.
var outcomes = []struct{ Status, Class, Label string }{
	{"succeeded", "ok", "succeeded"},
	{"failed", "bad", "failed"},
	{"unreachable", "warn", "unreachable"},
	{"rejected", "warn", "rejected"},
	{"cancelled", "muted", "cancelled"},
	{"running", "run", "running or queued"},
}

// chart is a stacked bar chart of runs per hour, drawn as SVG by the
// overview's template: every bar carries a title with its numbers, the
// series are named next to the chart, and a table holds the same numbers.
type chart struct {
	Width, Height int
	Bars          []bar
	Max           int
	Ticks         []tick
	Series        []series
	Total         int
}

type bar struct {
	X, W  int
	Hour  time.Time
	Title string
	Rects []rect
	Total int
	By    map[string]int
}

type rect struct {
	Y, H  int
	Class string
}

type tick struct {
	X     int
	Label string
}

type series struct {
	Class, Label string
	N            int
}

// hourlyChart lays out the 24 hours from since.
func hourlyChart(since time.Time, hours map[time.Time]map[string]int) chart {
	const width, height, plotTop, plotBottom, left = 720, 180, 10, 150, 40
	c := chart{Width: width, Height: height}
	for i := range 24 {
		at := since.Add(time.Duration(i) * time.Hour)
		n := 0
		for _, v := range hours[at] {
			n += v
		}
		c.Max = max(c.Max, n)
	}
	scale := 1.0
	if c.Max > 0 {
		scale = float64(plotBottom-plotTop) / float64(c.Max)
	}
	bw := (width - left) / 24
	totals := map[string]int{}
	for i := range 24 {
		at := since.Add(time.Duration(i) * time.Hour)
		b := bar{X: left + i*bw + 2, W: bw - 4, Hour: at, By: hours[at]}
		y := plotBottom
		title := at.Format("15:04") + " UTC:"
		for _, o := range outcomes {
			n := hours[at][o.Status]
			if n == 0 {
				continue
			}
			totals[o.Status] += n
			b.Total += n
			h := max(1, int(float64(n)*scale+0.5))
			y -= h
			b.Rects = append(b.Rects, rect{Y: y, H: h, Class: o.Class})
			title += fmt.Sprintf(" %d %s", n, o.Label)
		}
		if b.Total == 0 {
			title += " no runs"
		}
		b.Title = title
		c.Bars = append(c.Bars, b)
		if i%6 == 0 {
			c.Ticks = append(c.Ticks, tick{X: b.X, Label: at.Format("15:04")})
		}
	}
	for _, o := range outcomes {
		c.Series = append(c.Series, series{Class: o.Class, Label: o.Label, N: totals[o.Status]})
		c.Total += totals[o.Status]
	}
	return c
}
