package secrets_test

import (
	"context"
	"fmt"
	"os"

	"github.com/autoprovisioner/autoprovisioner/pkg/secrets"
)

func ExampleParseRef() {
	ref, err := secrets.ParseRef("vault:secret/projects/site?version=3#db_password")
	if err != nil {
		panic(err)
	}
	fmt.Println(ref.Scheme, ref.Mount, ref.Path, ref.Field, ref.Version)
	_, err = secrets.ParseRef("vault:secret/../sys#x")
	fmt.Println(secrets.IsBadRef(err))
	// Output:
	// vault secret projects/site db_password 3
	// true
}

func ExampleRedactor() {
	red := secrets.NewRedactor()
	red.AddString("s3cr3t-token")
	run := red.Child() // one per run; Release it when the run ends
	defer run.Release()
	run.AddString("run-only-password")

	fmt.Println(run.RedactString("token=s3cr3t-token pw=run-only-password b64=czNjcjN0LXRva2Vu"))

	w := run.NewWriter(os.Stdout) // masks secrets split across writes
	fmt.Fprint(w, "login with run-only-")
	fmt.Fprint(w, "password\n")
	w.Close()
	// Output:
	// token=[REDACTED] pw=[REDACTED] b64=[REDACTED]
	// login with [REDACTED]
}

func ExampleResolver() {
	lookup := func(name string) (string, bool) {
		if name == "AUTOPROV_SECRET_GIT_TOKEN" {
			return "ghp_exampletoken", true
		}
		return "", false
	}
	red := secrets.NewRedactor()
	res, err := secrets.Open(context.Background(), secrets.Config{EnvPrefix: secrets.DefaultEnvPrefix},
		secrets.Deps{Redactor: red, LookupEnv: lookup})
	if err != nil {
		panic(err)
	}
	defer res.Close()

	v, err := res.Resolve(context.Background(), "env:AUTOPROV_SECRET_GIT_TOKEN")
	if err != nil {
		panic(err)
	}
	defer v.Wipe()
	fmt.Println(v, len(v.Bytes()))
	fmt.Println(red.RedactString("cloning with ghp_exampletoken"))

	_, err = res.Resolve(context.Background(), "env:VAULT_TOKEN")
	fmt.Println(err)
	// Output:
	// [REDACTED] 16
	// cloning with [REDACTED]
	// secret env:VAULT_TOKEN: bad secret reference: variable name must start with "AUTOPROV_SECRET_"
}
