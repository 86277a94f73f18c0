"""Unit tests of the pure parts of the nemesis: python3 -m unittest."""
import unittest

import schedule


class ScheduleTest(unittest.TestCase):
    def test_a_seed_always_gives_the_same_schedule(self):
        a = [f.to_json() for f in schedule.generate(42, 600)]
        b = [f.to_json() for f in schedule.generate(42, 600)]
        c = [f.to_json() for f in schedule.generate(43, 600)]
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)

    def test_at_most_one_node_is_impaired_at_a_time(self):
        for seed in range(50):
            for profile in (schedule.SHORT, schedule.SOAK, schedule.DENSE):
                node = [f for f in schedule.generate(seed, 900, profile)
                        if f.kind in schedule.NODE_KINDS or f.kind == "power_loss_all"]
                for x in node:
                    for y in node:
                        overlap = x.start < y.end and y.start < x.end
                        if overlap and x is not y:
                            # Overlapping faults share one window's victim.
                            self.assertEqual(schedule.victim_of(x.target)[0],
                                             schedule.victim_of(y.target)[0], (seed, x, y))
                            self.assertNotEqual(x.kind, "power_loss_all")

    def test_exclusive_faults_do_not_overlap_on_the_victim(self):
        for seed in range(30):
            ex = [f for f in schedule.generate(seed, 900, schedule.SOAK)
                  if f.kind in schedule.EXCLUSIVE]
            for x, y in zip(ex, ex[1:]):
                self.assertLessEqual(x.end, y.start, (seed, x, y))

    def test_the_campaign_ends_healed(self):
        for seed in range(20):
            faults = schedule.generate(seed, 300)
            self.assertTrue(all(f.end <= 280 for f in faults))

    def test_every_short_campaign_loses_every_node_at_least_once(self):
        # What makes a build that acks before its commit fail the short profile.
        for seed in range(50):
            kinds = [f.kind for f in schedule.generate(seed, 240)]
            self.assertIn("power_loss_all", kinds, seed)

    def test_an_hour_long_soak_is_a_very_bad_hour_on_every_seed(self):
        # A new fault every 20 s on average, every kind at least 8 times,
        # every node powered off at once at least 5 times, Pulsar and
        # Mosquitto restarted about 10 times each.
        for seed in [7, 4242, 777001] + list(range(40)):
            faults = schedule.generate(seed, 3600, schedule.SOAK)
            c = schedule.counts(faults)
            self.assertTrue(150 <= len(faults) <= 215, (seed, len(faults), c))
            for kind in schedule.KINDS:
                self.assertGreaterEqual(c.get(kind, 0), 8, (seed, kind, c))
            self.assertGreaterEqual(c["power_loss_all"], 5, (seed, c))
            for kind in ("pulsar_restart", "mqtt_restart"):
                self.assertTrue(7 <= c[kind] <= 14, (seed, kind, c))

    def test_the_dense_profile_meets_every_kind_a_hundred_times(self):
        c = schedule.counts(schedule.generate(7, 3600, schedule.DENSE))
        for kind in schedule.KINDS:
            self.assertGreaterEqual(c.get(kind, 0), 100, (kind, c))


if __name__ == "__main__":
    unittest.main()
