package cluster

import (
	"errors"
	"strings"
	"testing"
)

const good = `apiVersion: evolve/v1
kind: Cluster
metadata:
  name: gb300-east
spec:
  concurrency: 4
  defaults:
    user: ubuntu
    keyPath: ~/.ssh/id_ed25519
    engine:
      backend: sim
      profile: gb300-kimi-k2
      env: {EVOLVE_LOG: info}
  hosts:
    - name: gpu-01
      address: 10.0.0.11
      gpus: 4
      role: prefill
    - name: gpu-02
      address: 10.0.0.12
      port: 2222
      bastion: {address: jump.example.com, user: jump}
      engine:
        env: {CUDA_VISIBLE_DEVICES: "0,1,2,3"}
`

func TestParseMergesDefaults(t *testing.T) {
	f, err := Parse("cluster.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	h1, h2 := f.Spec.Hosts[0], f.Spec.Hosts[1]
	if h1.User != "ubuntu" || h1.Port != 22 || h1.Engine.Backend != "sim" || h1.Engine.Profile != "gb300-kimi-k2" || h1.Engine.Port != 8100 {
		t.Fatalf("host 1 after defaults: %+v", h1)
	}
	if h2.Port != 2222 || h2.Bastion == nil || h2.Bastion.Port != 22 || h2.Engine.Env["CUDA_VISIBLE_DEVICES"] != "0,1,2,3" || h2.Engine.Env["EVOLVE_LOG"] != "info" {
		t.Fatalf("host 2 after defaults: %+v %+v", h2, h2.Bastion)
	}
	o := f.Spec.Orchestrator
	if o.Host != "local" || o.RouterPort != 8000 || o.NATSPort != 4222 || f.Spec.Concurrency != 4 {
		t.Fatalf("orchestrator %+v", o)
	}
	plan := f.Plan()
	if len(plan) != 3 || plan[1].SSH != "ubuntu@10.0.0.12:2222 via jump@jump.example.com:22" || plan[2].Host != "local" {
		t.Fatalf("plan %+v", plan)
	}
	if !strings.Contains(strings.Join(plan[0].Steps, "\n"), "role prefill") {
		t.Fatalf("plan for gpu-01: %v", plan[0].Steps)
	}
}

// Every problem is reported at once, each with its field and its line.
func TestParseErrorsNameTheFieldAndLine(t *testing.T) {
	bad := strings.NewReplacer(
		"kind: Cluster", "kind: Clustre",
		"role: prefill", "role: both",
		"address: 10.0.0.12", "address: \"\"",
		"profile: gb300-kimi-k2", "profile: gb301",
	).Replace(good)
	_, err := Parse("cluster.yaml", []byte(bad))
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %v is not a list of field errors", err)
	}
	want := map[string]int{"kind": 2, "spec.hosts[0].role": 18, "spec.hosts[1].address": 20, "spec.hosts[0].engine.profile": 12}
	for _, e := range es {
		if line, ok := want[e.Field]; ok {
			if e.Line != line {
				t.Errorf("%s reported at line %d, want %d", e.Field, e.Line, line)
			}
			delete(want, e.Field)
		}
	}
	if len(want) > 0 {
		t.Fatalf("not reported: %v in\n%v", want, err)
	}
	if !strings.Contains(err.Error(), "cluster.yaml:2: kind:") {
		t.Fatalf("message: %v", err)
	}
	// Unknown fields are schema errors with their line.
	_, err = Parse("c.yaml", []byte(strings.Replace(good, "gpus: 4", "gpus: 4\n      gpu: 4", 1)))
	if err == nil || !strings.Contains(err.Error(), "c.yaml:18") || !strings.Contains(err.Error(), "gpu") {
		t.Fatalf("unknown field: %v", err)
	}
	// A duplicate host name, a port out of range and an unknown orchestrator host.
	dup := strings.Replace(good, "name: gpu-02", "name: gpu-01", 1)
	dup = strings.Replace(dup, "port: 2222", "port: 70000", 1)
	dup = strings.Replace(dup, "concurrency: 4", "concurrency: 4\n  orchestrator: {host: gpu-09}", 1)
	_, err = Parse("c.yaml", []byte(dup))
	for _, want := range []string{"also the name of hosts[0]", "70000 is not a port", "want local or the name of a host"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("want %q in %v", want, err)
		}
	}
}

// A vllm host needs its model in engine.args, takes no profile (and no
// default one meant for sim hosts), and a sim host takes no command.
func TestParseVLLMEngines(t *testing.T) {
	doc := func(hosts string) []byte {
		return []byte("apiVersion: evolve/v1\nkind: Cluster\nmetadata: {name: t}\nspec:\n  defaults: {engine: {profile: tiny}}\n  hosts:\n" + hosts)
	}
	f, err := Parse("c.yaml", doc("    - {name: a, address: h, engine: {backend: vllm, args: [m]}}\n    - {name: b, address: h, engine: {backend: vllm, args: [m], kvEventsPort: 6557}}\n"))
	if err != nil || f.Spec.Hosts[0].Engine.Profile != "" {
		t.Fatalf("vllm host: %v %+v", err, f.Spec.Hosts[0].Engine)
	}
	if e := f.Spec.Hosts[0].Engine; e.KVEventsPort != 5557 || e.KVReplayPort != 5558 || e.NIXLPort != 5600 {
		t.Fatalf("vLLM's default ports: %+v", e)
	}
	if e := f.Spec.Hosts[1].Engine; e.KVEventsPort != 6557 || e.KVReplayPort != 5558 {
		t.Fatalf("a vLLM port set: %+v", e)
	}
	_, err = Parse("c.yaml", doc("    - {name: a, address: h, engine: {backend: vllm, args: [m], port: 5557}}\n    - {name: b, address: h, engine: {nixlPort: 1}}\n"))
	for _, want := range []string{"spec.hosts[0].engine.kvEventsPort: 5557 is also engine.port", "spec.hosts[1].engine: kvEventsPort, kvReplayPort and nixlPort are for the vllm backend"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("want %q in %v", want, err)
		}
	}
	_, err = Parse("c.yaml", doc("    - {name: a, address: h, engine: {backend: vllm}}\n    - {name: b, address: h, engine: {command: [x]}}\n"))
	for _, want := range []string{"spec.hosts[0].engine.args: is missing: the vllm backend needs the model", "spec.hosts[1].engine.command: is for the vllm backend"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("want %q in %v", want, err)
		}
	}
}

// The orchestrator's model aliases reach its command line; a pattern that
// cannot be read is a field error.
func TestOrchestratorModelAliases(t *testing.T) {
	withAliases := strings.Replace(good, "concurrency: 4", "concurrency: 4\n  orchestrator: {modelAliases: [claude-*, gpt-4o]}", 1)
	f, err := Parse("c.yaml", []byte(withAliases))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(f.Spec.Orchestrator.Args(), " "); got != "--model-alias claude-* --model-alias gpt-4o" {
		t.Fatalf("orchestrator args %q", got)
	}
	bad := strings.Replace(good, "concurrency: 4", "concurrency: 4\n  orchestrator: {modelAliases: [\"claude-[\", \"\"]}", 1)
	_, err = Parse("c.yaml", []byte(bad))
	for _, want := range []string{"spec.orchestrator.modelAliases[0]", "spec.orchestrator.modelAliases[1]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("want %q in %v", want, err)
		}
	}
}

// The orchestrator's certificate and key reach its command line; a path
// that is not absolute, or a missing one, is a field error.
func TestOrchestratorTLS(t *testing.T) {
	withTLS := strings.Replace(good, "concurrency: 4", "concurrency: 4\n  orchestrator: {tls: {certFile: /etc/evolve/tls.crt, keyFile: /etc/evolve/tls.key}}", 1)
	f, err := Parse("c.yaml", []byte(withTLS))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(f.Spec.Orchestrator.Args(), " "); got != "--tls-cert-file /etc/evolve/tls.crt --tls-key-file /etc/evolve/tls.key" {
		t.Fatalf("orchestrator args %q", got)
	}
	bad := strings.Replace(good, "concurrency: 4", "concurrency: 4\n  orchestrator: {tls: {certFile: tls.crt}}", 1)
	_, err = Parse("c.yaml", []byte(bad))
	for _, want := range []string{`spec.orchestrator.tls.certFile: "tls.crt"`, `spec.orchestrator.tls.keyFile: ""`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("want %q in %v", want, err)
		}
	}
}
