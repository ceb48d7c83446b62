#!/usr/bin/env python3
"""The API side of bench/cluster-scale.sh (workload described there).

    cluster-scale.py populate ENV PODS LOCAL NAMESPACES
    cluster-scale.py writes ENV           # the API server's writes so far (but Leases)
    cluster-scale.py measure ENV WORK N CHANGES "PIDS" APISERVER_PID PODS NAMESPACES LOCAL

ENV is tests/kube/apiserver.sh's env file; WORK holds the agents' logs (log-<i>)."""
import ctypes, datetime, http.client, ipaddress, json, os, re, ssl, statistics, sys, threading, time
from concurrent.futures import ThreadPoolExecutor

env = dict(l.strip().split("=", 1) for l in open(sys.argv[2]) if "=" in l)
URL = env["KUBE_URL"].removeprefix("https://")
CTX = ssl._create_unverified_context()
local = threading.local()


def call(method, path, body=None, kind="application/json"):
    """One request on this thread's kept-alive connection; returns (status, body, the
    time the response was read: the API server's acknowledgement)."""
    for attempt in range(5):
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPSConnection(URL, context=CTX, timeout=60)
        headers = {"Authorization": f"Bearer {env['ADMIN_TOKEN']}", "Content-Type": kind}
        local.sent = time.time_ns()
        try:
            conn.request(method, path, json.dumps(body).encode() if body is not None else None, headers)
            r = conn.getresponse()
            data = r.read()
            acked = time.time_ns()
        except (OSError, http.client.HTTPException):
            local.conn = None
            time.sleep(0.2 * (attempt + 1))
            continue
        if r.status == 429 or r.status >= 500:
            time.sleep(0.2 * (attempt + 1))
            continue
        if r.status >= 300 and not (method == "POST" and r.status == 409):
            sys.exit(f"{method} {path}: {r.status} {data[:300]!r}")
        return r.status, data, acked
    sys.exit(f"{method} {path}: failed 5 times")


def node_ip(i):
    return f"198.19.{i // 250}.{i % 250 + 1}"


def pod_ips(g):
    # Every pod an IPv6 address; the first 65,000 an IPv4 one too (198.18.0.0/16).
    v6 = str(ipaddress.ip_address("2001:db8:1::1") + g)
    return [str(ipaddress.ip_address("198.18.0.1") + g), v6] if g < 65000 else [v6]


def populate(pods, per_node, nsn):
    nodes = pods // per_node
    t = time.time()
    par = ThreadPoolExecutor(16)
    def namespace(k):
        labels = {"team": f"t{k % 10}", "kubernetes.io/metadata.name": f"ns{k}"}
        call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": f"ns{k}", "labels": labels}})
        egress = [{"type": "Allow", "to": {"cidrSelector": f"{100 + r}.{k // 256}.{k % 256}.0/24"},
                   **({"ports": [{"protocol": "TCP", "port": 443}]} if r % 3 == 0 else {})} for r in range(9)]
        if k == 0:
            egress.insert(0, {"type": "Allow", "to": {"nodeSelector": {"matchLabels": {"bench/role": "edge"}}}})
        egress.append({"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}})
        call("POST", f"/apis/k8s.ovn.org/v1/namespaces/ns{k}/egressfirewalls",
             {"apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall",
              "metadata": {"name": "default", "namespace": f"ns{k}"}, "spec": {"egress": egress}})
    list(par.map(namespace, range(nsn)))
    def node(i):
        labels = {"kubernetes.io/hostname": f"node-{i}"}
        if i == 1:
            labels["k8s.ovn.org/egress-assignable"] = ""
        call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i}", "labels": labels}})
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        call("PATCH", f"/api/v1/nodes/node-{i}/status", {"status": {
            "addresses": [{"type": "InternalIP", "address": node_ip(i)}],
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": now, "lastTransitionTime": now,
                            "reason": "KubeletReady", "message": "bench"}]}}, "application/merge-patch+json")
    list(par.map(node, range(nodes)))
    print(f"  namespaces and nodes: {time.time() - t:.0f} s", file=sys.stderr)
    def pod(g):
        k, j = divmod(g, per_node)
        ns = "ns0" if j == 0 else f"ns{g % nsn}"
        labels = {"app": f"a{g % 50}", **({"eip": "yes"} if j == 0 else {})}
        call("POST", f"/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"p{g}", "labels": labels},
             "spec": {"nodeName": f"node-{k}", "containers": [{"name": "c", "image": "example.invalid/c"}]}})
        ips = pod_ips(g)
        call("PATCH", f"/api/v1/namespaces/{ns}/pods/p{g}/status",
             {"status": {"phase": "Running", "podIP": ips[0], "podIPs": [{"ip": ip} for ip in ips]}},
             "application/merge-patch+json")
        if g % 10000 == 9999:
            print(f"  {g + 1} pods: {time.time() - t:.0f} s", file=sys.stderr)
    list(par.map(pod, range(pods)))


class Logs:
    """The agents' "dataplane in sync" lines, read on as they are written."""

    def __init__(self, work, n):
        self.paths = [f"{work}/log-{i}" for i in range(n)]
        self.offsets = [0] * n
        self.stamps = [[] for _ in range(n)]

    def read(self, i):
        with open(self.paths[i], "rb") as f:
            f.seek(self.offsets[i])
            data = f.read()
        done = data.rfind(b"\n") + 1
        self.offsets[i] += done
        for line in data[:done].decode(errors="replace").splitlines():
            # A sync that changed nothing in the kernel ("sync=Unchanged": a page of a
            # pod list, a status echo) is not the change arriving.
            if "dataplane in sync" in line and "sync=Unchanged" not in line:
                stamp = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))
                self.stamps[i].append(stamp.timestamp() * 1e9)
        return self.stamps[i]

    # A write is sent at `sent` and acknowledged (its response read) at `acked`; an agent
    # may apply it before the response is read (0 ms then).

    def last(self, i, sent, acked, until_ns):
        """Milliseconds from `acked` to agent i's last sync line in (sent, until_ns]."""
        within = [s for s in self.read(i) if sent < s <= until_ns]
        return max(0.0, (within[-1] - acked) / 1e6) if within else None

    def after(self, i, sent, acked, timeout=60):
        """Milliseconds from `acked` to agent i's first sync line stamped after `sent`."""
        end = time.time() + timeout
        while time.time() < end:
            later = [s for s in self.read(i) if s > sent]
            if later:
                return max(0.0, (later[0] - acked) / 1e6)
            time.sleep(0.01)
        return None


def metrics():
    """(watch events, Pod watch events, watch bytes, writes but Leases) of the API server."""
    _, body, _ = call("GET", "/metrics")
    events = pod_events = size = writes = 0.0
    for line in body.decode().splitlines():
        if line.startswith("apiserver_watch_events_total{"):
            v = float(line.rsplit(" ", 1)[1])
            events += v
            if 'kind="Pod"' in line:
                pod_events += v
        elif line.startswith("apiserver_watch_events_sizes_sum{"):
            size += float(line.rsplit(" ", 1)[1])
        elif line.startswith("apiserver_request_total{"):
            verb = re.search(r'verb="([A-Z]+)"', line)
            if verb and verb.group(1) in ("POST", "PUT", "PATCH", "DELETE", "APPLY") and 'resource="leases"' not in line:
                writes += float(line.rsplit(" ", 1)[1])
    return events, pod_events, size, writes


LIBC = ctypes.CDLL(None, use_errno=True)
SCRAPERS = ThreadPoolExecutor(16)


def received(pid):
    """(watch events, Pod watch events, objects listed) agent `pid` received so far
    (egressd_watch_events_total, read in its network namespace: bookmarks are not in it)."""
    with open(f"/proc/{pid}/ns/net") as ns:
        if LIBC.setns(ns.fileno(), 0x40000000) != 0:  # CLONE_NEWNET, this thread only
            raise OSError(ctypes.get_errno(), "setns")
    conn = http.client.HTTPConnection("127.0.0.1", 9799, timeout=10)
    conn.request("GET", "/metrics")
    events = pods = listed = 0.0
    for line in conn.getresponse().read().decode().splitlines():
        if line.startswith("egressd_watch_events_total{"):
            v = float(line.rsplit(" ", 1)[1])
            if 'event="listed"' in line:
                listed += v
            elif 'event="relist"' not in line:
                events += v
                if 'kind="Pod"' in line:
                    pods += v
    return events, pods, listed


def agents_received(pids):
    """(watch events, Pod watch events, objects listed) all agents received so far."""
    return tuple(sum(x) for x in zip(*SCRAPERS.map(received, pids)))


class SideWatch:
    """An EgressFirewall watch of the bench's own, opened once the agents are in sync:
    when no agent follows a change, it tells the API server's side (the event was not
    sent to anyone) from the agents' (it was)."""

    def __init__(self):
        self.events = []  # (time received in ns, event type, resourceVersion)
        threading.Thread(target=self.follow, daemon=True).start()

    def follow(self):
        while True:
            try:
                conn = http.client.HTTPSConnection(URL, context=CTX, timeout=600)
                conn.request("GET", "/apis/k8s.ovn.org/v1/egressfirewalls?watch=1&resourceVersion=0"
                             "&allowWatchBookmarks=true", headers={"Authorization": f"Bearer {env['ADMIN_TOKEN']}"})
                r = conn.getresponse()
                while True:
                    line = r.readline()
                    if not line:
                        break
                    event = json.loads(line)
                    rv = event.get("object", {}).get("metadata", {}).get("resourceVersion")
                    self.events.append((time.time_ns(), event.get("type"), rv))
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(1)

    def since(self, sent):
        return [e for e in self.events if e[0] > sent]


def stalled(work, n, pids, sent, side):
    """What to look at when no agent followed a change: written to WORK/stall."""
    with open(f"{work}/stall", "w") as out:
        print(f"change sent at {sent}; the bench's own watch got since then: {side.since(sent)[:20]}", file=out)
        _, body, _ = call("GET", "/metrics")
        for line in body.decode().splitlines():
            if line.startswith("apiserver_watch_events_total{") and "EgressFirewall" in line:
                print(line, file=out)
            if line.startswith("apiserver_registered_watchers{") and "EgressFirewall" in line:
                print(line, file=out)
        for i, pid in enumerate(pids):
            threads = []
            try:
                for task in sorted(os.listdir(f"/proc/{pid}/task")):
                    comm = open(f"/proc/{pid}/task/{task}/comm").read().strip()
                    wchan = open(f"/proc/{pid}/task/{task}/wchan").read().strip()
                    threads.append(f"{comm}:{wchan}")
            except OSError as e:
                threads.append(str(e))
            print(f"node-{i} pid {pid}: {' '.join(threads)}", file=out)


def proc(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_split(pid):
    """(user, system) CPU seconds of `pid` so far."""
    parts = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(parts[11]) / 100.0, int(parts[12]) / 100.0


def cpu_seconds(pid):
    return sum(cpu_split(pid))


def cpu_now(pids, api_pid):
    """(agents' user, agents' system, API server) CPU seconds so far."""
    split = [cpu_split(p) for p in pids]
    return sum(u for u, _ in split), sum(s for _, s in split), cpu_seconds(api_pid)


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, -(-len(v) * q // 100) - 1))]


def measure(work, n, changes, pids, api_pid, pods, nsn, per_node):
    logs = Logs(work, n)
    t0 = time.time()
    while True:
        ready = sum(1 for i in range(n) if logs.read(i))
        if ready == n:
            break
        if time.time() - t0 > 900:
            sys.exit(f"only {ready} of {n} agents in sync after 900 s")
        time.sleep(0.5)
    started = time.time() - t0
    # The start's status writes (the leader's, one per EgressFirewall) settle; they
    # are counted from before the agents started (WORK/writes).
    w0 = float(open(f"{work}/writes").read())
    last, quiet = metrics()[3], 0
    while quiet < 3 and time.time() - t0 < 1800:
        time.sleep(2)
        _, _, _, w = metrics()
        quiet = quiet + 1 if w - last < 5 else 0
        last = w
    settled = time.time() - t0
    start_writes = last - w0
    cpu0 = [cpu_seconds(p) for p in pids]
    all0 = cpu_now(pids, api_pid)
    time.sleep(10)
    idle = [100 * (cpu_seconds(p) - c) / 10 for p, c in zip(pids, cpu0)]
    # CPU per second when nothing changes (leases, timers): taken out of each change's.
    idle_rate = [(b - a) / 10 for a, b in zip(all0, cpu_now(pids, api_pid))]
    side = SideWatch()
    results = {}

    def run(kind, write, own, reset=None, settle=None):
        """`own`: the writes the change itself makes (not counted). With `settle`, a
        change makes several syncs: each node's last one before `settle` returns."""
        lat, per, host_lat = [], [], []
        for c in range(changes):
            got_before = agents_received(pids)
            before, began = metrics() + cpu_now(pids, api_pid), time.time()
            seen_before = len(side.events)
            acked, nodes = write(c)
            sent = local.sent
            until = settle(c) if settle else None
            for i in nodes:
                ms = logs.last(i, sent, acked, until) if settle else logs.after(i, sent, acked)
                with open(f"{work}/trace", "a") as trace:
                    stamp = datetime.datetime.fromtimestamp(acked / 1e9, datetime.timezone.utc).isoformat()
                    print(kind, c, stamp, f"node-{i}", ms, file=trace)
                if ms is None:
                    stalled(work, n, pids, sent, side)
                    sys.exit(f"{kind}: node-{i} did not sync within 60 s ({work}/log-{i}; {work}/stall)")
                lat.append(ms)
                if i == 1:
                    host_lat.append(ms)
            time.sleep(1.5)  # the change's status writes and Events
            after, window = metrics() + cpu_now(pids, api_pid), time.time() - began
            per.append([a - b for a, b in zip(after, before)])
            for k, rate in enumerate(idle_rate):
                per[-1][4 + k] -= rate * window
            per[-1][3] -= own
            per[-1][0] -= len(side.events) - seen_before  # the bench's own watch's events
            per[-1] += [a - b for a, b in zip(agents_received(pids), got_before)]
            if reset:
                reset(c)
        results[kind] = (lat, [statistics.median(x) for x in zip(*per)], host_lat)

    def edit(c):
        cidr = "198.51.100.0/24" if c % 2 == 0 else "100.0.0.0/24"
        _, _, acked = call("PATCH", "/apis/k8s.ovn.org/v1/namespaces/ns0/egressfirewalls/default",
                           [{"op": "replace", "path": "/spec/egress/1/to/cidrSelector", "value": cidr}],
                           "application/json-patch+json")
        return acked, range(n)
    run("firewall edit", edit, 1)

    def pod_added(c):
        i, name = c % n, f"bench-{n}-{c}"
        call("POST", "/api/v1/namespaces/ns0/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
             "spec": {"nodeName": f"node-{i}", "containers": [{"name": "c", "image": "example.invalid/c"}]}})
        time.sleep(0.3)
        ip = str(ipaddress.ip_address("198.18.255.0") + c + 1)
        _, _, acked = call("PATCH", f"/api/v1/namespaces/ns0/pods/{name}/status",
                           {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}},
                           "application/merge-patch+json")
        return acked, [i]
    run("pod added", pod_added, 2)

    last = pods // per_node - 1
    def label(c):
        value = "edge" if c % 2 == 0 else None
        _, _, acked = call("PATCH", f"/api/v1/nodes/node-{last}", {"metadata": {"labels": {"bench/role": value}}},
                           "application/merge-patch+json")
        return acked, range(n)
    run("node label", label, 1)

    def egress_ip(c):
        _, _, acked = call("POST", "/apis/k8s.ovn.org/v1/egressips", {"apiVersion": "k8s.ovn.org/v1",
             "kind": "EgressIP", "metadata": {"name": f"bench-{n}-{c}"},
             "spec": {"egressIPs": [f"198.19.250.{c % 250 + 1}"],
             "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns0"}},
             "podSelector": {"matchLabels": {"eip": "yes"}}}})
        return acked, range(n)
    def placed(c):
        # The leader's placement (status.items), then 2 s for every node to follow: each
        # node's last sync by then is the one that applied it.
        end = time.time() + 60
        while time.time() < end:
            _, body, _ = call("GET", f"/apis/k8s.ovn.org/v1/egressips/bench-{n}-{c}")
            if json.loads(body).get("status", {}).get("items"):
                time.sleep(2)
                return time.time_ns()
            time.sleep(0.005)
        sys.exit(f"egress IP bench-{n}-{c} not placed within 60 s")
    def delete_ip(c):
        call("DELETE", f"/apis/k8s.ovn.org/v1/egressips/bench-{n}-{c}")
        time.sleep(2)
    run("egress IP placed", egress_ip, 1, delete_ip, placed)
    # The same beside another EgressIP (one selecting no pod, placed on node-1 too): a
    # cluster that uses EgressIPs, where node-1 already follows every pod and keeps the
    # tunnel's per-peer entries ready. The first EgressIP of a cluster is the row above.
    resident = f"/apis/k8s.ovn.org/v1/egressips/bench-{n}-resident"
    call("POST", "/apis/k8s.ovn.org/v1/egressips", {"apiVersion": "k8s.ovn.org/v1",
         "kind": "EgressIP", "metadata": {"name": f"bench-{n}-resident"},
         "spec": {"egressIPs": ["198.19.251.1"],
         "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "bench-none"}}}})
    time.sleep(5)
    run("egress IP placed beside another", lambda c: egress_ip(c + changes), 1,
        lambda c: delete_ip(c + changes), lambda c: placed(c + changes))
    call("DELETE", resident)
    time.sleep(2)

    # Status writes per policy change whose status changes (one leader write per object):
    # a new EgressFirewall, one made invalid, and fixed again; 3 s each.
    def writes_after(action, own):
        """Writes in the 3 s after `action`, less its `own`."""
        before = metrics()[3]
        action()
        time.sleep(3)
        return metrics()[3] - before - own
    def set_rule(cidr):
        return lambda: call("PATCH", "/apis/k8s.ovn.org/v1/namespaces/ns0/egressfirewalls/default",
                            [{"op": "replace", "path": "/spec/egress/1/to/cidrSelector", "value": cidr}],
                            "application/json-patch+json")
    status_writes = {"made invalid": writes_after(set_rule("192.0.2.0/33"), 1),
                     "fixed": writes_after(set_rule("198.51.100.0/24"), 1)}
    def create_new():
        call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": f"bench-new-{n}"}})
        call("POST", f"/apis/k8s.ovn.org/v1/namespaces/bench-new-{n}/egressfirewalls", {
            "apiVersion": "k8s.ovn.org/v1", "kind": "EgressFirewall", "metadata": {"name": "default"},
            "spec": {"egress": [{"type": "Deny", "to": {"cidrSelector": "192.0.2.0/24"}}]}})
    status_writes["created"] = writes_after(create_new, 2)

    host = 1 if n > 1 else None
    others = [i for i in range(n) if i != host]
    rss = [proc(pids[i], "VmRSS") for i in others]
    hwm = [proc(pids[i], "VmHWM") for i in others]
    api_rss = proc(api_pid, "VmRSS")
    cells = [f"{n} agents, {pods} pods, {nsn} EgressFirewalls",
             f"all in sync {started:.0f} s; start writes {start_writes:.0f} (settled {settled:.0f} s)"]
    for kind, (lat, per, host_lat) in results.items():
        # node-1 is one node in N: at N = 100 a p99 over all nodes leaves its samples out.
        host_cell = f", node-1 max {max(host_lat):.0f} ms" if host_lat and n > 1 else ""
        cells.append(f"{kind}: p50 {pct(lat, 50):.0f} ms, p99 {pct(lat, 99):.0f} ms, max {max(lat):.0f} ms ({len(lat)}){host_cell}; "
                     f"per change: {per[0]:.0f} watch events sent ({per[1]:.0f} Pod, {per[2] / 1024:.0f} KiB; bookmarks included), "
                     f"{per[7]:.0f} received by the agents ({per[8]:.0f} Pod; no bookmarks) and {per[9]:.0f} objects listed, "
                     f"{per[3]:.0f} writes by egressd, "
                     f"CPU {1000 * per[4]:.0f} ms user + {1000 * per[5]:.0f} ms system in the agents, {1000 * per[6]:.0f} ms in the API server")
    cells.append("status writes by egressd per EgressFirewall " +
                 ", ".join(f"{k}: {v:.0f}" for k, v in status_writes.items()))
    cells.append(f"agent RSS median {statistics.median(rss):.0f} MiB, max {max(rss):.0f} MiB; "
                 f"peak median {statistics.median(hwm):.0f} MiB, max {max(hwm):.0f} MiB")
    if host is not None:
        cells.append(f"host node-1 (every pod) RSS {proc(pids[host], 'VmRSS'):.0f} MiB, peak {proc(pids[host], 'VmHWM'):.0f} MiB")
    cells.append(f"idle CPU median {statistics.median(idle):.2f} %, max {max(idle):.2f} %")
    cells.append(f"API server RSS {api_rss:.0f} MiB")
    print("| " + " | ".join(cells) + " |", flush=True)


if sys.argv[1] == "writes":
    print(metrics()[3])
elif sys.argv[1] == "populate":
    populate(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
else:
    measure(sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), [int(p) for p in sys.argv[6].split()],
            int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9]), int(sys.argv[10]))
