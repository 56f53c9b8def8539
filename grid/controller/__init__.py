"""The controller: pure reconciler, mutation governor, lease, service loop and admin API."""
