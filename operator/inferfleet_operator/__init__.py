"""inferfleet operator: plans and reconciles InferenceServices across mixed-vendor GPU pools."""
