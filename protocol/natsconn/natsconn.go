// Package natsconn turns the event plane's address as an operator gives
// it into what the NATS client dials: comma-separated nats:// or tls://
// URLs that may carry a token (nats://TOKEN@host:port) or a user and
// password, and an optional credentials file (--nats-creds, made by
// `nsc generate creds`). Engines and orchestrators that attach to an
// existing NATS both connect through it.
package natsconn

import (
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
)

// Options returns the servers to dial (the URLs without user info, comma
// separated) and the options that present their credentials.
//
// The credentials go as options rather than in the URLs, so that the
// servers the client learns of from the cluster, whose URLs carry none,
// get them too. An authorization error while reconnecting is tried
// again, not the end of the connection: a server of the cluster that
// restarts may refuse a client for a moment, and by default the client
// gives up after the same error twice, which would leave an engine off
// the event plane for good.
func Options(urls, credsFile string) (servers string, opts []nats.Option) {
	clean, user, password, token := Credentials(urls)
	opts = []nats.Option{nats.IgnoreAuthErrorAbort()}
	switch {
	case token != "":
		opts = append(opts, nats.Token(token))
	case user != "":
		opts = append(opts, nats.UserInfo(user, password))
	}
	if credsFile != "" {
		opts = append(opts, nats.UserCredentials(credsFile))
	}
	return strings.Join(clean, ","), opts
}

// Credentials splits the credentials off a comma-separated list of NATS
// URLs: the URLs without user info, and the token (nats://TOKEN@...) or
// user and password (nats://USER:PASS@...) of the first URL that has them.
func Credentials(urls string) (clean []string, user, password, token string) {
	found := false
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil || u.User == nil {
			clean = append(clean, raw)
			continue
		}
		if !found {
			found = true
			if p, ok := u.User.Password(); ok {
				user, password = u.User.Username(), p
			} else {
				token = u.User.Username()
			}
		}
		u.User = nil
		clean = append(clean, u.String())
	}
	return clean, user, password, token
}
