"""The feature maps phi (paper §5) and the normalisations of phi."""
