package payment

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"seckill/internal/auth"
)

// Provider takes payments: it starts one at the gateway for a payment
// row already written (status created).
type Provider interface {
	// Name is what the payments.provider column records.
	Name() string
	// Start starts the payment: a gateway answers where the buyer pays
	// (PayURL); a provider that takes the money at once says Succeeded.
	// Starting a payment again (the same reference) is safe.
	Start(ctx context.Context, p Payment) (Checkout, error)
}

// Checkout is what a provider answers when a payment starts.
type Checkout struct {
	// PayURL is the gateway's page where the buyer pays.
	PayURL string
	// Succeeded: the money came already; the payment is settled at once,
	// as a notification would settle it.
	Succeeded bool
}

// newReference names a new payment for its provider: random, so a
// gateway's notification cannot name a payment it was not told of.
func newReference() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("payment reference: %w", err)
	}
	return "pay_" + hex.EncodeToString(b), nil
}

// dev succeeds at once: the embedded default, for trying the shop out.
type dev struct{}

func (dev) Name() string { return ProviderDev }

func (dev) Start(context.Context, Payment) (Checkout, error) { return Checkout{Succeeded: true}, nil }

// webhook creates payments at a gateway shaped like real ones: a signed
// JSON request answered with the page where the buyer pays; the gateway
// then notifies the service (Notify).
type webhook struct {
	url, notifyURL string
	host           string
	secret         []byte
	timeout        time.Duration
	client         *http.Client
	now            func() time.Time
}

func newWebhook(cfg Config) *webhook {
	u, _ := url.Parse(cfg.GatewayURL) // checked by withDefaults
	return &webhook{url: cfg.GatewayURL, notifyURL: cfg.NotifyURL, host: u.Host, secret: cfg.Secret, timeout: cfg.Timeout, client: cfg.Client, now: cfg.Now}
}

func (w *webhook) Name() string { return ProviderWebhook }

// GatewayRequest is the JSON body posted to the gateway to create a
// payment, signed like auth.Sign (headers auth.WebhookTimestampHeader and
// auth.WebhookSignatureHeader).
type GatewayRequest struct {
	Reference string `json:"reference"`
	OrderID   int64  `json:"order_id,string"`
	Amount    int64  `json:"amount"`
	NotifyURL string `json:"notify_url,omitempty"`
}

// GatewayAnswer is the gateway's 2xx answer.
type GatewayAnswer struct {
	PayURL string `json:"pay_url"`
}

// errGateway marks a gateway that did not take the payment.
var errGateway = errors.New("payment gateway did not take the payment")

// Start posts the payment to the gateway once; the buyer may press Pay
// again, which starts the same payment (the same reference) again. An
// error never holds the secret or the URL's query.
func (w *webhook) Start(ctx context.Context, p Payment) (Checkout, error) {
	body, err := json.Marshal(GatewayRequest{Reference: p.Reference, OrderID: p.OrderID, Amount: p.Amount, NotifyURL: w.notifyURL})
	if err != nil {
		return Checkout{}, fmt.Errorf("gateway %s: %w", w.host, err)
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return Checkout{}, fmt.Errorf("gateway %s: %w: %v", w.host, errGateway, err)
	}
	ts := strconv.FormatInt(w.now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(auth.WebhookTimestampHeader, ts)
	req.Header.Set(auth.WebhookSignatureHeader, auth.Sign(w.secret, ts, body))
	resp, err := w.client.Do(req)
	if err != nil {
		var uerr *url.Error // names the URL, query and all: keep only what failed
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return Checkout{}, fmt.Errorf("gateway %s: %w: %v", w.host, errGateway, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Checkout{}, fmt.Errorf("gateway %s: %w: read answer: %v", w.host, errGateway, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return Checkout{}, fmt.Errorf("gateway %s: %w: answered %s", w.host, errGateway, resp.Status)
	}
	var a GatewayAnswer
	if err := json.Unmarshal(raw, &a); err != nil || !webURL(a.PayURL) {
		return Checkout{}, fmt.Errorf("gateway %s: %w: no http(s) pay_url in its answer", w.host, errGateway)
	}
	return Checkout{PayURL: a.PayURL}, nil
}
