"""The update rules: one folder per rule (sum/, delta/: the delta and gated delta rules) with one record each
(record.py, UpdateRule) that owns every form of the rule; the table (registry.py), the dispatch of a rule's
forms (dispatch.py), the public ops (public.py) and the reference loops' shared parts (reference.py)."""
