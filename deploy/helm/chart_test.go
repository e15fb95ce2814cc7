// Package helm holds the tests of the Helm chart in deploy/helm/seckill.
// It is a Go module of its own (Helm pulls in the Kubernetes modules), so
// the service's module and build stay light.
package helm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
	kubefake "helm.sh/helm/v4/pkg/kube/fake"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	chartDir = "seckill"
	// repoRoot is the repository, from deploy/helm.
	repoRoot = "../.."
	// clusterValues is the example values file for a Redis Cluster.
	clusterValues = "redis-cluster.values.yaml"
	// testSecrets are stand-in credentials (the chart requires them).
	testSecrets = "testdata/secrets.yaml"
)

// secretSettings hold credentials (secret rows of cmd/api's settings table,
// and the URLs and DSN that carry passwords): the chart puts them in the
// Secret, never the ConfigMap.
var secretSettings = []string{
	"SECKILL_TOKEN_SECRET", "SECKILL_MYSQL_DSN", "SECKILL_REDIS_URL",
	"SECKILL_LOCK_NODES", "SECKILL_PAY_WEBHOOK_SECRET", "SECKILL_LOGIN_WEBHOOK_SECRET",
}

// TestLint runs helm lint, strict (warnings fail), with the chart's
// defaults and with the Redis Cluster values.
func TestLint(t *testing.T) {
	t.Parallel()
	for _, files := range [][]string{{testSecrets}, {clusterValues, "testdata/cluster-secrets.yaml"}, nil} {
		vals := mergeValues(t, files...)
		lint := action.NewLint()
		lint.Strict = true
		lint.Namespace = "sale"
		res := lint.Run([]string{chartDir}, vals)
		for _, m := range res.Messages {
			t.Logf("lint %v: %s", files, m)
		}
		if len(res.Errors) > 0 {
			t.Errorf("helm lint %v: %v", files, res.Errors)
		}
		if res.TotalChartsLinted != 1 {
			t.Errorf("helm lint %v linted %d charts", files, res.TotalChartsLinted)
		}
	}
}

// TestChart renders the chart (helm template) with each set of values,
// decodes every object strictly into its Kubernetes type, and checks the
// objects against one another and against the binary's settings table.
func TestChart(t *testing.T) {
	t.Parallel()
	table := settingsTable(t)
	for _, tc := range []struct {
		name   string
		files  []string
		set    map[string]any
		secret bool // the chart makes the Secret
	}{
		{"defaults", []string{testSecrets}, nil, true},
		{"existing secret", nil, map[string]any{"existingSecret": "seckill-credentials"}, false},
		{"redis cluster", []string{clusterValues, "testdata/cluster-secrets.yaml"}, nil, true},
		{"no nginx", []string{testSecrets}, map[string]any{"nginx": map[string]any{"enabled": false},
			"networkPolicy": map[string]any{"apiFrom": []any{map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app": "gateway"}}}}}}, true},
		{"no network policies", []string{testSecrets}, map[string]any{"networkPolicy": map[string]any{"enabled": false}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := mergeValues(t, tc.files...)
			for k, v := range tc.set {
				vals[k] = v
			}
			objs := render(t, vals)
			checkObjects(t, objs)
			checkSettings(t, objs, table, tc.secret)
			checkPods(t, objs, table)
			if !tc.secret && len(objs.secrets) > 0 {
				t.Errorf("existingSecret set, yet the chart made a Secret")
			}
		})
	}
}

// TestRefused: values the chart must refuse, each with its reason.
func TestRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		files []string
		set   map[string]any
		want  string
	}{
		{"no secrets", nil, nil, "secrets.SECKILL_TOKEN_SECRET"},
		{"credentials in settings", []string{testSecrets},
			map[string]any{"settings": map[string]any{"SECKILL_MYSQL_DSN": "u:p@tcp(db)/seckill"}}, "holds credentials"},
		{"role in settings", []string{testSecrets},
			map[string]any{"settings": map[string]any{"SECKILL_ROLE": "all"}}, "set by the chart"},
		{"a setting in secrets", []string{testSecrets},
			map[string]any{"secrets": map[string]any{"SECKILL_SHARDS": "3"}}, "put it in settings"},
		{"nginx configuration for an address", []string{testSecrets},
			map[string]any{"podNetwork": []any{"10.0.0.0/8; allow all"}}, "addresses or CIDRs"},
		{"no nginx and nothing admitted to the API", []string{testSecrets},
			map[string]any{"nginx": map[string]any{"enabled": false}}, "networkPolicy.apiFrom"},
		{"HSTS max-age not in seconds", []string{testSecrets},
			map[string]any{"nginx": map[string]any{"hstsMaxAge": "1y"}}, "takes seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := mergeValues(t, tc.files...)
			for k, v := range tc.set {
				if m, ok := vals[k].(map[string]any); ok {
					for kk, vv := range v.(map[string]any) {
						m[kk] = vv
					}
					continue
				}
				vals[k] = v
			}
			_, err := renderManifest(t, vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("rendered with %v: err %v, want one saying %q", tc.set, err, tc.want)
			}
		})
	}
}

// TestNginxTemplate: the chart's nginx template is the repository's, and
// the nginx pod sets exactly the names the template's header lists.
func TestNginxTemplate(t *testing.T) {
	t.Parallel()
	repo, err := os.ReadFile(filepath.Join(repoRoot, "nginx", "seckill.conf.template"))
	if err != nil {
		t.Fatal(err)
	}
	copied, err := os.ReadFile(filepath.Join(chartDir, "files", "seckill.conf.template"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(repo, copied) {
		t.Fatalf("deploy/helm/seckill/files/seckill.conf.template differs from nginx/seckill.conf.template: cp nginx/seckill.conf.template deploy/helm/seckill/files/")
	}
	var want []string
	for _, m := range regexp.MustCompile(`\$\{(SECKILL_[A-Z_]+)\}`).FindAllStringSubmatch(string(repo), -1) {
		if !slices.Contains(want, m[1]) {
			want = append(want, m[1])
		}
	}
	objs := render(t, mergeValues(t, testSecrets))
	d := objs.deployment(t, "nginx")
	var got []string
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		got = append(got, e.Name)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("nginx env %v, the template fills in %v", got, want)
	}
}

// TestValuesDefaults: a setting in the chart's values (and the Redis
// Cluster example) is either the binary's default with a database server,
// or says why not in a "# why:" comment above it.
func TestValuesDefaults(t *testing.T) {
	t.Parallel()
	table := settingsTable(t)
	for _, file := range []string{filepath.Join(chartDir, "values.yaml"), clusterValues} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		root := doc.Content[0]
		var settings *yaml.Node
		for i := 0; i+1 < len(root.Content); i += 2 {
			if root.Content[i].Value == "settings" {
				settings = root.Content[i+1]
			}
		}
		if settings == nil {
			t.Fatalf("%s has no settings", file)
		}
		for i := 0; i+1 < len(settings.Content); i += 2 {
			k, v := settings.Content[i], settings.Content[i+1]
			s, ok := table[k.Value]
			if !ok {
				t.Errorf("%s: %s is not a setting of the binary (api serve --help)", file, k.Value)
				continue
			}
			why := strings.Contains(k.HeadComment, "why:")
			switch def := s.server(); {
			case v.Value != def && !why:
				t.Errorf("%s: %s: %q, the binary's default is %q: say why in a \"# why:\" comment above it, or leave it out", file, k.Value, v.Value, def)
			case v.Value == def && why:
				t.Errorf("%s: %s: %q is the binary's default, yet a \"# why:\" comment explains a difference", file, k.Value, v.Value)
			}
		}
	}
}

// setting is one row of "api serve --help".
type setting struct {
	name string
	def  string // the embedded mode's default; "" for none
	// withDSN is the default with SECKILL_MYSQL_DSN, when it differs.
	withDSN string
	doc     string
}

// server is the default with a database server, as the chart runs.
func (s setting) server() string { return cmp(s.withDSN, s.def) }

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var (
	helpRow = regexp.MustCompile(`^(SECKILL_[A-Z0-9_]+)\s{2,}(.*?)\s{2,}(.*)$`)
	twoDefs = regexp.MustCompile(`^(\S+) embedded, (\S+) with SECKILL_MYSQL_DSN$`)
)

// settingsTable runs "api serve --help" and reads its table.
func settingsTable(t *testing.T) map[string]setting {
	t.Helper()
	out, err := exec.Command(apiBinary(t), "serve", "--help").Output()
	if err != nil {
		t.Fatalf("api serve --help: %v", err)
	}
	table := map[string]setting{}
	for line := range strings.Lines(string(out)) {
		m := helpRow.FindStringSubmatch(strings.TrimRight(line, "\n"))
		if m == nil {
			continue
		}
		s := setting{name: m[1], def: m[2], doc: m[3]}
		if d := twoDefs.FindStringSubmatch(s.def); d != nil {
			s.def, s.withDSN = d[1], d[2]
		} else if strings.HasPrefix(s.def, "(") {
			s.def = "" // (none), (embedded), (data dir)
		}
		table[s.name] = s
	}
	if len(table) < 40 || table["SECKILL_ADDR"].withDSN == "" {
		t.Fatalf("read %d settings from api serve --help (SECKILL_ADDR %+v): has its format changed?", len(table), table["SECKILL_ADDR"])
	}
	return table
}

// build is cmd/api, built once for the whole run; TestMain removes it.
var build struct {
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	// Helm logs lint mode's missing required values here; the tests log
	// what they need.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	code := m.Run()
	if build.path != "" {
		_ = os.RemoveAll(filepath.Dir(build.path))
	}
	os.Exit(code)
}

// apiBinary builds cmd/api once per test run.
func apiBinary(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "seckill-helm-test")
		if err != nil {
			build.err = err
			return
		}
		build.path = filepath.Join(dir, "api")
		cmd := exec.Command("go", "build", "-o", build.path, "./cmd/api")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/api: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}

// mergeValues reads values files as helm -f does.
func mergeValues(t *testing.T, files ...string) map[string]any {
	t.Helper()
	opts := values.Options{ValueFiles: files}
	vals, err := opts.MergeValues(getter.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

// renderManifest is helm template: an install, dry run on the client.
func renderManifest(t *testing.T, vals map[string]any) (string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &action.Configuration{
		Releases:   storage.Init(driver.NewMemory()),
		KubeClient: &kubefake.PrintingKubeClient{Out: io.Discard},
	}
	install := action.NewInstall(cfg)
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = "shop"
	install.Namespace = "sale"
	install.Replace = true
	rel, err := install.RunWithContext(context.Background(), ch, vals)
	if err != nil {
		return "", err
	}
	r, ok := rel.(*releasev1.Release)
	if !ok {
		t.Fatalf("release is a %T", rel)
	}
	if len(r.Hooks) > 0 {
		t.Errorf("the chart has hooks (%d): none are expected", len(r.Hooks))
	}
	return r.Manifest, nil
}

// objects are the rendered objects by kind, each decoded strictly.
type objects struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	configMaps  []*corev1.ConfigMap
	secrets     []*corev1.Secret
	pdbs        []*policyv1.PodDisruptionBudget
	policies    []*networkingv1.NetworkPolicy
}

// deployment is the Deployment of one component (api, worker, nginx).
func (o objects) deployment(t *testing.T, component string) *appsv1.Deployment {
	t.Helper()
	for _, d := range o.deployments {
		if d.Spec.Template.Labels["app.kubernetes.io/component"] == component {
			return d
		}
	}
	t.Fatalf("no %s Deployment rendered", component)
	return nil
}

// render renders the chart and decodes every object into its Kubernetes
// type, refusing fields the type does not have (a misspelt field would be
// dropped by the API server, or refused) and kinds the test does not know.
func render(t *testing.T, vals map[string]any) objects {
	t.Helper()
	manifest, err := renderManifest(t, vals)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var o objects
	for name, doc := range releaseutil.SplitManifests(manifest) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := sigsyaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			d := &appsv1.Deployment{}
			o.deployments, obj = append(o.deployments, d), d
		case "v1 Service":
			s := &corev1.Service{}
			o.services, obj = append(o.services, s), s
		case "v1 ConfigMap":
			c := &corev1.ConfigMap{}
			o.configMaps, obj = append(o.configMaps, c), c
		case "v1 Secret":
			s := &corev1.Secret{}
			o.secrets, obj = append(o.secrets, s), s
		case "policy/v1 PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			o.pdbs, obj = append(o.pdbs, p), p
		case "networking.k8s.io/v1 NetworkPolicy":
			p := &networkingv1.NetworkPolicy{}
			o.policies, obj = append(o.policies, p), p
		default:
			t.Fatalf("%s: %s %s is not a kind the test knows", name, tm.APIVersion, tm.Kind)
		}
		if err := sigsyaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("%s: %s does not fit its schema: %v\n%s", name, tm.Kind, err, doc)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return o
}

// checkObjects checks what the types leave to the API server's validation:
// names, labels, required fields, and that selectors and references meet.
func checkObjects(t *testing.T, o objects) {
	t.Helper()
	meta := func(kind string, m metav1.ObjectMeta) {
		if m.Name == "" {
			t.Errorf("a %s has no name", kind)
		}
		check := validation.IsDNS1123Subdomain
		if kind == "Service" {
			check = validation.IsDNS1035Label
		}
		for _, e := range check(m.Name) {
			t.Errorf("%s %s: name: %s", kind, m.Name, e)
		}
		checkLabels(t, kind+" "+m.Name, m.Labels)
	}
	for _, c := range o.configMaps {
		meta("ConfigMap", c.ObjectMeta)
		for k := range c.Data {
			for _, e := range validation.IsConfigMapKey(k) {
				t.Errorf("ConfigMap %s: key %s: %s", c.Name, k, e)
			}
		}
	}
	for _, s := range o.secrets {
		meta("Secret", s.ObjectMeta)
		for k := range s.StringData {
			for _, e := range validation.IsConfigMapKey(k) {
				t.Errorf("Secret %s: key %s: %s", s.Name, k, e)
			}
		}
	}
	for _, d := range o.deployments {
		meta("Deployment", d.ObjectMeta)
		checkLabels(t, "pod template of "+d.Name, d.Spec.Template.Labels)
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil || d.Spec.Selector == nil || sel.Empty() {
			t.Errorf("Deployment %s: selector %v: %v", d.Name, d.Spec.Selector, err)
		} else if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("Deployment %s: selector %v does not match its pods' labels %v", d.Name, sel, d.Spec.Template.Labels)
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas < 1 {
			t.Errorf("Deployment %s: replicas %v", d.Name, d.Spec.Replicas)
		}
		checkPodSpec(t, d.Name, d.Spec.Template.Spec, o)
		// Each Deployment has one PodDisruptionBudget, for its pods only.
		var pdbs []string
		for _, p := range o.pdbs {
			ps, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			if err == nil && ps.Matches(labels.Set(d.Spec.Template.Labels)) {
				pdbs = append(pdbs, p.Name)
			}
		}
		if len(pdbs) != 1 {
			t.Errorf("Deployment %s: PodDisruptionBudgets %v, want one", d.Name, pdbs)
		}
	}
	for _, p := range o.pdbs {
		meta("PodDisruptionBudget", p.ObjectMeta)
		if (p.Spec.MinAvailable == nil) == (p.Spec.MaxUnavailable == nil) {
			t.Errorf("PodDisruptionBudget %s: set one of minAvailable and maxUnavailable", p.Name)
		}
		if _, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err != nil || p.Spec.Selector == nil {
			t.Errorf("PodDisruptionBudget %s: selector: %v", p.Name, err)
		}
	}
	for _, p := range o.policies {
		meta("NetworkPolicy", p.ObjectMeta)
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || sel.Empty() {
			t.Errorf("NetworkPolicy %s: podSelector %v: %v", p.Name, p.Spec.PodSelector, err)
			continue
		}
		var selected []*appsv1.Deployment
		for _, d := range o.deployments {
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				selected = append(selected, d)
			}
		}
		if len(selected) != 1 {
			t.Errorf("NetworkPolicy %s selects the pods of %d Deployments, want one", p.Name, len(selected))
			continue
		}
		for _, r := range p.Spec.Ingress {
			for _, port := range r.Ports {
				if port.Port == nil {
					t.Errorf("NetworkPolicy %s admits every port", p.Name)
				} else if _, ok := containerPort(selected[0].Spec.Template.Spec, port.Port.String()); !ok {
					t.Errorf("NetworkPolicy %s: port %s is no port of %s's pods", p.Name, port.Port.String(), selected[0].Name)
				}
			}
		}
	}
	for _, s := range o.services {
		meta("Service", s.ObjectMeta)
		if len(s.Spec.Selector) == 0 || len(s.Spec.Ports) == 0 {
			t.Errorf("Service %s: needs a selector and ports", s.Name)
		}
		var backs []*appsv1.Deployment
		for _, d := range o.deployments {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
				backs = append(backs, d)
			}
		}
		if len(backs) != 1 {
			t.Errorf("Service %s selects the pods of %d Deployments, want one", s.Name, len(backs))
			continue
		}
		for _, p := range s.Spec.Ports {
			if len(validation.IsValidPortNum(int(p.Port))) > 0 {
				t.Errorf("Service %s: port %d", s.Name, p.Port)
			}
			if _, ok := containerPort(backs[0].Spec.Template.Spec, p.TargetPort.String()); !ok {
				t.Errorf("Service %s: targetPort %s is no port of %s's pods", s.Name, p.TargetPort.String(), backs[0].Name)
			}
		}
		if backs[0].Spec.Template.Labels["app.kubernetes.io/component"] == "worker" {
			t.Errorf("Service %s selects worker pods: workers take no traffic", s.Name)
		}
	}
}

func checkLabels(t *testing.T, what string, l map[string]string) {
	t.Helper()
	for k, v := range l {
		for _, e := range validation.IsQualifiedName(k) {
			t.Errorf("%s: label %s: %s", what, k, e)
		}
		for _, e := range validation.IsValidLabelValue(v) {
			t.Errorf("%s: label %s=%s: %s", what, k, v, e)
		}
	}
}

// checkPodSpec checks a pod's containers: names, images, ports, that every
// probe's port is one of them, and that envFrom names a rendered
// ConfigMap, and a rendered Secret unless it is made outside the chart.
func checkPodSpec(t *testing.T, name string, spec corev1.PodSpec, o objects) {
	t.Helper()
	if len(spec.Containers) == 0 {
		t.Errorf("Deployment %s has no containers", name)
	}
	for _, c := range spec.Containers {
		if c.Name == "" || c.Image == "" {
			t.Errorf("Deployment %s: a container without a name or image", name)
		}
		for _, e := range validation.IsDNS1123Label(c.Name) {
			t.Errorf("Deployment %s: container %s: %s", name, c.Name, e)
		}
		for _, p := range c.Ports {
			for _, e := range validation.IsValidPortName(p.Name) {
				t.Errorf("Deployment %s: port %s: %s", name, p.Name, e)
			}
			for _, e := range validation.IsValidPortNum(int(p.ContainerPort)) {
				t.Errorf("Deployment %s: port %d: %s", name, p.ContainerPort, e)
			}
		}
		for kind, pr := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
			if pr == nil {
				continue
			}
			var port string
			switch {
			case pr.HTTPGet != nil:
				port = pr.HTTPGet.Port.String()
			case pr.TCPSocket != nil:
				port = pr.TCPSocket.Port.String()
			default:
				t.Errorf("Deployment %s: %s probe is neither httpGet nor tcpSocket", name, kind)
				continue
			}
			if _, ok := containerPort(spec, port); !ok {
				t.Errorf("Deployment %s: %s probe's port %s is no port of the container", name, kind, port)
			}
		}
		if c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("Deployment %s: container %s needs readiness and liveness probes", name, c.Name)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("Deployment %s: container %s needs CPU and memory requests and a memory limit", name, c.Name)
		}
		for _, ef := range c.EnvFrom {
			switch {
			case ef.ConfigMapRef != nil:
				if !slices.ContainsFunc(o.configMaps, func(m *corev1.ConfigMap) bool { return m.Name == ef.ConfigMapRef.Name }) {
					t.Errorf("Deployment %s: envFrom ConfigMap %s is not rendered", name, ef.ConfigMapRef.Name)
				}
			case ef.SecretRef != nil:
				if len(o.secrets) > 0 && !slices.ContainsFunc(o.secrets, func(s *corev1.Secret) bool { return s.Name == ef.SecretRef.Name }) {
					t.Errorf("Deployment %s: envFrom Secret %s is not rendered", name, ef.SecretRef.Name)
				}
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && !slices.ContainsFunc(o.configMaps, func(m *corev1.ConfigMap) bool { return m.Name == v.ConfigMap.Name }) {
			t.Errorf("Deployment %s: volume %s: ConfigMap %s is not rendered", name, v.Name, v.ConfigMap.Name)
		}
	}
}

// containerPort resolves a port by name or number among spec's containers.
func containerPort(spec corev1.PodSpec, port string) (int32, bool) {
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			if p.Name == port || strconv.Itoa(int(p.ContainerPort)) == port {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// checkSettings: every SECKILL_* the chart sets is a setting of the binary;
// credentials are in the Secret only; each role's pods say their role.
func checkSettings(t *testing.T, o objects, table map[string]setting, chartSecret bool) {
	t.Helper()
	if len(o.configMaps) == 0 {
		t.Fatal("no ConfigMap rendered")
	}
	known := func(where, name string) {
		if _, ok := table[name]; !ok {
			t.Errorf("%s sets %s, which is not a setting of the binary (api serve --help)", where, name)
		}
	}
	for _, c := range o.configMaps {
		for k := range c.Data {
			if !strings.HasPrefix(k, "SECKILL_") {
				continue
			}
			known("ConfigMap "+c.Name, k)
			if slices.Contains(secretSettings, k) {
				t.Errorf("ConfigMap %s holds %s, a credential: it belongs in the Secret", c.Name, k)
			}
		}
	}
	for _, s := range o.secrets {
		for k := range s.StringData {
			known("Secret "+s.Name, k)
		}
		for _, k := range []string{"SECKILL_TOKEN_SECRET", "SECKILL_MYSQL_DSN", "SECKILL_REDIS_URL"} {
			if s.StringData[k] == "" {
				t.Errorf("Secret %s has no %s", s.Name, k)
			}
		}
	}
	if chartSecret != (len(o.secrets) == 1) {
		t.Errorf("%d Secrets rendered", len(o.secrets))
	}
	for _, role := range []string{"api", "worker"} {
		c := o.deployment(t, role).Spec.Template.Spec.Containers[0]
		got := ""
		for _, e := range c.Env {
			known("the "+role+" container", e.Name)
			if e.Name == "SECKILL_ROLE" {
				got = e.Value
			}
		}
		if got != role {
			t.Errorf("the %s pods run with SECKILL_ROLE=%q", role, got)
		}
	}
}

// podEnv is the environment a role's container starts with: its ConfigMap
// and Secret (envFrom), then its env.
func podEnv(t *testing.T, o objects, c corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			for _, m := range o.configMaps {
				if m.Name == ef.ConfigMapRef.Name {
					for k, v := range m.Data {
						env[k] = v
					}
				}
			}
		case ef.SecretRef != nil:
			data := standIns(t) // a Secret made outside the chart
			for _, s := range o.secrets {
				if s.Name == ef.SecretRef.Name {
					data = s.StringData
				}
			}
			for k, v := range data {
				env[k] = v
			}
		}
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// standIns are the stand-in credentials of testdata/secrets.yaml.
func standIns(t *testing.T) map[string]string {
	t.Helper()
	var v struct{ Secrets map[string]string }
	b, err := os.ReadFile(testSecrets)
	if err == nil {
		err = sigsyaml.UnmarshalStrict(b, &v)
	}
	if err != nil {
		t.Fatal(err)
	}
	return v.Secrets
}

// checkPods checks the API and worker pods against the binary: the probes
// are /readyz and /healthz on SECKILL_ADDR's port, Prometheus scrapes that
// port, the grace period outlasts the drain, and the binary accepts the
// pods' settings.
func checkPods(t *testing.T, o objects, table map[string]setting) {
	t.Helper()
	for _, role := range []string{"api", "worker"} {
		d := o.deployment(t, role)
		spec := d.Spec.Template.Spec
		c := spec.Containers[0]
		env := podEnv(t, o, c)
		addr := cmp(env["SECKILL_ADDR"], table["SECKILL_ADDR"].server())
		_, portText, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("%s: SECKILL_ADDR %q: %v", role, addr, err)
			continue
		}
		port, _ := strconv.Atoi(portText)
		for _, p := range []struct {
			kind, path string
			probe      *corev1.Probe
		}{
			{"readiness", "/readyz", c.ReadinessProbe},
			{"liveness", "/healthz", c.LivenessProbe},
			{"startup", "/healthz", c.StartupProbe},
		} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s: no HTTP %s probe", role, p.kind)
				continue
			}
			got, _ := containerPort(spec, p.probe.HTTPGet.Port.String())
			if p.probe.HTTPGet.Path != p.path || int(got) != port {
				t.Errorf("%s: %s probe GET %s on port %d; the binary serves %s on SECKILL_ADDR's port %d",
					role, p.kind, p.probe.HTTPGet.Path, got, p.path, port)
			}
		}
		a := d.Spec.Template.Annotations
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != portText || a["prometheus.io/path"] != "/metrics" {
			t.Errorf("%s: Prometheus annotations %v: want /metrics on port %s", role, a, portText)
		}
		// The grace period outlasts the preStop pause plus the drain.
		shutdown, err := time.ParseDuration(cmp(env["SECKILL_SHUTDOWN_TIMEOUT"], table["SECKILL_SHUTDOWN_TIMEOUT"].server()))
		if err != nil {
			t.Fatal(err)
		}
		var pause time.Duration
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Exec != nil {
			cmd := c.Lifecycle.PreStop.Exec.Command
			s, err := strconv.Atoi(cmd[len(cmd)-1])
			if err != nil || cmd[0] != "sleep" {
				t.Errorf("%s: preStop %v: want sleep SECONDS", role, cmd)
			}
			pause = time.Duration(s) * time.Second
		}
		if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= shutdown+pause {
			t.Errorf("%s: terminationGracePeriodSeconds %v: must exceed SECKILL_SHUTDOWN_TIMEOUT %s plus the preStop pause %s", role, g, shutdown, pause)
		}
		// The binary reads every setting of the pod and accepts them all:
		// "api token" loads the whole configuration, opens nothing.
		cmd := exec.Command(apiBinary(t), "token", "--user", "1", "--ttl", "1m")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: the binary refuses the pod's settings: %v\n%s", role, err, out)
		}
	}
}

// TestProbesAnswer starts the binary with each role's settings as the chart
// renders them (on its embedded stores, on a free loopback port) and asks
// it every path the chart's probes and Prometheus use: each must answer
// 200.
func TestProbesAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the service")
	}
	t.Parallel()
	objs := render(t, mergeValues(t, testSecrets))
	for _, role := range []string{"api", "worker"} {
		t.Run(role, func(t *testing.T) {
			t.Parallel()
			c := objs.deployment(t, role).Spec.Template.Spec.Containers[0]
			env := podEnv(t, objs, c)
			// Embedded stores: no Redis or database servers in this test.
			delete(env, "SECKILL_MYSQL_DSN")
			delete(env, "SECKILL_REDIS_URL")
			delete(env, "SECKILL_LOCK_NODES")
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			env["SECKILL_ADDR"] = addr
			env["SECKILL_ADMIN_ADDR"] = "off"
			env["SECKILL_DATA_DIR"] = t.TempDir()
			ctx, cancel := context.WithCancel(context.Background())
			cmd := exec.CommandContext(ctx, apiBinary(t), c.Args...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
			for k, v := range env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			var logs bytes.Buffer
			cmd.Stdout, cmd.Stderr = &logs, &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cancel()
				_ = cmd.Wait()
				if t.Failed() {
					t.Logf("the %s instance's log:\n%s", role, logs.String())
				}
			})
			var paths []string
			for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
				paths = append(paths, p.HTTPGet.Path)
			}
			paths = append(paths, objs.deployment(t, role).Spec.Template.Annotations["prometheus.io/path"])
			for _, path := range paths {
				if err := await(ctx, "http://"+addr+path, time.Minute); err != nil {
					t.Errorf("%s: GET %s: %v", role, path, err)
				}
			}
		})
	}
}

// await asks url until it answers 200 (an error but 503, not ready yet,
// ends it) or within is over.
func await(ctx context.Context, url string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := errors.New("no answer")
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err != nil {
			last = err
		} else {
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				return nil
			case http.StatusServiceUnavailable: // not ready yet
				last = fmt.Errorf("status %d", resp.StatusCode)
			default:
				return fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		select {
		case <-ctx.Done():
			return last
		case <-tick.C:
		}
	}
}

// TestNginxConfigIsValid runs `nginx -t` on the nginx pod's configuration:
// the chart's ConfigMap rendered with the pod's env as the image's envsubst
// does (the API Service's name, unknown here, becomes loopback; the access
// log a file), under nginx/nginx.conf. It does so for each kind of hop in
// front (nginx.realIP), and checks the directives each renders.
func TestNginxConfigIsValid(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/nginx")
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nginx not found (scripts/deps.sh installs it)")
		}
		t.Skip("nginx not found")
	}
	for _, tc := range []struct {
		name   string
		realIP map[string]any
		want   []string // directives of the rendered configuration
	}{
		{"an ingress controller", nil, []string{
			"listen 8080 reuseport", "set_real_ip_from 10.244.0.0/16;", "real_ip_header X-Forwarded-For;", "real_ip_recursive on;",
			`map "31536000" $seckill_hsts`}},
		{"an L4 balancer with the PROXY protocol", map[string]any{"ingress": false, "from": []any{"10.0.1.0/24", "10.0.2.0/24"}, "proxyProtocol": true}, []string{
			"listen 8080 proxy_protocol reuseport", "set_real_ip_from 10.0.1.0/24; set_real_ip_from 10.0.2.0/24;", "real_ip_header proxy_protocol;"}},
		{"nothing in front", map[string]any{"ingress": false}, []string{
			"listen 8080 reuseport", "real_ip_header X-Forwarded-For;"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			vals := mergeValues(t, testSecrets)
			if tc.realIP != nil {
				vals["nginx"] = map[string]any{"realIP": tc.realIP}
			}
			conf := nginxConf(t, render(t, vals))
			var directives strings.Builder // conf without its comments
			for line := range strings.Lines(conf) {
				code, _, _ := strings.Cut(line, "#")
				directives.WriteString(strings.Join(strings.Fields(code), " ") + "\n")
			}
			for _, want := range tc.want {
				if !strings.Contains(directives.String(), want) {
					t.Errorf("the nginx pod's configuration lacks %q", want)
				}
			}
			if n := strings.Count(directives.String(), "set_real_ip_from"); tc.name == "nothing in front" && n != 0 {
				t.Errorf("nothing in front, yet nginx trusts %d addresses", n)
			}
			dir := t.TempDir()
			for _, sub := range []string{"logs", "temp"} {
				if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			main, err := os.ReadFile(filepath.Join(repoRoot, "nginx", "nginx.conf"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), main, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "seckill.conf"), []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "-p", dir+"/", "-e", "logs/error.log", "-c", filepath.Join(dir, "nginx.conf"), "-t").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "test is successful") {
				t.Fatalf("nginx -t: %v\n%s", err, out)
			}
		})
	}
}

// nginxConf is the nginx pod's seckill.conf: the chart's ConfigMap
// rendered with the pod's env as the image's envsubst does, the API
// Service's name (unknown here) made loopback, the access log a file.
func nginxConf(t *testing.T, objs objects) string {
	t.Helper()
	d := objs.deployment(t, "nginx")
	var tmpl string
	for _, c := range objs.configMaps {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil && c.Name == v.ConfigMap.Name {
				tmpl = c.Data["default.conf.template"]
			}
		}
	}
	if tmpl == "" {
		t.Fatal("the nginx ConfigMap has no default.conf.template")
	}
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	env["SECKILL_UPSTREAM_SERVERS"] = regexp.MustCompile(`server [^ :;]+`).ReplaceAllString(env["SECKILL_UPSTREAM_SERVERS"], "server 127.0.0.1")
	env["SECKILL_NGINX_ACCESS_LOG"] = "logs/access.log"
	if env["SECKILL_NGINX_CACHE_DIR"] != "/var/cache/nginx/seckill_draw" {
		t.Errorf("the nginx pod keeps the draw's pages in %q, not in its writable cache directory", env["SECKILL_NGINX_CACHE_DIR"])
	}
	env["SECKILL_NGINX_CACHE_DIR"] = "cache" // under the test's prefix
	return regexp.MustCompile(`\$\{[A-Z0-9_]+\}`).ReplaceAllStringFunc(tmpl, func(p string) string {
		v, ok := env[p[2:len(p)-1]]
		if !ok {
			t.Errorf("the nginx pod does not set %s", p)
		}
		return v
	})
}

// TestChartNames: every SECKILL_* name in the chart's files is a setting of
// the binary or one the nginx template fills in, and the chart's list of
// settings with credentials is the test's.
func TestChartNames(t *testing.T) {
	t.Parallel()
	table := settingsTable(t)
	tmpl, err := os.ReadFile(filepath.Join(repoRoot, "nginx", "seckill.conf.template"))
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`SECKILL_[A-Z0-9_]*[A-Z0-9]`)
	for _, s := range secretSettings {
		if _, ok := table[s]; !ok {
			t.Errorf("secretSettings lists %s, which is not a setting", s)
		}
	}
	err = filepath.WalkDir(chartDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(path, filepath.Join(chartDir, "files")) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, n := range name.FindAllString(string(b), -1) {
			if _, ok := table[n]; !ok && !strings.Contains(string(tmpl), "${"+n+"}") {
				t.Errorf("%s names %s, neither a setting of the binary nor a name of the nginx template", path, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	helpers, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`define "seckill.secretSettings" -}}\n(.*)\n`).FindSubmatch(helpers)
	if m == nil || !slices.Equal(strings.Fields(string(m[1])), secretSettings) {
		t.Errorf("the chart's seckill.secretSettings is not secretSettings %v", secretSettings)
	}
}

// TestNetworkPolicy: with the chart's defaults, nothing reaches the API
// pods' port but the nginx pods and Prometheus, the workers' port but
// Prometheus, nginx's port but the Ingress controller's pods; and the API
// trusts X-Forwarded-For from the pod network only, not the binary's every
// private range.
func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	objs := render(t, mergeValues(t, testSecrets))
	prometheus := map[string]string{"app.kubernetes.io/name": "prometheus"}
	ingress := map[string]string{"app.kubernetes.io/name": "ingress-nginx"}
	for _, tc := range []struct {
		component string
		from      []map[string]string // pod labels admitted, one rule each
	}{
		{"api", []map[string]string{objs.deployment(t, "nginx").Spec.Template.Labels, prometheus}},
		{"worker", []map[string]string{prometheus}},
		{"nginx", []map[string]string{ingress}},
	} {
		d := objs.deployment(t, tc.component)
		var p *networkingv1.NetworkPolicy
		for _, np := range objs.policies {
			if sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err == nil && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				p = np
			}
		}
		if p == nil {
			t.Errorf("no NetworkPolicy selects the %s pods", tc.component)
			continue
		}
		if !slices.Equal(p.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("NetworkPolicy %s: policyTypes %v, want Ingress", p.Name, p.Spec.PolicyTypes)
		}
		if len(p.Spec.Ingress) != len(tc.from) {
			t.Errorf("NetworkPolicy %s has %d rules, want %d", p.Name, len(p.Spec.Ingress), len(tc.from))
			continue
		}
		for i, r := range p.Spec.Ingress {
			if len(r.From) != 1 || r.From[0].PodSelector == nil || r.From[0].IPBlock != nil {
				t.Errorf("NetworkPolicy %s rule %d admits %+v, want pods labelled %v", p.Name, i, r.From, tc.from[i])
				continue
			}
			sel, err := metav1.LabelSelectorAsSelector(r.From[0].PodSelector)
			if err != nil || sel.Empty() || !sel.Matches(labels.Set(tc.from[i])) {
				t.Errorf("NetworkPolicy %s rule %d admits pods %v, want pods labelled %v", p.Name, i, r.From[0].PodSelector, tc.from[i])
			}
			if tc.component == "nginx" && r.From[0].NamespaceSelector == nil {
				t.Errorf("NetworkPolicy %s admits pods of its own namespace, want the Ingress controller's", p.Name)
			}
			if len(r.Ports) != 1 || r.Ports[0].Port == nil || r.Ports[0].Port.String() != "http" {
				t.Errorf("NetworkPolicy %s rule %d: ports %v, want http", p.Name, i, r.Ports)
			}
		}
	}

	env := podEnv(t, objs, objs.deployment(t, "api").Spec.Template.Spec.Containers[0])
	if got := env["SECKILL_TRUSTED_PROXIES"]; got != "10.244.0.0/16" {
		t.Errorf("the API pods trust X-Forwarded-For from %q, want the pod network 10.244.0.0/16", got)
	}
	vals := mergeValues(t, testSecrets)
	vals["settings"] = map[string]any{"SECKILL_TRUSTED_PROXIES": "10.1.2.0/24"}
	env = podEnv(t, render(t, vals), objs.deployment(t, "api").Spec.Template.Spec.Containers[0])
	if got := env["SECKILL_TRUSTED_PROXIES"]; got != "10.1.2.0/24" {
		t.Errorf("with settings.SECKILL_TRUSTED_PROXIES, the API pods trust %q, want 10.1.2.0/24", got)
	}
}

// TestHardened: every pod runs as a user, never root, under the runtime's
// seccomp profile, without privilege escalation or capabilities, on a
// read-only root filesystem, without a service account token; what nginx
// writes (the rendered configuration, pid and temp files, cache) is on
// emptyDir volumes.
func TestHardened(t *testing.T) {
	t.Parallel()
	objs := render(t, mergeValues(t, testSecrets))
	for _, component := range []string{"api", "worker", "nginx"} {
		spec := objs.deployment(t, component).Spec.Template.Spec
		psc := spec.SecurityContext
		switch {
		case psc == nil:
			t.Errorf("%s: no pod securityContext", component)
			continue
		case psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot:
			t.Errorf("%s: runAsNonRoot is not set", component)
		case psc.RunAsUser == nil || *psc.RunAsUser == 0:
			t.Errorf("%s: runAsUser %v, want a user", component, psc.RunAsUser)
		case psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
			t.Errorf("%s: seccompProfile %v, want RuntimeDefault", component, psc.SeccompProfile)
		}
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Errorf("%s: the service account token is mounted; no pod talks to the Kubernetes API", component)
		}
		for _, c := range spec.Containers {
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Errorf("%s: container %s has no securityContext", component, c.Name)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s: container %s may escalate privileges", component, c.Name)
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s: container %s has a writable root filesystem", component, c.Name)
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
				t.Errorf("%s: container %s capabilities %v, want all dropped, none added", component, c.Name, sc.Capabilities)
			case sc.Privileged != nil && *sc.Privileged:
				t.Errorf("%s: container %s is privileged", component, c.Name)
			}
		}
	}
	spec := objs.deployment(t, "nginx").Spec.Template.Spec
	emptyDirs := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.EmptyDir != nil {
			emptyDirs[v.Name] = true
		}
	}
	written := map[string]bool{}
	for _, m := range spec.Containers[0].VolumeMounts {
		if emptyDirs[m.Name] && !m.ReadOnly {
			written[m.MountPath] = true
		}
	}
	for _, dir := range []string{"/etc/nginx/conf.d", "/tmp", "/var/cache/nginx"} {
		if !written[dir] {
			t.Errorf("nginx: %s is not a writable emptyDir on the read-only root", dir)
		}
	}
	if img := spec.Containers[0].Image; !strings.HasPrefix(img, "nginxinc/nginx-unprivileged:") {
		t.Errorf("nginx runs %s: the chart's user and paths are nginxinc/nginx-unprivileged's", img)
	}
}
