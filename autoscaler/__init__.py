"""gang-autoscaler: whole-gang autoscaling for LeaderWorkerSet inference deployments."""
