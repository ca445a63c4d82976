package console

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/auth"
	"github.com/autoprovisioner/autoprovisioner/services/deployer/internal/credentials"
)

// ---- Credentials: the projects' named secret references, through the
// API's /credentials as the session's key (so a key sees and changes only
// its projects' credentials). A value typed here goes to Vault by the API
// and is never shown again, stored or put back into the form.

// credentialList is the API's GET /credentials answer.
type credentialList struct {
	Items []*credentials.Credential `json:"items"`
}

func (c *Console) credentialsPage(w http.ResponseWriter, r *http.Request) {
	c.renderCredentials(w, r, http.StatusOK, nil, "")
}

// renderCredentials shows the list and the form; form holds what the
// caller typed back (never the value).
func (c *Console) renderCredentials(w http.ResponseWriter, r *http.Request, status int, form map[string]string, msg string) {
	var list credentialList
	res, err := c.call(r, http.MethodGet, "/api/v1/credentials", nil, &list)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	key := c.key(r)
	if form == nil {
		form = map[string]string{}
		if len(key.Projects) > 0 {
			form["project_id"] = key.Projects[0]
		}
	}
	c.render(w, r, status, "credentials", map[string]any{"Title": "Credentials", "Credentials": list.Items,
		"Form": form, "Error": msg, "Projects": key.Projects, "CanWrite": key.Has(auth.ScopeCredentialsWrite)})
}

func (c *Console) createCredential(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "Bad form.")
		return
	}
	form := map[string]string{}
	for _, k := range []string{"project_id", "name", "ref", "description"} {
		form[k] = strings.TrimSpace(r.PostFormValue(k))
	}
	body := map[string]any{"name": form["name"]}
	for _, k := range []string{"project_id", "ref", "description"} {
		if form[k] != "" {
			body[k] = form[k]
		}
	}
	if v := r.PostFormValue("value"); v != "" {
		body["value"] = v
	}
	res, err := c.call(r, http.MethodPost, "/api/v1/credentials", body, nil)
	if err != nil {
		c.failAPI(w, r, res, err)
		return
	}
	if res.Problem != nil {
		c.renderCredentials(w, r, res.Status, form, problemText(res.Problem))
		return
	}
	http.Redirect(w, r, Prefix+"/credentials?done="+url.QueryEscape("created "+form["name"]), http.StatusSeeOther)
}

func (c *Console) deleteCredential(w http.ResponseWriter, r *http.Request) {
	name, project := chi.URLParam(r, "name"), r.PostFormValue("project_id")
	if !confirmed(r) {
		c.confirm(w, r, confirmation{Question: "Delete credential " + name + "?",
			Warning: "Jobs that name it fail from now on; its secret itself stays where its reference points.",
			Action:  Prefix + "/credentials/" + url.PathEscape(name) + "/delete", Hidden: map[string]string{"project_id": project},
			Button: "Delete it", ButtonID: "confirm-delete", Cancel: Prefix + "/credentials"})
		return
	}
	res, err := c.call(r, http.MethodDelete, "/api/v1/credentials/"+url.PathEscape(name)+"?project_id="+url.QueryEscape(project), nil, nil)
	if err != nil || res.Problem != nil {
		c.failAPI(w, r, res, err)
		return
	}
	http.Redirect(w, r, Prefix+"/credentials?done="+url.QueryEscape("deleted "+name), http.StatusSeeOther)
}

// credentialNames are the names of the credentials the session's key may
// read, for the job form's pickers; none when it may not.
func (c *Console) credentialNames(r *http.Request) []string {
	if !c.key(r).Has(auth.ScopeCredentialsRead) {
		return nil
	}
	var list credentialList
	if res, err := c.call(r, http.MethodGet, "/api/v1/credentials", nil, &list); err != nil || res.Problem != nil {
		return nil
	}
	var names []string
	for _, cr := range list.Items {
		names = append(names, cr.Name)
	}
	return names
}
