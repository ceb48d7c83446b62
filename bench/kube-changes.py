#!/usr/bin/env python3
"""What a user of Kubernetes mode waits for (bench/kube-pods.sh): CHANGES writes of each
kind against the API server, each timed from its acknowledgement (the response read)
to the next "dataplane in sync" line of egressd's LOG (logged after the kernel's ack).

    bench/kube-changes.py ENV LOG CHANGES   # ENV: tests/kube/apiserver.sh's env file

Egressd must be node-0 with ns0 holding local pods and an EgressFirewall."""
import datetime, ipaddress, json, ssl, statistics, sys, time, urllib.request
env = dict(l.strip().split("=", 1) for l in open(sys.argv[1]) if "=" in l)
log, changes = sys.argv[2], int(sys.argv[3])
ctx = ssl._create_unverified_context()
def call(method, path, body, kind="application/merge-patch+json"):
    req = urllib.request.Request(f"{env['KUBE_URL']}{path}", data=json.dumps(body).encode(), method=method,
        headers={"Authorization": f"Bearer {env['ADMIN_TOKEN']}", "Content-Type": kind})
    urllib.request.urlopen(req, context=ctx, timeout=30).read()
    return time.time_ns()  # the response read: the API server's acknowledgement
sync_lines, read_to = [], 0
def syncs():
    # The log's sync lines so far (read on from where the last call stopped).
    global read_to
    with open(log) as f:
        f.seek(read_to)
        text = f.read()
    done = text.rfind("\n") + 1  # a line still being written is read next time
    read_to += len(text[:done].encode())
    sync_lines.extend(l for l in text[:done].splitlines() if "dataplane in sync" in l)
    return sync_lines
KEYS = ("seen_ms", "compile_ms", "diff_ms", "nft_ms")
seen = {kind: {k: [] for k in KEYS} for kind in ("rule edited", "pod added")}
def after(count, acked, kind):
    # The first sync line past `count`; its timestamp is taken after the kernel's ack.
    # Its seen_ms (from the watch event's arrival in egressd to that ack) is kept too:
    # the rest of the time is the API server's and the watch's delivery.
    for _ in range(2000):
        lines = syncs()
        if len(lines) > count:
            stamp = datetime.datetime.fromisoformat(lines[count].split()[0].replace("Z", "+00:00"))
            for word in lines[count].split():
                key, _, value = word.partition("=")
                if key in KEYS:
                    seen[kind][key].append(float(value))
            return (stamp.timestamp() * 1e9 - acked) / 1e6
        time.sleep(0.005)
    sys.exit("no sync within 10 s of a change")
def stats(values):
    v = sorted(values)
    p99 = v[min(len(v) - 1, -(-len(v) * 99 // 100) - 1)]
    return f"median {statistics.median(v):.1f} ms, p99 {p99:.1f} ms of {len(v)}"
edit = []
for i in range(changes):
    count = len(syncs())
    cidr = "198.51.100.0/24" if i % 2 == 0 else "100.0.0.0/24"
    # A JSON patch replaces one rule's destination, the rest unchanged.
    acked = call("PATCH", "/apis/k8s.ovn.org/v1/namespaces/ns0/egressfirewalls/default",
                 [{"op": "replace", "path": "/spec/egress/0/to/cidrSelector", "value": cidr}], "application/json-patch+json")
    edit.append(after(count, acked, "rule edited"))
    time.sleep(0.2)
pod = []
for i in range(changes):
    name = f"extra{i}"
    call("POST", "/api/v1/namespaces/ns0/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
         "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "example.invalid/c"}]}}, "application/json")
    time.sleep(0.2)
    count = len(syncs())
    v4 = str(ipaddress.ip_address("198.19.255.0") + i + 1)
    acked = call("PATCH", f"/api/v1/namespaces/ns0/pods/{name}/status",
                 {"status": {"phase": "Running", "podIP": v4, "podIPs": [{"ip": v4}]}})
    pod.append(after(count, acked, "pod added"))
    time.sleep(0.2)
def median(values):
    return f"{statistics.median(values):.1f} ms" if values else "—"
def inside(kind):
    parts = ", ".join(f"{k[:-3]} {median(seen[kind][k])}" for k in KEYS[1:])
    return f"in egressd: median {median(seen[kind]['seen_ms'])} ({parts})"
print(f"rule edited: {stats(edit)} ({inside('rule edited')}); pod added: {stats(pod)} ({inside('pod added')})")
