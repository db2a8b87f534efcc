"""The delta rule (paper §4.2) and the gated delta rule (Gated DeltaNet, Yang et al. 2024): the gated rule's forms
are the core, and the delta rule is the gated one with alpha = 1 (its forms skip every decay)."""
