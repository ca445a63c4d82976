package secrets

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/hashicorp/vault-client-go"
)

// WriteKV writes fields as a new version of the KV v2 secret at
// mount/path and returns the reference of that version (field set when
// fields has exactly one key). Only the deployer's credentials store writes
// (a value a client posts goes to Vault; its database keeps the
// reference). The values are registered with the client's redactor, if
// any, and never appear in an error.
func (v *Vault) WriteKV(ctx context.Context, mount, path string, fields map[string]Value) (Ref, error) {
	ref := Ref{Scheme: SchemeVault, Mount: mount, Path: path}
	if e := checkSegments(mount + "/" + path); e != nil {
		e.Detail = "vault write: " + e.Detail
		return Ref{}, e
	}
	op := "write " + mount + "/data/" + path
	if len(v.allowed) > 0 && !PathAllowed(v.allowed, mount+"/data/"+path) {
		return Ref{}, &Error{Ref: ref.String(), Kind: ErrPermission, Detail: "vault " + op + ": outside the paths this client may use (its policy); no request made"}
	}
	data := make(map[string]any, len(fields))
	for k, val := range fields {
		data[k] = val.Reveal()
		if v.red != nil {
			v.red.AddValue(val)
		}
		if len(fields) == 1 {
			ref.Field = k
		}
	}
	defer clear(data)
	segs := strings.Split(path, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	p := "/" + url.PathEscape(mount) + "/data/" + strings.Join(segs, "/")
	body := map[string]any{"data": data}
	gen := v.state().gen
	resp, err := v.client.Write(ctx, p, body)
	if err != nil && vault.IsErrorStatus(err, http.StatusForbidden) && v.reloginAfterDenied(ctx, gen) {
		resp, err = v.client.Write(ctx, p, body)
	}
	if err != nil {
		return Ref{}, vaultFailure(op, err, false)
	}
	if resp != nil {
		ref.Version = int(jsonInt(resp.Data["version"]))
	}
	return ref, nil
}
