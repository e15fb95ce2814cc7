package deploy

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
)

const (
	alertsPath     = "prometheus/alerts.yml"
	alertTestsPath = "prometheus/alerts_test.yml"
)

// promtool returns the path of promtool, or skips the test (fails it under
// CI=true, where scripts/deps.sh installs it).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("promtool not found (apt-get install prometheus; scripts/deps.sh does it)")
	}
	t.Skip("promtool not found: apt-get install prometheus")
	return ""
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAlertRulesPromtool: the rules and the compose Prometheus's
// configuration (which loads them) pass Prometheus's own checker, and the
// unit tests in alerts_test.yml (each rule firing on the series that should
// page it, none firing on a healthy sale) pass.
func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", alertsPath},
		{"check", "config", "prometheus/prometheus.yml"},
		{"test", "rules", alertTestsPath},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// TestAlertRules: every alert uses only metrics and labels the service
// exports, says how bad it is and what it means, has a promtool test that
// sees it fire, and has a runbook row in docs/operating.md.
func TestAlertRules(t *testing.T) {
	series := exported(t)
	tests, err := os.ReadFile(alertTestsPath)
	if err != nil {
		t.Fatal(err)
	}
	runbooks, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s has a rule that is not an alert: %q", g.Name, r.Expr)
				continue
			}
			alerts = append(alerts, r.Alert)
			checkExported(t, series, "alert "+r.Alert, r.Expr)
			if s := r.Labels["severity"]; s != "page" && s != "ticket" {
				t.Errorf("%s: severity %q, want page or ticket", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s needs a summary and a description", r.Alert)
			}
			// A test that expects it to fire: its name followed, in the
			// same alert_rule_test entry, by a non-empty exp_alerts.
			fires := regexp.MustCompile(`alertname: ` + r.Alert + `\s*\n\s*exp_alerts:\s*\n\s*- exp_labels`)
			if !fires.Match(tests) {
				t.Errorf("%s: no test in %s expects it to fire", r.Alert, alertTestsPath)
			}
			quiet := regexp.MustCompile(`alertname: ` + r.Alert + `, exp_alerts: \[\]`)
			if !quiet.Match(tests) {
				t.Errorf("%s: no test in %s expects it quiet on a healthy sale", r.Alert, alertTestsPath)
			}
			runbook := regexp.MustCompile("(?m)^\\| `" + r.Alert + "` \\|")
			if !runbook.Match(runbooks) {
				t.Errorf("%s has no runbook row in docs/operating.md (| `%s` | ... |)", r.Alert, r.Alert)
			}
		}
	}
	if len(alerts) == 0 {
		t.Fatal("no alerts in " + alertsPath)
	}
	for _, want := range []string{"SeckillOrderBacklogGrowing", "SeckillDeadLetters", "SeckillShardNotReady",
		"SeckillRedisErrors", "SeckillMySQLErrors", "SeckillInstanceDown", "SeckillPurchaseSlow", "SeckillDelayQueueOverdue",
		"SeckillShardRebuilt", "SeckillShardRebuildFlapping", "SeckillPurchasesNotReplicated",
		"SeckillPaymentsNeedRefund", "SeckillUnpaidUnitsLate", "SeckillPaymentNotificationsRefused"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s", want)
		}
	}
}
