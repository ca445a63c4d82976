package console

import "testing"

func TestAnsiHTML(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "ok: [web-1]", "ok: [web-1]"},
		{"markup escaped", "<img src=x>", "&lt;img src=x&gt;"},
		{"a colour", "\x1b[0;32mok: [web-1]\x1b[0m done", `<span class="ansi-32">ok: [web-1]</span> done`},
		{"bold red, unclosed", "\x1b[1;31mfatal <b>", `<span class="ansi-1 ansi-31">fatal &lt;b&gt;</span>`},
		{"other sequences dropped", "line\x1b[Kend\x1b[?25h", "lineend"},
		{"colour to colour", "\x1b[33ma\x1b[34mb", `<span class="ansi-33">a</span><span class="ansi-34">b</span>`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(ansiHTML(tc.in)); got != tc.want {
				t.Errorf("ansiHTML(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestLogLines(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"empty", "", nil},
		{"final break", "a\nb\n", []string{"a", "b"}},
		{"crlf and colours per line", "\x1b[32mok\x1b[0m\r\n<b>", []string{`<span class="ansi-32">ok</span>`, "&lt;b&gt;"}},
		{"blank lines kept", "a\n\nb", []string{"a", "", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := logLines(tc.in)
			if len(got) != len(tc.want) {
				t.Fatalf("logLines(%q) = %d lines, want %d", tc.in, len(got), len(tc.want))
			}
			for i, l := range got {
				if l.N != i+1 || string(l.HTML) != tc.want[i] {
					t.Errorf("line %d = %d %q, want %d %q", i, l.N, l.HTML, i+1, tc.want[i])
				}
			}
		})
	}
}
