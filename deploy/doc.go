// Package deploy holds the checks of the deployment files at the top of the
// tree and under deploy/: docker-compose.yml and .env.example, the
// Dockerfile, and the Kubernetes manifests (deploy/k8s, rendered with
// kustomize). No Docker engine or cluster runs where `make test` runs, so
// its tests load and render these files with the libraries the tools use
// (compose-go, kustomize's krusty) and check them against the code: the
// variables the services read, their admin ports and probe paths, the
// stream and group names.
package deploy
