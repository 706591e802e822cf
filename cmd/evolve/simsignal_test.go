package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// SIGTERM (a supervisor's stop, a CI job's timeout) stops evolve sim as
// Ctrl-C does: at the simulations' next modelled minute it prints what it
// has (here no result, and how far the one simulation got) and exits 1,
// rather than dying with nothing printed.
func TestSimStopsOnSIGTERMWithWhatItHas(t *testing.T) {
	cmd, out := startBin(t, []string{"XDG_CONFIG_HOME=" + t.TempDir()}, "sim", "--gpus", "12", "--workload", "coding", "--agents", "16",
		"--duration", "3h", "--warmup", "0s", "--policies", "static:1:2", "-o", "json")
	wait.Until(t, 30*time.Second, "the simulation starts", func() bool { return strings.Contains(out.String(), "simulating static:1:2") })
	time.Sleep(time.Second) // a modelled minute or more
	signalAndWait(t, cmd, syscall.SIGTERM, out)
	s := out.String()
	var res struct {
		Interrupted struct {
			Unfinished []struct {
				Policy    string  `json:"policy"`
				ModelledS float64 `json:"modelled_s"`
			} `json:"unfinished"`
		} `json:"interrupted"`
	}
	i := strings.Index(s, "\n{")
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(s, "interrupted: printing the 0 of 1") || i < 0 {
		t.Fatalf("after SIGTERM: exit %d\n%s", cmd.ProcessState.ExitCode(), s)
	}
	if err := json.NewDecoder(strings.NewReader(s[i+1:])).Decode(&res); err != nil || len(res.Interrupted.Unfinished) != 1 ||
		res.Interrupted.Unfinished[0].Policy != "static:1:2" || res.Interrupted.Unfinished[0].ModelledS <= 0 {
		t.Fatalf("after SIGTERM: %v: %+v\n%s", err, res, s)
	}
}
