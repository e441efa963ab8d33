"""`vit audit`'s checks of a dataset, each usable on its own.

- `vit.audit.scan`: one pass over every image: size, mode, format, bad files, content and perceptual hashes.
- `vit.audit.duplicates`: exact duplicates (same decoded pixels) and near-duplicates (pHash within a radius),
  found through a multi-index hash table, not by comparing every pair.
- `vit.audit.labels`: out-of-fold probabilities and confident learning (Northcutt et al., 2021).
- `vit.audit.inventory`: what a dataset holds: images per class and split, sizes, modes, formats, bad files.
- `vit.audit.verify`: whether a candidate pair is an edited copy (its best colour correlation over the edits).
- `vit.audit.report`: summary.json, the CSV files and report.html.
- `vit.audit.run`: one audit of a DataModule, the checks above in turn: `run_audit`, `Audit.write`, `findings`.
"""
