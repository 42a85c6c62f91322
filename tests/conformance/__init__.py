"""One conformance suite for any Kubernetes API server: loopd's embedded API and a real kube-apiserver."""
