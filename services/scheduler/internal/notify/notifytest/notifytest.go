// Package notifytest has local receivers of Slack incoming webhooks and of
// the Telegram Bot API's sendMessage that check what the public APIs
// require (method, content type, JSON body, text length, token, chat) and
// enforce their documented rate limits with 429 answers, for tests and for
// `make run`'s local webhook receiver.
package notifytest

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Message is a message a receiver accepted.
type Message struct {
	Text      string
	At        time.Time
	Chat      string // Telegram only
	ParseMode string // Telegram only: "", "HTML", "MarkdownV2" or "Markdown"
}

// Receiver is the common part of the receivers.
type Receiver struct {
	mu       sync.Mutex
	accepted []Message
	rejected []string
	last     map[string]time.Time
	failNext int
	status   int
	// MinInterval is the documented rate limit (one message per interval);
	// a faster message gets 429. Zero disables the check.
	MinInterval time.Duration
	// Log, when set, receives one line per accepted message.
	Log io.Writer
	// Hold, when set, is called before a message is accepted (tests block
	// in it to model a slow channel).
	Hold func()
}

// Messages returns the accepted messages.
func (r *Receiver) Messages() []Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Message(nil), r.accepted...)
}

// Rejected returns why requests were refused (bad input; not 429s or
// injected failures).
func (r *Receiver) Rejected() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.rejected...)
}

// FailNext makes the next n messages fail with status (500, 503, ...).
func (r *Receiver) FailNext(n, status int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failNext, r.status = n, status
}

// injected returns the injected failure status, or 0.
func (r *Receiver) injected() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failNext > 0 {
		r.failNext--
		return r.status
	}
	return 0
}

func (r *Receiver) reject(why string) {
	r.mu.Lock()
	r.rejected = append(r.rejected, why)
	r.mu.Unlock()
}

// limited reports whether a message to key now breaks the rate limit (and
// records it otherwise).
func (r *Receiver) limited(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]time.Time{}
	}
	now := time.Now()
	// A little tolerance for the sender's clock.
	if last, ok := r.last[key]; ok && r.MinInterval > 0 && now.Sub(last) < r.MinInterval-50*time.Millisecond {
		return true
	}
	r.last[key] = now
	return false
}

func (r *Receiver) accept(m Message) {
	if r.Hold != nil {
		r.Hold()
	}
	r.mu.Lock()
	r.accepted = append(r.accepted, m)
	log := r.Log
	r.mu.Unlock()
	if log != nil {
		fmt.Fprintf(log, "%s received%s:\n%s\n\n", m.At.Format(time.RFC3339), map[bool]string{true: " for chat " + m.Chat, false: ""}[m.Chat != ""], m.Text)
	}
}

func isJSON(req *http.Request) bool {
	mt, _, err := mime.ParseMediaType(req.Header.Get("Content-Type"))
	return err == nil && mt == "application/json"
}

// Slack receives incoming-webhook posts at Path.
type Slack struct {
	Receiver
	// Path is the webhook's path (its secret part), e.g. /services/T0/B0/XXXX.
	Path string
}

// NewSlack returns a Slack receiver for path with Slack's documented limit
// of one message per second.
func NewSlack(path string) *Slack {
	return &Slack{Path: path, Receiver: Receiver{MinInterval: time.Second}}
}

// ServeHTTP answers like Slack: 200 "ok", 400 invalid_payload/no_text,
// 404 no_service, 429 with Retry-After.
func (s *Slack) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != s.Path {
		s.reject("unknown webhook path")
		http.Error(w, "no_service", http.StatusNotFound)
		return
	}
	if req.Method != http.MethodPost {
		s.reject("method " + req.Method)
		http.Error(w, "invalid_method", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	var payload map[string]any
	if err != nil || !isJSON(req) || json.Unmarshal(body, &payload) != nil {
		s.reject("payload is not JSON")
		http.Error(w, "invalid_payload", http.StatusBadRequest)
		return
	}
	text, ok := payload["text"].(string)
	if !ok || strings.TrimSpace(text) == "" {
		s.reject("no text")
		http.Error(w, "no_text", http.StatusBadRequest)
		return
	}
	if utf8.RuneCountInString(text) > 40000 {
		s.reject("text too long")
		http.Error(w, "msg_too_long", http.StatusBadRequest)
		return
	}
	if st := s.injected(); st != 0 {
		http.Error(w, "rollup_error", st)
		return
	}
	if s.limited("") {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "rate_limited", http.StatusTooManyRequests)
		return
	}
	s.accept(Message{Text: text, At: time.Now()})
	_, _ = io.WriteString(w, "ok")
}

// Telegram receives Bot API sendMessage calls for one bot token.
type Telegram struct {
	Receiver
	Token string
	// Chats the bot may write to.
	Chats []string
}

// NewTelegram returns a Telegram receiver with Telegram's documented limit
// of about one message per second per chat.
func NewTelegram(token string, chats ...string) *Telegram {
	return &Telegram{Token: token, Chats: chats, Receiver: Receiver{MinInterval: time.Second}}
}

func tgError(w http.ResponseWriter, code int, desc string, retryAfter int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	body := map[string]any{"ok": false, "error_code": code, "description": desc}
	if retryAfter > 0 {
		body["parameters"] = map[string]int{"retry_after": retryAfter}
	}
	_ = json.NewEncoder(w).Encode(body)
}

// ServeHTTP answers like the Bot API.
func (t *Telegram) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rest, ok := strings.CutPrefix(req.URL.Path, "/bot")
	token, method, _ := strings.Cut(rest, "/")
	if !ok || token != t.Token {
		t.reject("bad token")
		tgError(w, http.StatusUnauthorized, "Unauthorized", 0)
		return
	}
	if method != "sendMessage" {
		t.reject("method " + method)
		tgError(w, http.StatusNotFound, "Not Found: method not found", 0)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	var p struct {
		ChatID    any    `json:"chat_id"`
		Text      string `json:"text"`
		ParseMode string `json:"parse_mode"`
	}
	if err != nil || req.Method != http.MethodPost || !isJSON(req) || json.Unmarshal(body, &p) != nil {
		t.reject("bad request body")
		tgError(w, http.StatusBadRequest, "Bad Request: invalid request body", 0)
		return
	}
	chat := fmt.Sprint(p.ChatID)
	known := false
	for _, c := range t.Chats {
		known = known || c == chat
	}
	// Telegram counts the text after its entities are parsed.
	plain, perr := p.Text, error(nil)
	switch p.ParseMode {
	case "":
	case "HTML":
		plain, perr = ParseHTML(p.Text)
	default:
		perr = fmt.Errorf("parse mode %q is not checked by this receiver", p.ParseMode)
	}
	switch n := utf8.RuneCountInString(strings.TrimSpace(plain)); {
	case p.ChatID == nil || !known:
		t.reject("chat not found")
		tgError(w, http.StatusBadRequest, "Bad Request: chat not found", 0)
		return
	case n == 0:
		t.reject("empty text")
		tgError(w, http.StatusBadRequest, "Bad Request: message text is empty", 0)
		return
	case perr != nil:
		t.reject("can't parse entities: " + perr.Error())
		tgError(w, http.StatusBadRequest, "Bad Request: can't parse entities: "+perr.Error(), 0)
		return
	case utf8.RuneCountInString(plain) > 4096:
		t.reject("text too long")
		tgError(w, http.StatusBadRequest, "Bad Request: message is too long", 0)
		return
	}
	if st := t.injected(); st != 0 {
		tgError(w, st, "Internal Server Error", 0)
		return
	}
	if t.limited(chat) {
		tgError(w, http.StatusTooManyRequests, "Too Many Requests: retry after 1", 1)
		return
	}
	t.accept(Message{Text: p.Text, At: time.Now(), Chat: chat, ParseMode: p.ParseMode})
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "result": map[string]any{"message_id": len(t.Messages()), "text": p.Text}})
}

// htmlTags are the tags the Bot API's HTML parse mode supports.
var htmlTags = map[string]bool{"b": true, "strong": true, "i": true, "em": true, "u": true, "ins": true,
	"s": true, "strike": true, "del": true, "span": true, "tg-spoiler": true, "a": true, "tg-emoji": true,
	"code": true, "pre": true, "blockquote": true}

// ParseHTML checks text the way the Bot API's parse_mode HTML does and
// returns its plain text: every <, > and & must be part of a supported tag
// or an entity (only &lt; &gt; &amp; &quot; and numeric ones are known),
// and tags must nest and be closed. The error reads like Telegram's "can't
// parse entities" descriptions.
func ParseHTML(text string) (string, error) {
	var plain strings.Builder
	var open []string
	for i := 0; i < len(text); {
		switch c := text[i]; c {
		case '<':
			end := strings.IndexByte(text[i:], '>')
			if end < 0 {
				return "", fmt.Errorf("unclosed start tag at byte offset %d", i)
			}
			tag := text[i+1 : i+end]
			closing := strings.HasPrefix(tag, "/")
			name, _, _ := strings.Cut(strings.TrimPrefix(tag, "/"), " ")
			switch {
			case !htmlTags[name]:
				return "", fmt.Errorf("unsupported start tag %q at byte offset %d", name, i)
			case closing && (len(open) == 0 || open[len(open)-1] != name):
				return "", fmt.Errorf("unmatched end tag at byte offset %d, expected \"</%s>\", found \"</%s>\"", i, last(open), name)
			case closing:
				open = open[:len(open)-1]
			default:
				open = append(open, name)
			}
			i += end + 1
		case '>':
			return "", fmt.Errorf("character '>' is reserved and must be escaped, at byte offset %d", i)
		case '&':
			end := strings.IndexByte(text[i:], ';')
			ent := ""
			if end > 0 {
				ent = text[i+1 : i+end]
			}
			repl, ok := map[string]string{"lt": "<", "gt": ">", "amp": "&", "quot": `"`}[ent]
			if !ok && strings.HasPrefix(ent, "#") && len(ent) > 1 {
				ok, repl = true, "?"
			}
			if !ok {
				return "", fmt.Errorf("unsupported or unterminated entity at byte offset %d", i)
			}
			plain.WriteString(repl)
			i += end + 1
		default:
			plain.WriteByte(c)
			i++
		}
	}
	if len(open) > 0 {
		return "", fmt.Errorf("can't find end tag corresponding to start tag %q", last(open))
	}
	return plain.String(), nil
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}
