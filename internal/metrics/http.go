package metrics

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"seckill/internal/apierr"
)

type httpKey struct {
	route, method string
	status        int
}

type httpSeries struct {
	requests prometheus.Counter
	took     prometheus.Observer
}

// Gin measures every request of the engine it is added to: a count by route
// template, method and status, and latency by route template and method.
// A request that matched no route counts as route "unmatched", and an
// unusual method as "other": no client can make new series.
func (m *Metrics) Gin() gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		s := m.httpSeriesOf(c.FullPath(), c.Request.Method, c.Writer.Status())
		s.requests.Inc()
		s.took.Observe(time.Since(start).Seconds())
	}
}

// httpSeriesOf returns the series of a request, made on first use; later
// uses only read a map.
func (m *Metrics) httpSeriesOf(route, method string, status int) httpSeries {
	if route == "" {
		route = "unmatched"
	}
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
	default:
		method = "other"
	}
	if status < 100 || status > 599 {
		status = 0
	}
	k := httpKey{route, method, status}
	m.httpMu.RLock()
	s, ok := m.httpSeries[k]
	m.httpMu.RUnlock()
	if ok {
		return s
	}
	code := "other"
	if status != 0 {
		code = statusText[status]
	}
	s = httpSeries{requests: m.httpRequests.WithLabelValues(route, method, code), took: m.httpTook.WithLabelValues(route, method)}
	m.httpMu.Lock()
	m.httpSeries[k] = s
	m.httpMu.Unlock()
	return s
}

// Handler serves the registry in Prometheus's text format. Metrics are for
// a Prometheus that scrapes each instance directly: a request that came
// through a proxy (it carries X-Forwarded-For or X-Real-IP, which nginx
// always sets) gets 404, so the public never sees them even when the proxy
// forwards every path.
func (m *Metrics) Handler() gin.HandlerFunc {
	h := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Registry:            m.reg, // counts its own errors there
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
	return func(c *gin.Context) {
		if c.GetHeader("X-Forwarded-For") != "" || c.GetHeader("X-Real-IP") != "" {
			apierr.Abort(c, http.StatusNotFound, "not_found", "no such route")
			return
		}
		h.ServeHTTP(c.Writer, c.Request)
	}
}
