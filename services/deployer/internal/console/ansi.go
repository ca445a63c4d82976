package console

import (
	"html/template"
	"regexp"
	"strings"
)

// csi matches an ANSI control sequence (ESC [ parameters final-byte).
var csi = regexp.MustCompile(`\x1b\[([0-9;?]*)([A-Za-z])`)

// ansiHTML renders text (a run's log) as HTML: its text escaped, its SGR
// colour codes (ESC[...m) turned into spans of classes ansi-<code> (the
// console's script does the same for live output), any other control
// sequence dropped.
func ansiHTML(text string) template.HTML {
	var b strings.Builder
	open := false
	last := 0
	for _, m := range csi.FindAllStringSubmatchIndex(text, -1) {
		b.WriteString(template.HTMLEscapeString(text[last:m[0]]))
		last = m[1]
		if text[m[4]:m[5]] != "m" {
			continue
		}
		if open {
			b.WriteString("</span>")
			open = false
		}
		var classes []string
		for _, c := range strings.Split(text[m[2]:m[3]], ";") {
			if c != "" && c != "0" && strings.Trim(c, "0123456789") == "" {
				classes = append(classes, "ansi-"+c)
			}
		}
		if len(classes) > 0 {
			b.WriteString(`<span class="` + strings.Join(classes, " ") + `">`)
			open = true
		}
	}
	b.WriteString(template.HTMLEscapeString(text[last:]))
	if open {
		b.WriteString("</span>")
	}
	return template.HTML(b.String()) // #nosec G203: every byte of text went through HTMLEscapeString
}

// logLine is one line of a run's log as the console shows it: its number
// (1-based, the target of its link) and its HTML (ansiHTML).
type logLine struct {
	N    int
	HTML template.HTML
}

// logLines splits text (a run's log) into lines, each rendered by
// ansiHTML on its own (Ansible colours each line by itself); a final line
// break makes no empty last line.
func logLines(text string) []logLine {
	text = strings.TrimSuffix(text, "\n")
	if text == "" {
		return nil
	}
	parts := strings.Split(text, "\n")
	out := make([]logLine, len(parts))
	for i, p := range parts {
		out[i] = logLine{N: i + 1, HTML: ansiHTML(strings.TrimSuffix(p, "\r"))}
	}
	return out
}
