"""`ladder reproduce` (run a paper's comparison over seeds and judge its claims) and `ladder report`
(write docs/reproductions.md from the recorded reproductions)."""
