package protocol

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestEngineTokenComesFromTheEventPlanesURL(t *testing.T) {
	for url, want := range map[string]string{
		"nats://s3cret@10.0.0.1:4222": "s3cret",
		"tls://s3cret@orch:4222":      "s3cret",
		"nats://user:pass@orch:4222":  "", // a user and password, not a token
		"nats://orch:4222":            "",
		"":                            "",
		"::not a url":                 "",
		// Several orchestrators' servers, as NATS takes them.
		"nats://s3cret@a:4222,nats://s3cret@b:4222": "s3cret",
	} {
		t.Run(url, func(t *testing.T) {
			if got := EngineToken(url); got != want {
				t.Errorf("EngineToken(%q) = %q, want %q", url, got, want)
			}
		})
	}
}

func TestBearerTransportSendsTheTokenUnlessTheRequestHasOne(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	with := &http.Client{Transport: &BearerTransport{Token: "tok"}}
	without := &http.Client{Transport: &BearerTransport{}}

	plain, _ := http.NewRequest("GET", srv.URL, nil)
	own, _ := http.NewRequest("GET", srv.URL, nil)
	own.Header.Set("Authorization", "Bearer mine")
	for i, c := range []struct {
		client *http.Client
		req    *http.Request
	}{{with, plain}, {with, own}, {without, plain}} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			resp, err := c.client.Do(c.req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		})
	}
	want := []string{"Bearer tok", "Bearer mine", ""}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Authorization sent: %q, want %q", got, want)
		}
	}
	if plain.Header.Get("Authorization") != "" {
		t.Fatal("the transport wrote the token into the caller's request")
	}
}

// The bearer scheme is the same in any case (RFC 7235): "bearer TOKEN"
// and "BEARER TOKEN" carry TOKEN as "Bearer TOKEN" does; another scheme,
// or no token, carries none.
func TestBearerTokenTakesTheSchemeInAnyCase(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer t0k": "t0k", "bearer t0k": "t0k", "BEARER t0k": "t0k", "Bearer  t0k": "t0k",
		"t0k": "", "Basic dTpw": "", "Bearer": "", "Bearer ": "", "": "", "Bearert0k": "",
	} {
		got, ok := BearerToken(header)
		if got != want || ok != (want != "") {
			t.Errorf("BearerToken(%q) = %q, %v; want %q", header, got, ok, want)
		}
	}
}
