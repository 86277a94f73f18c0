"""Network namespaces for the nemesis: one per node, on a bridge of our own.

The campaign's brokers (Pulsar, Mosquitto) and the harness stay in the root
namespace and listen on the bridge's address; each node runs in a namespace
of its own with one address on the bridge. Faults are iptables rules inside
a node's namespace, in a chain of the nemesis's own (`NEMESIS`), so one
fault's rules can be removed without touching another's:

- cut: nothing to or from the other nodes;
- one-way cut: nothing from the other nodes reaches this one;
- lossy: a share of the packets to and from the other nodes is dropped;
- cut from Pulsar or from the broker: nothing to their ports.

Dropped packets are dropped silently, as a cut cable or a black-holing
firewall would: connections hang until timeouts and keepalives notice.
(`tc netem`, for added latency, is not in this kernel; packet loss is how
the campaign makes a link slow.)
"""

import subprocess


def sh(*args, check=True, ns=None):
    cmd = list(args)
    if ns:
        cmd = ["ip", "netns", "exec", ns] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


class Net:
    """A bridge 10.<a>.<b>.1/24 and one namespace per node."""

    def __init__(self, tag, a, b, nodes):
        self.tag = tag
        self.prefix = f"10.{a}.{b}"
        self.bridge = f"fsb{tag}"
        self.host_ip = f"{self.prefix}.1"
        self.nodes = nodes
        self.made = []

    def node_ip(self, i):
        return f"{self.prefix}.{10 + i}"

    def ns(self, i):
        return f"fs{self.tag}n{i}"

    def up(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i in range(1, self.nodes + 1):
            ns, host, inner = self.ns(i), f"fs{self.tag}h{i}", f"fs{self.tag}c{i}"
            sh("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
            self.made.append(("link", host))
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", host, "master", self.bridge)
            sh("ip", "link", "set", host, "up")
            sh("ip", "addr", "add", f"{self.node_ip(i)}/24", "dev", inner, ns=ns)
            sh("ip", "link", "set", inner, "up", ns=ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
            sh("iptables", "-N", "NEMESIS", ns=ns)
            sh("iptables", "-I", "INPUT", "-j", "NEMESIS", ns=ns)
            sh("iptables", "-I", "OUTPUT", "-j", "NEMESIS", ns=ns)

    def down(self):
        for kind, name in reversed(self.made):
            if kind == "netns":
                sh("ip", "netns", "del", name, check=False)
            else:
                sh("ip", "link", "del", name, check=False)
        self.made.clear()

    # --- rules ---------------------------------------------------------

    def _rules(self, i, kind, arg):
        peers = [self.node_ip(j) for j in range(1, self.nodes + 1) if j != i]
        rules = []
        if kind == "cut":
            for p in peers:
                rules += [["-A", "NEMESIS", "-d", p, "-j", "DROP"],
                          ["-A", "NEMESIS", "-s", p, "-j", "DROP"]]
        elif kind == "one_way_cut":
            for p in peers:
                rules.append(["-A", "NEMESIS", "-s", p, "-j", "DROP"])
        elif kind == "lossy":
            for p in peers:
                for d in ("-d", "-s"):
                    rules.append(["-A", "NEMESIS", d, p, "-m", "statistic", "--mode", "random",
                                  "--probability", "0.2", "-j", "DROP"])
        elif kind in ("cut_pulsar", "cut_mqtt"):
            for port in arg:
                rules.append(["-A", "NEMESIS", "-d", self.host_ip, "-p", "tcp",
                              "--dport", str(port), "-j", "DROP"])
        return rules

    def add(self, i, kind, arg=()):
        """Adds one fault's rules in node i's namespace; returns them."""
        rules = self._rules(i, kind, arg)
        for r in rules:
            sh("iptables", *r, ns=self.ns(i))
        return rules

    def remove(self, i, rules):
        for r in rules:
            sh("iptables", "-D", *r[1:], ns=self.ns(i), check=False)

    def heal_all(self):
        for i in range(1, self.nodes + 1):
            sh("iptables", "-F", "NEMESIS", ns=self.ns(i), check=False)
