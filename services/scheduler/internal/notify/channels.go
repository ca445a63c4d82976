package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/go-resty/resty/v2"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
)

// newClient returns a resty client that never logs requests (URLs hold
// secrets) and does not retry by itself (the dispatcher does).
func newClient(timeout time.Duration) *resty.Client {
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	c := resty.New().SetTimeout(timeout).SetRetryCount(0).SetDebug(false).
		SetRedirectPolicy(resty.NoRedirectPolicy())
	c.SetLogger(quietLogger{})
	return c
}

type quietLogger struct{}

func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Warnf(string, ...any)  {}
func (quietLogger) Debugf(string, ...any) {}

// retryAfter reads a Retry-After header in seconds (default 1s).
func retryAfter(h string) time.Duration {
	if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	return time.Second
}

// errBlank: a secret holds whitespace or control characters, which no URL
// or token does (a line end kept from the file it was read from, most
// often).
var errBlank = errors.New("holds whitespace or control characters (a line end or a space copied with it?)")

func hasBlank(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) })
}

// checkPlain refuses an empty secret and one holding blanks (the checks
// every notification secret shares). The error never quotes the value.
func checkPlain(s string) error {
	switch {
	case s == "":
		return errors.New("is empty")
	case hasBlank(s):
		return errBlank
	}
	return nil
}

// CheckSlackURL reports whether the secret is usable as a Slack incoming
// webhook URL: an absolute http or https URL with a host, without
// whitespace or control characters. The error never quotes the value.
func CheckSlackURL(v secrets.Value) error {
	s := v.Reveal()
	if err := checkPlain(s); err != nil {
		return err
	}
	u, err := url.Parse(s)
	switch {
	case err != nil: // url.Error quotes the URL: not wrapped
		return errors.New("is not a URL")
	case u.Scheme != "https" && u.Scheme != "http":
		return errors.New("is not an absolute http(s) URL")
	case u.Host == "":
		return errors.New("is a URL without a host")
	}
	return nil
}

// telegramTokenRE is the shape of a Bot API token: the bot's id, a colon,
// the secret part.
var telegramTokenRE = regexp.MustCompile(`^[0-9]+:[A-Za-z0-9_-]+$`)

// CheckTelegramToken reports whether the secret looks like a Telegram bot
// token ("123456:ABC-..."). The error never quotes the value.
func CheckTelegramToken(v secrets.Value) error {
	s := v.Reveal()
	if err := checkPlain(s); err != nil {
		return err
	}
	if !telegramTokenRE.MatchString(s) {
		return errors.New("does not look like a bot token (<bot id>:<secret>, as @BotFather gives it)")
	}
	return nil
}

// Slack posts to a Slack incoming webhook: POST of {"text": ...} as JSON;
// Slack answers 200 "ok", or an error code as text (invalid_payload,
// channel_not_found, ...), or 429 with Retry-After.
type Slack struct {
	url    secrets.Value
	red    *secrets.Redactor
	client *resty.Client
}

// NewSlack returns a Slack channel posting to the webhook URL (a secret).
func NewSlack(webhookURL secrets.Value, red *secrets.Redactor, timeout time.Duration) *Slack {
	red.AddValue(webhookURL)
	return &Slack{url: webhookURL, red: red, client: newClient(timeout)}
}

// Name is "slack".
func (s *Slack) Name() string { return "slack" }

// Markup: incoming webhooks read text as mrkdwn.
func (s *Slack) Markup() Markup { return SlackMrkdwn }

// Limit: Slack allows about one message per second per incoming webhook,
// with short bursts.
func (s *Slack) Limit() (time.Duration, int) { return time.Second, 1 }

// MaxLen: Slack truncates text past 40,000 characters and advises at most
// 4,000.
func (s *Slack) MaxLen() int { return 4000 }

// Send posts text.
func (s *Slack) Send(ctx context.Context, text string) error {
	body, _ := json.Marshal(map[string]string{"text": text})
	resp, err := s.client.R().SetContext(ctx).SetHeader("Content-Type", "application/json").SetBody(body).Post(s.url.Reveal())
	if err != nil {
		return fmt.Errorf("slack: %s", s.red.RedactString(err.Error()))
	}
	answer := strings.TrimSpace(string(resp.Body()))
	switch {
	case resp.StatusCode() == http.StatusTooManyRequests:
		return &RetryAfterError{After: retryAfter(resp.Header().Get("Retry-After")), Err: fmt.Errorf("slack: 429 %s", answer)}
	case resp.StatusCode() != http.StatusOK:
		return fmt.Errorf("slack: status %d: %s", resp.StatusCode(), s.red.RedactString(truncate(answer, 200)))
	}
	return nil
}

// Telegram sends with the Bot API's sendMessage: POST
// <api>/bot<token>/sendMessage with {"chat_id", "text", "parse_mode":
// "HTML"} as JSON; the answer
// is {"ok": true, ...} or {"ok": false, "error_code", "description",
// "parameters": {"retry_after"}}.
type Telegram struct {
	api    string
	token  secrets.Value
	chat   string
	red    *secrets.Redactor
	client *resty.Client
}

// DefaultTelegramAPI is the Bot API's base URL.
const DefaultTelegramAPI = "https://api.telegram.org"

// NewTelegram returns a Telegram channel for chat (an id or @channel).
func NewTelegram(api string, token secrets.Value, chat string, red *secrets.Redactor, timeout time.Duration) *Telegram {
	if api == "" {
		api = DefaultTelegramAPI
	}
	red.AddValue(token)
	return &Telegram{api: strings.TrimRight(api, "/"), token: token, chat: chat, red: red, client: newClient(timeout)}
}

// Name is "telegram:<chat>".
func (t *Telegram) Name() string { return "telegram:" + t.chat }

// Limit: Telegram allows about one message per second in one chat (and 20
// a minute in a group).
func (t *Telegram) Limit() (time.Duration, int) {
	if strings.HasPrefix(t.chat, "-") || strings.HasPrefix(t.chat, "@") { // groups and channels
		return 3 * time.Second, 1
	}
	return time.Second, 1
}

// Markup: messages are sent with parse_mode HTML.
func (t *Telegram) Markup() Markup { return TelegramHTML }

// MaxLen: sendMessage takes 1-4096 characters.
func (t *Telegram) MaxLen() int { return 4096 }

// Send posts text.
func (t *Telegram) Send(ctx context.Context, text string) error {
	body, _ := json.Marshal(map[string]any{"chat_id": t.chat, "text": text, "parse_mode": "HTML",
		"disable_web_page_preview": true})
	resp, err := t.client.R().SetContext(ctx).SetHeader("Content-Type", "application/json").SetBody(body).
		Post(t.api + "/bot" + t.token.Reveal() + "/sendMessage")
	if err != nil {
		return fmt.Errorf("telegram: %s", t.red.RedactString(err.Error()))
	}
	var answer struct {
		OK          bool   `json:"ok"`
		ErrorCode   int    `json:"error_code"`
		Description string `json:"description"`
		Parameters  struct {
			RetryAfter int `json:"retry_after"`
		} `json:"parameters"`
	}
	if err := json.Unmarshal(resp.Body(), &answer); err != nil {
		return fmt.Errorf("telegram: status %d, unreadable answer", resp.StatusCode())
	}
	switch {
	case answer.OK:
		return nil
	case answer.ErrorCode == http.StatusTooManyRequests || resp.StatusCode() == http.StatusTooManyRequests:
		after := time.Duration(max(answer.Parameters.RetryAfter, 1)) * time.Second
		return &RetryAfterError{After: after, Err: fmt.Errorf("telegram: %s", answer.Description)}
	}
	return fmt.Errorf("telegram: error %d: %s", answer.ErrorCode, t.red.RedactString(answer.Description))
}
