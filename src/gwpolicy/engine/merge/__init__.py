"""Merging settings into effective policy: leaves (S5.1), FieldMerge (S5), Atomic/Patch/None (S6)."""
