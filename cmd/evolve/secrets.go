package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// checkPrivate refuses the file of a secret (a token, API keys, a private
// key) that other users of the machine may read or change, as ssh refuses
// such a private key: a secret they may read is theirs too, and a warning
// scrolls by unread. As ssh, it looks only at files of the user evolve
// runs as: one another owns (root's, readable by a group) is that owner's
// to guard.
func checkPrivate(flag, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	mode := fi.Mode().Perm()
	st, ok := fi.Sys().(*syscall.Stat_t)
	if mode&0o077 != 0 && (!ok || int(st.Uid) == os.Geteuid()) {
		return fmt.Errorf("--%s: other users of this machine may read %s (mode %04o), which holds a secret: chmod 600 %s (ssh refuses a private key so open, and so does evolve)",
			flag, path, mode, path)
	}
	return nil
}

// warnOnCommandLine warns when cmd's flag, which holds a secret, was given
// on the command line, where ps shows it to every user of the machine;
// instead says where it belongs.
func warnOnCommandLine(cmd *cobra.Command, flag, instead string) {
	if f := cmd.Flags().Lookup(flag); f != nil && f.Changed && f.Value.String() != "" && f.Value.String() != "[]" {
		slog.Warn(fmt.Sprintf("--%s on the command line shows in ps to every user of this machine; use %s", flag, instead))
	}
}

// readSecretFile is the secret in file path: its content without the
// surrounding white space. An empty file is an error, not "no secret",
// and so is a file others may read (checkPrivate).
func readSecretFile(flag, path string) (string, error) {
	if err := checkPrivate(flag, path); err != nil {
		return "", err
	}
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
// readable NATS credentials file (a user JWT and its nkey seed), which
// others may not read (the seed is a private key: checkPrivate).
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
	return checkPrivate("nats-creds", path)
}
