package cluster

import "testing"

// FuzzParse feeds arbitrary cluster files to the parser operators' hand-
// written YAML goes through: it accepts a file or names what is wrong,
// never panics, and a file it accepts names its cluster and its hosts.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`apiVersion: evolve/v1
kind: Cluster
metadata: {name: lab}
spec:
  orchestrator: {host: local, advertise: 10.0.0.5}
  defaults: {user: ubuntu, gpus: 4, engine: {backend: vllm, args: [m, --tensor-parallel-size, "4"]}}
  hosts:
    - {name: gpu-01, address: 10.0.0.11, role: prefill}
    - {name: gpu-02, address: 10.0.0.12, bastion: {address: jump.lab, user: ops}}
`))
	f.Add([]byte("apiVersion: evolve/v1\nkind: Cluster\nmetadata: {name: x}\nspec:\n  hosts: [{name: a, address: b, port: 70000}]\n"))
	f.Add([]byte("spec: {hosts: [&a {name: *a}]}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse("cluster.yaml", b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if file.Metadata.Name == "" || len(file.Spec.Hosts) == 0 {
			t.Fatalf("accepted a file without a name or hosts: %+v", file)
		}
	})
}
