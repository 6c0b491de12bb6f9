"""Evaluation on labelled faces: datasets (:mod:`.datasets`: the AffectNet protocol, CSV), metrics
(:mod:`.metrics`), and the prediction loop with its distributed gather and reports (:mod:`.loop`)."""
