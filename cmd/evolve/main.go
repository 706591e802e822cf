// Command evolve is the operator's tool and every process of an evolve
// cluster: `evolve engine` serves a model replica, and the commands added
// beside it bring clusters up, watch and steer them.
//
// Exit codes: 0 success, 1 error, 2 usage error (bad flag or argument),
// 3 partial failure (some hosts or nodes failed).
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// run executes the command line and returns the process exit code.
func run(args []string) int {
	root := newRootCmd()
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, "error:", err)
	var ue usageError
	if strings.HasPrefix(err.Error(), "unknown command") {
		ue = usageError{cmd: "evolve", err: err}
	}
	if errors.As(err, &ue) || ue.err != nil {
		fmt.Fprintf(os.Stderr, "run '%s --help' for usage\n", ue.cmd)
		return 2
	}
	var ec exitCodeError
	if errors.As(err, &ec) {
		return ec.code
	}
	return 1
}

// usageError is a mistake in how a command was called.
type usageError struct {
	cmd string
	err error
}

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitCodeError carries a specific exit code.
type exitCodeError struct {
	code int
	err  error
}

func (e exitCodeError) Error() string { return e.err.Error() }
func (e exitCodeError) Unwrap() error { return e.err }
