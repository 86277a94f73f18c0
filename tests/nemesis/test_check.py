"""Unit tests of the checker on made-up histories: python3 -m unittest."""
import math
import unittest

import check
import tap


def history(n, acked=None):
    t_pub = [100.0 + i * 0.01 for i in range(n)]
    t_ack = [t + 0.002 if acked is None or i in acked else math.nan for i, t in enumerate(t_pub)]
    return t_pub, t_ack


LOAD = {"start": 100.0, "seconds": 10.0}


class CheckTest(unittest.TestCase):
    def test_a_clean_topic_is_clean(self):
        t_pub, t_ack = history(5)
        msgs = [(i, i + 1, 100.5 + i * 0.01) for i in range(5)]
        v = check.analyze(t_pub, t_ack, msgs, [], LOAD, 1)
        self.assertTrue(v["ok"], v)
        self.assertEqual((v["lost"], v["duplicated"], v["unexpected"], v["out_of_order"]), (0, 0, 0, 0))

    def test_lost_duplicated_unexpected_and_reordered_are_found(self):
        t_pub, t_ack = history(6, acked={0, 1, 2, 3, 4})
        # 3 lost (acked, absent); 5 absent but never acked: not lost; 1 twice;
        # an id nobody published; seqs out of order.
        msgs = [(0, 1, 101), (1, 2, 101), (1, 3, 101), (2, 5, 101), (4, 4, 101), (99, 6, 101)]
        v = check.analyze(t_pub, t_ack, msgs, [], LOAD, 1)
        self.assertFalse(v["ok"])
        self.assertEqual(v["lost_ids"], [3])
        self.assertEqual(v["duplicated_ids"], [1])
        self.assertEqual(v["unexpected"], 1)
        self.assertEqual(v["out_of_order"], 2)

    def test_a_copy_after_the_window_is_a_new_message_and_one_inside_is_a_duplicate(self):
        t_pub, t_ack = history(3)
        # id 0 again 700 s after its first copy: outside a 600 s window; id 1
        # again 599 s after: inside it.
        msgs = [(0, 1, 101.0), (1, 2, 101.0), (2, 3, 101.0), (0, 4, 801.0), (1, 5, 700.0)]
        v = check.analyze(t_pub, t_ack, msgs, [], LOAD, 1, window_secs=600)
        self.assertEqual((v["duplicated_ids"], v["copies_after_window"]), ([1], 1))
        self.assertFalse(v["ok"])
        v = check.analyze(t_pub, t_ack, msgs, [], LOAD, 1)
        self.assertEqual(v["duplicated_ids"], [0, 1], "without a window every copy counts")

    def test_a_loss_some_bridge_acked_is_told_apart(self):
        t_pub, t_ack = history(3)
        first_ack = [100.1, math.nan, 100.2]
        msgs = [(0, 1, 101)]
        v = check.analyze(t_pub, t_ack, msgs, [], LOAD, 1, first_ack=first_ack)
        self.assertEqual(v["lost_ids"], [1, 2])
        self.assertEqual(v["acked_uncommitted_ids"], [2])

    def test_stalls_and_recovery_are_measured_per_fault(self):
        # Progress every 0.1 s, except between 103 and 106.
        progress = [100 + k / 10 for k in range(100) if not (30 <= k < 60)]
        self.assertAlmostEqual(check.gaps(progress, 100, 110)[0], 3.1, places=5)
        # From 105.5 on, the next 3 s hold 25 of the 30 the rate promises.
        after = check.steady_after(progress, 104.0, 10, 110)
        self.assertAlmostEqual(after, 1.5, places=5)

    def test_the_tap_maps_bridge_acks_to_messages(self):
        t = tap.Tap(10, ["firstseen-1-feed", "firstseen-2-feed"])
        t.feed("Sending PUBLISH to firstseen-2-feed (d0, q1, r0, m7, '/nemesis/ab/3/3', ... (12 bytes))", 1.0)
        t.feed("Sending PUBLISH to other (d0, q1, r0, m8, '/nemesis/ab/4/4', ... (12 bytes))", 1.0)
        t.feed("Received PUBACK from firstseen-2-feed (Mid: 7, RC:0)", 2.5)
        t.feed("Received PUBACK from other (Mid: 8, RC:0)", 2.5)
        self.assertEqual(t.first_ack[3], 2.5)
        self.assertEqual(t.by[3], 2)
        self.assertTrue(math.isnan(t.first_ack[4]))


if __name__ == "__main__":
    unittest.main()
