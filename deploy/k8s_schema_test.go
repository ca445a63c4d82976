package deploy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	sigsjson "sigs.k8s.io/json"
)

// KEDA's objects, as its published CRDs (keda.sh/v1alpha1, KEDA 2.x:
// keda.sh_scaledobjects.yaml, keda.sh_triggerauthentications.yaml)
// describe them: every field the schema has, so a strict decode refuses
// what KEDA's API server would prune or reject. Fields this repository
// does not use and whose shape is deep are kept as raw JSON.
type (
	kedaScaledObject struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
		Spec       struct {
			ScaleTargetRef *struct {
				APIVersion             string `json:"apiVersion,omitempty"`
				Kind                   string `json:"kind,omitempty"`
				Name                   string `json:"name"`
				EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
			} `json:"scaleTargetRef"`
			PollingInterval       *int32 `json:"pollingInterval,omitempty"`
			InitialCooldownPeriod *int32 `json:"initialCooldownPeriod,omitempty"`
			CooldownPeriod        *int32 `json:"cooldownPeriod,omitempty"`
			IdleReplicaCount      *int32 `json:"idleReplicaCount,omitempty"`
			MinReplicaCount       *int32 `json:"minReplicaCount,omitempty"`
			MaxReplicaCount       *int32 `json:"maxReplicaCount,omitempty"`
			Advanced              *struct {
				RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount,omitempty"`
				HorizontalPodAutoscalerConfig *struct {
					Name     string                                         `json:"name,omitempty"`
					Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
				} `json:"horizontalPodAutoscalerConfig,omitempty"`
				ScalingModifiers *struct {
					Formula          string `json:"formula,omitempty"`
					Target           string `json:"target,omitempty"`
					ActivationTarget string `json:"activationTarget,omitempty"`
					MetricType       string `json:"metricType,omitempty"`
				} `json:"scalingModifiers,omitempty"`
			} `json:"advanced,omitempty"`
			Fallback *struct {
				FailureThreshold int32  `json:"failureThreshold"`
				Replicas         int32  `json:"replicas"`
				Behavior         string `json:"behavior,omitempty"`
			} `json:"fallback,omitempty"`
			Triggers []struct {
				Type              string            `json:"type"`
				Name              string            `json:"name,omitempty"`
				UseCachedMetrics  bool              `json:"useCachedMetrics,omitempty"`
				Metadata          map[string]string `json:"metadata"`
				MetricType        string            `json:"metricType,omitempty"`
				AuthenticationRef *struct {
					Name string `json:"name"`
					Kind string `json:"kind,omitempty"`
				} `json:"authenticationRef,omitempty"`
			} `json:"triggers"`
		} `json:"spec"`
		Status json.RawMessage `json:"status,omitempty"`
	}
	kedaTriggerAuthentication struct {
		APIVersion string          `json:"apiVersion"`
		Kind       string          `json:"kind"`
		Metadata   json.RawMessage `json:"metadata"`
		Spec       struct {
			SecretTargetRef []struct {
				Parameter string `json:"parameter"`
				Name      string `json:"name"`
				Key       string `json:"key"`
			} `json:"secretTargetRef,omitempty"`
			ConfigMapTargetRef []struct {
				Parameter string `json:"parameter"`
				Name      string `json:"name"`
				Key       string `json:"key"`
			} `json:"configMapTargetRef,omitempty"`
			Env []struct {
				Parameter     string `json:"parameter"`
				Name          string `json:"name"`
				ContainerName string `json:"containerName,omitempty"`
			} `json:"env,omitempty"`
			PodIdentity              json.RawMessage `json:"podIdentity,omitempty"`
			HashiCorpVault           json.RawMessage `json:"hashiCorpVault,omitempty"`
			AzureKeyVault            json.RawMessage `json:"azureKeyVault,omitempty"`
			AwsSecretManager         json.RawMessage `json:"awsSecretManager,omitempty"`
			GcpSecretManager         json.RawMessage `json:"gcpSecretManager,omitempty"`
			BoundServiceAccountToken json.RawMessage `json:"boundServiceAccountToken,omitempty"`
			FilePath                 string          `json:"filePath,omitempty"`
		} `json:"spec"`
		Status json.RawMessage `json:"status,omitempty"`
	}
)

// redisStreamsParams are the metadata keys of KEDA's redis-streams scaler
// (its documentation's parameter list): a misspelt key is ignored by KEDA,
// silently changing how infra scales.
var redisStreamsParams = []string{
	"address", "addressFromEnv", "host", "hostFromEnv", "port", "portFromEnv",
	"username", "usernameFromEnv", "passwordFromEnv", "databaseIndex", "enableTLS", "unsafeSsl",
	"stream", "consumerGroup", "pendingEntriesCount", "streamLength", "lagCount", "activationLagCount",
}

// kubeTypes maps apiVersion/kind to a new value of its Go type.
var kubeTypes = map[string]func() any{
	"v1/ConfigMap":                       func() any { return &corev1.ConfigMap{} },
	"v1/Service":                         func() any { return &corev1.Service{} },
	"v1/Secret":                          func() any { return &corev1.Secret{} },
	"v1/ServiceAccount":                  func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                 func() any { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":      func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy": func() any { return &networkingv1.NetworkPolicy{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any {
		return &autoscalingv2.HorizontalPodAutoscaler{}
	},
	"keda.sh/v1alpha1/ScaledObject":          func() any { return &kedaScaledObject{} },
	"keda.sh/v1alpha1/TriggerAuthentication": func() any { return &kedaTriggerAuthentication{} },
}

// TestKubernetesSchemas decodes every rendered object strictly (unknown
// and duplicate fields are errors, field names case-sensitive, as the API
// server's strict field validation) into the Kubernetes API's Go types
// (k8s.io/api) or KEDA's CRD schema, and checks the fields those schemas
// require.
func TestKubernetesSchemas(t *testing.T) {
	for _, overlay := range []string{"base", "overlays/production", "overlays/production-hpa"} {
		t.Run(strings.ReplaceAll(overlay, "/", "_"), func(t *testing.T) {
			for _, o := range render(t, overlay) {
				apiVersion, _ := o.raw["apiVersion"].(string)
				id := fmt.Sprintf("%s %s/%s", overlay, o.Kind, o.Metadata.Name)
				mk, ok := kubeTypes[apiVersion+"/"+o.Kind]
				if !ok {
					t.Errorf("%s: apiVersion %s kind %s has no schema here: add its type to kubeTypes", id, apiVersion, o.Kind)
					continue
				}
				data, err := json.Marshal(o.raw)
				if err != nil {
					t.Fatal(err)
				}
				typed := mk()
				strict, err := sigsjson.UnmarshalStrict(data, typed)
				if err != nil {
					t.Errorf("%s: %v", id, err)
					continue
				}
				for _, e := range strict {
					t.Errorf("%s: %v", id, e)
				}
				if o.Metadata.Name == "" {
					t.Errorf("%s: no metadata.name", id)
				}
				checkRequired(t, id, typed)
			}
		})
	}
}

// TestKubernetesSchemasRefuse shows the strict decode refuses what it must.
func TestKubernetesSchemasRefuse(t *testing.T) {
	for name, tc := range map[string]struct{ kind, doc string }{
		"unknown field":      {"apps/v1/Deployment", `{"spec":{"replica":2}}`},
		"wrong case":         {"apps/v1/Deployment", `{"spec":{"Replicas":2}}`},
		"wrong type":         {"apps/v1/Deployment", `{"spec":{"replicas":"two"}}`},
		"KEDA unknown field": {"keda.sh/v1alpha1/ScaledObject", `{"spec":{"maxReplicas":3}}`},
		"KEDA trigger field": {"keda.sh/v1alpha1/ScaledObject", `{"spec":{"triggers":[{"type":"redis-streams","metdata":{}}]}}`},
	} {
		t.Run(name, func(t *testing.T) {
			strict, err := sigsjson.UnmarshalStrict([]byte(tc.doc), kubeTypes[tc.kind]())
			if err == nil && len(strict) == 0 {
				t.Errorf("%s accepted by %s", tc.doc, tc.kind)
			}
		})
	}
}

// checkRequired checks the fields the schemas mark required that a strict
// decode cannot see missing.
func checkRequired(t *testing.T, id string, typed any) {
	t.Helper()
	switch v := typed.(type) {
	case *appsv1.Deployment:
		if v.Spec.Selector == nil {
			t.Errorf("%s: no spec.selector", id)
		}
		for _, c := range v.Spec.Template.Spec.Containers {
			if c.Name == "" || c.Image == "" {
				t.Errorf("%s: a container without name or image", id)
			}
		}
	case *corev1.Service:
		for _, p := range v.Spec.Ports {
			if p.Port == 0 {
				t.Errorf("%s: a port without port", id)
			}
		}
	case *autoscalingv2.HorizontalPodAutoscaler:
		if v.Spec.ScaleTargetRef.Name == "" || v.Spec.MaxReplicas == 0 {
			t.Errorf("%s: no scaleTargetRef.name or maxReplicas", id)
		}
	case *kedaScaledObject:
		if v.Spec.ScaleTargetRef == nil || v.Spec.ScaleTargetRef.Name == "" {
			t.Errorf("%s: no spec.scaleTargetRef.name", id)
		}
		if len(v.Spec.Triggers) == 0 {
			t.Errorf("%s: no spec.triggers", id)
		}
		for i, tr := range v.Spec.Triggers {
			if tr.Type == "" || tr.Metadata == nil {
				t.Errorf("%s: trigger %d without type or metadata", id, i)
			}
			if tr.AuthenticationRef != nil && tr.AuthenticationRef.Name == "" {
				t.Errorf("%s: trigger %d: authenticationRef without name", id, i)
			}
			if tr.Type == "redis-streams" {
				for k := range tr.Metadata {
					if !slices.Contains(redisStreamsParams, k) {
						t.Errorf("%s: trigger %d: %q is no parameter of KEDA's redis-streams scaler", id, i, k)
					}
				}
			}
		}
	case *kedaTriggerAuthentication:
		for _, r := range v.Spec.SecretTargetRef {
			if r.Parameter == "" || r.Name == "" || r.Key == "" {
				t.Errorf("%s: secretTargetRef needs parameter, name and key", id)
			}
		}
	}
}
