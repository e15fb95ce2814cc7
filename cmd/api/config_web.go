package main

// webConfig holds the settings of the browser-facing features: login,
// the web page and rate limits.
type webConfig struct{}

func loadWebConfig(getenv func(string) string) (webConfig, []string) {
	return webConfig{}, nil
}
