"""The ctpipe test suite (a package, so that test modules import shared helpers from ``tests._support``)."""
