"""The hostile-input suite (issue 22 "Tests"): every parser family fed mutated real files and hostile values.

Each family (families.py) builds its seeds with the real writer once, draws cases from them with hypothesis
(values.py: hostile text, numbers and shapes; byte mutations), and feeds each case to the product's own edge
(the `carl` command, the engine's follow, the audit on a real nats-server, `carl-tui --serve`). The oracle
(oracle.py): a case returns or ends in one line for the user, never another exception; it finishes in bounded
time; the rows of a baseline store are all still there; and nothing printed holds a raw control byte. CI runs
a few hundred cases a family (test_*.py here); bench/hostile.py runs 10,000 and prints the table.
"""
