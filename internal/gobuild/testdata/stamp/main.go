// Command stamp prints the version it was built with, for gobuild's test.
package main

import (
	"fmt"

	"github.com/agentrunner/runner/version"
)

func main() { fmt.Print(version.Version) }
