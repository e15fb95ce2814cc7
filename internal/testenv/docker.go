package testenv

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// dockerAnswers reports whether a Docker engine is reachable. testcontainers
// panics in some setups without one, hence the recover.
func dockerAnswers() (ok bool) {
	defer func() { _ = recover() }() // ok stays false
	p, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return p.Health(ctx) == nil
}

// runContainer starts image, waits with w and returns the host:port of port.
// Main terminates it; the testcontainers reaper does if Main never runs.
func runContainer(image, port string, env map[string]string, w wait.Strategy) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := testcontainers.Run(ctx, image,
		testcontainers.WithExposedPorts(port),
		testcontainers.WithEnv(env),
		testcontainers.WithWaitStrategy(w))
	if c != nil {
		atStop(func() { _ = testcontainers.TerminateContainer(c) })
	}
	if err != nil {
		return "", fmt.Errorf("run %s: %w", image, err)
	}
	return c.PortEndpoint(ctx, port, "")
}
