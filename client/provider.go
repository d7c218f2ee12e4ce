package client

import (
	"encoding/json"

	"github.com/agentrunner/runner/wire"
)

// Provider is the registry name of the runner adapter.
const Provider = "runner"

// exitRecord is the wire exit record plus a field a future daemon may add
// to say the end was asked for (terminate, suspend, destroy). The client
// honours it when present and tracks terminations itself otherwise.
type exitRecord struct {
	wire.Exit
	Terminated bool `json:"terminated,omitempty"`
}

func decodeExit(b []byte) (exitRecord, error) {
	var e exitRecord
	err := json.Unmarshal(b, &e)
	return e, err
}
