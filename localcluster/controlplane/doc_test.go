package controlplane

import "testing"

func TestBuild(t *testing.T) {}
