package apierr

import (
	"testing"

	"github.com/agentrunner/runner/wire"
)

// TestErrorStatusesFromTable: every constructor's status is one the error
// table lists for its code, and a code's default status is the table's.
func TestErrorStatusesFromTable(t *testing.T) {
	for _, ae := range []*Error{
		Invalid("x"), Conflict("x"), TooLarge(1), NotFound("x"), NotSupported("x"),
		Unavailable("x"), Uncertain("x"), CommandExited(), Truncated("x"), Denied, NoRoute,
		WriteFailed("x"), Provider("x"),
	} {
		row, ok := wire.RowOf(ae.Code)
		if !ok {
			t.Errorf("%v: code %s is not in wire.ErrorTable", ae, ae.Code)
			continue
		}
		found := false
		for _, s := range row.Statuses {
			found = found || s == ae.Status
		}
		if !found {
			t.Errorf("%v: status %d is not one of %v, the table's statuses for %s", ae, ae.Status, row.Statuses, ae.Code)
		}
	}
}
