"""Re-evaluation triggers (SPEC 6): statistical detectors, episodes and their delivery."""
