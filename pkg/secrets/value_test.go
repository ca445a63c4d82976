package secrets

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

func TestValueNeverPrints(t *testing.T) {
	t.Parallel()
	v := ValueFromString(canary)
	type wrapper struct {
		Name  string
		Token Value
		Ptr   *Value
	}
	w := wrapper{Name: "n", Token: v, Ptr: &v}

	var outputs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3s", "%T"} {
		outputs = append(outputs, fmt.Sprintf(verb, v), fmt.Sprintf(verb, w), fmt.Sprintf(verb, &v))
	}
	outputs = append(outputs, fmt.Sprint(v), fmt.Sprintln(v), v.String(), v.GoString())

	j, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, string(j))
	txt, _ := v.MarshalText()
	outputs = append(outputs, string(txt))
	x, err := xml.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, string(x))

	var zl bytes.Buffer
	logger := zerolog.New(&zl)
	logger.Info().Interface("i", v).Stringer("s", v).Object("o", v).Any("a", w).EmbedObject(v).Msg("m")
	outputs = append(outputs, zl.String())

	var sl bytes.Buffer
	slog.New(slog.NewJSONHandler(&sl, nil)).Info("m", "v", v, "w", w)
	outputs = append(outputs, sl.String())

	for _, out := range outputs {
		if strings.Contains(out, "Kanar1e") || strings.Contains(out, "4b616e") || strings.Contains(out, "4B616E") {
			t.Errorf("value printed: %s", out)
		}
	}
	if !strings.Contains(string(j), `"Token":"[REDACTED]"`) {
		t.Errorf("JSON = %s", j)
	}
	if !strings.Contains(zl.String(), `"o":{"secret":"[REDACTED]"}`) {
		t.Errorf("zerolog = %s", zl.String())
	}
}

func TestValueAccessAndWipe(t *testing.T) {
	t.Parallel()
	buf := []byte("s3cret-value")
	v := NewValue(buf)
	cp := v // copies share the buffer
	if got := string(v.Bytes()); got != "s3cret-value" || v.Reveal() != "s3cret-value" || v.Len() != 12 || v.IsZero() {
		t.Fatalf("Bytes = %q", got)
	}
	cp.Wipe()
	if !bytes.Equal(buf, make([]byte, len(buf))) {
		t.Errorf("buffer not zeroed: %q", buf)
	}
	if v.Bytes() != nil || !v.IsZero() || v.Len() != 0 {
		t.Error("copy still holds the secret after Wipe")
	}
	v.Wipe() // again: no panic
	var zero Value
	zero.Wipe()
	if zero.Bytes() != nil || !zero.IsZero() {
		t.Error("zero Value not empty")
	}
}

func TestValueUnmarshalText(t *testing.T) {
	t.Parallel()
	var v Value
	in := []byte("from-env")
	if err := v.UnmarshalText(in); err != nil {
		t.Fatal(err)
	}
	in[0] = 'X'
	if v.Reveal() != "from-env" {
		t.Errorf("UnmarshalText kept the caller's buffer: %q", v.Reveal())
	}
}
