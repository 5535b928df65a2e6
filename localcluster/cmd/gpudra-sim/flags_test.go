package main

import (
	"errors"
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestDeprecatedForm: the flags without a command map onto the options of
// the command they name, and say once which command line to use instead.
func TestDeprecatedForm(t *testing.T) {
	for _, tc := range []struct {
		name, old, now, use string
	}{
		{"none", "", "up", "running without a subcommand is deprecated and will be removed in the next release; use: gpudra-sim up\n"},
		{"up", "--fleet gb200-nvl72 --keep-running --real-nodes 1 --settle-timeout 90s --v 3 --log-file sim.log",
			"up --fleet gb200-nvl72 --keep-running --real-nodes 1 --settle-timeout 1m30s --v 3 --log-file sim.log",
			"flags without a subcommand are deprecated and will be removed in the next release; use: gpudra-sim up --fleet gb200-nvl72 --keep-running --log-file sim.log --real-nodes 1 --settle-timeout 1m30s --v 3\n"},
		{"load with flags of up, ignored as before", "--load 400 --load-nodes 50 --load-mix mixed --load-rounds 2 --load-round-timeout 5m --load-baseline-driver b.example.com --load-dir /tmp --cpu-profile cpu.out --fleet demo",
			"load --pods 400 --nodes 50 --mix mixed --rounds 2 --round-timeout 5m --baseline-driver b.example.com --dir /tmp --cpu-profile cpu.out",
			"use: gpudra-sim load --cpu-profile cpu.out --pods 400 --baseline-driver b.example.com --dir /tmp --mix mixed --nodes 50 --round-timeout 5m0s --rounds 2\n"},
		{"--load 0 is up", "--load 0 --manifests 'my dir'", "up --manifests 'my dir'", `use: gpudra-sim up --manifests "my dir"` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr strings.Builder
			old, err := parse(fields(tc.old), &stderr)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(stderr.String(), "gpudra-sim: ") || !strings.HasSuffix(stderr.String(), tc.use) || strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("stderr %q, want one line ending %q", stderr.String(), tc.use)
			}
			stderr.Reset()
			now, err := parse(fields(tc.now), &stderr)
			if err != nil {
				t.Fatal(err)
			}
			if stderr.Len() > 0 {
				t.Errorf("the command form wrote %q", stderr.String())
			}
			if !reflect.DeepEqual(old, now) {
				t.Errorf("%q gives %+v,\n%q gives %+v", tc.old, old, tc.now, now)
			}
		})
	}
}

// fields splits a command line at spaces outside single quotes.
func fields(line string) []string {
	var out []string
	for i, part := range strings.Split(line, "'") {
		if i%2 == 1 {
			out = append(out, part)
			continue
		}
		out = append(out, strings.Fields(part)...)
	}
	return out
}

// TestCommandFlags: each command's -h lists all of its flags, and the
// flags land in its options.
func TestCommandFlags(t *testing.T) {
	for command, want := range map[string][]string{
		"up": {"fleet", "chart-values", "manifests", "events", "report", "keep-running", "kubeconfig", "settle-timeout",
			"real-nodes", "fleet-view", "log-file", "v"},
		"load": {"pods", "nodes", "mix", "rounds", "round-timeout", "baseline-driver", "dir", "cpu-profile",
			"cpu-profile-baseline", "cpu-profile-idle", "log-file", "v"},
	} {
		t.Run(command, func(t *testing.T) {
			var stderr strings.Builder
			if _, err := parse([]string{command, "-h"}, &stderr); !errors.Is(err, flag.ErrHelp) {
				t.Errorf("-h: %v, want flag.ErrHelp", err)
			}
			for _, name := range want {
				if !strings.Contains(stderr.String(), "\n  -"+name+" ") && !strings.Contains(stderr.String(), "\n  -"+name+"\n") {
					t.Errorf("%s -h does not list -%s:\n%s", command, name, stderr.String())
				}
			}
		})
	}
	inv, err := parse(fields("load --pods 16 --nodes 2 --rounds 1 --round-timeout 2m"), &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	inv2, err := parse(fields("up --kubernetes-version 1.34 --feature-gates DRAConsumableCapacity=true,DRADeviceTaints=false"), &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if o := inv2.up; o.KubernetesVersion != "1.34" || len(o.FeatureGates) != 2 || !o.FeatureGates["DRAConsumableCapacity"] || o.FeatureGates["DRADeviceTaints"] {
		t.Errorf("up options %+v", o)
	}
	if o := inv.load; inv.command != "load" || o.Pods != 16 || o.Nodes != 2 || o.Rounds != 1 || o.RoundTimeout != 2*time.Minute || o.Mix != "gpu" {
		t.Errorf("load options %+v", o)
	}
}

// TestParseRefuses: what the command line cannot mean is an error that
// names it, and -h alone lists the commands.
func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"down", `unknown command "down": want up or load`},
		{"load", "load: --pods 0: want 1 or more"},
		{"up extra", "up: unexpected arguments [extra]"},
		{"--fleet demo extra", "unexpected arguments [extra]"},
		{"up --load 3", "flag provided but not defined: -load"},
		{"up --feature-gates DRAPartitionableDevices=maybe", "--feature-gates: feature gates \"DRAPartitionableDevices=maybe\": DRAPartitionableDevices=\"maybe\": the value must be true or false"},
		{"up --feature-gates NoSuchGateAnywhere=true", `feature gate "NoSuchGateAnywhere": no such gate in Kubernetes`},
		{"-h", flag.ErrHelp.Error()},
	} {
		var stderr strings.Builder
		_, err := parse(fields(tc.line), &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.line, err, tc.want)
		}
		if tc.line == "-h" && !strings.Contains(stderr.String(), "Commands:\n  up ") {
			t.Errorf("-h wrote %q, want the commands", stderr.String())
		}
	}
}
