package messages_test

import (
	"strings"
	"testing"

	"github.com/autoprovisioner/autoprovisioner/pkg/messages"
	"github.com/autoprovisioner/autoprovisioner/pkg/messages/internal/cases"
)

// TestValidate checks every rule, valid and invalid, with the exact field
// errors; then that the same value sent over the wire (Encode, Decode)
// gives the same verdict.
func TestValidate(t *testing.T) {
	for typ, tcs := range cases.Validations() {
		for _, tc := range tcs {
			t.Run(typ+"/"+tc.Name, func(t *testing.T) {
				err := tc.Msg.Validate()
				if diff := diffEmptyEqual(tc.Want, fieldsOf(t, err)); diff != "" {
					t.Errorf("Validate field errors (-want +got):\n%s", diff)
				}
				data, err := messages.Encode(tc.Msg)
				if err != nil {
					t.Fatalf("Encode: %v", err)
				}
				decoded, err := cases.DecodeAny(typ, data)
				if diff := diffEmptyEqual(tc.Want, fieldsOf(t, err)); diff != "" {
					t.Errorf("Decode field errors (-want +got):\n%s", diff)
				}
				if decoded == nil {
					t.Errorf("Decode returned no message (error %v)", err)
				}
			})
		}
	}
}

// fieldsOf returns the field errors of a *ValidationError, failing the test
// on any other error.
func fieldsOf(t *testing.T, err error) []messages.FieldError {
	t.Helper()
	if err == nil {
		return nil
	}
	ve, ok := err.(*messages.ValidationError)
	if !ok {
		t.Fatalf("error %T %v, want *ValidationError", err, err)
	}
	if !messages.IsInvalid(err) {
		t.Errorf("IsInvalid(%v) = false", err)
	}
	return ve.Fields
}

// TestValidationNeverEchoesValues checks that a secret put where a
// reference belongs does not leak into the error.
func TestValidationNeverEchoesValues(t *testing.T) {
	const token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
	m := &messages.AnsibleDeployMessage{
		ProjectID: token, RepoFullName: token, Branch: token + "..", ServerIP: token, Port: 22,
		Modules: []string{token}, GitHubTokenRef: token, SecretsRef: "vault:" + token + " x",
		RequestMeta: messages.RequestMeta{JobID: token + " ", CorrelationID: token + " ", CreatedAt: token},
	}
	err := m.Validate()
	if err == nil {
		t.Fatal("Validate accepted the message")
	}
	if strings.Contains(err.Error(), token) {
		t.Errorf("error repeats the value: %v", err)
	}
	for _, f := range err.(*messages.ValidationError).Fields {
		if strings.Contains(f.Message, token) {
			t.Errorf("field error %s repeats the value", f.Field)
		}
	}
}
