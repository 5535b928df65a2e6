// Command printversion prints version.Get() as JSON; the tests build it
// with -ldflags -X to check the variable paths that release builds stamp.
package main

import (
	"encoding/json"
	"os"

	"github.com/gpudra/gpudra/pkg/version"
)

func main() {
	if err := json.NewEncoder(os.Stdout).Encode(version.Get()); err != nil {
		os.Exit(1)
	}
}
