package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/evolvellm/evolve/cluster"
	"github.com/evolvellm/evolve/controlapi"
	"github.com/evolvellm/evolve/internal/networds"
	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"
)

// controlClient talks to an orchestrator's control API.
type controlClient struct {
	base  string
	token string
	// tokenFile is the file the token came from: the local cluster's,
	// when it was not given.
	tokenFile string
	http      *http.Client
	note      io.Writer // where a retry is said (stderr); nil: silently
	// err, when not nil, is why no call is made: the local cluster's
	// record does not read, and no --server says where to go instead.
	err error
}

// addClientFlags adds --server and --token to a command that uses the
// control API.
func addClientFlags(cmd *cobra.Command) {
	cmd.Flags().String("server", "", "control API URL (default: the local cluster's, else http://127.0.0.1:8001)")
	cmd.Flags().String("token", "", "bearer token for the control API (or env EVOLVE_TOKEN; default: the local cluster's, from its state directory)")
}

func newControlClient(cmd *cobra.Command) *controlClient {
	c := &controlClient{http: &http.Client{Timeout: 15 * time.Second}, note: cmd.ErrOrStderr()}
	server := flagOrConfig(cmd, "server")
	st, err := cluster.ReadLocalState(localDir())
	var damaged *cluster.DamagedStateError
	switch {
	case server != "":
	case errors.As(err, &damaged):
		// Not the default URL, which on a shared machine may be
		// another user's cluster.
		c.err = fmt.Errorf("%w: pass the control API's URL with --server, or remove the file if no local cluster runs", err)
	case err == nil && st.ControlURL != "":
		server = st.ControlURL
		// Of several orchestrators, the first that runs.
		for _, o := range st.Orchestrators {
			if cluster.Ours(o.PID) {
				server = o.ControlURL
				break
			}
		}
	default:
		server = "http://127.0.0.1:8001"
	}
	c.base = strings.TrimRight(server, "/")
	warnOnCommandLine(cmd, "token", "$EVOLVE_TOKEN")
	c.token = flagOrConfig(cmd, "token")
	if c.token == "" {
		c.token = os.Getenv("EVOLVE_TOKEN")
	}
	if c.token == "" && st != nil && st.ControlTokenFile != "" && st.ServesControl(c.base) {
		// The local cluster's own, which only its user may read.
		if b, err := os.ReadFile(st.ControlTokenFile); err == nil {
			c.token, c.tokenFile = strings.TrimSpace(string(b)), st.ControlTokenFile
		}
	}
	return c
}

// flagOrConfig reads a flag of cmd through the config (flag > env > file >
// default).
func flagOrConfig(cmd *cobra.Command, name string) string {
	return config.GetString(cfgKey(cmd) + "." + name)
}

// retryBudget is how long a command goes on asking an orchestrator that
// asks it to try again later (503 with Retry-After: no planner leader
// while the lease moves, which takes up to 5 s).
const retryBudget = 20 * time.Second

func (c *controlClient) do(ctx context.Context, method, path string, in, out any) error {
	if c.err != nil {
		return c.err
	}
	api := &controlapi.Client{Base: c.base, Token: c.token, HTTP: c.http, RetryFor: retryBudget}
	if c.note != nil {
		api.OnRetry = func(e *controlapi.Error) { fmt.Fprintf(c.note, "%s; trying again in %v\n", e.Message, e.RetryAfter) }
	}
	err := api.Do(ctx, method, path, in, out)
	var te *controlapi.TransportError
	if errors.As(err, &te) {
		hint := "is a cluster up? try 'evolve up'"
		var ve *tls.CertificateVerificationError
		if errors.As(err, &ve) {
			hint = "its certificate is not trusted here, or does not name this address: trust a private CA's with SSL_CERT_FILE=ca.pem"
		} else if st, serr := cluster.ReadLocalState(localDir()); serr == nil && st.ControlURL == c.base && !cluster.Ours(st.Orchestrator) {
			// The local cluster's record is there, its orchestrator not.
			hint = "the local cluster's orchestrator is gone (see " + filepath.Join(st.LogDir, "orchestrator.log") +
				"); 'evolve down' stops what it left, 'evolve up' starts a new one"
		}
		return &plainError{msg: fmt.Sprintf("cannot reach the orchestrator at %s: %s (%s)", c.base, netCause(te.Err), hint), err: te}
	}
	return err
}

// plainError is an error whose text is written for people, wrapping the
// error it came from for errors.Is and errors.As.
type plainError struct {
	msg string
	err error
}

func (e *plainError) Error() string { return e.msg }
func (e *plainError) Unwrap() error { return e.err }

// reachCause is an error of a control API call in words: a failure to
// connect as netCause says it, an answer as the API wrote it.
func reachCause(err error) string {
	var te *controlapi.TransportError
	if errors.As(err, &te) {
		return netCause(te.Err)
	}
	return err.Error()
}

// netCause says why a connection failed in words (networds.Cause).
func netCause(err error) string { return networds.Cause(err) }

// output writes v as -o asks: json, yaml, or through table for table/wide.
func output(cmd *cobra.Command, v any, table func(w *tabwriter.Writer, wide bool)) error {
	format := flagOrConfig(cmd, "output")
	w := cmd.OutOrStdout()
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false) // "a -> b", not "a -\u003e b"
		return enc.Encode(v)
	case "yaml":
		// Through JSON, so that field names match the JSON output.
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		var generic any
		if err := json.Unmarshal(b, &generic); err != nil {
			return err
		}
		return yaml.NewEncoder(w).Encode(generic)
	case "table", "wide", "":
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		table(tw, format == "wide")
		return tw.Flush()
	}
	return usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("-o %q: want table, wide, json or yaml", format)}
}

func addOutputFlag(cmd *cobra.Command, formats string) {
	cmd.Flags().StringP("output", "o", "table", "output format: "+formats)
}

func newHTTPClient(timeout time.Duration) *http.Client { return &http.Client{Timeout: timeout} }

// counted writes n and the noun, plural unless n is 1: "1 engine", "4 engines".
func counted(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// serverBase is an OpenAI-compatible server's base URL as given, without
// a trailing slash or the /v1 that OpenAI clients' base URLs end in.
func serverBase(url string) string {
	return strings.TrimSuffix(strings.TrimRight(url, "/"), "/v1")
}
