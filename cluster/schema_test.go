package cluster

import (
	"errors"
	"fmt"
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
	if e := f.Spec.Hosts[0].Engine; e.KVEventsPort != 5557 || e.KVReplayPort != 5558 || e.NIXLPort != 5600 || e.PassMetricsPort != 0 {
		t.Fatalf("vLLM's default ports: %+v", e)
	}
	if e := f.Spec.Hosts[1].Engine; e.KVEventsPort != 6557 || e.KVReplayPort != 5558 {
		t.Fatalf("a vLLM port set: %+v", e)
	}
	_, err = Parse("c.yaml", doc("    - {name: a, address: h, engine: {backend: vllm, args: [m], port: 5557}}\n    - {name: b, address: h, engine: {nixlPort: 1}}\n"))
	for _, want := range []string{"spec.hosts[0].engine.kvEventsPort: 5557 is also engine.port", "spec.hosts[1].engine: kvEventsPort, kvReplayPort, nixlPort and passMetricsPort are for the vllm backend"} {
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

// A host of several engines shares its GPUs out evenly and gives each
// engine its own name, folder and ports; a single-engine host is its own
// engine, as before.
func TestHostOfSeveralEngines(t *testing.T) {
	doc := func(hosts string) []byte {
		return []byte("apiVersion: evolve/v1\nkind: Cluster\nmetadata: {name: t}\nspec:\n  defaults: {engine: {profile: tiny}}\n  hosts:\n" + hosts)
	}
	f, err := Parse("c.yaml", doc(`    - {name: h200, address: h, gpus: 8, engines: 4, role: decode, engine: {backend: vllm, args: [m, --tensor-parallel-size, "2"], passMetricsPort: 20380, env: {HF_HOME: /data}}}
    - {name: odd, address: h2, gpus: 4, engines: 2, dir: /var/lib/evolve, engine: {backend: vllm, args: [m], port: 9000, env: {CUDA_VISIBLE_DEVICES: "4,5,6,7"}}}
    - {name: one, address: h3, gpus: 4}
`))
	if err != nil {
		t.Fatal(err)
	}
	es := f.Engines()
	if len(es) != 7 {
		t.Fatalf("%d engines, want 4 + 2 + 1", len(es))
	}
	for i, want := range []struct {
		name, dir, devs          string
		port, ev, rep, nixl, fpm int
	}{
		{"h200-0", "$HOME/.local/state/evolve/engine/h200-0", "0,1", 8100, 5557, 5561, 5600, 20380},
		{"h200-1", "$HOME/.local/state/evolve/engine/h200-1", "2,3", 8101, 5558, 5562, 5601, 20381},
		{"h200-2", "$HOME/.local/state/evolve/engine/h200-2", "4,5", 8102, 5559, 5563, 5602, 20382},
		{"h200-3", "$HOME/.local/state/evolve/engine/h200-3", "6,7", 8103, 5560, 5564, 5603, 20383},
		{"odd-0", "/var/lib/evolve/odd-0", "4,5", 9000, 5557, 5559, 5600, 0},
		{"odd-1", "/var/lib/evolve/odd-1", "6,7", 9001, 5558, 5560, 5601, 0},
	} {
		t.Run(want.name, func(t *testing.T) {
			e := es[i]
			got := [...]int{e.Engine.Port, e.Engine.KVEventsPort, e.Engine.KVReplayPort, e.Engine.NIXLPort, e.Engine.PassMetricsPort}
			if e.Name != want.name || e.StateDir() != want.dir || e.Engine.Env["CUDA_VISIBLE_DEVICES"] != want.devs ||
				got != [...]int{want.port, want.ev, want.rep, want.nixl, want.fpm} {
				t.Errorf("engine %d: %s in %s, GPUs %q, ports %v; want %+v", i, e.Name, e.StateDir(), e.Engine.Env["CUDA_VISIBLE_DEVICES"], got, want)
			}
			if e.GPUs != 2 || e.Role != f.Spec.Hosts[i/4].Role || e.HostName() != f.Spec.Hosts[min(i/4, 1)].Name {
				t.Errorf("engine %d: %d GPUs, role %q, host %q", i, e.GPUs, e.Role, e.HostName())
			}
		})
	}
	if es[0].Engine.Env["HF_HOME"] != "/data" || f.Spec.Hosts[0].Engine.Env["CUDA_VISIBLE_DEVICES"] != "" {
		t.Fatalf("engine env %v, host env %v: the engines share the host's, each with its own GPUs", es[0].Engine.Env, f.Spec.Hosts[0].Engine.Env)
	}
	if one := es[6]; one.Name != "one" || one.StateDir() != "$HOME/.local/state/evolve/engine" || one.GPUs != 4 || one.Engine.Env["CUDA_VISIBLE_DEVICES"] != "" || one.HostName() != "one" {
		t.Fatalf("a single-engine host: %+v", one)
	}
	if f.Engine("h200-2").Engine.Port != 8102 || f.Engine("h200").Name != "" {
		t.Fatal("Engine finds engines by their names, and a shared host's name is none")
	}

	for _, c := range []struct{ hosts, want string }{
		{"    - {name: a, address: h, gpus: 6, engines: 4, engine: {backend: vllm, args: [m]}}\n",
			"spec.hosts[0].gpus: 6 GPUs cannot be shared evenly by 4 engines"},
		{"    - {name: a, address: h, engines: 2, engine: {backend: vllm, args: [m]}}\n",
			"spec.hosts[0].gpus: 0 GPUs cannot be shared evenly by 2 engines"},
		{"    - {name: a, address: h, engines: 2, engine: {env: {CUDA_VISIBLE_DEVICES: \"0,1,2\"}}}\n",
			`spec.hosts[0].engine.env.CUDA_VISIBLE_DEVICES: "0,1,2" lists 3 GPUs, which 2 engines cannot share evenly`},
		{"    - {name: a, address: h, engines: -1}\n", "spec.hosts[0].engines: must be at least 1"},
		{"    - {name: a, address: h, gpus: 8, engines: 8, engine: {backend: vllm, args: [m], kvReplayPort: 5560}}\n",
			"spec.hosts[0].engine.kvReplayPort: its 8 engines take 5560-5567, which overlaps engine.kvEventsPort's 5557-5564: leave 8 ports to each kind"},
		{"    - {name: a, address: h, engines: 3, engine: {port: 65534}}\n", "3 engines take ports 65534 to 65536, past 65535"},
		{"    - {name: a, address: h, gpus: 2, engines: 2, engine: {backend: vllm, args: [m], passMetricsPort: 5601}}\n",
			"spec.hosts[0].engine.passMetricsPort: its 2 engines take 5601-5602, which overlaps engine.nixlPort's 5600-5601"},
		{"    - {name: a, address: h, gpus: 2, engines: 2, engine: {backend: vllm, args: [m, --forward-pass-metrics-port, \"20380\"]}}\n",
			"spec.hosts[0].engine.args: --forward-pass-metrics-port: the host's 2 engines would all publish on that port; set engine.passMetricsPort instead"},
		{"    - {name: a, address: h, gpus: 2, engine: {backend: vllm, args: [m, --forward-pass-metrics-port=20380], passMetricsPort: 20390}}\n",
			"spec.hosts[0].engine.passMetricsPort: engine.args set --forward-pass-metrics-port too: set one of them"},
		{"    - {name: a, address: h, engines: 2}\n    - {name: a-1, address: h2}\n",
			`spec.hosts[1].name: "a-1" is also the name of an engine of hosts[0]`},
		{"    - {name: a, address: h, gpus: 8, engines: 4, engine: {backend: vllm, args: [m, --tensor-parallel-size, \"4\"]}}\n",
			"spec.hosts[0].engine.args: vLLM's parallel sizes ask for 4 GPUs per engine; 4 engines sharing 8 GPUs have 2 each"},
		{"    - {name: a, address: h, gpus: 4, engine: {backend: vllm, args: [m, -tp=2, --pipeline-parallel-size, \"4\"]}}\n",
			"spec.hosts[0].engine.args: vLLM's parallel sizes ask for 8 GPUs; the engine has 4"},
		{"    - {name: a, address: h, engine: {backend: vllm, args: [m, -tp, \"2\"], env: {CUDA_VISIBLE_DEVICES: \"3\"}}}\n",
			"spec.hosts[0].engine.args: vLLM's parallel sizes ask for 2 GPUs; the engine has 1"},
		{"    - {name: a, address: h, gpus: 8, engine: {backend: vllm, args: [m, -tp, \"2\", -dp, \"4\"]}}\n",
			"spec.hosts[0].engine.args: --data-parallel-size 4: evolve follows one vLLM server's KV events per engine; run the ranks as engines of their own (engines: 4,"},
		{"    - {name: a, address: h, engine: {backend: vllm, args: [m, --tensor-parallel-size, two]}}\n",
			"spec.hosts[0].engine.args: --tensor-parallel-size two: want a positive number"},
	} {
		t.Run(c.hosts, func(t *testing.T) {
			if _, err := Parse("c.yaml", doc(c.hosts)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: want %q, got %v", c.hosts, c.want, err)
			}
		})
	}
	// Sim engines need no GPUs to share.
	f, err = Parse("c.yaml", doc("    - {name: a, address: h, engines: 3}\n"))
	if err != nil || len(f.Engines()) != 3 || f.Engines()[2].Engine.Env["CUDA_VISIBLE_DEVICES"] != "" {
		t.Fatalf("three sim engines on a host without GPUs: %v", err)
	}
	// The plan names each engine with its GPUs, and the orchestrator once.
	f, _ = Parse("c.yaml", doc("    - {name: g, address: h, gpus: 4, engines: 2, engine: {backend: vllm, args: [m]}}\n  orchestrator: {host: g}\n"))
	plan := f.Plan()
	if len(plan) != 2 || plan[1].Host != "g-1" || !strings.Contains(strings.Join(plan[1].Steps, "\n"), "GPUs 2,3") {
		t.Fatalf("plan: %+v", plan)
	}
	if o := strings.Count(fmt.Sprint(plan), "start the orchestrator"); o != 1 {
		t.Fatalf("the orchestrator starts %d times in the plan: %+v", o, plan)
	}
}

// A mistake in a cluster file is named as the operator wrote it: the
// field's path and line, what was wanted and what was given, a likely
// meant field for a misspelt one, the right line of a YAML syntax error,
// and an empty file says so.
func TestClusterFileErrorsNameThePath(t *testing.T) {
	doc := func(spec string) []byte {
		return []byte("apiVersion: evolve/v1\nkind: Cluster\nmetadata: {name: t}\nspec:\n" + spec)
	}
	for _, tc := range []struct {
		src  []byte
		want string
	}{
		{doc("  hosts:\n    - name: a\n      address: 10.0.0.1\n    - name: b\n      adress: 10.0.0.2\n"),
			"c.yaml:9: spec.hosts[1].adress: unknown field (did you mean address?)"},
		{doc("  defaults:\n    gpus: four\n"), `c.yaml:6: spec.defaults.gpus: want a whole number, got "four"`},
		{doc("  hosts:\n    - name: a\n      GPUs: 4\n"), "spec.hosts[0].GPUs: unknown field (did you mean gpus?)"},
		{doc("  hosts:\n    name: a\n"), "c.yaml:6: spec.hosts: want a list, got a mapping"},
		{doc("  hosts:\n    - name: a\n      engine: {args: 7}\n"), `spec.hosts[0].engine.args: want a list, got "7"`},
		{doc("  hosts:\n    - name: [a, b]\n"), "spec.hosts[0].name: want a string, got a list"},
		{doc("  hosts:\n    - name: a\n      engine: {env: {A: [1]}}\n"), "spec.hosts[0].engine.env.A: want a string, got a list"},
		{[]byte("hello\n"), `c.yaml:1: the file: want a mapping of fields, got "hello"`},
		{[]byte(""), "c.yaml: the file is empty"},
		{[]byte("# only a comment\n"), "c.yaml: the file is empty"},
		// yaml.v3 counts a parser error's line from 0: the flow list
		// opened on line 3 is reported on line 3, not 2.
		{[]byte("apiVersion: evolve/v1\nkind: Cluster\nmetadata: [a, b\nspec: {}\n"), "c.yaml:3: not valid YAML: did not find expected ',' or ']'"},
		{[]byte("apiVersion: evolve/v1\n\tkind: Cluster\n"), "c.yaml:2: not valid YAML: found a tab character"},
		// A merge key merges a mapping of the same shape, checked as such.
		{doc("  defaults: &d {gpus: 4}\n  hosts:\n    - <<: *d\n      name: a\n      adress: x\n"), "spec.hosts[0].adress: unknown field (did you mean address?)"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			_, err := Parse("c.yaml", tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%q:\n got %v\nwant %s", tc.src, err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "cluster.") {
				t.Errorf("%q: a Go type in the message: %v", tc.src, err)
			}
		})
	}
}

// spec.orchestrator.hosts runs one orchestrator on each host it names,
// with the ports a host gives of its own; each is started with its name
// and its peers' route addresses.
func TestOrchestratorsOnSeveralHosts(t *testing.T) {
	three := strings.Replace(good, "spec:\n", "spec:\n  orchestrator: {hosts: [gpu-01, gpu-02, gpu-03], clusterPort: 7222}\n", 1) +
		"    - {name: gpu-03, address: 10.0.0.13, orchestrator: {routerPort: 9000, clusterPort: 7300}}\n"
	f, err := Parse("cluster.yaml", []byte(three))
	if err != nil {
		t.Fatal(err)
	}
	o := f.Spec.Orchestrator
	if o.Local() || len(o.OnHosts()) != 3 {
		t.Fatalf("orchestrators on %v", o.OnHosts())
	}
	if p := f.OrchestratorPorts("gpu-03"); p != (OrchestratorPorts{RouterPort: 9000, ControlPort: 8001, NATSPort: 4222, ClusterPort: 7300}) {
		t.Fatalf("gpu-03's ports %+v", p)
	}
	args := strings.Join(clusterArgs(f, "gpu-01", UpOptions{}), " ")
	if args != "--name gpu-01 --cluster-listen 0.0.0.0:7222 --cluster-peers 10.0.0.12:7222,10.0.0.13:7300" {
		t.Fatalf("gpu-01's cluster flags: %s", args)
	}
	if len(clusterArgs(f, "gpu-01", UpOptions{})) == 0 || LogNames(f)[2] != "orchestrator@gpu-03" {
		t.Fatalf("log names %v", LogNames(f))
	}
	// One orchestrator on a host takes no cluster flags.
	one := strings.Replace(good, "spec:\n", "spec:\n  orchestrator: {host: gpu-02}\n", 1)
	if f, err := Parse("cluster.yaml", []byte(one)); err != nil || clusterArgs(f, "gpu-02", UpOptions{}) != nil || LogNames(f)[0] != "orchestrator" {
		t.Fatalf("one orchestrator on a host: %v", err)
	}

	for _, c := range []struct{ name, orch, extra, field, msg string }{
		{"host and hosts", "{host: gpu-01, hosts: [gpu-02]}", "", "spec.orchestrator.hosts", "not both"},
		{"an unknown host", "{hosts: [gpu-01, gpu-09]}", "", "spec.orchestrator.hosts[1]", `"gpu-09": want the name of a host`},
		{"a host twice", "{hosts: [gpu-01, gpu-02, gpu-01]}", "", "spec.orchestrator.hosts[2]", "a host runs one orchestrator"},
		{"advertise of several", "{hosts: [gpu-01, gpu-02], advertise: 10.0.0.5}", "", "spec.orchestrator.advertise", "is for one orchestrator"},
		{"ports of a host without one", "{hosts: [gpu-01, gpu-02]}", "    - {name: gpu-03, address: 10.0.0.13, orchestrator: {natsPort: 5222}}\n", "spec.hosts[2].orchestrator", "runs no orchestrator"},
		{"a port twice", "{hosts: [gpu-01, gpu-02, gpu-03]}", "    - {name: gpu-03, address: 10.0.0.13, orchestrator: {natsPort: 8000}}\n", "spec.hosts[2].orchestrator.natsPort", "also the orchestrator's routerPort"},
		{"a bad cluster port", "{hosts: [gpu-01, gpu-02], clusterPort: 70000}", "", "spec.orchestrator.clusterPort", "is not a port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			y := strings.Replace(good, "spec:\n", "spec:\n  orchestrator: "+c.orch+"\n", 1) + c.extra
			_, err := Parse("cluster.yaml", []byte(y))
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("%v is not a list of field errors", err)
			}
			for _, e := range es {
				if e.Field == c.field && strings.Contains(e.Msg, c.msg) && e.Line > 0 {
					return
				}
			}
			t.Fatalf("want %s: %s; got %v", c.field, c.msg, err)
		})
	}
	t.Run("defaults", func(t *testing.T) {
		y := strings.Replace(good, "    user: ubuntu\n", "    user: ubuntu\n    orchestrator: {routerPort: 9000}\n", 1)
		if _, err := Parse("cluster.yaml", []byte(y)); err == nil || !strings.Contains(err.Error(), "spec.defaults.orchestrator: is per host") {
			t.Fatalf("orchestrator ports in the defaults: %v", err)
		}
	})
}
