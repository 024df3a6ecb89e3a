"""Kubernetes API access for the node daemon: pod cache, patches with retries, events, node state."""
