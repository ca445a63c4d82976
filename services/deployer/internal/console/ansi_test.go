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
