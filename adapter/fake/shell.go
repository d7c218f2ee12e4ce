package fake

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// proc is the goroutine that plays one command. It touches sandbox and
// session state only under driver.mu.
type proc struct {
	a        *driver
	sb       *sandbox
	s        *session
	trapTERM bool
}

// signaled unwinds the interpreter when a signal kills the process.
type signaled struct{ sig string }

func (e signaled) Error() string { return "killed by " + e.sig }

// exitNow unwinds the interpreter on the exit builtin.
type exitNow struct{ code int }

func (e exitNow) Error() string { return "exit " + strconv.Itoa(e.code) }

// main runs the command and records its exit after its last byte.
func (p *proc) main() {
	code, err := p.run()
	a, s := p.a, p.s
	a.mu.Lock()
	defer a.mu.Unlock()
	defer close(s.done)
	defer s.broadcast()
	if s.lost {
		return
	}
	var sig signaled
	switch {
	case errors.As(err, &sig):
		r := adapter.ReasonSignaled
		if s.terminating {
			r = adapter.ReasonTerminated
		}
		s.exit = &adapter.Exit{Code: -1, Signal: sig.sig, Reason: r}
	default:
		r := adapter.ReasonExited
		if s.terminating {
			r = adapter.ReasonTerminated
		}
		s.exit = &adapter.Exit{Code: code & 0xff, Reason: r}
	}
	if s.hidden {
		delete(p.sb.sessions, s.id)
	}
}

func (p *proc) run() (int, error) {
	c := p.s.cmd
	if (c.Path == "sh" || c.Path == "bash") && len(c.Args) == 2 && (c.Args[0] == "-c" || c.Args[0] == "-lc") {
		return p.script(c.Args[1])
	}
	if c.Path == "sh" || c.Path == "bash" {
		p.write(2, []byte(c.Path+": only -c SCRIPT is supported\n"))
		return 2, nil
	}
	code, err := p.simple(append([]string{c.Path}, c.Args...), redirs{})
	var ex exitNow
	if errors.As(err, &ex) {
		return ex.code, nil
	}
	return code, err
}

// write appends to stream i (0 stdout, 1 stderr) of the journal; a TTY
// session has one stream.
func (p *proc) write(i int, b []byte) {
	if len(b) == 0 {
		return
	}
	p.a.mu.Lock()
	defer p.a.mu.Unlock()
	if p.s.tty != nil {
		i = 0
	}
	p.s.out[i] = append(p.s.out[i], b...)
	p.s.broadcast()
}

// wait blocks until ch is closed, timer fires (either may be nil), or a
// signal kills the process.
func (p *proc) wait(ch <-chan struct{}, timer <-chan time.Time) error {
	term := (<-chan struct{})(p.s.term)
	if p.trapTERM {
		term = nil
	}
	select {
	case <-ch:
		return nil
	case <-timer:
		return nil
	case <-term:
		return signaled{sigTERM}
	case <-p.s.kill:
		return signaled{sigKILL}
	}
}

// pending returns a delivered, untrapped signal without blocking.
func (p *proc) pending() error {
	select {
	case <-p.s.kill:
		return signaled{sigKILL}
	default:
	}
	if !p.trapTERM {
		select {
		case <-p.s.term:
			return signaled{sigTERM}
		default:
		}
	}
	return nil
}

// readStdin returns the next stdin bytes, or io.EOF-like (nil, true).
func (p *proc) readStdin() ([]byte, bool, error) {
	for {
		p.a.mu.Lock()
		if len(p.s.stdin) > 0 {
			b := p.s.stdin
			p.s.stdin = nil
			p.a.mu.Unlock()
			return b, false, nil
		}
		if p.s.stdinClosed {
			p.a.mu.Unlock()
			return nil, true, nil
		}
		ch := p.s.changed
		p.a.mu.Unlock()
		if err := p.wait(ch, nil); err != nil {
			return nil, false, err
		}
	}
}

func (p *proc) sleep(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	return p.wait(nil, t.C)
}

// --- the script language ---

type token struct {
	op   string // ";", "&&", "||", or a redirection; "" for a word
	word string
}

var ops = []string{"&&", "||", "1>&2", "2>&1", ">&2", "2>", ">>", ">", "<", ";", "\n"}

func tokenize(src string) ([]token, error) {
	var toks []token
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			toks = append(toks, token{word: cur.String()})
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(src[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated '")
			}
			cur.WriteString(src[i+1 : i+1+j])
			inWord = true
			i += j + 2
			continue
		case c == '"':
			i++
			for ; i < len(src) && src[i] != '"'; i++ {
				if src[i] == '\\' && i+1 < len(src) && strings.IndexByte("\"\\$`", src[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(src[i])
			}
			if i >= len(src) {
				return nil, errors.New("unterminated \"")
			}
			inWord = true
			i++
			continue
		case c == ' ' || c == '\t':
			flush()
			i++
			continue
		}
		matched := false
		for _, op := range ops {
			// "1>&2" and "2>" are operators only at a word's start.
			if strings.HasPrefix(src[i:], op) && !(inWord && (op[0] == '1' || op[0] == '2')) {
				flush()
				if op == "\n" {
					op = ";"
				}
				toks = append(toks, token{op: op})
				i += len(op)
				matched = true
				break
			}
		}
		if !matched {
			cur.WriteByte(c)
			inWord = true
			i++
		}
	}
	flush()
	return toks, nil
}

type redirs struct {
	stdout, stderr string // "" keep; "&1" / "&2" a stream; else a file
	appendOut      bool
	stdin          string // "" stdin; else a file
}

func (p *proc) script(src string) (int, error) {
	toks, err := tokenize(src)
	if err != nil {
		p.write(1, []byte("sh: syntax error: "+err.Error()+"\n"))
		return 2, nil
	}
	status := 0
	skip := false
	var words []string
	var r redirs
	for i := 0; i <= len(toks); i++ {
		var t token
		if i < len(toks) {
			t = toks[i]
		} else {
			t = token{op: ";"}
		}
		switch t.op {
		case "":
			words = append(words, t.word)
		case ";", "&&", "||":
			if len(words) > 0 && !skip {
				code, err := p.simple(words, r)
				var ex exitNow
				if errors.As(err, &ex) {
					return ex.code, nil
				}
				if err != nil {
					return 0, err
				}
				status = code
			}
			words, r = nil, redirs{}
			skip = (t.op == "&&" && status != 0) || (t.op == "||" && status == 0)
		case "1>&2", ">&2":
			r.stdout = "&2"
		case "2>&1":
			r.stderr = "&1"
		case ">", ">>", "2>", "<":
			if i+1 >= len(toks) || toks[i+1].op != "" {
				p.write(1, []byte("sh: syntax error: "+t.op+" needs a file\n"))
				return 2, nil
			}
			i++
			switch t.op {
			case ">", ">>":
				r.stdout, r.appendOut = toks[i].word, t.op == ">>"
			case "2>":
				r.stderr = toks[i].word
			case "<":
				r.stdin = toks[i].word
			}
		}
		if err := p.pending(); err != nil {
			return 0, err
		}
	}
	return status, nil
}

// simple runs one builtin with its redirections.
func (p *proc) simple(argv []string, r redirs) (int, error) {
	emit := func(target string, deflt int, b []byte) {
		switch target {
		case "":
			p.write(deflt, b)
		case "&1":
			p.write(0, b)
		case "&2":
			p.write(1, b)
		default:
			p.a.mu.Lock()
			p.sb.files[target] = append(p.sb.files[target], b...)
			p.a.mu.Unlock()
		}
	}
	// A redirection creates its file; ">" and "2>" also truncate it.
	for _, f := range []struct {
		name  string
		trunc bool
	}{{r.stdout, !r.appendOut}, {r.stderr, true}} {
		if f.name == "" || f.name[0] == '&' {
			continue
		}
		p.a.mu.Lock()
		if _, ok := p.sb.files[f.name]; !ok || f.trunc {
			p.sb.files[f.name] = []byte{}
		}
		p.a.mu.Unlock()
	}
	stdout := func(b []byte) { emit(r.stdout, 0, b) }
	stderr := func(b []byte) {
		if r.stderr == "&1" {
			emit(r.stdout, 0, b)
			return
		}
		emit(r.stderr, 1, b)
	}
	readFile := func(name string) ([]byte, bool) {
		p.a.mu.Lock()
		defer p.a.mu.Unlock()
		b, ok := p.sb.files[name]
		return append([]byte(nil), b...), ok
	}
	name, args := argv[0], argv[1:]
	switch name {
	case "true", ":":
		return 0, nil
	case "false":
		return 1, nil
	case "exit":
		code := 0
		if len(args) > 0 {
			n, err := strconv.Atoi(args[0])
			if err != nil {
				stderr([]byte("sh: exit: " + args[0] + ": numeric argument required\n"))
				return 0, exitNow{2}
			}
			code = n
		}
		return 0, exitNow{code & 0xff}
	case "echo":
		nl := "\n"
		if len(args) > 0 && args[0] == "-n" {
			args, nl = args[1:], ""
		}
		stdout([]byte(strings.Join(args, " ") + nl))
		return 0, nil
	case "printf":
		if len(args) == 0 {
			stderr([]byte("printf: usage: printf FORMAT [ARGS]\n"))
			return 2, nil
		}
		stdout([]byte(printf(args[0], args[1:])))
		return 0, nil
	case "seq":
		n, err := strconv.Atoi(firstOr(args, ""))
		if err != nil {
			stderr([]byte("seq: invalid count\n"))
			return 1, nil
		}
		var b strings.Builder
		for i := 1; i <= n; i++ {
			fmt.Fprintf(&b, "%d\n", i)
		}
		stdout([]byte(b.String()))
		return 0, nil
	case "cat":
		if r.stdin != "" {
			args = append(args, r.stdin)
		}
		if len(args) == 0 {
			for {
				b, eof, err := p.readStdin()
				if err != nil {
					return 0, err
				}
				if eof {
					return 0, nil
				}
				stdout(b)
			}
		}
		status := 0
		for _, f := range args {
			b, ok := readFile(f)
			if !ok {
				stderr([]byte("cat: " + f + ": No such file or directory\n"))
				status = 1
				continue
			}
			stdout(b)
		}
		return status, nil
	case "rm":
		p.a.mu.Lock()
		for _, f := range args {
			delete(p.sb.files, f)
		}
		p.a.mu.Unlock()
		return 0, nil
	case "sleep":
		secs, err := strconv.ParseFloat(firstOr(args, ""), 64)
		if err != nil || secs < 0 {
			stderr([]byte("sleep: invalid time interval\n"))
			return 1, nil
		}
		return 0, p.sleep(time.Duration(secs * float64(time.Second)))
	case "tick":
		if len(args) != 2 {
			stderr([]byte("tick: usage: tick N INTERVAL\n"))
			return 2, nil
		}
		n, err1 := strconv.Atoi(args[0])
		d, err2 := parseInterval(args[1])
		if err1 != nil || err2 != nil {
			stderr([]byte("tick: bad N or INTERVAL\n"))
			return 2, nil
		}
		for i := 1; i <= n; i++ {
			if err := p.sleep(d); err != nil {
				return 0, err
			}
			stdout([]byte("tick " + strconv.Itoa(i) + "\n"))
		}
		return 0, nil
	case "probe":
		host := firstOr(args, "")
		p.a.mu.Lock()
		ok := host != "" && p.sb.allowed(host)
		p.a.mu.Unlock()
		if !ok {
			stderr([]byte("probe: " + host + ": connection refused by egress policy\n"))
			return 7, nil
		}
		stdout([]byte("probe: " + host + ": connected\n"))
		return 0, nil
	case "trap":
		if len(args) == 2 && args[1] == "TERM" {
			p.trapTERM = args[0] == ""
			return 0, nil
		}
		stderr([]byte("trap: only trap '' TERM and trap - TERM\n"))
		return 2, nil
	case "kill":
		if len(args) == 2 && args[1] == "$$" && strings.HasPrefix(args[0], "-") {
			sig := strings.TrimPrefix(strings.TrimPrefix(args[0], "-"), "SIG")
			if sig == "TERM" && p.trapTERM {
				return 0, nil
			}
			return 0, signaled{"SIG" + sig}
		}
		stderr([]byte("kill: only kill -SIG $$\n"))
		return 2, nil
	case "stty":
		p.a.mu.Lock()
		tty := p.s.tty
		var size adapter.TTYSize
		if tty != nil {
			size = *tty
		}
		p.a.mu.Unlock()
		if tty == nil || len(args) != 1 || args[0] != "size" {
			stderr([]byte("stty: standard input: Not a tty\n"))
			return 1, nil
		}
		stdout(fmt.Appendf(nil, "%d %d\n", size.Rows, size.Cols))
		return 0, nil
	}
	stderr([]byte("sh: " + name + ": not found\n"))
	return 127, nil
}

func firstOr(args []string, d string) string {
	if len(args) > 0 {
		return args[0]
	}
	return d
}

func parseInterval(s string) (time.Duration, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	return time.Duration(f * float64(time.Second)), err
}

// printf implements %s %d %% and the escapes \n \t \\.
func printf(format string, args []string) string {
	var b strings.Builder
	next := func() string {
		if len(args) == 0 {
			return ""
		}
		a := args[0]
		args = args[1:]
		return a
	}
	for i := 0; i < len(format); i++ {
		c := format[i]
		switch {
		case c == '\\' && i+1 < len(format):
			i++
			switch format[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			default:
				b.WriteByte(format[i])
			}
		case c == '%' && i+1 < len(format):
			i++
			switch format[i] {
			case 's':
				b.WriteString(next())
			case 'd':
				n, _ := strconv.Atoi(next())
				b.WriteString(strconv.Itoa(n))
			default:
				b.WriteByte(format[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
