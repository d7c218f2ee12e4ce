package cli

// Checkpoints of a sandbox's disk: checkpoint, checkpoints and restore.

import (
	"context"
	"flag"
	"fmt"
	"time"

	units "github.com/docker/go-units"
	"golang.org/x/term"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

func init() {
	commands = append(commands,
		&command{name: "checkpoint", args: "NAME [-m COMMENT]", min: 1, max: 1,
			short: "checkpoint a sandbox's disk (its processes frozen meanwhile)",
			long: `Prints the checkpoint's id. The sandbox's processes are frozen while its disk
is read and continue after; sessions lose no output. Storage is deduplicated:
a second checkpoint after a small change stores little.
--json prints the checkpoint object.
Example:
  id=$(runner checkpoint web-1 -m "before the migration")`,
			setup: checkpointCmd},
		&command{name: "checkpoints", args: "NAME", min: 1, max: 1,
			short: "list a sandbox's checkpoints, oldest first",
			long: `Columns: id, created, size of the files, bytes it added to storage (both in
units of 1024: KiB, MiB, GiB; --json has the exact bytes), comment.`,
			setup: checkpointsCmd},
		&command{name: "restore", args: "NAME ID", min: 2, max: 2,
			short: "replace a sandbox's disk with a checkpoint (parks and resumes it)",
			long: `A running sandbox is parked first (its sessions end as runner suspend ends
them; their logs stay), its disk replaced in one swap, then resumed. A
corrupted checkpoint fails restore_failed with the disk unchanged.`,
			setup: restoreCmd},
	)
}

// progress shows, on a terminal only and only after a second, what is
// being waited for and for how long, rewritten every second; stop clears
// it. (runnerd does not report a fraction done: elapsed time is what is
// known.)
func (e *env) progress(what string) (stop func()) {
	if !term.IsTerminal(int(e.io.err.Fd())) {
		return func() {}
	}
	start := time.Now()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		shown := false
		for {
			select {
			case <-done:
				if shown {
					fmt.Fprint(e.io.err, "\r\033[K")
				}
				return
			case <-tick.C:
				fmt.Fprintf(e.io.err, "\rrunner: %s... %s", what, time.Since(start).Truncate(time.Second))
				shown = true
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

func checkpointCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	comment := fs.String("m", "", "a comment stored with the checkpoint")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		c, err := e.client()
		if err != nil {
			return err
		}
		defer e.progress("checkpointing " + pos[0])()
		ck, err := c.CreateCheckpoint(ctx, pos[0], *comment)
		if err != nil {
			return fail("checkpoint "+pos[0], err)
		}
		if e.g.json {
			return e.printJSON(ck)
		}
		fmt.Fprintln(e.io.out, ck.ID)
		return nil
	}
}

func checkpointsCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	return withClient(func(ctx context.Context, e *env, c *client.Client, pos []string) error {
		list, err := c.Checkpoints(ctx, pos[0])
		if err != nil {
			return fail("checkpoints "+pos[0], err)
		}
		return printList(e, listForm{}, listing[wire.Checkpoint]{
			items:  list,
			json:   wire.Checkpoints{Checkpoints: list},
			header: "ID\tCREATED\tSIZE\tSTORED\tCOMMENT",
			row: func(ck wire.Checkpoint) []string {
				return []string{ck.ID, when(ck.Created), units.BytesSize(float64(ck.Size)), units.BytesSize(float64(ck.StoredBytes)), ck.Comment}
			},
		})
	})
}

func restoreCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	return func(ctx context.Context, e *env, pos, _ []string) error {
		c, err := e.client()
		if err != nil {
			return err
		}
		defer e.progress("restoring " + pos[0] + " from " + pos[1])()
		sb, err := c.RestoreCheckpoint(ctx, pos[0], pos[1])
		if err != nil {
			return fail("restore "+pos[0], err)
		}
		if e.g.json {
			return e.printJSON(sb)
		}
		fmt.Fprintf(e.io.out, "%s restored from %s, %s\n", sb.Name, pos[1], sb.State)
		return nil
	}
}
