package sandboxes

import "testing"

// TestWithSandboxUser pins the copy of the user database: the host's
// lines kept byte for byte (a last line without its newline gets one), an
// entry that would shadow the sandbox's (its name, or its id) dropped, and
// the sandbox's entry appended.
func TestWithSandboxUser(t *testing.T) {
	passwd := "root:x:0:0:root:/root:/bin/bash\n" +
		"sandbox:x:1000:1000:an operator's own:/home/sandbox:/bin/sh\n" +
		"old:x:7000:7000::/nonexistent:/usr/sbin/nologin\n" +
		"# a comment\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"
	got := string(withSandboxUser([]byte(passwd), false, 7000, 7001, "/ws/box", "/bin/sh"))
	want := "root:x:0:0:root:/root:/bin/bash\n" +
		"# a comment\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" +
		"sandbox:x:7000:7001:sandbox:/ws/box:/bin/sh\n"
	if got != want {
		t.Errorf("passwd:\n%s\nwant:\n%s", got, want)
	}
	group := "root:x:0:\nsandbox:x:1000:\nclash:x:7001:alice\nusers:x:100:\n"
	got = string(withSandboxUser([]byte(group), true, 7000, 7001, "/ws/box", "/bin/sh"))
	want = "root:x:0:\nusers:x:100:\nsandbox:x:7001:\n"
	if got != want {
		t.Errorf("group:\n%s\nwant:\n%s", got, want)
	}
}
