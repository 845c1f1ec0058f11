"""The running operator: kopf handlers, reconciles, work queue, leadership, Events, metrics, caches."""
