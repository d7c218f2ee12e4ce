//go:build linux && cgo

// The pod join before the Go runtime (see doc.go).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_TASKS 16

static void podjoin_fail(int report, const char *step) {
	int e = errno;
	dprintf(report, "error %d setup %s\n", e, step);
	_exit(127);
}

static int next_int(const char **s, long *out) {
	char *end;
	errno = 0;
	*out = strtol(*s, &end, 10);
	if (errno || end == *s || (*end != ',' && *end != '\0'))
		return -1;
	*s = *end == ',' ? end + 1 : end;
	return 0;
}

__attribute__((constructor)) static void runner_podjoin(void) {
	const char *v = getenv("_RUNNER_PODJOIN");
	if (v == NULL)
		return;
	long pidfd, uid, gid, report, tasks[MAX_TASKS];
	int ntasks = 0;
	const char *s = v;
	if (next_int(&s, &pidfd) || next_int(&s, &uid) || next_int(&s, &gid) || next_int(&s, &report))
		_exit(127); /* no report descriptor to say it on: the shim sees EOF */
	while (*s != '\0') {
		if (ntasks == MAX_TASKS || next_int(&s, &tasks[ntasks]))
			podjoin_fail(report, "nsexec: parse the pod join");
		ntasks++;
	}
	unsetenv("_RUNNER_PODJOIN");

	for (int i = 0; i < ntasks; i++) {
		if (write(tasks[i], "0", 1) != 1)
			podjoin_fail(report, "nsexec: join cgroup v1 (tasks)");
		close(tasks[i]);
	}
	if (setns(pidfd, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | CLONE_NEWNET) < 0)
		podjoin_fail(report, "nsexec: join the pod");
	close(pidfd);
	if (setgroups(0, NULL) < 0)
		podjoin_fail(report, "nsexec: setgroups in the pod");
	if (setresgid(gid, gid, gid) < 0)
		podjoin_fail(report, "nsexec: setgid in the pod");
	if (setresuid(uid, uid, uid) < 0)
		podjoin_fail(report, "nsexec: setuid in the pod");

	int gate[2];
	if (pipe2(gate, O_CLOEXEC) < 0)
		podjoin_fail(report, "nsexec: make the pod gate");
	/* fork(2)'s semantics (a copy of this stack) with CLONE_PARENT: the
	 * child's parent is the shim. */
	long child = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0);
	if (child < 0)
		podjoin_fail(report, "nsexec: fork in the pod");
	if (child == 0) {
		char c;
		close(gate[1]);
		/* EOF once the parent wrote the pid line: the report's order. */
		while (read(gate[0], &c, 1) < 0 && errno == EINTR)
			;
		close(gate[0]);
		return; /* into the Go runtime: the helper's remaining steps */
	}
	dprintf(report, "pod %ld\n", child);
	_exit(0);
}
