"""Helpers shared by the test modules: synthetic DICOM series, volumes, detector bundles and shapes."""
