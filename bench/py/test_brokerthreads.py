"""Unit tests of the broker thread split (brokerthreads.py)."""

import os
import tempfile
import unittest

import brokerthreads as bt


class Pools(unittest.TestCase):
    def test_members_of_a_pool_share_its_name(self):
        self.assertEqual(bt.pool("C2_CompilerThre"), "C_CompilerThre")
        self.assertEqual(bt.pool("pulsar-io-4-1"), "pulsar-io")
        self.assertEqual(bt.pool("BookieJournal-3181"), "BookieJournal")
        self.assertEqual(bt.pool("123"), "?")


class Spent(unittest.TestCase):
    def test_a_thread_born_meanwhile_counts_from_zero_and_ticks_never_go_negative(self):
        before = {"1": ("pulsar-io-1", 100), "2": ("pulsar-io-2", 50), "3": ("gone", 7)}
        after = {"1": ("pulsar-io-1", 160), "2": ("pulsar-io-2", 50), "4": ("pulsar-io-3", 40)}
        spent = bt.spent(before, after)
        self.assertAlmostEqual(spent["pulsar-io"], 100 / bt.TICKS_PER_SEC)
        self.assertNotIn("gone", spent)

    def test_reads_what_bench_sh_writes(self):
        with tempfile.TemporaryDirectory() as d:
            for when, ticks in (("before", 10), ("after", 35)):
                with open(os.path.join(d, f"benthos.{when}"), "w") as f:
                    f.write(f"11 BookieJournal-1 {ticks}\n12 C2_CompilerThre 5\nnot a line\n")
            self.assertEqual(bt.main([d]), 0)
            rows = bt.read(os.path.join(d, "benthos.after"))
            self.assertEqual(rows["11"], ("BookieJournal-1", 35))
            self.assertEqual(len(rows), 2)


if __name__ == "__main__":
    unittest.main()
