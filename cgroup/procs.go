package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// walkProcs calls fn for every pid in cgroup.procs of dir and the cgroups
// below it. A directory that vanishes meanwhile is skipped; dir absent
// lists nothing.
func walkProcs(dir string, fn func(pid int)) error {
	f, err := os.Open(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pid, err := strconv.Atoi(sc.Text())
		if err != nil {
			f.Close()
			return fmt.Errorf("parse %s: %w", f.Name(), err)
		}
		fn(pid)
	}
	err = sc.Err()
	f.Close()
	if err != nil {
		return fmt.Errorf("read %s: %w", f.Name(), err)
	}
	children, err := listDirs(dir)
	if err != nil {
		return err
	}
	for _, c := range children {
		if err := walkProcs(filepath.Join(dir, c), fn); err != nil {
			return err
		}
	}
	return nil
}
