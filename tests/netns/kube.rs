//! A real kube-apiserver (1.20, built from Debian's source package by
//! tests/kube/build-apiserver.sh) with etcd, in a network namespace, for the Kubernetes
//! tests; egressd authenticates as system:serviceaccount:egressd:egressd, bound only to
//! daemonset/rbac.yaml.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{Agent, Netns, wait_for};

/// etcd + kube-apiserver in `ns`; stopped (by their PIDs) on drop.
pub struct ApiServer<'a> {
    pub ns: &'a Netns,
    pub dir: PathBuf,
}

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kube/apiserver.sh")
}

impl<'a> ApiServer<'a> {
    /// Start it; `host` is the address egressd's kubeconfig names.
    pub fn start(ns: &'a Netns, dir: PathBuf, host: &str) -> Self {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.name, "env", "BIND=0.0.0.0", &format!("KUBE_HOST={host}")])
            .arg(script())
            .arg("start")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let server = Self { ns, dir };
        assert!(out.status.success(), "apiserver did not start: {}", String::from_utf8_lossy(&out.stderr));
        server
    }

    pub fn script(&self, cmd: &str) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns.name])
            .arg(script())
            .arg(cmd)
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// `kubectl` as admin, with `stdin` as input.
    pub fn kubectl(&self, args: &[&str], stdin: &str) -> (bool, String) {
        use std::io::Write;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns.name, "kubectl", "--kubeconfig"])
            .arg(self.dir.join("kubeconfig-admin"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    pub fn apply(&self, yaml: &str) {
        let (ok, out) = self.kubectl(&["apply", "-f", "-"], yaml);
        assert!(ok, "kubectl apply: {out}\n{yaml}");
    }

    pub fn get(&self, args: &[&str]) -> String {
        self.kubectl(&[&["get"], args].concat(), "").1
    }

    pub fn patch_status(&self, kind: &str, name: &str, ns: Option<&str>, patch: &str) {
        let mut args = vec!["patch", kind, name, "--subresource=status", "--type=merge", "-p", patch];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let (ok, out) = self.kubectl(&args, "");
        assert!(ok, "patch status: {out}");
    }

    pub fn kubeconfig_egressd(&self) -> String {
        self.dir.join("kubeconfig-egressd").to_str().unwrap().to_string()
    }

    /// The controller's identity of the split layout (daemonset/modes/split).
    pub fn kubeconfig_controller(&self) -> String {
        self.dir.join("kubeconfig-egressd-controller").to_str().unwrap().to_string()
    }
}

impl Drop for ApiServer<'_> {
    fn drop(&mut self) {
        let _ =
            Command::new("ip").args(["netns", "exec", &self.ns.name]).arg(script()).arg("stop").arg(&self.dir).status();
    }
}

/// egressd in Kubernetes mode on `ns` as node `name`: leases of 3 s renewed every
/// second, its state in `dir/state-<name>`, health on `health`, a log per start in
/// `dir`; returns once it synced.
pub fn start_kube_agent(
    ns: &Netns,
    api: &ApiServer,
    dir: &Path,
    name: &str,
    health: &str,
    cluster_cidrs: &[&str],
    extra: &[&str],
) -> Agent {
    start_kube_agent_env(ns, api, dir, name, health, cluster_cidrs, extra, &[])
}

/// [`start_kube_agent`] with extra environment variables.
#[allow(clippy::too_many_arguments)]
pub fn start_kube_agent_env(
    ns: &Netns,
    api: &ApiServer,
    dir: &Path,
    name: &str,
    health: &str,
    cluster_cidrs: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
) -> Agent {
    static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // A node's own kubeconfig (a token bound to its pod: `bind_node_agent`) if it has one.
    let own = api.dir.join(format!("kubeconfig-egressd-{name}"));
    let kubeconfig = if own.exists() { own.to_str().unwrap().to_string() } else { api.kubeconfig_egressd() };
    let state = dir.join(format!("state-{name}")).to_str().unwrap().to_string();
    let mut args = vec!["run", "--kubeconfig", &kubeconfig, "--node-name", name];
    for cidr in cluster_cidrs {
        args.extend(["--cluster-cidr", cidr]);
    }
    args.extend(["--lease-duration-secs", "3", "--lease-renew-secs", "1", "--state-dir", &state]);
    args.extend(["--health-addr", health]);
    args.extend_from_slice(extra);
    let agent = Agent::start_env(ns, &args, env, dir.join(format!("{name}-{run}.log")));
    let synced = wait_for(Duration::from_secs(30), || agent.log_text().contains("dataplane in sync"));
    assert!(synced.is_some(), "egressd on {name} did not sync:\n{}", agent.log_text());
    agent
}

/// A node object for `name` with `ip`, Ready.
pub fn node(api: &ApiServer, name: &str, ip: &str, ready: bool) {
    api.apply(&format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n"));
    node_status(api, name, &[ip], ready);
}

/// Node `name`'s status (no kubelet here): InternalIP `addresses`, Ready or not.
pub fn node_status(api: &ApiServer, name: &str, addresses: &[&str], ready: bool) {
    let status = if ready { "True" } else { "False" };
    let addresses: Vec<String> =
        addresses.iter().map(|a| format!(r#"{{"type":"InternalIP","address":"{a}"}}"#)).collect();
    api.patch_status(
        "node",
        name,
        None,
        &format!(
            r#"{{"status":{{"addresses":[{}],"conditions":[{{"type":"Ready","status":"{status}","reason":"Test","message":"test","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}}]}}}}"#,
            addresses.join(",")
        ),
    );
}

/// The cluster of most kube tests: `crds` and `rbac` (texts) applied and served,
/// namespace team-a, Ready node-a at 198.18.254.1 with pod0 (198.18.1.2), and a Deny of
/// 203.0.113.0/24 in team-a.
pub fn team_a(api: &ApiServer, crds: &str, rbac: &str) {
    api.apply(crds);
    api.apply(rbac);
    let served = wait_for(Duration::from_secs(10), || api.kubectl(&["get", "egressfirewalls", "-A"], "").0);
    assert!(served.is_some(), "CRDs not served");
    api.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n");
    node(api, "node-a", "198.18.254.1", true);
    pod(api, "team-a", "pod0", "node-a", "198.18.1.2", "2001:db8:1:1::2");
    api.apply(
        "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\nmetadata: {name: default, namespace: team-a}\nspec:\n  egress:\n  - {type: Deny, to: {cidrSelector: 203.0.113.0/24}}\n",
    );
}

pub fn pod(api: &ApiServer, ns: &str, name: &str, node: &str, v4: &str, v6: &str) {
    api.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  nodeName: {node}\n  containers: [{{name: c, image: example.invalid/c}}]\n"
    ));
    api.patch_status(
        "pod",
        name,
        Some(ns),
        &format!(r#"{{"status":{{"phase":"Running","podIP":"{v4}","podIPs":[{{"ip":"{v4}"}},{{"ip":"{v6}"}}]}}}}"#),
    );
}

/// The EgressIP clusters' objects: namespace `prod` (`team: prod`); each node (labelled
/// `k8s.ovn.org/egress-assignable` when `assignable(n)`), Ready with its `addresses(n)`,
/// and its `pods[n]` pods (`<node>-pod<i>` in `prod`, `app: web`) at `pod_ips(n, i)`.
pub fn declare_egress_cluster(
    api: &ApiServer,
    names: &[&str],
    pods: &[usize],
    assignable: impl Fn(usize) -> bool,
    addresses: impl Fn(usize) -> Vec<String>,
    pod_ips: impl Fn(usize, usize) -> [String; 2],
) {
    setup(api);
    api.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: prod, labels: {team: prod}}\n");
    for (n, name) in names.iter().enumerate() {
        let labels = if assignable(n) { "labels: {\"k8s.ovn.org/egress-assignable\": \"\"}" } else { "" };
        api.apply(&format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, {labels}}}\n"));
        let addrs = addresses(n);
        node_status(api, name, &addrs.iter().map(String::as_str).collect::<Vec<_>>(), true);
        for i in 0..pods[n] {
            let pod = format!("{name}-pod{i}");
            api.apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: prod, labels: {{app: web}}}}\nspec:\n  nodeName: {name}\n  containers: [{{name: c, image: example.invalid/c}}]\n"
            ));
            let [v4, v6] = pod_ips(n, i);
            api.patch_status(
                "pod",
                &pod,
                Some("prod"),
                &format!(
                    r#"{{"status":{{"phase":"Running","podIP":"{v4}","podIPs":[{{"ip":"{v4}"}},{{"ip":"{v6}"}}]}}}}"#
                ),
            );
        }
    }
}

pub fn setup(api: &ApiServer) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in ["daemonset/crds/crds.yaml", "daemonset/rbac.yaml"] {
        api.apply(&std::fs::read_to_string(root.join(f)).unwrap());
    }
    // CRDs take a moment to be served.
    let served = wait_for(Duration::from_secs(10), || api.kubectl(&["get", "egressfirewalls", "-A"], "").0);
    assert!(served.is_some(), "CRDs not served");
    api.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n");
}

pub fn signal(agent: &Agent, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.pid() as i32), sig).unwrap();
}

/// Apply (for real) an overlay of the repository's kustomize directories `resources`
/// and `components` (paths from the repository's root), written in `dir`.
pub fn apply_overlay(api: &ApiServer, dir: &Path, resources: &[&str], components: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    // kustomize takes relative paths only.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let up = "../".repeat(dir.components().count() - 1);
    let path = |p: &&str| format!("- {up}{}/{p}\n", repo.strip_prefix("/").unwrap().display());
    let list = |items: &[&str]| items.iter().map(path).collect::<String>();
    let text = format!("resources:\n{}components:\n{}", list(resources), list(components));
    std::fs::write(dir.join("kustomization.yaml"), text).unwrap();
    let (ok, out) = api.kubectl(&["apply", "-k", dir.to_str().unwrap()], "");
    assert!(ok, "{}: {out}", dir.display());
}

/// An EgressIP `name` of `ips` for the namespaces labelled `team: prod`.
pub fn egress_ip(api: &ApiServer, name: &str, ips: &[&str]) {
    let list: Vec<String> = ips.iter().map(|i| format!("\"{i}\"")).collect();
    api.apply(&format!(
        "apiVersion: k8s.ovn.org/v1\nkind: EgressIP\nmetadata: {{name: {name}}}\nspec:\n  egressIPs: [{}]\n  namespaceSelector: {{matchLabels: {{team: prod}}}}\n",
        list.join(", ")
    ));
}

/// `status.items` of EgressIP `name`, sorted: (ip, node).
pub fn items(api: &ApiServer, name: &str) -> Vec<(String, String)> {
    let out = api.get(&["egressip", name, "-o", r#"jsonpath={range .status.items[*]}{.egressIP}={.node}{" "}{end}"#]);
    let mut v: Vec<(String, String)> =
        out.split_whitespace().filter_map(|p| p.split_once('=').map(|(a, b)| (a.to_string(), b.to_string()))).collect();
    v.sort();
    v
}

/// CloudPrivateIPConfig `name` as `spec.node|status.node|Assigned status|reason|message|finalizers`
/// (empty when it does not exist).
pub fn config(api: &ApiServer, name: &str) -> String {
    let (ok, out) = api.kubectl(
        &[
            "get",
            "cloudprivateipconfig",
            name,
            "-o",
            r#"jsonpath={.spec.node}|{.status.node}|{.status.conditions[0].status}|{.status.conditions[0].reason}|{.status.conditions[0].message}|{.metadata.finalizers}"#,
        ],
        "",
    );
    if ok { out } else { String::new() }
}

/// The split layout's node agent of `node` as in a cluster: a pod `egressd-<node>` of
/// the DaemonSet (namespace egressd, its labels, on `node`) and a token bound to it (a
/// TokenRequest, as the kubelet's projected volume holds), written as
/// `kubeconfig-egressd-<node>`, which [`start_kube_agent`] then uses. Returns the pod's
/// name (`--pod-name`).
pub fn bind_node_agent(api: &ApiServer, node: &str) -> String {
    let pod = format!("egressd-{node}");
    api.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: egressd, labels: {{app.kubernetes.io/name: egressd}}}}\n\
         spec: {{nodeName: {node}, serviceAccountName: egressd, containers: [{{name: egressd, image: egressd}}]}}\n"
    ));
    let (ok, token) = api.kubectl(
        &["create", "token", "egressd", "-n", "egressd", "--bound-object-kind", "Pod", "--bound-object-name", &pod],
        "",
    );
    assert!(ok, "token for {pod}: {token}");
    let shared = std::fs::read_to_string(api.kubeconfig_egressd()).unwrap();
    let own: String = shared
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("user: {token:") {
                format!("  user: {{token: \"{}\"}}", token.trim())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_ne!(own, shared.trim_end(), "no token line in {}", api.kubeconfig_egressd());
    std::fs::write(api.dir.join(format!("kubeconfig-egressd-{node}")), own + "\n").unwrap();
    pod
}

/// Point the split layout's admission webhooks (daemonset/modes/split/webhook.yaml) at
/// `https://127.0.0.1:<port>/validate`: the test API server has no Service network.
pub fn webhook_at(api: &ApiServer, port: u16) {
    let url = format!("https://127.0.0.1:{port}/validate");
    let ops: Vec<String> = (0..2)
        .map(|i| format!(r#"{{"op":"replace","path":"/webhooks/{i}/clientConfig","value":{{"url":"{url}"}}}}"#))
        .collect();
    let (ok, out) = api.kubectl(
        &["patch", "validatingwebhookconfiguration", "egressd", "--type=json", "-p", &format!("[{}]", ops.join(","))],
        "",
    );
    assert!(ok, "webhook url: {out}");
}
