package auth

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Headers of a webhook request: the Unix time it was signed at, and the
// signature "sha256=" + hex(HMAC-SHA256(secret, timestamp + "." + body)).
// A gateway recomputes the signature over the raw body and refuses a
// timestamp older than a few minutes, so a captured request cannot be
// replayed later.
const (
	WebhookTimestampHeader = "X-Seckill-Timestamp"
	WebhookSignatureHeader = "X-Seckill-Signature"
)

// WebhookMessage is the JSON body a WebhookSender posts.
type WebhookMessage struct {
	Phone string `json:"phone"`
	Code  string `json:"code"`
	Text  string `json:"text"` // the SMS text, ready to send
}

// WebhookConfig sets up a WebhookSender.
type WebhookConfig struct {
	URL     string        // where codes are posted (https in production)
	Secret  []byte        // shared with the gateway; never logged
	Timeout time.Duration // per attempt; default 5s
	Retries int           // further attempts after a 5xx or a network error; default 2
	Backoff time.Duration // wait before the first retry, doubled after each; default 200ms
	Client  *http.Client  // default: a client with no timeout of its own (Timeout bounds each attempt)
	Now     func() time.Time
}

// WebhookSender posts each login code as JSON to an SMS gateway or relay,
// signed with HMAC-SHA256 over the timestamp and the body. A 2xx answer
// means sent; a 5xx or a network error is retried a bounded number of
// times; any other answer fails at once. An error never holds the secret,
// the code or the URL's query, so it can be logged.
type WebhookSender struct {
	cfg  WebhookConfig
	host string
}

// NewWebhookSender checks the URL and the secret and returns the sender.
func NewWebhookSender(cfg WebhookConfig) (*WebhookSender, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("sms webhook url must be an absolute http or https url")
	}
	if len(cfg.Secret) < 16 {
		return nil, errors.New("sms webhook secret must be at least 16 bytes")
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, 5*time.Second)
	if cfg.Retries < 0 {
		cfg.Retries = 0
	} else if cfg.Retries == 0 {
		cfg.Retries = 2
	}
	cfg.Backoff = cmp.Or(cfg.Backoff, 200*time.Millisecond)
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &WebhookSender{cfg: cfg, host: u.Host}, nil
}

// Sign returns the signature header value of body signed at ts (Unix
// seconds): what the sender sends and what a gateway checks.
func Sign(secret []byte, ts string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// errPermanent marks an answer that another attempt would not change.
var errPermanent = errors.New("refused")

// Send posts the code, retrying 5xx answers and network errors.
func (s *WebhookSender) Send(ctx context.Context, phone, code string) error {
	body, err := json.Marshal(WebhookMessage{Phone: phone, Code: code, Text: "your seckill login code is " + code})
	if err != nil {
		return fmt.Errorf("sms webhook: %w", err)
	}
	wait := s.cfg.Backoff
	for attempt := 0; ; attempt++ {
		err = s.post(ctx, body)
		if err == nil || errors.Is(err, errPermanent) || attempt >= s.cfg.Retries || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("sms webhook %s: %w (then %w)", s.host, err, ctx.Err())
		case <-t.C:
		}
		wait *= 2
	}
	if err != nil {
		return fmt.Errorf("sms webhook %s: %w", s.host, err)
	}
	return nil
}

// post makes one attempt.
func (s *WebhookSender) post(ctx context.Context, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", errPermanent, err)
	}
	ts := strconv.FormatInt(s.cfg.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(WebhookTimestampHeader, ts)
	req.Header.Set(WebhookSignatureHeader, Sign(s.cfg.Secret, ts, body))
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		// *url.Error names the URL, query and all: keep only what failed.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("post: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode >= 500:
		return fmt.Errorf("answered %s", resp.Status)
	default:
		return fmt.Errorf("%w: answered %s", errPermanent, resp.Status)
	}
}
