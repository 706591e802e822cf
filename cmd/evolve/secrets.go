package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// readSecretFile is the secret in file path: its content without the
// surrounding white space. An empty file is an error, not "no secret".
func readSecretFile(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("--%s: %s is empty", flag, path)
	}
	if strings.ContainsAny(s, "\n\r") {
		return "", fmt.Errorf("--%s: %s holds more than one line; want the token alone", flag, path)
	}
	return s, nil
}

// secretFromFile sets command's key (a flag that holds a secret) from the
// file its companion flag names, and warns when the secret itself was given
// on the command line, where ps shows it to every user of the machine.
func secretFromFile(cmd *cobra.Command, command, key, fileFlag string) error {
	if cmd.Flags().Changed(key) && cmd.Flags().Changed(fileFlag) {
		return fmt.Errorf("--%s and --%s both give the secret; keep one", key, fileFlag)
	}
	if path := config.GetString(command + "." + fileFlag); path != "" {
		s, err := readSecretFile(fileFlag, path)
		if err != nil {
			return err
		}
		config.Set(command+"."+key, s)
		return nil
	}
	if cmd.Flags().Changed(key) && config.GetString(command+"."+key) != "" {
		slog.Warn(fmt.Sprintf("--%s on the command line shows in ps to every user of this machine; use $%s or --%s", key, envName(command+"."+key), fileFlag))
	}
	return nil
}

// natsURLWithToken is u with token as its user, the way NATS takes a
// token in its URL; u must not carry one of its own. Of a list of
// servers (comma-separated), each gets it.
func natsURLWithToken(u, token string) (string, error) {
	if strings.Contains(u, ",") {
		var out []string
		for _, one := range strings.Split(u, ",") {
			w, err := natsURLWithToken(strings.TrimSpace(one), token)
			if err != nil {
				return "", err
			}
			out = append(out, w)
		}
		return strings.Join(out, ","), nil
	}
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		return "", fmt.Errorf("--nats %q: want nats://HOST:PORT or tls://HOST:PORT", u)
	}
	if p.User != nil {
		return "", errors.New("--nats carries a token and --nats-token-file gives another; keep one")
	}
	p.User = url.User(token)
	return p.String(), nil
}

// engineNATSSecret takes the engine's event-plane token from
// --nats-token-file into its URL, and warns when --nats carries one on the
// command line.
func engineNATSSecret(cmd *cobra.Command) error {
	u := config.GetString("engine.nats")
	if path := config.GetString("engine.nats-token-file"); path != "" {
		if u == "" {
			return errors.New("--nats-token-file without --nats: no event plane to present it to")
		}
		tok, err := readSecretFile("nats-token-file", path)
		if err != nil {
			return err
		}
		withToken, err := natsURLWithToken(u, tok)
		if err != nil {
			return err
		}
		config.Set("engine.nats", withToken)
		return nil
	}
	if cmd.Flags().Changed("nats") {
		if p, err := url.Parse(u); err == nil && p.User != nil {
			slog.Warn("--nats with a token on the command line shows it in ps to every user of this machine; use $EVOLVE_ENGINE_NATS or --nats-token-file")
		}
	}
	return nil
}

// checkNATSCreds checks command's --nats-creds: given with --nats, a
// readable NATS credentials file (a user JWT and its nkey seed), and
// warns when others may read the seed in it.
func checkNATSCreds(command string) error {
	path := config.GetString(command + ".nats-creds")
	if path == "" {
		return nil
	}
	if config.GetString(command+".nats") == "" {
		return errors.New("--nats-creds without --nats: no NATS server to present them to")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--nats-creds: %w", err)
	}
	if !strings.Contains(string(b), "-----BEGIN NATS USER JWT-----") || !strings.Contains(string(b), "-----BEGIN USER NKEY SEED-----") {
		return fmt.Errorf("--nats-creds: %s is not a NATS credentials file (a user JWT and its nkey seed, as 'nsc generate creds' writes)", path)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		slog.Warn("--nats-creds: other users of this machine may read the key in the credentials file; chmod 600 it", "file", path, "mode", fi.Mode().Perm().String())
	}
	return nil
}
