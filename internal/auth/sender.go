package auth

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Sender delivers a login code to a phone. A real SMS gateway implements
// it; the two shipped here are for development and tests.
type Sender interface {
	Send(ctx context.Context, phone, code string) error
}

// ConsoleSender is the development SMS gateway: it writes each code as a
// plain line to W (the process's stdout), outside the structured log, the
// way run prints the first admin token. No log record ever holds a code;
// use it only where stdout is not collected as logs.
type ConsoleSender struct {
	mu sync.Mutex
	W  io.Writer
}

// Send writes "dev sms to PHONE: your seckill login code is CODE".
func (s *ConsoleSender) Send(_ context.Context, phone, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := fmt.Fprintf(s.W, "dev sms to %s: your seckill login code is %s\n", phone, code)
	return err
}

// OutboxSender appends each code as a line to a file (mode 0600), the
// outbox that tests and local tools read. The line is the one ConsoleSender
// writes, prefixed with the time.
type OutboxSender struct {
	mu   sync.Mutex
	Path string
}

// Send appends the code to the outbox.
func (s *OutboxSender) Send(_ context.Context, phone, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := os.OpenFile(s.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open login outbox: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s dev sms to %s: your seckill login code is %s\n", time.Now().UTC().Format(time.RFC3339), phone, code)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write login outbox: %w", err)
	}
	return nil
}

// MaskPhone keeps a phone number out of logs in full: "+86*******8000".
func MaskPhone(phone string) string {
	if len(phone) <= 7 {
		return "***"
	}
	return phone[:3] + "*******" + phone[len(phone)-4:]
}
