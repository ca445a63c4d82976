package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// apiClient talks to the deployer's API.
type apiClient struct {
	base, key string
	http      *http.Client
}

// DefaultAPIURL is where the commands of the deployer's API (job,
// template, schedule, trigger) find it unless AUTOPROV_API_URL says
// otherwise (the deployer's default API_ADDR).
const DefaultAPIURL = "http://127.0.0.1:8080"

// api returns a client of the deployer's API with the key of
// AUTOPROV_API_KEY (environment or env file, never the command line).
func (g *globals) api() (*apiClient, error) {
	key := g.getenv("AUTOPROV_API_KEY")
	if key == "" {
		return nil, usageError{errors.New("AUTOPROV_API_KEY is not set: an API key of the deployer with the command's scopes (`deployer keys create --scopes jobs:write,templates:write,templates:launch --project ID`)")}
	}
	base := g.getenv("AUTOPROV_API_URL")
	if base == "" {
		base = DefaultAPIURL
	}
	return &apiClient{base: strings.TrimSuffix(base, "/"), key: key, http: &http.Client{}}, nil
}

// apiError is a problem the API answered.
type apiError struct {
	Status int
	Body   []byte
}

func (e *apiError) Error() string {
	var p struct {
		Title  string `json:"title"`
		Detail string `json:"detail"`
		Errors []struct {
			Field, Message string
		} `json:"errors"`
	}
	msg := fmt.Sprintf("HTTP %d", e.Status)
	if json.Unmarshal(e.Body, &p) == nil {
		switch {
		case p.Detail != "":
			msg += ": " + printable(p.Detail)
		case p.Title != "":
			msg += ": " + printable(p.Title)
		}
		// One line a field: a 422 names each field the API refused.
		for _, f := range p.Errors {
			msg += fmt.Sprintf("\n  %s: %s", printable(f.Field), printable(f.Message))
		}
	}
	if e.Status == http.StatusNotFound {
		msg += "\n  (an id of a project the API key is not bound to is not found either)"
	}
	return msg
}

// do sends a request and decodes a JSON answer into out (nil: none).
func (c *apiClient) do(ctx context.Context, method, path string, body []byte, hdr map[string]string, out any) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp, err
	}
	if resp.StatusCode >= 300 {
		return resp, &apiError{Status: resp.StatusCode, Body: data}
	}
	if out != nil {
		return resp, json.Unmarshal(data, out)
	}
	return resp, nil
}

// call sends a request without headers and decodes the JSON answer into
// out (nil: none), returning it as it came too (for --json).
func (c *apiClient) call(ctx context.Context, method, path string, body []byte, out any) (json.RawMessage, error) {
	var raw json.RawMessage
	var into any
	if method != http.MethodDelete {
		into = &raw
	}
	if _, err := c.do(ctx, method, path, body, nil, into); err != nil {
		return nil, err
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("%s %s: the answer: %w", method, path, err)
		}
	}
	return raw, nil
}

// writeRaw prints an answer of the API as it came (--json).
func (g *globals) writeRaw(raw json.RawMessage) error {
	_, err := g.env.Stdout.Write(append(bytes.TrimSpace(raw), '\n'))
	return err
}

// readInput reads a command's JSON input: the file named, or stdin for
// -; what: what it is, for the errors.
func (g *globals) readInput(file, what string) ([]byte, error) {
	var body []byte
	var err error
	if file == "-" {
		if g.env.Stdin == nil {
			return nil, usageError{fmt.Errorf("no stdin to read the %s from", what)}
		}
		body, err = io.ReadAll(io.LimitReader(g.env.Stdin, 1<<20))
	} else {
		body, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, usageError{fmt.Errorf("read the %s: %w", what, err)}
	}
	if !json.Valid(body) {
		return nil, usageError{fmt.Errorf("the %s is not valid JSON", what)}
	}
	return body, nil
}

// readShown reads what a show --json printed, edited (file as for
// readInput), without its members drop (those that are no definition:
// ids, times), as the body of an update.
func (g *globals) readShown(file, what string, drop ...string) ([]byte, error) {
	data, err := g.readInput(file, what)
	if err != nil {
		return nil, err
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(data, &body); err != nil || body == nil {
		return nil, usageError{fmt.Errorf("the %s is not a JSON object", what)}
	}
	for _, k := range drop {
		delete(body, k)
	}
	return json.Marshal(body)
}

// deleteThing DELETEs path, the API's what of id, and says so.
func (g *globals) deleteThing(path, what, id string) error {
	if _, _, err := g.request(http.MethodDelete, path, nil, "delete the "+what); err != nil {
		return err
	}
	if g.json {
		return writeJSON(g.env.Stdout, map[string]any{"id": id, "deleted": true})
	}
	fmt.Fprintf(g.env.Stdout, "%s %s deleted\n", what, id)
	return nil
}

// listItems GETs path, a list of the API ({"items": [...]}) of what, and
// prints it as it came (--json), or as a table of header with a row for
// each item, or "no <what>".
func listItems[T any](g *globals, path, what string, header []string, row func(api *apiClient, item *T) []string) error {
	api, raw, err := g.request(http.MethodGet, path, nil, "list the "+what)
	if err != nil {
		return err
	}
	if g.json {
		return g.writeRaw(raw)
	}
	var list struct{ Items []T }
	if err := json.Unmarshal(raw, &list); err != nil {
		return err
	}
	if len(list.Items) == 0 {
		fmt.Fprintln(g.env.Stdout, "no "+what)
		return nil
	}
	t := newTable(g.env.Stdout, header...)
	for k := range list.Items {
		t.row(row(api, &list.Items[k])...)
	}
	return t.flush()
}

// answer sends a request to the API (doing: what it does, for its error)
// and prints the answer with show.
func (g *globals) answer(method, path string, body []byte, doing string, show func(*apiClient, json.RawMessage) error) error {
	api, raw, err := g.request(method, path, body, doing)
	if err != nil {
		return err
	}
	return show(api, raw)
}

// request sends a request to the API (doing: what it does, for its
// error) and returns the answer, and the client for more.
func (g *globals) request(method, path string, body []byte, doing string) (*apiClient, json.RawMessage, error) {
	api, err := g.api()
	if err != nil {
		return nil, nil, err
	}
	raw, err := api.call(g.ctx, method, path, body, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", doing, err)
	}
	return api, raw, nil
}
