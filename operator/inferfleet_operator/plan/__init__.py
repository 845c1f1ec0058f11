"""Pure decisions: nodes, pools, runtime choice, replicas, autoscaling, routing, builds and manifests."""
