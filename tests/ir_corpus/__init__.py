"""The golden IR corpus: kernels, capture and comparison (see README.md here)."""
