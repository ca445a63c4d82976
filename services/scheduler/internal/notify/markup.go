package notify

import (
	"strings"
	"unicode/utf8"
)

// Markup is the formatting language a channel's messages are read in. A
// message's fixed text is written in it; everything that comes from
// outside (a server's handle, a job id, a provider's or a play's error) is
// escaped first, so that it shows as written and can neither mention
// people (Slack's <!channel>, <!here>, <@U123>), nor add links
// (<http://evil|click>), nor break the message's own formatting.
type Markup int

const (
	// SlackMrkdwn is Slack's mrkdwn: &, < and > are its control
	// characters and are escaped as &amp;, &lt; and &gt; (Slack has no
	// escape for *, _ and ~; without < > they cannot mention or link).
	// Code is written between backticks.
	SlackMrkdwn Markup = iota
	// TelegramHTML is the Bot API's parse_mode "HTML": &, < and > are
	// escaped as &amp;, &lt; and &gt; (Markdown-like characters mean
	// nothing in it); code is <code>...</code>.
	TelegramHTML
	// PlainText is an email's text/plain body: nothing is markup, so
	// nothing is escaped (what could harm there, a line end in a header,
	// is kept out of headers instead); code is written between backticks.
	PlainText
)

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// Escape returns s, text from outside, made inert in m.
func (m Markup) Escape(s string) string {
	if m == PlainText {
		return s
	}
	// Both languages escape the same three characters the same way.
	return htmlEscaper.Replace(s)
}

// Code formats s (fixed text and escaped values) as code.
func (m Markup) Code(s string) string {
	if m == TelegramHTML {
		return "<code>" + s + "</code>"
	}
	return "`" + s + "`"
}

// Truncate cuts text (in m) to at most n characters, ending it with "…":
// never inside an entity (&amp;) or a tag, and closing a code element the
// cut leaves open, so that the channel can still parse it (Telegram
// refuses a message whose HTML it cannot parse).
func (m Markup) Truncate(text string, n int) string {
	if n <= 0 || utf8.RuneCountInString(text) <= n {
		return text
	}
	r := []rune(text)
	if m == PlainText {
		return string(r[:n-1]) + "…"
	}
	for cut := n - 1; cut > 0; {
		head := string(r[:cut])
		// An entity or a tag the cut ends inside is left out whole.
		if i := strings.LastIndexAny(head, "&<"); i >= 0 && !strings.ContainsAny(head[i:], ";>") {
			head = head[:i]
		}
		closing := ""
		if m == TelegramHTML && strings.Count(head, "<code>") > strings.Count(head, "</code>") {
			closing = "</code>"
		}
		out := head + "…" + closing
		over := utf8.RuneCountInString(out) - n
		if over <= 0 {
			return out
		}
		cut = utf8.RuneCountInString(head) - over
	}
	return "…"
}
