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
		&command{name: "checkpoint", args: "NAME [-m COMMENT] | export NAME ID [--base ID] | import NAME", min: 1, max: 3,
			short: "checkpoint a sandbox's disk (its processes frozen meanwhile); export, import",
			long: `Prints the checkpoint's id. The sandbox's processes are frozen while its disk
is read and continue after; sessions lose no output. Storage is deduplicated:
a second checkpoint after a small change stores little.
--json prints the checkpoint object.

runner checkpoint export NAME ID writes checkpoint ID of sandbox NAME to stdout
as an archive (never to a terminal); --base ID2 leaves out what checkpoint ID2
holds, for a receiver that imported ID2 already (one without it refuses the
archive). runner checkpoint import NAME reads an archive from stdin into
sandbox NAME's checkpoints and prints the checkpoint's id (--json: the object);
every file of it then belongs to NAME's user, setuid bits cleared. A
corrupted or truncated archive fails restore_failed with nothing kept.
Examples:
  id=$(runner checkpoint web-1 -m "before the migration")
  runner checkpoint export web-1 "$id" | ssh host2 runner checkpoint import web-1`,
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
	base := fs.String("base", "", "export: leave out what this checkpoint (held by the receiver) holds")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		// By the count of arguments: a sandbox may be named export or
		// import, and "runner checkpoint export" checkpoints it.
		switch {
		case len(pos) == 3 && pos[0] == "export":
			return exportCheckpoint(ctx, e, pos[1], pos[2], *base)
		case len(pos) == 2 && pos[0] == "import":
			return importCheckpoint(ctx, e, pos[1])
		case len(pos) != 1:
			return usagef("checkpoint", "want NAME, export NAME ID, or import NAME; got %q", pos)
		case *base != "":
			return usagef("checkpoint", "--base is for checkpoint export")
		}
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

// exportCheckpoint writes checkpoint id of sandbox name to stdout as an
// archive.
func exportCheckpoint(ctx context.Context, e *env, name, id, base string) error {
	if term.IsTerminal(int(e.io.out.Fd())) {
		return usagef("checkpoint", "stdout is a terminal: redirect the archive to a file or a pipe")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	defer e.progress("exporting " + id + " of " + name)()
	if _, err := c.ExportCheckpoint(ctx, name, id, e.io.out, base); err != nil {
		return fail("checkpoint export "+name, err)
	}
	return nil
}

// importCheckpoint reads an archive from stdin into sandbox name's
// checkpoints and prints the checkpoint's id.
func importCheckpoint(ctx context.Context, e *env, name string) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	stop := e.progress("importing into " + name)
	ck, _, err := c.ImportCheckpoint(ctx, name, e.io.in)
	stop()
	if err != nil {
		return fail("checkpoint import "+name, err)
	}
	if e.g.json {
		return e.printJSON(ck)
	}
	fmt.Fprintln(e.io.out, ck.ID)
	return nil
}
