package client

import (
	"encoding/json"

	"github.com/agentrunner/runner/wire"
)

// Provider is the registry name of the runner adapter.
const Provider = "runner"

// decodeExit decodes an exit record: the Runner-Exit header of a stream
// body (an exit frame's payload goes through wire.Frame.Exit).
func decodeExit(b []byte) (wire.Exit, error) {
	var e wire.Exit
	err := json.Unmarshal(b, &e)
	return e, err
}
